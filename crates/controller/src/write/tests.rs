//! Unit tests of the writer, over a mocked API server, and the mock they share (`ops`, `reply`).

use std::time::Duration;

use http::{Request, Response};
use kube::client::Body;

use super::*;
use crate::{drain::Leaving, lifecycle::EvictionAnswer};

pub(crate) type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

pub(crate) fn ops(fence: Fence) -> (Writer, Handle) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "default");
    let reporter = Reporter {
        controller: "test".into(),
        instance: None,
    };
    (
        Writer::from_clients(client.clone(), client, fence, reporter),
        handle,
    )
}

fn pod() -> Leaving {
    Leaving {
        uid: "uid-1".into(),
        labels: std::collections::BTreeMap::new(),
        ..crate::test_fixtures::leaving("train-0", "train")
    }
}

pub(crate) async fn body_json(request: Request<Body>) -> serde_json::Value {
    let bytes = request.into_body().collect_bytes().await.unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

/// The next `count` requests, each taken before any is answered (a request sent only after an
/// answer never comes, and the wait fails): the caller answers them.
pub(crate) async fn held_at_once(
    handle: &mut Handle,
    count: usize,
) -> Vec<(Request<Body>, tower_test::mock::SendResponse<Response<Body>>)> {
    let mut held = Vec::new();
    for _ in 0..count {
        let request = tokio::time::timeout(Duration::from_secs(5), handle.next_request())
            .await
            .expect("every request is sent before the first is answered")
            .expect("the client is alive");
        held.push(request);
    }
    held
}

pub(crate) fn reply(code: u16, body: &serde_json::Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .body(Body::from(serde_json::to_vec(body).unwrap()))
        .unwrap()
}

#[tokio::test]
async fn a_replica_that_is_not_the_leader_sends_no_eviction() {
    let (fence, _keeper) = Fence::keeper(None);
    let (ops, mut handle) = ops(fence);
    let outcome = ops.evict(&pod(), None, false).await;
    assert!(
        matches!(
            outcome,
            Err(EvictPodError {
                source: WriteError::Fenced(_),
                ..
            })
        ),
        "{outcome:?}"
    );
    let request = tokio::time::timeout(Duration::from_millis(50), handle.next_request()).await;
    assert!(request.is_err(), "no request may reach the server");
}

#[tokio::test]
async fn an_eviction_is_a_typed_policy_v1_eviction_carrying_its_delete_options() {
    let (ops, mut handle) = ops(Fence::standalone());
    let server = tokio::spawn(async move {
        let (request, respond) = handle.next_request().await.expect("one request");
        let uri = request.uri().to_string();
        let method = request.method().clone();
        let body = body_json(request).await;
        respond.send_response(reply(
            201,
            &serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}),
        ));
        (method, uri, body)
    });
    let outcome = ops.evict(&pod(), Some(15), true).await.unwrap();
    assert!(matches!(outcome, EvictionAnswer::Accepted));
    let (method, uri, body) = server.await.unwrap();
    assert_eq!(method, http::Method::POST);
    assert!(
        uri.starts_with("/api/v1/namespaces/work/pods/train-0/eviction"),
        "{uri}"
    );
    assert!(uri.contains("dryRun=All"), "{uri}");
    assert_eq!(body["apiVersion"], "policy/v1");
    assert_eq!(body["kind"], "Eviction");
    assert_eq!(body["deleteOptions"]["gracePeriodSeconds"], 15);
    assert_eq!(body["deleteOptions"]["preconditions"]["uid"], "uid-1");
    assert_eq!(body["deleteOptions"]["dryRun"], serde_json::json!(["All"]));
}

#[tokio::test]
async fn a_refusal_by_a_budget_comes_back_at_once_with_the_servers_words() {
    let (ops, mut handle) = ops(Fence::standalone());
    let refusal = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 429, "reason": "TooManyRequests",
        "message": "Cannot evict pod as it would violate the pod's disruption budget.",
        "details": {"causes": [{"reason": "DisruptionBudget", "message": "The disruption budget web needs 3 healthy pods and has 3 currently"}]},
    });
    let server = tokio::spawn(async move {
        let (_, respond) = handle.next_request().await.expect("one request");
        respond.send_response(reply(429, &refusal));
        // The refusal is the caller's to record: nothing here asks again (the real eviction client
        // also has kube's retry layer off; the e2e Blocked test shows 429s arrive at once).
        tokio::time::timeout(Duration::from_millis(300), handle.next_request())
            .await
            .is_err()
    });
    let outcome = ops.evict(&pod(), None, false).await.unwrap();
    let EvictionAnswer::Refused(status) = outcome else {
        panic!("expected a refusal, got {outcome:?}")
    };
    assert_eq!(status.code, 429);
    assert_eq!(crate::drain::budget_named_in(&status).as_deref(), Some("web"));
    assert!(server.await.unwrap(), "the refused eviction was asked only once");
}

#[test]
fn nodes_and_pods_never_carry_the_fail_closed_label_but_evictions_and_our_objects_do() {
    for (verb, resource) in [
        (Verb::Patch, "nodes"),
        (Verb::Replace, "nodes"),
        (Verb::Replace, "pods"),
    ] {
        assert!(shared_with_others(verb, resource), "{verb:?} {resource}");
    }
    for (verb, resource) in [
        (Verb::Evict, "pods"),
        (Verb::Create, "gpuremediations"),
        (Verb::Replace, "devicetaintrules"),
        (Verb::Create, "jobs"),
        (Verb::Replace, "nodeclaims"),
    ] {
        assert!(!shared_with_others(verb, resource), "{verb:?} {resource}");
    }
}
