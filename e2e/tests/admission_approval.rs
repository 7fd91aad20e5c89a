//! Approval as a permission (`manifests/approval/`): with the shipped policy and the
//! `gpu-remediation-approver` `ClusterRole` installed, a user who may patch remediations but lacks
//! the verb `approve` is refused with a message naming the verb; an approver who names someone else
//! in `gpuremediation.dev/approved-by` is refused; an approver naming themselves approves.

mod common;

use std::{path::Path, process::Command, time::Duration};

use common::{bind, client_as, cluster, eventually, install_crd, unique_name};
use gpu_remediation_api::{
    GpuRemediation,
    constants::{APPROVED_ANNOTATION, APPROVED_BY_ANNOTATION},
    crds,
};
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::json;

async fn kubectl_apply_kustomization(dir: &str) {
    let cluster = cluster().await;
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(dir);
    let output = Command::new(cluster.kubectl())
        .arg("--kubeconfig")
        .arg(cluster.kubeconfig_path())
        .args(["apply", "-k"])
        .arg(&path)
        .output()
        .expect("kubectl runs");
    assert!(
        output.status.success(),
        "kubectl apply -k {dir}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

async fn approve(as_user: &Client, name: &str, approved_by: &str) -> Result<GpuRemediation, kube::Error> {
    let patch = json!({"metadata": {"annotations": {APPROVED_ANNOTATION: "true", APPROVED_BY_ANNOTATION: approved_by}}});
    Api::<GpuRemediation>::all(as_user.clone())
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
}

fn refusal(what: &str, result: Result<GpuRemediation, kube::Error>) -> String {
    common::refused_by("gpu-remediation-approval'", what, result)
}

#[tokio::test]
async fn approving_needs_the_approve_verb_and_names_the_approver() {
    let admin = cluster().await.client();
    for (_, yaml) in crds::render_all() {
        install_crd(&admin, &yaml).await;
    }
    kubectl_apply_kustomization("manifests/approval").await;
    // An editor: everything on remediations but the verb approve.
    let editor_role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": "e2e-remediation-editor"},
        "rules": [{"apiGroups": ["gpuremediation.dev"], "resources": ["gpuremediations"],
                   "verbs": ["get", "list", "watch", "patch", "update"]}],
    }))
    .unwrap();
    Api::<ClusterRole>::all(admin.clone())
        .create(&PostParams::default(), &editor_role)
        .await
        .unwrap();
    bind(&admin, "bob", "e2e-remediation-editor").await;
    bind(&admin, "alice", "gpu-remediation-approver").await;

    let name = unique_name("awaiting");
    let remediation: GpuRemediation = serde_json::from_value(json!({
        "apiVersion": "gpuremediation.dev/v1alpha1", "kind": "GpuRemediation",
        "metadata": {"name": name},
        "spec": {"nodeName": "gpu-x", "policyName": "p", "action": "None", "mode": "Manual",
                 "trigger": {"conditionType": "GpuHealthy", "status": "False", "reason": "XID79"}},
    }))
    .unwrap();
    Api::<GpuRemediation>::all(admin.clone())
        .create(&PostParams::default(), &remediation)
        .await
        .unwrap();

    let bob = client_as("bob").await;
    // The policy takes a moment to load; until then bob's approval would pass.
    let message = eventually("bob's approval refused", Duration::from_secs(30), || async {
        match approve(&bob, &name, "bob").await {
            Ok(_) => {
                // Loaded too late: undo, and try again.
                let undo = json!({"metadata": {"annotations": {APPROVED_ANNOTATION: null, APPROVED_BY_ANNOTATION: null}}});
                Api::<GpuRemediation>::all(admin.clone())
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&undo))
                    .await
                    .unwrap();
                None
            }
            refused => Some(refusal("bob without approve", refused)),
        }
    })
    .await;
    assert!(message.contains("needs the verb approve"), "{message}");
    assert!(message.contains("bob may not approve"), "{message}");

    let alice = client_as("alice").await;
    let message = refusal("alice naming bob", approve(&alice, &name, "bob").await);
    assert!(message.contains("names its approver"), "{message}");

    let approved = approve(&alice, &name, "alice")
        .await
        .expect("alice approves in her own name");
    let annotations = approved.metadata.annotations.unwrap_or_default();
    assert_eq!(annotations[APPROVED_ANNOTATION], "true");
    assert_eq!(annotations[APPROVED_BY_ANNOTATION], "alice");

    // Other edits by the editor stay allowed: the policy guards only the approval.
    let label = json!({"metadata": {"labels": {"team": "gpu"}}});
    Api::<GpuRemediation>::all(bob.clone())
        .patch(&name, &PatchParams::default(), &Patch::Merge(&label))
        .await
        .expect("bob may still label the record");
    // And bob cannot take the approval back either.
    let revoke = json!({"metadata": {"annotations": {APPROVED_ANNOTATION: null}}});
    let revoked = Api::<GpuRemediation>::all(bob)
        .patch(&name, &PatchParams::default(), &Patch::Merge(&revoke))
        .await;
    assert!(refusal("bob revoking", revoked).contains("needs the verb approve"));
}
