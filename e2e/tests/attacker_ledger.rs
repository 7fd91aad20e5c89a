//! A broken or compromised agent cannot steer the hardware ledger, on the real control plane: the
//! agent of node A names node B's board as failed (a serial A's inventory never listed) before B
//! joins, and the agent of node C lists another of B's boards in its own inventory and then fails
//! it (a serial two live nodes claim). Neither counts: no hardware record is made for B's serials,
//! B joins clean (its unchecked taint lifted, neither flagged nor cordoned), the conflict is
//! reported on C's remediation (its ledger and an Event), and when B's board really fails B is
//! remediated by its trigger's action, not sent to Replace.

mod common;
mod scenario;

use std::time::Duration;

use common::eventually;
use gpu_remediation_api::{
    GpuHardwareRecord, GpuRemediation, Phase,
    constants::{FAILED_SERIAL_LABEL, REPEAT_OFFENDER_LABEL},
    hardware::{Distrust, HardwareKind, record_name},
    policy::Action,
};
use gpu_remediator::hardware::join::has_unchecked_taint;
use gpu_sandbox::hardware::{SimGpu, fail_gpu, set_inventory};
use kube::{Api, ResourceExt};
use scenario::{RunningController, Scenario, event_notes, is_unschedulable};
use serde_json::json;

#[tokio::test]
async fn an_agent_naming_another_node_s_boards_as_failed_flags_nothing_and_the_conflict_is_reported() {
    let s = Scenario::new(2).await;
    let [a, c] = <[String; 2]>::try_from(s.nodes()).unwrap();
    // B joins later, carrying its two boards.
    let b = format!("{}-{:04}", s.fleet.name(), 2);
    let tag = s.fleet.name().to_owned();
    let (a0, b0, b1, c0) = (
        SimGpu::new(0, &format!("{tag}-a0")),
        SimGpu::new(0, &format!("{tag}-b0")),
        SimGpu::new(1, &format!("{tag}-b1")),
        SimGpu::new(0, &format!("{tag}-c0")),
    );
    set_inventory(&s.client, &a, std::slice::from_ref(&a0))
        .await
        .unwrap();
    set_inventory(&s.client, &c, std::slice::from_ref(&c0))
        .await
        .unwrap();
    // One earlier failure makes a repeat offender, cordoned at join and sent to Replace.
    let offender = json!({"failures": 1, "window": "720h", "cordonOnJoin": true});
    s.policy(json!({
        "triggers": [{"conditionType": "GpuHealthy", "status": "False", "for": "1s"}],
        "replacement": {"strategy": "DeleteNode", "timeout": "2m"},
        "safety": {"maxConcurrent": 3, "maxUnhealthy": "100%", "repeatOffender": offender},
    }))
    .await;
    let controller = RunningController::start(&s.scope).await;
    s.stamped_serial(&a, "").await;

    // A names B's first board, which its inventory never listed.
    fail_gpu(&s.client, &a, &b0, "XID79").await.unwrap();
    let on_a = past_pending(&s, &a).await;
    let untrusted = &on_a.spec.hardware.as_ref().expect("a ledger").untrusted;
    assert_eq!(
        untrusted
            .iter()
            .map(|u| (u.serial.as_deref(), u.why))
            .collect::<Vec<_>>(),
        [(Some(b0.serial.as_str()), Distrust::NotInInventory)],
        "{untrusted:?}"
    );
    assert!(
        !on_a.labels().contains_key(FAILED_SERIAL_LABEL),
        "{:?}",
        on_a.labels()
    );

    // B joins carrying the board A named (with the unchecked taint): checked clean, not flagged,
    // not cordoned.
    let carried = [b0.clone(), b1.clone()];
    s.join_carrying(&b, &carried).await;
    let joined = eventually("B's unchecked taint lifted", Duration::from_secs(20), || async {
        let node = s.node(&b).await;
        (!has_unchecked_taint(&node)).then_some(node)
    })
    .await;
    assert!(
        !joined.labels().contains_key(REPEAT_OFFENDER_LABEL),
        "B flagged at join"
    );
    assert!(!is_unschedulable(&joined), "B cordoned at join");
    s.stamped_serial(&b, "").await;
    // C's agent lists B's second board as its own.
    set_inventory(&s.client, &c, &[c0.clone(), b1.clone()])
        .await
        .unwrap();
    s.stamped_serial(&c, &b1.serial).await;

    // C fails B's second board, which both C and B list: a conflict, reported.
    fail_gpu(&s.client, &c, &b1, "XID79").await.unwrap();
    let on_c = past_pending(&s, &c).await;
    let untrusted = &on_c.spec.hardware.as_ref().expect("a ledger").untrusted;
    assert_eq!(untrusted.len(), 1, "{untrusted:?}");
    assert_eq!(
        (untrusted[0].why, untrusted[0].claimed_by.as_slice()),
        (Distrust::Conflict, std::slice::from_ref(&b)),
    );
    let notes = eventually(
        "a HardwareUntrusted Event on C's remediation",
        Duration::from_secs(20),
        || async {
            let notes = event_notes(&s.client, &on_c.name_any(), "HardwareUntrusted").await;
            (!notes.is_empty()).then_some(notes)
        },
    )
    .await;
    assert!(
        notes[0].contains("conflict") && notes[0].contains(&b1.serial) && notes[0].contains(&b),
        "{notes:?}"
    );

    // Several ledger syncs later: no record of B's boards, B neither flagged nor cordoned.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let records = Api::<GpuHardwareRecord>::all(s.client.clone());
    for serial in [&b0.serial, &b1.serial] {
        let name = record_name(HardwareKind::Gpu, serial);
        assert!(
            records.get_opt(&name).await.unwrap().is_none(),
            "record {name} made"
        );
    }
    let node_b = s.node(&b).await;
    assert!(!node_b.labels().contains_key(REPEAT_OFFENDER_LABEL), "B flagged");
    assert!(!is_unschedulable(&node_b), "B cordoned");

    // B's own board really fails: remediated by its trigger (None), not sent to Replace.
    fail_gpu(&s.client, &b, &b0, "XID79").await.unwrap();
    let on_b = past_pending(&s, &b).await;
    assert_eq!(
        on_b.spec.action,
        Action::None,
        "the trigger's action, not the last rung"
    );
    let ledger = on_b.spec.hardware.as_ref().expect("a ledger");
    assert_eq!(ledger.repeat_offender, None);
    assert!(ledger.untrusted.is_empty(), "{:?}", ledger.untrusted);
    assert_eq!(
        on_b.labels().get(FAILED_SERIAL_LABEL),
        Some(&b0.serial),
        "B's own failure counts"
    );
    controller.stop().await;
}

/// The remediation of `node` once it has left `Pending` (its ledger written at admission).
async fn past_pending(s: &Scenario, node: &str) -> GpuRemediation {
    eventually(
        &format!("the remediation of {node} past Pending"),
        Duration::from_secs(30),
        || async {
            s.remediation_of(node)
                .await
                .filter(|r| r.status.as_ref().is_some_and(|st| st.phase != Phase::Pending))
        },
    )
    .await
}
