//! `history.ttl` never lets a broken node back: a `Failed` record past its ttl still holds its
//! node's cordon, so it is kept, and says in its status (condition `AwaitingPerson`) and an Event
//! that it waits for a person; the node stays cordoned and tainted.

mod common;
mod scenario;

use std::time::Duration;

use common::eventually;
use gpu_remediation_api::{
    Phase,
    constants::{CORDONED_BY_ANNOTATION, reasons, remediation_conditions},
};
use kube::ResourceExt;
use scenario::{
    RunningController, Scenario, has_our_taint, is_unschedulable, reboot_policy, report_reboot_failed,
};
use serde_json::json;

#[tokio::test]
async fn a_failed_record_past_its_ttl_keeps_the_node_cordoned_and_waits_for_a_person() {
    let s = Scenario::new(2).await;
    common::install_crd(&s.client, common::REBOOT_CRD).await;
    let broken = s.nodes()[0].clone();
    let mut spec = reboot_policy(&s, "5m");
    // A short ttl: the windows it must outlive are shorter still.
    spec["history"] = json!({"ttl": "4s"});
    spec["safety"]["rate"] = json!({"limit": 10, "per": "2s"});
    spec["safety"]["maxAttemptsPerNode"] = json!({"count": 5, "per": "2s"});
    s.policy(spec).await;
    let controller = RunningController::start(&s.scope).await;

    s.break_gpu(&broken).await;
    let verifying = s
        .wait_phase(&broken, Phase::Verifying, Duration::from_secs(60))
        .await;
    let object = verifying
        .status
        .as_ref()
        .and_then(|st| st.replacement.as_ref())
        .map(|r| r.name.clone())
        .expect("a reboot object is recorded");
    report_reboot_failed(&s, &object).await;
    let failed = s
        .wait_phase(&broken, Phase::Failed, Duration::from_secs(30))
        .await;
    let failed_at = std::time::Instant::now();

    let condition = eventually(
        "the Failed record marked as awaiting a person",
        Duration::from_secs(30),
        || async {
            s.remediations()
                .await
                .into_iter()
                .filter(|r| r.name_any() == failed.name_any())
                .find_map(|r| {
                    r.status?
                        .conditions
                        .into_iter()
                        .find(|c| c.type_ == remediation_conditions::AWAITING_PERSON && c.status == "True")
                })
        },
    )
    .await;
    let marked_after = failed_at.elapsed();
    assert_eq!(condition.reason, reasons::HELD_PAST_TTL);
    assert!(
        condition.message.contains("waits for a person") && condition.message.contains("history.ttl"),
        "{}",
        condition.message
    );
    eventually("the Event saying so", Duration::from_secs(10), || async {
        let events = scenario::events_about(&s.client, &failed.name_any()).await;
        events.contains_key(reasons::HELD_PAST_TTL).then_some(())
    })
    .await;

    // Well past the ttl: the record stays, the node stays cordoned and tainted by it.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let still = s.remediations().await;
    assert!(
        still.iter().any(|r| r.name_any() == failed.name_any()
            && r.status.as_ref().is_some_and(|st| st.phase == Phase::Failed)),
        "the Failed record is kept past its ttl: {:?}",
        still.iter().map(ResourceExt::name_any).collect::<Vec<_>>()
    );
    let node = s.node(&broken).await;
    assert!(is_unschedulable(&node) && has_our_taint(&node), "{:?}", node.spec);
    assert_eq!(
        node.annotations().get(CORDONED_BY_ANNOTATION),
        Some(&failed.name_any())
    );
    eprintln!(
        "marked AwaitingPerson {marked_after:?} after Failed (ttl 4s); record and cordon kept 6s later"
    );
    controller.stop().await;
}
