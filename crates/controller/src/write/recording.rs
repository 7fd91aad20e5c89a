//! A recording API server for the acting modules' unit tests: a [`Writer`] over an in-process
//! mock that keeps the objects it is given and written, answers reads from them, and records every
//! request, so a test can say exactly which writes an acting module made for a plan. Writes are
//! applied simply (a create stores the body, a replace replaces it, a patch is merged into the
//! stored object, a delete removes it), which is all the acting modules' requests need; it is not
//! an API server, and a test that needs admission or a watch runs in e2e.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, PoisonError},
};

use http::{Method, Request, Response};
use kube::{Client, client::Body};
use serde_json::{Value, json};

use super::Writer;
use crate::leader::Fence;

/// One request the writer sent.
#[derive(Debug, Clone)]
pub(crate) struct Recorded {
    pub(crate) method: Method,
    /// The path, without the query.
    pub(crate) path: String,
    pub(crate) query: String,
    pub(crate) body: Value,
}

impl Recorded {
    /// Whether this request changes something (not a read).
    pub(crate) fn is_write(&self) -> bool {
        self.method != Method::GET
    }
}

/// The recorder's shared state: objects by path, and the requests in order.
#[derive(Clone, Default)]
pub(crate) struct Recording {
    objects: Arc<Mutex<BTreeMap<String, Value>>>,
    requests: Arc<Mutex<Vec<Recorded>>>,
}

impl Recording {
    /// Stores `object` at `path` (e.g. `/api/v1/nodes/gpu-1`), as if it existed on the server.
    pub(crate) fn put(&self, path: &str, object: Value) {
        self.objects
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(path.to_owned(), object);
    }

    /// The object at `path`, as the writes left it.
    pub(crate) fn object(&self, path: &str) -> Option<Value> {
        self.objects
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(path)
            .cloned()
    }

    /// Every request so far.
    pub(crate) fn requests(&self) -> Vec<Recorded> {
        self.requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The first PATCH sent, for what it carried (its body, its query).
    pub(crate) fn first_patch(&self) -> Option<Recorded> {
        self.requests()
            .into_iter()
            .find(|r| r.method == http::Method::PATCH)
    }

    /// The writes so far, as `METHOD path`, Events left out (a report, not a change).
    pub(crate) fn writes(&self) -> Vec<String> {
        self.requests()
            .iter()
            .filter(|r| r.is_write() && !r.path.contains("/events"))
            .map(|r| format!("{} {}", r.method, r.path))
            .collect()
    }

    /// The Events written so far, as their `reason`s.
    pub(crate) fn event_reasons(&self) -> Vec<String> {
        self.requests()
            .iter()
            .filter(|r| r.is_write() && r.path.contains("/events"))
            .filter_map(|r| r.body["reason"].as_str().map(str::to_owned))
            .collect()
    }

    fn answer(&self, method: &Method, path: &str, body: Value) -> (u16, Value) {
        let mut objects = self.objects.lock().unwrap_or_else(PoisonError::into_inner);
        let version = objects.len() + self.requests.lock().map_or(0, |r| r.len());
        let stamp = |mut object: Value, name: &str| {
            object["metadata"]["resourceVersion"] = json!(version.to_string());
            if object["metadata"]["uid"].is_null() {
                object["metadata"]["uid"] = json!(format!("uid-{name}"));
            }
            object
        };
        match *method {
            Method::GET if is_collection(path) => {
                let items: Vec<Value> = objects
                    .iter()
                    .filter(|(at, _)| in_collection(at, path))
                    .map(|(_, object)| object.clone())
                    .collect();
                (
                    200,
                    json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": "1"}, "items": items}),
                )
            }
            Method::GET => objects
                .get(path)
                .map_or_else(|| (404, status(404, "NotFound")), |o| (200, o.clone())),
            // An eviction granted: the pod goes at once (no grace period here).
            Method::POST if path.ends_with("/eviction") => {
                objects.remove(path.trim_end_matches("/eviction"));
                (201, status(201, "Success"))
            }
            Method::POST => {
                let name = body["metadata"]["name"].as_str().unwrap_or("unnamed").to_owned();
                let at = format!("{path}/{name}");
                if objects.contains_key(&at) {
                    return (409, status(409, "AlreadyExists"));
                }
                let created = stamp(body, &name);
                objects.insert(at, created.clone());
                (201, created)
            }
            Method::PUT => {
                let name = path.rsplit('/').next().unwrap_or_default().to_owned();
                let replaced = stamp(body, &name);
                objects.insert(path.to_owned(), replaced.clone());
                (200, replaced)
            }
            Method::PATCH => {
                let object_path = path.trim_end_matches("/status");
                let Some(stored) = objects.get(object_path).cloned() else {
                    return (404, status(404, "NotFound"));
                };
                let mut merged = stored;
                merge(&mut merged, &body);
                let name = object_path.rsplit('/').next().unwrap_or_default().to_owned();
                let patched = stamp(merged, &name);
                objects.insert(object_path.to_owned(), patched.clone());
                (200, patched)
            }
            Method::DELETE => match objects.remove(path) {
                Some(_) => (200, status(200, "Success")),
                None => (404, status(404, "NotFound")),
            },
            _ => (405, status(405, "MethodNotAllowed")),
        }
    }
}

/// The segments of `path` after its group and version (`/api/v1`, `/apis/<group>/<version>`).
fn resource_segments(path: &str) -> Vec<&str> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match segments.first() {
        Some(&"api") => segments[2.min(segments.len())..].to_vec(),
        Some(&"apis") => segments[3.min(segments.len())..].to_vec(),
        _ => segments,
    }
}

/// Whether `path` names a collection (`pods`, `namespaces/<ns>/pods`), not an object.
fn is_collection(path: &str) -> bool {
    matches!(resource_segments(path).len(), 1 | 3)
}

/// Whether the object kept at `at` is in the collection `path` (a cluster-wide list of a
/// namespaced kind holds every namespace's objects; selectors are not applied).
fn in_collection(at: &str, path: &str) -> bool {
    let prefix = path.trim_end_matches('/');
    let (object, collection) = (resource_segments(at), resource_segments(path));
    let same_group = at
        .split('/')
        .take(if path.starts_with("/apis") { 4 } else { 3 })
        .eq(path
            .split('/')
            .take(if path.starts_with("/apis") { 4 } else { 3 }));
    same_group
        && match (object.as_slice(), collection.as_slice()) {
            ([plural, _] | ["namespaces", _, plural, _], [wanted]) => plural == wanted,
            _ => at.starts_with(&format!("{prefix}/")) && object.len() == collection.len() + 1,
        }
}

/// RFC 7386 merge of `patch` into `target` (a server-side apply is merged the same way here).
fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(fields) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    for (key, value) in fields {
        if value.is_null() {
            if let Some(object) = target.as_object_mut() {
                object.remove(key);
            }
        } else {
            merge(&mut target[key], value);
        }
    }
}

fn status(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": if code < 300 { "Success" } else { "Failure" },
           "code": code, "reason": reason, "message": reason})
}

/// A writer (under `fence`) whose requests go to a recorder, and the recorder.
pub(crate) fn recording_writer(fence: Fence) -> (Writer, Recording) {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "default");
    let recording = Recording::default();
    let server = recording.clone();
    tokio::spawn(async move {
        while let Some((request, respond)) = handle.next_request().await {
            let method = request.method().clone();
            let path = request.uri().path().to_owned();
            let query = request.uri().query().unwrap_or_default().to_owned();
            let bytes = request.into_body().collect_bytes().await.unwrap_or_default();
            let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let (code, answer) = server.answer(&method, &path, body.clone());
            server
                .requests
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(Recorded {
                    method,
                    path,
                    query,
                    body,
                });
            let response = Response::builder()
                .status(code)
                .body(Body::from(serde_json::to_vec(&answer).unwrap_or_default()))
                .unwrap_or_else(|_| Response::new(Body::empty()));
            respond.send_response(response);
        }
    });
    (Writer::over(client, fence), recording)
}

/// The path the recorder keeps `node` at.
pub(crate) fn node_path(name: &str) -> String {
    format!("/api/v1/nodes/{name}")
}

/// The path the recorder keeps remediation `name` at.
pub(crate) fn remediation_path(name: &str) -> String {
    format!("/apis/gpuremediation.dev/v1alpha1/gpuremediations/{name}")
}

/// A context whose caches hold exactly these objects, and whose writer records into the returned
/// recorder, which holds them too (standalone: no leader election, so no claim).
pub(crate) fn context(
    policies: Vec<gpu_remediation_api::GpuRemediationPolicy>,
    remediations: Vec<gpu_remediation_api::GpuRemediation>,
    nodes: Vec<k8s_openapi::api::core::v1::Node>,
) -> (crate::Context, Recording) {
    use kube::ResourceExt as _;
    let (writer, recording) = recording_writer(Fence::standalone());
    for node in &nodes {
        recording.put(
            &node_path(&node.name_any()),
            serde_json::to_value(node).unwrap_or_default(),
        );
    }
    for remediation in &remediations {
        recording.put(
            &remediation_path(&remediation.name_any()),
            serde_json::to_value(remediation).unwrap_or_default(),
        );
    }
    let caches = crate::observe::Caches::fixed(writer.overlays(), policies, remediations, nodes);
    let metrics = crate::telemetry::Metrics::new();
    let context = crate::Context::new(crate::Settings::default(), writer, caches, metrics);
    (context, recording)
}

impl Recording {
    /// Waits (up to a second) until the Events queued behind the caller have been sent, and
    /// returns their reasons.
    pub(crate) async fn events_sent(&self, expected: usize) -> Vec<String> {
        for _ in 0..100 {
            let reasons = self.event_reasons();
            if reasons.len() >= expected {
                return reasons;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        self.event_reasons()
    }
}
