//! The controller's `patch pods` right is the checkpoint notice and nothing else, on the real
//! control plane: with `manifests/controller/pod-notice-policy.yaml` installed as shipped and the
//! shipped controller's user (its service account's name, impersonated) granted what the shipped
//! role grants on pods, writing `gpuremediation.dev/evict-at` (with the claim annotation every
//! controller write carries) is allowed; any other change to a pod (another annotation, an
//! annotation removed, a label, a finalizer) is refused with the policy's message, and the pod
//! stays as it was.

mod common;

use std::time::Duration;

use common::{bind, client_as, eventually};
use gpu_remediation_api::constants::{CLAIM_ANNOTATION, EVICT_AT_ANNOTATION};
use k8s_openapi::api::{core::v1::Pod, rbac::v1::ClusterRole};
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};

const SHIPPED_CONTROLLER: &str = "system:serviceaccount:gpu-remediation:gpu-remediator";
const POLICY: &str = "gpu-remediator-pod-notice";

/// The shipped controller's user, with the shipped role's rights on pods.
async fn the_controller(admin: &Client) -> Client {
    let rbac = common::repo_file("manifests/controller/rbac.yaml");
    let shipped = gpu_sandbox::demo::install::parse_documents(&rbac).unwrap();
    let role = shipped
        .iter()
        .find(|o| o["kind"] == "ClusterRole" && o["metadata"]["name"] == "gpu-remediator")
        .expect("the shipped controller role");
    let pods: Vec<Value> = role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["resources"] == json!(["pods"]))
        .cloned()
        .collect();
    assert_eq!(pods.len(), 1, "one rule on pods: {pods:?}");
    assert!(pods[0]["verbs"].as_array().unwrap().contains(&json!("patch")));
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": "e2e-shipped-controller-pods"}, "rules": pods,
    }))
    .unwrap();
    Api::<ClusterRole>::all(admin.clone())
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    bind(admin, SHIPPED_CONTROLLER, "e2e-shipped-controller-pods").await;
    client_as(SHIPPED_CONTROLLER).await
}

async fn patch(as_user: &Client, namespace: &str, name: &str, patch: &Value) -> Result<Pod, kube::Error> {
    Api::<Pod>::namespaced(as_user.clone(), namespace)
        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
}

#[tokio::test]
async fn the_controller_may_give_a_pod_the_checkpoint_notice_and_change_nothing_else() {
    common::init_logs();
    let admin = common::cluster().await.client();
    let namespace = common::namespace().await;
    let policy = gpu_sandbox::demo::install::parse_documents(&common::repo_file(
        "manifests/controller/pod-notice-policy.yaml",
    ))
    .unwrap();
    gpu_sandbox::demo::install::apply(&admin, &policy).await.unwrap();
    let controller = the_controller(&admin).await;
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "worker-0", "namespace": namespace,
                     "labels": {"app": "train"}, "annotations": {"team": "ml"}},
        "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]},
    }))
    .unwrap();
    let pods = Api::<Pod>::namespaced(admin.clone(), &namespace);
    let created = pods.create(&PostParams::default(), &pod).await.unwrap();
    let name = created.name_any();

    // The policy takes a moment to be enforced: wait until another annotation is refused.
    let another = json!({"metadata": {"annotations": {"team": "ops"}}});
    let refused = eventually(
        "the pod-notice policy enforced",
        Duration::from_secs(30),
        || async {
            if let Err(error) = patch(&controller, &namespace, &name, &another).await {
                return Some(error);
            }
            // Not enforced yet: put it back for the next try.
            let undo = json!({"metadata": {"annotations": {"team": "ml"}}});
            pods.patch(&name, &PatchParams::default(), &Patch::Merge(&undo))
                .await
                .unwrap();
            None
        },
    )
    .await;
    let message = common::refused_by(POLICY, "another annotation", Err::<Pod, _>(refused));
    assert!(
        message.contains("only a pod's gpuremediation.dev/evict-at"),
        "{message}"
    );

    let notice = json!({"metadata": {
        "uid": created.uid(),
        "annotations": {EVICT_AT_ANNOTATION: "2026-12-05T09:00:00Z", CLAIM_ANNOTATION: "replica-a/3"},
    }});
    let noticed = patch(&controller, &namespace, &name, &notice)
        .await
        .expect("the notice is allowed");
    assert_eq!(
        noticed.annotations().get(EVICT_AT_ANNOTATION).map(String::as_str),
        Some("2026-12-05T09:00:00Z")
    );

    for (what, change) in [
        ("a label", json!({"metadata": {"labels": {"app": "other"}}})),
        (
            "an annotation removed",
            json!({"metadata": {"annotations": {"team": null}}}),
        ),
        (
            "a finalizer",
            json!({"metadata": {"finalizers": ["example.com/hold"]}}),
        ),
        (
            "a gpuremediation.dev annotation other than the notice",
            json!({"metadata": {"annotations": {"gpuremediation.dev/checkpointed": "x"}}}),
        ),
    ] {
        common::refused_by(POLICY, what, patch(&controller, &namespace, &name, &change).await);
    }
    let stored = pods.get(&name).await.unwrap();
    assert_eq!(stored.labels().get("app").map(String::as_str), Some("train"));
    assert_eq!(stored.annotations().get("team").map(String::as_str), Some("ml"));
    assert!(stored.finalizers().is_empty());
    assert!(
        !stored
            .annotations()
            .contains_key("gpuremediation.dev/checkpointed")
    );
}
