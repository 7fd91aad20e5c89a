//! The same node rebooted twice in one run through a template named after the node, as Self Node
//! Remediation requires (`{{nodeName}}`): the first attempt's object outlives its remediation, so
//! the second attempt deletes it (it is ours: its controlling owner is the finished first record),
//! waits for it to go, and creates its own. Both recoveries are released.

mod common;
mod scenario;

use std::time::Duration;

use common::eventually;
use gpu_remediation_api::{GpuRemediation, Phase, constants::CORDONED_BY_ANNOTATION};
use kube::ResourceExt;
use scenario::{
    RunningController, Scenario, has_our_taint, is_unschedulable, reboot_policy, report_rebooted,
};

fn replacement_uid(remediation: &GpuRemediation) -> (String, Option<String>) {
    let reference = remediation
        .status
        .as_ref()
        .and_then(|s| s.replacement.as_ref())
        .expect("a reboot object is recorded");
    (reference.name.clone(), reference.uid.clone())
}

async fn released(s: &Scenario, node: &str) {
    eventually(&format!("{node} released"), Duration::from_secs(30), || async {
        let node = s.node(node).await;
        (!is_unschedulable(&node)
            && !has_our_taint(&node)
            && !node.annotations().contains_key(CORDONED_BY_ANNOTATION))
        .then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_node_rebooted_twice_through_an_object_named_after_it_is_released_both_times() {
    let s = Scenario::new(2).await;
    common::install_crd(&s.client, common::REBOOT_CRD).await;
    let broken = s.nodes()[0].clone();
    let mut spec = reboot_policy(&s, "2m");
    spec["replacement"]["template"]["metadata"]["name"] = serde_json::json!("{{nodeName}}");
    s.policy(spec).await;
    let controller = RunningController::start(&s.scope).await;

    s.break_gpu(&broken).await;
    let first = s
        .wait_phase(&broken, Phase::Verifying, Duration::from_secs(60))
        .await;
    let (first_object, first_uid) = replacement_uid(&first);
    assert_eq!(first_object, broken, "the object is named after the node");
    report_rebooted(&s, &first_object).await;
    s.wait_phase(&broken, Phase::Succeeded, Duration::from_secs(30))
        .await;
    released(&s, &broken).await;

    // A new episode on the same node while the first object still exists under its name.
    s.heal_gpu(&broken).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    s.break_gpu(&broken).await;
    let started = std::time::Instant::now();
    let second = eventually(
        "the second remediation in Verifying",
        Duration::from_secs(90),
        || async {
            s.remediations().await.into_iter().find(|r| {
                r.name_any() != first.name_any()
                    && r.spec.node_name == broken
                    && r.status.as_ref().is_some_and(|st| st.phase == Phase::Verifying)
            })
        },
    )
    .await;
    let (second_object, second_uid) = replacement_uid(&second);
    assert_eq!(second_object, broken);
    assert_ne!(second_uid, first_uid, "a new object, not the first one adopted");
    // The first record is still there (history), its object replaced by the second's.
    assert!(
        s.remediations()
            .await
            .iter()
            .any(|r| r.name_any() == first.name_any())
    );
    report_rebooted(&s, &second_object).await;
    eventually(
        "the second remediation Succeeded",
        Duration::from_secs(30),
        || async {
            s.remediations().await.into_iter().find(|r| {
                r.name_any() == second.name_any()
                    && r.status.as_ref().is_some_and(|st| st.phase == Phase::Succeeded)
            })
        },
    )
    .await;
    released(&s, &broken).await;
    eprintln!(
        "second reboot object created {:?} after the second fault (the first object removed first)",
        started.elapsed()
    );
    controller.stop().await;
}
