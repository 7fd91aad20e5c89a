//! The agent confined to its own node by the API server (`manifests/agent/admission-policy.yaml`),
//! under the agent's shipped role (`manifests/agent/rbac.yaml`): a token bound to a pod on node A
//! (a `TokenRequest` with `boundObjectRef`, as the kubelet projects it) can set node A's
//! `GpuHealthy` and publish Events about A, and is refused, with the policy's message, on node B's
//! status, on A's `Ready` condition, on A's capacity, on a `lastTransitionTime` an hour in the
//! future, on an annotation it does not publish, and on Events about B. A token bound to no pod
//! is refused on A too. The device plugin's GPU assignment (`gpuremediation.dev/gpu-pods`), which
//! the controller believes when it narrows a GPU reset's drain, is accepted on A only, and only
//! within its size bound.

mod common;

use std::time::Duration;

use common::{
    agent_identity::{agent_on, apply_status, gpu_healthy, install_agent_manifests, refusal, token},
    cluster, eventually,
};
use k8s_openapi::{
    api::{core::v1::Node, events::v1::Event},
    jiff::{SignedDuration, Timestamp},
};
use kube::{Api, Client, ResourceExt, api::PostParams};
use serde_json::{Value, json};

fn event(node: &str) -> Event {
    serde_json::from_value(json!({
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"generateName": "gpu-health-agent-", "namespace": "default"},
        "eventTime": Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string(),
        "reportingController": "gpuremediation.dev/gpu-health-agent", "reportingInstance": "e2e",
        "action": "Probe", "reason": "XID79", "type": "Warning", "note": "GPU 3 fell off the bus",
        "regarding": {"apiVersion": "v1", "kind": "Node", "name": node},
    }))
    .unwrap()
}

/// The agent on node `own` publishes an Event about it, and is refused, by the policy, one about
/// node `other`.
async fn events_only_about(agent: &Client, own: &str, other: &str) {
    let events: Api<Event> = Api::namespaced(agent.clone(), "default");
    events
        .create(&PostParams::default(), &event(own))
        .await
        .expect("an Event about its own node");
    // The Events' policy is a policy of its own, loaded on its own: the caller's wait for the node
    // status policy says nothing of it (CI once saw an Event about the other node admitted just after
    // that wait).
    eventually(
        &format!("the policy refuses an Event about {other}"),
        Duration::from_secs(30),
        || async {
            events
                .create(&PostParams::default(), &event(other))
                .await
                .is_err()
                .then_some(())
        },
    )
    .await;
    let message = refusal(
        &format!("an Event about {other}"),
        events.create(&PostParams::default(), &event(other)).await,
    );
    assert!(message.contains("Events only about its own node"), "{message}");
}

/// The agent's manifests installed, two nodes `a` and `b` (sorted), and an agent's client on `a`
/// ([`agent_on`]): the admin's client, the fleet, the nodes and the agent's client.
async fn agent_on_the_first_of_two() -> (Client, gpu_sandbox::Fleet, [String; 2], Client) {
    let admin = cluster().await.client();
    install_agent_manifests().await;
    let fleet = common::fleet(2).await;
    let mut nodes = fleet.node_names();
    nodes.sort();
    let (a, b) = (nodes[0].clone(), nodes[1].clone());
    let agent = agent_on(&admin, &a).await;
    (admin, fleet, [a, b], agent)
}

#[tokio::test]
async fn a_token_bound_to_a_pod_on_node_a_writes_only_node_as_gpu_healthy_condition() {
    let (admin, fleet, [a, b], agent) = agent_on_the_first_of_two().await;
    let no_annotations = json!({});

    // The policy takes a moment to be loaded; until then B's status would be writable.
    eventually("the policy refuses node B", Duration::from_secs(30), || async {
        apply_status(
            &agent,
            &b,
            &no_annotations,
            &gpu_healthy("False", Timestamp::now()),
        )
        .await
        .is_err()
        .then_some(())
    })
    .await;
    let message = refusal(
        "node B",
        apply_status(
            &agent,
            &b,
            &no_annotations,
            &gpu_healthy("False", Timestamp::now()),
        )
        .await,
    );
    assert!(
        message.contains(&format!("on node {a} may not write the status of node {b}")),
        "{message}"
    );

    let written = apply_status(
        &agent,
        &a,
        &no_annotations,
        &gpu_healthy("False", Timestamp::now()),
    )
    .await
    .expect("the agent sets its own node's GpuHealthy");
    let condition = written
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "GpuHealthy")
        .expect("the condition was written");
    assert_eq!(condition.status, "False");
    let published = json!({"gpuremediation.dev/gpu-inventory": "[]"});
    apply_status(&agent, &a, &published, &gpu_healthy("False", Timestamp::now()))
        .await
        .expect("the agent publishes its inventory annotation");

    let ready = json!({"conditions": [
        {"type": "GpuHealthy", "status": "False", "reason": "XID79", "message": "GPU 3 fell off the bus"},
        {"type": "Ready", "status": "False", "reason": "KubeletNotReady", "message": "forged"},
    ]});
    let message = refusal("A's Ready", apply_status(&agent, &a, &published, &ready).await);
    assert!(
        message.contains("only its node's GpuHealthy condition"),
        "{message}"
    );

    let mut capacity = gpu_healthy("False", Timestamp::now());
    capacity["capacity"] = json!({"nvidia.com/gpu": "100"});
    let message = refusal(
        "A's capacity",
        apply_status(&agent, &a, &published, &capacity).await,
    );
    assert!(message.contains("not its capacity"), "{message}");

    let future = Timestamp::now() + SignedDuration::from_hours(1);
    let message = refusal(
        "a lastTransitionTime an hour ahead",
        apply_status(&agent, &a, &published, &gpu_healthy("False", future)).await,
    );
    assert!(message.contains("lastTransitionTime in the future"), "{message}");

    let foreign = json!({"gpuremediation.dev/gpu-inventory": "[]", "example.com/owner": "agent"});
    let message = refusal(
        "another annotation",
        apply_status(&agent, &a, &foreign, &gpu_healthy("False", Timestamp::now())).await,
    );
    assert!(message.contains("no annotation but"), "{message}");

    events_only_about(&agent, &a, &b).await;

    let unbound = cluster().await.client_with_token(&token(&admin, None).await);
    let message = refusal(
        "a token bound to no pod",
        apply_status(
            &unbound,
            &a,
            &no_annotations,
            &gpu_healthy("False", Timestamp::now()),
        )
        .await,
    );
    assert!(message.contains("only with a token bound to a pod"), "{message}");

    let node = Api::<Node>::all(admin).get(&a).await.unwrap();
    let capacity = node.status.and_then(|s| s.capacity).unwrap_or_default();
    assert_ne!(
        capacity.get("nvidia.com/gpu").map(|q| q.0.as_str()),
        Some("100"),
        "capacity unchanged"
    );
    fleet.stop().await.expect("stopping the fleet");
}

#[tokio::test]
async fn the_agent_publishes_its_gpu_pods_assignment_only_on_its_own_node_and_within_its_bound() {
    let (admin, fleet, [a, b], agent) = agent_on_the_first_of_two().await;
    let assignment = |pods: usize| {
        let pods: Vec<Value> = (0..pods)
            .map(|i| json!({"namespace": "train", "name": format!("worker-{i:05}"), "gpus": [format!("GPU-{i:08}")]}))
            .collect();
        json!({"gpuremediation.dev/gpu-pods":
            json!({"readAt": Timestamp::now().to_string(), "pods": pods}).to_string()})
    };

    // On node B, an assignment that would make the controller evict B's pods is refused (once the
    // policy is loaded: the probe carries no assignment, so none lands on B before).
    eventually("the policy refuses node B", Duration::from_secs(30), || async {
        apply_status(&agent, &b, &json!({}), &gpu_healthy("True", Timestamp::now()))
            .await
            .is_err()
            .then_some(())
    })
    .await;
    let message = refusal(
        "an assignment on node B",
        apply_status(&agent, &b, &assignment(1), &gpu_healthy("True", Timestamp::now())).await,
    );
    assert!(
        message.contains(&format!("on node {a} may not write the status of node {b}")),
        "{message}"
    );
    let on_b = Api::<Node>::all(admin.clone()).get(&b).await.unwrap();
    assert!(
        !on_b.annotations().contains_key("gpuremediation.dev/gpu-pods"),
        "node B carries no assignment"
    );

    // On its own node it publishes one, within the bound.
    let written = apply_status(&agent, &a, &assignment(8), &gpu_healthy("True", Timestamp::now()))
        .await
        .expect("the agent publishes its own node's assignment");
    assert!(written.annotations().contains_key("gpuremediation.dev/gpu-pods"));

    // Past 16384 bytes it is refused (the agent itself leaves pods out to stay within it).
    let oversized = assignment(400);
    assert!(oversized["gpuremediation.dev/gpu-pods"].as_str().unwrap().len() > 16_384);
    let message = refusal(
        "an oversized assignment",
        apply_status(&agent, &a, &oversized, &gpu_healthy("True", Timestamp::now())).await,
    );
    assert!(message.contains("at most 16384 bytes"), "{message}");
    fleet.stop().await.expect("stopping the fleet");
}
