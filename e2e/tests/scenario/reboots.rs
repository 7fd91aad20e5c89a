//! A node rebooted twice through the policy's template in one run: the flow the template tests
//! share (lifecycle's, with objects named per remediation and after the node).

use std::time::Duration;

use gpu_remediation_api::{GpuRemediation, Phase, constants::CORDONED_BY_ANNOTATION};
use kube::ResourceExt;

use super::{RunningController, Scenario, has_our_taint, is_unschedulable, reboot_policy, report_rebooted};
use crate::common::{self, eventually};

/// The object a remediation's replacement created, recorded in its status.
pub fn replacement_of(
    remediation: &GpuRemediation,
) -> gpu_remediation_api::object_reference::ObjectReference {
    remediation
        .status
        .as_ref()
        .and_then(|s| s.replacement.clone())
        .expect("a replacement object is recorded")
}

/// Waits until `node` carries nothing of ours and is schedulable.
pub async fn released(s: &Scenario, node: &str) {
    eventually(&format!("{node} released"), Duration::from_secs(30), || async {
        let node = s.node(node).await;
        (!is_unschedulable(&node)
            && !has_our_taint(&node)
            && !node.annotations().contains_key(CORDONED_BY_ANNOTATION))
        .then_some(())
    })
    .await;
}

/// Breaks a node, reboots it through the template with its object named `name` (a placeholder
/// such as `{{remediationName}}`), reports it rebooted and heals it, and checks it released once
/// healthy for `healthyFor`; breaks it again (a new episode) and does it all again. Returns both remediations as they were in
/// `Verifying` (their objects recorded).
pub async fn reboot_twice(name: &str) -> (GpuRemediation, GpuRemediation) {
    let s = Scenario::new(2).await;
    common::install_crd(&s.client, common::REBOOT_CRD).await;
    let broken = s.nodes()[0].clone();
    let mut spec = reboot_policy(&s, "2m");
    spec["replacement"]["template"]["metadata"]["name"] = serde_json::json!(name);
    // A reboot reported done is evidence, not proof: the node must then stay healthy this long.
    spec["release"] = serde_json::json!({"healthyFor": "2s"});
    s.policy(spec).await;
    let controller = RunningController::start(&s.scope).await;

    s.break_gpu(&broken).await;
    let first = s
        .wait_phase(&broken, Phase::Verifying, Duration::from_secs(60))
        .await;
    report_rebooted(&s, &replacement_of(&first).name).await;
    s.heal_gpu(&broken).await;
    s.wait_phase(&broken, Phase::Succeeded, Duration::from_secs(30))
        .await;
    released(&s, &broken).await;

    // The node, back healthy, fails again: a new episode, a new record (no sooner than a minute
    // after the first, `fleet::episodes::EPISODE_FLOOR`).
    tokio::time::sleep(Duration::from_secs(2)).await;
    s.break_gpu(&broken).await;
    let second = eventually(
        "a second remediation in Verifying",
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
    // The first record stays (history) while the second runs.
    assert!(
        s.remediations()
            .await
            .iter()
            .any(|r| r.name_any() == first.name_any())
    );
    report_rebooted(&s, &replacement_of(&second).name).await;
    s.heal_gpu(&broken).await;
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
    controller.stop().await;
    (first, second)
}
