//! The kubectl plugin through the sandbox's kubectl and its plugin discovery (`kubectl-gpu` on
//! the `PATH`): a policy in `Manual` mode holds a broken node's remediation for approval;
//! `kubectl gpu explain` says so, `kubectl gpu approve` approves it in the caller's name (the
//! API server's, from a `SelfSubjectReview`) and the controller goes on, `kubectl gpu history`
//! lists the record, `kubectl gpu explain` of a node that does not exist fails, and
//! `kubectl gpu validate` passes the samples and fails a broken policy.

mod common;

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
    time::Duration,
};

use gpu_remediation_api::{GpuRemediation, GpuRemediationPolicy, Phase, constants::NODE_LABEL};
use gpu_sandbox::fleet::FLEET_LABEL;
use kube::{Api, ResourceExt as _, api::ListParams};
use serde_json::json;

/// The directory holding the built `kubectl-gpu`.
fn plugin_dir() -> PathBuf {
    let dir = e2e::build_binaries(&[("gpu-remediator", "kubectl-gpu")]);
    assert!(
        dir.join("kubectl-gpu").exists(),
        "kubectl-gpu not built in {}",
        dir.display()
    );
    dir
}

/// `kubectl ARGS` with the plugin's directory first on the `PATH` and the sandbox's kubeconfig.
async fn kubectl(args: &[&str]) -> Output {
    let cluster = common::cluster().await;
    let path = std::env::join_paths(std::iter::once(plugin_dir()).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))
    .unwrap();
    let output = Command::new(cluster.kubectl())
        .args(args)
        .env("PATH", path)
        .env("KUBECONFIG", cluster.kubeconfig_path())
        .output()
        .expect("kubectl runs");
    eprintln!(
        "$ kubectl {}\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test]
async fn kubectl_gpu_explains_approves_and_lists_a_nodes_remediation() {
    let client = common::cluster().await.client();
    common::install_shipped_crds(&client).await;
    let fleet = common::fleet(1).await;
    let node = fleet.node_names()[0].clone();
    let scope = common::unique_name("plugin");
    let policy: GpuRemediationPolicy = serde_json::from_value(json!({
        "apiVersion": "gpuremediation.dev/v1alpha1", "kind": "GpuRemediationPolicy",
        "metadata": {"name": scope, "labels": {"e2e.gpuremediation.dev/scope": scope}},
        "spec": {
            "nodeSelector": {"matchLabels": {FLEET_LABEL: fleet.name()}},
            "triggers": [{"conditionType": "GpuHealthy", "status": "False", "for": "1s"}],
            "mode": "Manual", "action": "None",
            "safety": {"maxUnhealthy": "100%"},
        },
    }))
    .unwrap();
    let stop = common::run_controller_over(&client, &policy, &scope).await;
    gpu_sandbox::fault::set_gpu_condition(&client, &node, "False", "XID79", "GPU fell off the bus")
        .await
        .unwrap();

    let remediations: Api<GpuRemediation> = Api::all(client.clone());
    let phase_of = |wanted: fn(Phase) -> bool| {
        let (remediations, node) = (remediations.clone(), node.clone());
        move || {
            let (remediations, node) = (remediations.clone(), node.clone());
            async move {
                let list = remediations
                    .list(&ListParams::default().labels(&format!("{NODE_LABEL}={node}")))
                    .await
                    .ok()?;
                let record = list.items.into_iter().next()?;
                wanted(record.status.as_ref()?.phase).then_some(record)
            }
        }
    };
    let waiting = common::eventually(
        "the remediation awaiting approval",
        Duration::from_secs(60),
        phase_of(|p| p == Phase::AwaitingApproval),
    )
    .await;
    let name = waiting.name_any();

    let explained = kubectl(&["gpu", "explain", &node]).await;
    assert!(explained.status.success());
    assert!(
        stdout(&explained).starts_with(&format!(
            "node {node}: being remediated: {name} is AwaitingApproval"
        )),
        "{}",
        stdout(&explained)
    );
    assert!(stdout(&explained).contains(&format!("policy {scope} governs the node")));

    let approved = kubectl(&["gpu", "approve", &name]).await;
    assert!(approved.status.success());
    assert_eq!(
        stdout(&approved).trim(),
        format!("gpuremediation/{name} approved by gpu-sandbox-admin")
    );
    let record = remediations.get(&name).await.unwrap();
    assert_eq!(record.annotations()["gpuremediation.dev/approved"], "true");
    assert_eq!(
        record.annotations()["gpuremediation.dev/approved-by"],
        "gpu-sandbox-admin"
    );
    // Action None: cordoned, drained, then held in Verifying for a person or for recovery.
    common::eventually(
        "the approved remediation to reach Verifying",
        Duration::from_secs(60),
        phase_of(|p| p == Phase::Verifying),
    )
    .await;
    let again = kubectl(&["gpu", "approve", &name]).await;
    assert!(again.status.success());
    assert!(stdout(&again).contains("was already approved by gpu-sandbox-admin"));

    let history = kubectl(&["gpu", "history", &node]).await;
    assert!(history.status.success());
    let lines: Vec<String> = stdout(&history).lines().map(str::to_owned).collect();
    assert_eq!(lines.len(), 2, "a header and the one record: {lines:?}");
    let cells: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(
        cells[..5],
        [name.as_str(), scope.as_str(), "Verifying", "XID79", "None"]
    );
    assert_eq!(cells[6..], ["-", "-"], "not finished: {cells:?}");

    let missing = kubectl(&["gpu", "explain", "no-such-node"]).await;
    assert_eq!(missing.status.code(), Some(1));
    assert!(stdout(&missing).starts_with("node no-such-node: not remediated: no such node"));
    let empty = kubectl(&["gpu", "history", "no-such-node"]).await;
    assert_eq!(stdout(&empty), "no remediations of node no-such-node\n");

    let _ = stop.send(());
}

#[tokio::test]
async fn kubectl_gpu_validate_passes_the_samples_and_fails_a_broken_policy() {
    let config = Path::new(e2e::WORKSPACE).join("config");
    let samples = kubectl(&["gpu", "validate", config.to_str().unwrap()]).await;
    assert!(samples.status.success());
    let broken = Path::new(e2e::WORKSPACE).join("crates/api/tests/fixtures/invalid/05-rate-limit-zero.yaml");
    let refused = kubectl(&["gpu", "validate", broken.to_str().unwrap()]).await;
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        stdout(&refused).contains("spec.safety.rate.limit: "),
        "{}",
        stdout(&refused)
    );
}
