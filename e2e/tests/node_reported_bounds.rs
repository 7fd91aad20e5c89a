//! What a node reports about itself cannot stop its own remediation by its size: a condition
//! message of 100 kB and a GPU serial of 10 kB (the agent's annotations, which a broken or hostile
//! node writes as it likes) reach the record cut to the bounds the CRD declares, ending with the
//! writer's marker, and the remediation is created and proceeds (issue 38: the writer enforces the
//! schema's limits on what it writes).

mod common;
mod scenario;

use std::time::Duration;

use gpu_remediation_api::{Phase, bounds::STRING_MAX_LENGTH, hardware::HARDWARE_ID_MAX_LENGTH};
use gpu_sandbox::{
    fault::set_gpu_condition,
    hardware::{SimGpu, name_failed_gpu, set_inventory},
};
use scenario::{RunningController, Scenario};
use serde_json::json;

/// The start of the writer's marker on a cut string (`…[cut N chars]`).
const CUT_MARKER: &str = "…[cut ";

#[tokio::test]
async fn a_node_reporting_a_huge_message_and_serial_is_remediated_with_both_cut_and_marked() {
    let s = Scenario::new(1).await;
    let node = s.nodes().remove(0);
    let serial = format!("{}-{}", s.fleet.name(), "S".repeat(10_000));
    let board = SimGpu::new(0, &serial);
    set_inventory(&s.client, &node, std::slice::from_ref(&board))
        .await
        .expect("the inventory annotation");
    s.policy(json!({
        "triggers": [{"conditionType": "GpuHealthy", "status": "False", "for": "1s"}],
        "action": "None",
        "safety": {"maxConcurrent": 1, "maxUnhealthy": "100%"},
    }))
    .await;
    let controller = RunningController::start(&s.scope).await;

    // The failed-GPUs annotation names the 10 kB serial; then the condition turns, its message
    // 100 kB (one write: a shorter message first could be the one the record keeps, if the second
    // came after `for` on a loaded machine).
    name_failed_gpu(&s.client, &node, &board, "XID79")
        .await
        .expect("naming the failed board");
    let message = format!("GPU 0 has fallen off the bus: {}", "x".repeat(100_000));
    set_gpu_condition(&s.client, &node, "False", "XID79", &message)
        .await
        .expect("a 100 kB condition message (the API server takes it)");

    // Created, and past the cordon and the drain: the remediation proceeds.
    let record = s
        .wait_phase(&node, Phase::Verifying, Duration::from_secs(60))
        .await;

    let written = &record.spec.trigger.message;
    let limit = usize::try_from(STRING_MAX_LENGTH).unwrap();
    assert_eq!(
        written.chars().count(),
        limit,
        "the message is cut to exactly its bound"
    );
    assert!(
        written.starts_with("GPU 0 has fallen off the bus: xxx"),
        "what is kept is the start"
    );
    assert!(
        written.contains(CUT_MARKER),
        "the cut is marked: …{}",
        tail(written)
    );

    let hardware = record
        .spec
        .hardware
        .as_ref()
        .expect("the record keeps the node's hardware");
    for (list, gpus) in [("gpus", &hardware.gpus), ("failed", &hardware.failed)] {
        let recorded = gpus[0].serial.as_deref().expect("a serial is recorded");
        assert_eq!(
            recorded.chars().count(),
            HARDWARE_ID_MAX_LENGTH,
            "spec.hardware.{list}[0].serial is cut to its bound"
        );
        assert!(
            recorded.starts_with(&serial[..64]) && recorded.contains(CUT_MARKER),
            "spec.hardware.{list}[0].serial keeps its start and is marked: …{}",
            tail(recorded)
        );
    }
    controller.stop().await;
}

/// The last 40 characters of a long string, for a failure message.
fn tail(text: &str) -> String {
    let count = text.chars().count();
    text.chars().skip(count.saturating_sub(40)).collect()
}
