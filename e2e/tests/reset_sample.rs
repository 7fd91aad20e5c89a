//! The shipped reset Job (`config/ladder-steps/reset-job.yaml`) under what it ships with
//! (`manifests/optional/gpu-reset`), as shipped, on the real API server: the Job's pod (a token of
//! `gpu-reset` bound to a pod on node A, as the kubelet projects it) applies the sample's own patch,
//! the agent's clear annotation, to node A; the same account is refused, by the admission policy,
//! on node B, on any other annotation, label, taint or the cordon of A, on a clear that is not a
//! time, and with a token bound to no pod. The sample's Job names the account, namespace and patch
//! file the manifests and its two containers agree on. The reset itself (`nvidia-smi`) needs a
//! GPU; the sandbox's nodes have none, so the test plays the pod's one API call.

mod common;

use std::time::Duration;

use common::{
    agent_identity::{NAMESPACE, client_on, token_of},
    cluster, eventually, refused_by,
};
use gpu_sandbox::demo::install;
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use serde_json::{Value, json};

const POLICY: &str = "gpu-reset-own-node-clear";
const ACCOUNT: &str = "gpu-reset";

/// The namespace and the optional component, applied as shipped.
async fn install_component(admin: &Client) {
    let mut objects = install::parse_documents(&common::repo_file("manifests/namespace.yaml")).unwrap();
    for file in ["rbac.yaml", "admission-policy.yaml"] {
        objects.extend(
            install::parse_documents(&common::repo_file(&format!(
                "manifests/optional/gpu-reset/{file}"
            )))
            .unwrap(),
        );
    }
    install::apply(admin, &objects).await.unwrap();
}

/// The sample's Job template, as the ladder step carries it.
fn sample_job() -> Value {
    let step: gpu_remediation_api::ladder::LadderStep =
        serde_yaml::from_str(&common::repo_file("config/ladder-steps/reset-job.yaml")).unwrap();
    step.template.expect("the reset step's template")
}

/// The patch the sample's init container writes (its `printf`, with a time in place of `date`).
fn clear_patch(at: &str) -> Value {
    json!({"metadata": {"annotations": {"gpuremediation.dev/clear": at}}})
}

async fn patch(
    client: &Client,
    node: &str,
    body: &Value,
) -> Result<k8s_openapi::api::core::v1::Node, kube::Error> {
    Api::all(client.clone())
        .patch(node, &PatchParams::default(), &Patch::Merge(body))
        .await
}

#[test]
fn the_samples_job_runs_under_the_shipped_account_and_its_containers_share_the_patch() {
    let job = sample_job();
    assert_eq!(job["metadata"]["namespace"], NAMESPACE);
    let pod = &job["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], ACCOUNT);
    let rbac = common::repo_file("manifests/optional/gpu-reset/rbac.yaml");
    assert!(
        rbac.contains(&format!("name: {ACCOUNT}\n  namespace: {NAMESPACE}")),
        "{rbac}"
    );
    let writes = pod["initContainers"][0]["args"][0].as_str().unwrap();
    assert!(
        writes.contains("gpuremediation.dev/clear") && writes.contains("> /clear/patch.json"),
        "{writes}"
    );
    assert!(writes.contains("for uuid in {{gpuUUIDs}}"), "{writes}");
    let applies = &pod["containers"][0]["args"];
    assert_eq!(
        applies,
        &json!([
            "patch",
            "node",
            "{{nodeName}}",
            "--type=merge",
            "--patch-file=/clear/patch.json"
        ])
    );
}

#[tokio::test]
async fn the_reset_job_writes_only_the_clear_annotation_of_its_own_node() {
    let admin = cluster().await.client();
    install_component(&admin).await;
    let fleet = common::fleet(2).await;
    let mut nodes = fleet.node_names();
    nodes.sort();
    let (a, b) = (nodes[0].clone(), nodes[1].clone());
    let job = client_on(&admin, ACCOUNT, &a).await;

    // The policy is enforced a moment after it is created: wait for its first refusal.
    eventually("the reset policy enforced", Duration::from_secs(30), || async {
        patch(&job, &b, &clear_patch("2027-01-15T10:00:00Z"))
            .await
            .is_err()
            .then_some(())
    })
    .await;

    let now = k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let written = patch(&job, &a, &clear_patch(&now))
        .await
        .expect("the clear on its own node");
    assert_eq!(
        written
            .metadata
            .annotations
            .unwrap_or_default()
            .get("gpuremediation.dev/clear"),
        Some(&now)
    );

    let other_node = refused_by(
        POLICY,
        "the clear on node B",
        patch(&job, &b, &clear_patch(&now)).await,
    );
    assert!(
        other_node.contains(&format!("may not write node {b}")),
        "{other_node}"
    );
    for (what, body) in [
        (
            "another annotation",
            json!({"metadata": {"annotations": {"gpuremediation.dev/failed-gpus": "[]"}}}),
        ),
        (
            "a label",
            json!({"metadata": {"labels": {"nvidia.com/gpu.present": "false"}}}),
        ),
        ("the cordon", json!({"spec": {"unschedulable": true}})),
        (
            "a taint",
            json!({"spec": {"taints": [{"key": "x", "effect": "NoSchedule"}]}}),
        ),
        (
            "a finalizer",
            json!({"metadata": {"finalizers": ["example.com/hold"]}}),
        ),
    ] {
        let message = refused_by(POLICY, what, patch(&job, &a, &body).await);
        assert!(
            message.contains("only the gpuremediation.dev/clear annotation"),
            "{what}: {message}"
        );
    }
    let not_a_time = refused_by(
        POLICY,
        "a clear that is no time",
        patch(&job, &a, &clear_patch("now; reboot")).await,
    );
    assert!(not_a_time.contains("RFC 3339"), "{not_a_time}");

    let unbound = cluster()
        .await
        .client_with_token(&token_of(&admin, ACCOUNT, None).await);
    let message = refused_by(
        POLICY,
        "a token bound to no pod",
        patch(&unbound, &a, &clear_patch(&now)).await,
    );
    assert!(message.contains("token bound to a pod on that node"), "{message}");
    fleet.stop().await.expect("stopping the fleet");
}
