//! The hardware ledger on the real control plane: a GPU board fails on node A; node A is replaced;
//! the board reappears in node B (the simulated fleet moves it) and fails again: the second
//! remediation goes straight to the last rung (`Replace`, where the trigger says `None`) and names
//! the first; `history --serial` lists both recycles; and a node that joins carrying the board is
//! flagged and cordoned before any pod lands on it.

mod common;
mod scenario;

use std::time::Duration;

use common::eventually;
use gpu_remediation_api::{
    GpuHardwareRecord, GpuRemediation, Phase,
    constants::{FAILED_SERIAL_LABEL, REPEAT_OFFENDER_LABEL, node_conditions},
    hardware::{HardwareKind, record_name},
    policy::Action,
};
use gpu_sandbox::hardware::{SimGpu, fail_gpu, set_inventory};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, ListParams, PostParams},
};
use scenario::{RunningController, Scenario, events_about, is_unschedulable};
use serde_json::json;

fn carries_label(node: &Node) -> bool {
    node.labels()
        .get(REPEAT_OFFENDER_LABEL)
        .is_some_and(|v| v == "true")
}

fn offender_condition(node: &Node) -> Option<(String, String)> {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| {
            cs.iter()
                .find(|c| c.type_ == node_conditions::GPU_REPEAT_OFFENDER)
        })
        .map(|c| (c.status.clone(), c.message.clone().unwrap_or_default()))
}

#[tokio::test]
async fn a_gpu_failing_again_on_another_node_skips_to_replace_and_a_node_joining_with_it_is_flagged_first() {
    let s = Scenario::new(2).await;
    let [a, b] = <[String; 2]>::try_from(s.nodes()).unwrap();
    let serial = format!("{}-sn1", s.fleet.name());
    let bad = SimGpu::new(0, &serial);
    set_inventory(
        &s.client,
        &a,
        &[bad.clone(), SimGpu::new(1, &format!("{serial}a"))],
    )
    .await
    .unwrap();
    set_inventory(&s.client, &b, &[SimGpu::new(0, &format!("{serial}b"))])
        .await
        .unwrap();
    s.policy(json!({
        "triggers": [{"conditionType": "GpuHealthy", "status": "False", "for": "1s", "action": "None"}],
        "action": "Replace",
        "replacement": {"strategy": "DeleteNode", "timeout": "2m"},
        "safety": {"maxConcurrent": 2, "maxUnhealthy": "100%",
                   "repeatOffender": {"failures": 1, "window": "720h", "cordonOnJoin": true}},
    }))
    .await;
    let controller = RunningController::start(&s.scope).await;
    let first = fails_on_a_which_is_replaced(&s, &a, &bad, &serial).await;
    let second = fails_again_on_b(&s, &b, &bad, &serial, &first).await;
    let history = gpu_remediator::cli::serial_history(s.client.clone(), &serial)
        .await
        .unwrap();
    println!("$ gpu-remediator history --serial {serial}\n{history}");
    let lines: Vec<&str> = history.lines().collect();
    assert!(lines[0].contains("2 failure(s) on record"), "{history}");
    assert!(
        lines[2].contains(&first.name_any()) && lines[2].contains(&a),
        "{history}"
    );
    assert!(
        lines[3].contains(&second.name_any()) && lines[3].contains("repeat offender"),
        "{history}"
    );
    a_node_joining_with_it_is_flagged_before_a_pod_lands(&s, &bad, &serial).await;
    controller.stop().await;
}

/// The board fails on node A: the remediation records it (action None: the trigger's) and is
/// selectable by the serial; then node A is replaced (its provider deletes it) and it ends.
async fn fails_on_a_which_is_replaced(s: &Scenario, a: &str, bad: &SimGpu, serial: &str) -> GpuRemediation {
    // A board counts as failed only once its node listed it before the fault: the controller
    // stamps when it first saw each serial in the inventory.
    s.stamped_serial(a, "").await;
    fail_gpu(&s.client, a, bad, "XID79").await.unwrap();
    let first = s.wait_phase(a, Phase::Verifying, Duration::from_secs(60)).await;
    assert_eq!(first.spec.action, Action::None);
    let ledger = first
        .spec
        .hardware
        .clone()
        .expect("the first remediation records the hardware");
    assert_eq!(ledger.failed[0].serial.as_deref(), Some(serial));
    assert_eq!(ledger.gpus.len(), 2);
    let selected = Api::<GpuRemediation>::all(s.client.clone())
        .list(&ListParams::default().labels(&format!("{FAILED_SERIAL_LABEL}={serial}")))
        .await
        .unwrap();
    assert_eq!(
        selected
            .items
            .iter()
            .map(ResourceExt::name_any)
            .collect::<Vec<_>>(),
        [first.name_any()],
        "kubectl get gpur -l {FAILED_SERIAL_LABEL}={serial}"
    );
    wait_record(s, serial, 1).await;
    Api::<Node>::all(s.client.clone())
        .delete(a, &DeleteParams::default())
        .await
        .unwrap();
    s.wait_phase(a, Phase::Cancelled, Duration::from_secs(30)).await;
    first
}

/// Waits until the board's hardware record counts `failures`.
async fn wait_record(s: &Scenario, serial: &str, failures: u32) {
    let records = Api::<GpuHardwareRecord>::all(s.client.clone());
    let name = record_name(HardwareKind::Gpu, serial);
    eventually(
        &format!("{name} counting {failures} failures"),
        Duration::from_secs(20),
        || async {
            records
                .get_opt(&name)
                .await
                .unwrap()
                .filter(|r| r.spec.failure_count == failures)
        },
    )
    .await;
}

/// The board reappears in node B, which is flagged (and cordoned) at once; it fails again there:
/// straight to Replace, naming the failure on A, with an Event; the record holds both.
async fn fails_again_on_b(
    s: &Scenario,
    b: &str,
    bad: &SimGpu,
    serial: &str,
    first: &GpuRemediation,
) -> GpuRemediation {
    set_inventory(
        &s.client,
        b,
        &[bad.clone(), SimGpu::new(1, &format!("{serial}b"))],
    )
    .await
    .unwrap();
    eventually(
        "node B flagged as carrying a repeat offender",
        Duration::from_secs(20),
        || async {
            let node = s.node(b).await;
            (carries_label(&node) && is_unschedulable(&node)).then_some(())
        },
    )
    .await;
    fail_gpu(&s.client, b, bad, "XID79").await.unwrap();
    let second = eventually(
        "node B's remediation replacing it",
        Duration::from_secs(60),
        || async {
            s.remediation_of(b).await.filter(|r| {
                r.status.as_ref().is_some_and(|st| {
                    matches!(st.phase, Phase::Replacing | Phase::Verifying | Phase::Succeeded)
                })
            })
        },
    )
    .await;
    assert_eq!(
        second.spec.action,
        Action::Replace,
        "the last rung, not the trigger's None"
    );
    assert_eq!(
        second.labels().get(REPEAT_OFFENDER_LABEL).map(String::as_str),
        Some("true")
    );
    let offence = second
        .spec
        .hardware
        .as_ref()
        .and_then(|h| h.repeat_offender.clone())
        .expect("the second remediation names the offence");
    assert_eq!((offence.kind, offence.id.as_str()), (HardwareKind::Gpu, serial));
    assert_eq!(offence.earlier[0].remediation, first.name_any());
    assert_eq!(offence.earlier[0].node, first.spec.node_name);
    eventually(
        "a RepeatOffender Event on the second remediation",
        Duration::from_secs(20),
        || async {
            events_about(&s.client, &second.name_any())
                .await
                .contains_key("RepeatOffender")
                .then_some(())
        },
    )
    .await;
    wait_record(s, serial, 2).await;
    second
}

/// A node joins carrying the board while a pod waits for it: flagged (label, condition, Event)
/// and cordoned before any pod lands on it.
async fn a_node_joining_with_it_is_flagged_before_a_pod_lands(s: &Scenario, bad: &SimGpu, serial: &str) {
    let joining = format!("{}-{:04}", s.fleet.name(), 2);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "waits-for-a-gpu-node", "namespace": s.namespace},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": joining},
                 "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]},
    }))
    .unwrap();
    let pods = Api::<Pod>::namespaced(s.client.clone(), &s.namespace);
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let carried = [bad.clone(), SimGpu::new(1, &format!("{serial}c"))];
    s.join_carrying(&joining, &carried).await;
    let node = eventually("the joining node flagged", Duration::from_secs(20), || async {
        let node = s.node(&joining).await;
        (carries_label(&node) && is_unschedulable(&node) && offender_condition(&node).is_some())
            .then_some(node)
    })
    .await;
    let (status, message) = offender_condition(&node).unwrap();
    assert_eq!(status, "True");
    assert!(
        message.contains(serial) && message.contains("failed 2 time(s)"),
        "{message}"
    );
    eventually(
        "a RepeatOffender Event on the joining node",
        Duration::from_secs(20),
        || async {
            events_about(&s.client, &joining)
                .await
                .contains_key("RepeatOffender")
                .then_some(())
        },
    )
    .await;
    // The scheduler has had the pod all along: it never landed on the node.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let waiting = pods.get("waits-for-a-gpu-node").await.unwrap();
    assert_eq!(
        waiting.spec.and_then(|spec| spec.node_name),
        None,
        "no pod lands on the node"
    );
}
