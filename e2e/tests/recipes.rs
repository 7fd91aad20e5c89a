//! The detector recipes in `config/recipes/`, each on the sandbox with the in-process controller:
//! the node condition the other detector would write, written as it would write it, makes the
//! recipe's policy remediate the node (a `GpuRemediation` naming that condition, which cordons
//! the node), and a condition the recipe does not count leaves its node alone.
//!
//! - node-problem-detector: `check-gpu-xid.sh` runs on a kernel log with a fatal XID (and on one
//!   without), and its output becomes the `GpuFatalXid` condition's message, as NPD's custom
//!   plugin monitor `gpu-xid-monitor.json` would set it.
//! - the EKS node monitoring agent: `AcceleratedHardwareReady=False` with a fatal reason.

mod common;

use std::{path::Path, process::Command, time::Duration};

use gpu_remediation_api::{GpuRemediation, GpuRemediationPolicy, Phase, constants::NODE_LABEL};
use gpu_sandbox::fleet::FLEET_LABEL;
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client,
    api::{ListParams, Patch, PatchParams},
};
use serde_json::{Value, json};

const RECIPES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../config/recipes");

/// Sets a node condition as another detector does: a strategic merge patch of the node's status
/// by that detector's field manager.
async fn set_condition(client: &Client, node: &str, manager: &str, condition: (&str, &str, &str, &str)) {
    let (kind, status, reason, message) = condition;
    let patch = gpu_sandbox::fault::condition_patch(
        None,
        kind,
        status,
        reason,
        message,
        k8s_openapi::jiff::Timestamp::now(),
    );
    Api::<Node>::all(client.clone())
        .patch_status(node, &PatchParams::apply(manager), &Patch::Strategic(patch))
        .await
        .unwrap_or_else(|e| panic!("setting {kind} on {node}: {e}"));
}

/// Runs the recipe's policy (from its file, scoped to a fresh two-node fleet, its `for`
/// shortened) with an in-process controller; `break_nodes` writes the conditions on
/// (counted node, ignored node). Returns the counted node's remediation once the node is cordoned.
async fn remediates<F, Fut>(recipe: &str, break_nodes: F) -> GpuRemediation
where
    F: FnOnce(Client, String, String) -> Fut,
    Fut: Future<Output = ()>,
{
    let client = common::cluster().await.client();
    common::install_shipped_crds(&client).await;
    let fleet = common::fleet(2).await;
    let nodes = fleet.node_names();
    let scope = common::unique_name("recipe");
    let mut policy: Value =
        serde_yaml::from_str(&std::fs::read_to_string(Path::new(RECIPES).join(recipe)).unwrap()).unwrap();
    policy["metadata"] = json!({"name": scope, "labels": {"e2e.gpuremediation.dev/scope": scope}});
    policy["spec"]["nodeSelector"] = json!({"matchLabels": {FLEET_LABEL: fleet.name()}});
    // Room for both nodes: were the other node's condition counted, it would be admitted too.
    policy["spec"]["safety"]["maxUnhealthy"] = json!("100%");
    policy["spec"]["safety"]["maxConcurrent"] = json!(2);
    for trigger in policy["spec"]["triggers"].as_array_mut().unwrap() {
        trigger["for"] = json!("1s");
    }
    let policy: GpuRemediationPolicy = serde_json::from_value(policy).unwrap();
    let stop = common::run_controller_over(&client, &policy, &scope).await;
    break_nodes(client.clone(), nodes[0].clone(), nodes[1].clone()).await;

    let remediations: Api<GpuRemediation> = Api::all(client.clone());
    let of = |node: &str| ListParams::default().labels(&format!("{NODE_LABEL}={node}"));
    // Cordoned, by the record's own history (the default strategy, DeleteNode, then deletes the
    // node, so the node itself may be gone by the time it is read).
    let record = common::eventually(
        "the remediation to cordon the node",
        Duration::from_secs(60),
        || {
            let (remediations, params) = (remediations.clone(), of(&nodes[0]));
            async move {
                let record = remediations.list(&params).await.ok()?.items.into_iter().next()?;
                let history = &record.status.as_ref()?.phase_history;
                history
                    .iter()
                    .any(|t| t.phase == Phase::Cordoned)
                    .then_some(record)
            }
        },
    )
    .await;
    // The other node's condition was written first: the pass that admitted the first saw it.
    let ignored = remediations.list(&of(&nodes[1])).await.unwrap().items;
    assert!(
        ignored.is_empty(),
        "a condition the recipe does not count was remediated: {ignored:?}"
    );
    let _ = stop.send(());
    record
}

fn check_gpu_xid(log: &str) -> (Option<i32>, String) {
    let file = std::env::temp_dir().join(format!("kern-{}-{}.log", std::process::id(), log.len()));
    std::fs::write(&file, log).unwrap();
    let output = Command::new("sh")
        .arg(Path::new(RECIPES).join("npd/check-gpu-xid.sh"))
        .arg(&file)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&file);
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).trim().to_owned(),
    )
}

#[tokio::test]
async fn npd_custom_plugin_turns_a_fatal_xid_into_a_condition_the_recipe_remediates() {
    let monitor: Value = serde_json::from_str(
        &std::fs::read_to_string(Path::new(RECIPES).join("npd/gpu-xid-monitor.json")).unwrap(),
    )
    .unwrap();
    let rule = &monitor["rules"][0];
    let (condition, reason) = (
        rule["condition"].as_str().unwrap(),
        rule["reason"].as_str().unwrap(),
    );
    assert_eq!(monitor["conditions"][0]["type"], condition);
    assert!(rule["path"].as_str().unwrap().ends_with("/check-gpu-xid.sh"));

    let benign =
        "[  10.1] NVRM: Xid (PCI:0000:3b:00): 13, pid=4242, name=python, Graphics Exception: ESR 0x405\n";
    let fatal = format!(
        "{benign}[  20.2] NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
    );
    let (ok_code, ok_message) = check_gpu_xid(benign);
    assert_eq!(ok_code, Some(0), "{ok_message}");
    let (code, message) = check_gpu_xid(&fatal);
    assert_eq!(code, Some(1), "NPD's 'problem' exit status: {message}");
    assert_eq!(
        message,
        "XID 79 on PCI:0000:3b:00: pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    );

    let (condition, reason, ok_message) = (condition.to_owned(), reason.to_owned(), ok_message.clone());
    let record = remediates("npd/policy.yaml", |client, broken, fine| async move {
        // NPD writes its default (False) first, then True with the rule's reason and the plugin's output.
        let default_reason = monitor["conditions"][0]["reason"].as_str().unwrap().to_owned();
        set_condition(
            &client,
            &fine,
            "node-problem-detector",
            (&condition, "False", &default_reason, &ok_message),
        )
        .await;
        set_condition(
            &client,
            &broken,
            "node-problem-detector",
            (&condition, "True", &reason, &message),
        )
        .await;
    })
    .await;
    assert_eq!(record.spec.trigger.condition_type, "GpuFatalXid");
    assert_eq!(record.spec.trigger.reason, "FatalXid");
    assert!(
        record
            .spec
            .trigger
            .message
            .starts_with("XID 79 on PCI:0000:3b:00")
    );
}

#[tokio::test]
async fn eks_accelerated_hardware_ready_false_with_a_fatal_reason_is_remediated() {
    let record = remediates("eks/policy.yaml", |client, broken, fine| async move {
        // A warning-class XID: the agent's reason, but not one the recipe counts.
        set_condition(
            &client,
            &fine,
            "eks-node-monitoring-agent",
            (
                "AcceleratedHardwareReady",
                "False",
                "NvidiaXID13Error",
                "detected XID-13 on the instance",
            ),
        )
        .await;
        set_condition(
            &client,
            &broken,
            "eks-node-monitoring-agent",
            (
                "AcceleratedHardwareReady",
                "False",
                "NvidiaXID79Error",
                "detected XID-79 on the instance, review kernel logs for additional information.",
            ),
        )
        .await;
    })
    .await;
    assert_eq!(record.spec.trigger.condition_type, "AcceleratedHardwareReady");
    assert_eq!(record.spec.trigger.reason, "NvidiaXID79Error");
}
