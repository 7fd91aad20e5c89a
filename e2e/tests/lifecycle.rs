//! Every path gives back what it took, on the real control plane: a reboot through a template
//! releases the node and a second fault is remediated again (also with the object named after the
//! node, as Self Node Remediation requires, the first object deleted and a new one made); a
//! template the server refuses with a 404 fails at once in the server's words and frees its slot;
//! evictions refused by an admission policy are blockers in the server's words under
//! `drain.timeout`; a node re-created under the same name is never touched; a policy deleted
//! mid-replacement is followed by its snapshot; a deleted record is a person's cancel.

mod common;
mod scenario;

use std::time::Duration;

use common::eventually;
use gpu_remediation_api::{GpuRemediation, GpuRemediationPolicy, Phase, constants::CANCELLED_ANNOTATION};
use gpu_sandbox::workload::Budget;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use scenario::{
    RunningController, Scenario, is_unschedulable, reboot_policy,
    reboots::{released, replacement_of},
    report_rebooted,
};
use serde_json::json;

#[tokio::test]
async fn a_reboot_through_a_template_releases_the_node_and_a_second_fault_is_remediated_again() {
    let (first, second) = scenario::reboots::reboot_twice("{{remediationName}}").await;
    let first_object = replacement_of(&first).name;
    assert_eq!(
        first_object,
        first.name_any(),
        "objects are named after the remediation"
    );
    assert_ne!(replacement_of(&second).name, first_object);
}

/// The same node rebooted twice in one run through a template named after the node, as Self Node
/// Remediation requires (`{{nodeName}}`): the first attempt's object outlives its remediation, so
/// the second attempt deletes it (it is ours: its controlling owner is the finished first record),
/// waits for it to go, and creates its own. Both recoveries are released.
#[tokio::test]
async fn a_node_rebooted_twice_through_an_object_named_after_it_is_released_both_times() {
    let (first, second) = scenario::reboots::reboot_twice("{{nodeName}}").await;
    let (first, second) = (replacement_of(&first), replacement_of(&second));
    assert_eq!(first.name, second.name, "both objects are named after the node");
    assert_ne!(first.uid, second.uid, "a new object, not the first one adopted");
}

#[tokio::test]
async fn a_template_the_server_refuses_with_a_404_fails_at_once_in_its_words_and_frees_its_slot() {
    let s = Scenario::new(2).await;
    let broken = s.nodes()[0].clone();
    let mut spec = reboot_policy(&s, "5m");
    spec["replacement"]["template"]["apiVersion"] = json!("nothere.e2e.gpuremediation.dev/v1");
    spec["replacement"]["template"]["kind"] = json!("Missing");
    let controller = s.enforce_and_break(spec, &broken).await;

    // A 404 is the server's last word: no retry until replacement.timeout (5m), the step fails at
    // once with the server's own answer, naming the kind.
    let failed = s
        .wait_phase(&broken, Phase::Failed, Duration::from_secs(60))
        .await;
    let status = failed.status.clone().unwrap();
    let refusal = status.refusal.clone().expect("the refusal is kept in status");
    assert!(
        refusal.code == Some(404)
            && refusal
                .message
                .contains("nothere.e2e.gpuremediation.dev/v1 Missing"),
        "the server's own answer, naming the kind: {refusal:?}"
    );
    let message = status.message.unwrap_or_default();
    assert!(
        message.contains("404 page not found") && message.contains("not asked again"),
        "{message}"
    );
    let entered = |phase| {
        status
            .phase_history
            .iter()
            .find(|t| t.phase == phase)
            .map(|t| t.at.0)
            .unwrap()
    };
    let took = entered(Phase::Failed).duration_since(entered(Phase::Replacing));
    assert!(
        took < k8s_openapi::jiff::SignedDuration::from_secs(10),
        "failed {took:?} after the trigger"
    );
    let events = eventually("the failure's Event", Duration::from_secs(10), || async {
        let events = scenario::events_about(&s.client, &failed.name_any()).await;
        events.contains_key("ReplacementFailed").then_some(events)
    })
    .await;
    assert!(!events.contains_key("ReplacementTimeout"), "{events:?}");
    eventually("the slot freed", Duration::from_secs(30), || async {
        let policy = Api::<GpuRemediationPolicy>::all(s.client.clone())
            .get(&s.scope)
            .await
            .ok()?;
        (policy.status?.in_flight == 0).then_some(())
    })
    .await;
    controller.stop().await;
}

#[tokio::test]
async fn evictions_an_admission_policy_refuses_are_blockers_in_its_words_and_the_drain_times_out() {
    let s = Scenario::new(3).await;
    let nodes = s.nodes();
    let (broken, spares) = (nodes[0].clone(), nodes[1..2].to_vec());
    s.protected_workload("frozen", &broken, &spares, 2, &Budget::min_available(0))
        .await;
    // An admission policy refusing every eviction in the namespace (as a webhook might), with
    // reason Forbidden: the server answers 403 with the policy's message.
    let freeze = common::deny(
        &s.client,
        &format!("freeze-{}", s.namespace),
        json!([{
            "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
            "resources": ["pods/eviction"],
        }]),
        json!({"expression": "false", "reason": "Forbidden",
               "message": "evictions are frozen in this namespace"}),
        json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": s.namespace}}}),
        // The eviction of a pod that does not exist: admission answers before the pod is looked up.
        || async {
            let eviction = json!({"apiVersion": "policy/v1", "kind": "Eviction",
                                  "metadata": {"name": "no-such-pod", "namespace": s.namespace}});
            Api::<Pod>::namespaced(s.client.clone(), &s.namespace)
                .create_subresource::<_, serde_json::Value>(
                    "eviction",
                    "no-such-pod",
                    &PostParams::default(),
                    &eviction,
                )
                .await
        },
    )
    .await;
    let controller = s
        .enforce_and_break(
            json!({"drain": {"timeout": "6s", "onTimeout": "Block"}, "safety": {"maxUnhealthy": "100%"}}),
            &broken,
        )
        .await;
    let blocked = s
        .wait_phase(&broken, Phase::Blocked, Duration::from_secs(60))
        .await;
    let drain = blocked
        .status
        .as_ref()
        .and_then(|st| st.drain.clone())
        .expect("drain status");
    assert_eq!(drain.blockers.len(), 2, "{drain:?}");
    for blocker in &drain.blockers {
        assert_eq!(blocker.code, 403, "{blocker:?}");
        assert!(
            blocker.message.contains("evictions are frozen in this namespace"),
            "{blocker:?}"
        );
    }
    assert!(
        is_unschedulable(&s.node(&broken).await),
        "Blocked keeps the node cordoned"
    );
    freeze.remove(&s.client).await;
    controller.stop().await;
}

/// Deletes `name` and registers a node of the same name again (a new UID), as a re-imaged
/// machine would, with its GPU still broken.
async fn re_register(s: &Scenario, name: &str) -> Node {
    let nodes = Api::<Node>::all(s.client.clone());
    let mut old = nodes.get(name).await.unwrap();
    nodes.delete(name, &DeleteParams::default()).await.unwrap();
    eventually("the old node gone", Duration::from_secs(30), || async {
        nodes.get_opt(name).await.ok()?.is_none().then_some(())
    })
    .await;
    let status = old.status.take();
    old.metadata = kube::api::ObjectMeta {
        name: Some(name.to_owned()),
        labels: old.metadata.labels.clone(),
        ..kube::api::ObjectMeta::default()
    };
    old.spec = Some(k8s_openapi::api::core::v1::NodeSpec::default());
    let created = nodes.create(&PostParams::default(), &old).await.unwrap();
    nodes
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": status})),
        )
        .await
        .unwrap();
    s.break_gpu(name).await;
    created
}

#[tokio::test]
async fn a_node_re_created_under_the_same_name_mid_drain_ends_the_remediation_and_is_never_touched() {
    let (s, broken, _) = scenario::pinned::pinned_behind_a_closed_budget().await;
    let (controller, draining) = s.replace_held_in_draining(&broken).await;
    // The swap happens while no controller watches (a watch could also see the gap between the
    // delete and the create, which ends the remediation NodeGone instead).
    controller.stop().await;
    let new = re_register(&s, &broken).await;
    let controller = RunningController::start(&s.scope).await;
    let ended = eventually(
        "the remediation Cancelled as NodeReplaced",
        Duration::from_secs(30),
        || async {
            s.remediations().await.into_iter().find(|r| {
                r.name_any() == draining.name_any()
                    && r.status.as_ref().is_some_and(|st| st.phase == Phase::Cancelled)
            })
        },
    )
    .await;
    let complete = ended
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Complete")
        .unwrap();
    assert_eq!(complete.reason, "NodeReplaced");
    // Whatever the controller does next with the new node (a new record for a new episode), the
    // old record never edits it: the new node carries no annotation naming it.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let node = s.node(&broken).await;
    assert_eq!(node.metadata.uid, new.metadata.uid);
    assert!(
        node.annotations().values().all(|v| *v != draining.name_any()),
        "the old remediation touched the new node: {:?}",
        node.annotations()
    );
    controller.stop().await;
}

#[tokio::test]
async fn a_policy_deleted_while_its_remediation_replaces_the_node_is_followed_to_the_end_by_its_snapshot() {
    let s = Scenario::new(2).await;
    common::install_crd(&s.client, common::REBOOT_CRD).await;
    let broken = s.nodes()[0].clone();
    let mut spec = reboot_policy(&s, "5m");
    spec["release"] = json!({"healthyFor": "2s"});
    let controller = s.enforce_and_break(spec, &broken).await;
    let verifying = s
        .wait_phase(&broken, Phase::Verifying, Duration::from_secs(60))
        .await;
    assert_eq!(
        verifying.status.as_ref().and_then(|st| st.policy_generation),
        Some(1),
        "the status names the policy generation it follows"
    );
    Api::<GpuRemediationPolicy>::all(s.client.clone())
        .delete(&s.scope, &DeleteParams::default())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    report_rebooted(&s, &replacement_of(&verifying).name).await;
    s.heal_gpu(&broken).await;
    s.wait_phase(&broken, Phase::Succeeded, Duration::from_secs(30))
        .await;
    released(&s, &broken).await;
    controller.stop().await;
}

#[tokio::test]
async fn deleting_a_record_mid_drain_releases_the_node_and_the_episode_is_not_admitted_again() {
    let (s, broken, _) = scenario::pinned::pinned_behind_a_closed_budget().await;
    let (controller, draining) = s.replace_held_in_draining(&broken).await;
    let remediations = Api::<GpuRemediation>::all(s.client.clone());
    remediations
        .delete(&draining.name_any(), &DeleteParams::default())
        .await
        .unwrap();
    eventually("the record gone", Duration::from_secs(30), || async {
        remediations
            .get_opt(&draining.name_any())
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    released(&s, &broken).await;
    let node = s.node(&broken).await;
    assert_eq!(
        node.annotations().get(CANCELLED_ANNOTATION),
        Some(&draining.name_any()),
        "the node remembers the cancelled episode"
    );
    // The GPU is still broken: the same episode is not admitted again.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        s.remediations().await.is_empty(),
        "no new record for the cancelled episode"
    );
    controller.stop().await;
}
