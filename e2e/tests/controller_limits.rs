//! The policy's limits against the real control plane: the circuit breaker, one at a time and a
//! rate window, flaps shorter than `for`, approval, attempts per node, a restart mid-drain, and
//! one Event per change.

mod common;
mod scenario;

use std::time::{Duration, Instant};

use common::eventually;
use gpu_remediation_api::{
    GpuRemediation, GpuRemediationPolicy, Phase,
    constants::{APPROVED_ANNOTATION, APPROVED_BY_ANNOTATION, policy_conditions},
};
use gpu_sandbox::fault;
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams},
};
use scenario::{RunningController, Scenario, events_about, has_our_taint, is_unschedulable};

/// Ten nodes under a policy allowing 30 % unhealthy and five at once; the first four (sorted)
/// broken before the controller starts, so its first look sees all four at once: the scenario,
/// its nodes and the controller.
async fn four_of_ten_broken_before_the_controller() -> (Scenario, Vec<String>, RunningController) {
    let s = Scenario::new(10).await;
    let nodes = s.nodes();
    s.policy(serde_json::json!({"safety": {"maxUnhealthy": "30%", "maxConcurrent": 5}}))
        .await;
    for node in &nodes[..4] {
        s.break_gpu(node).await;
    }
    // Let `for` (3s) pass for all four, whose transition seconds may differ, before the
    // controller's first look: it must see the fault at its full extent, not half of it.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let controller = RunningController::start(&s.scope).await;
    (s, nodes, controller)
}

#[tokio::test]
async fn four_of_ten_failing_at_once_opens_the_circuit_and_the_policy_says_why() {
    let (s, nodes, controller) = four_of_ten_broken_before_the_controller().await;
    let policies = Api::<GpuRemediationPolicy>::all(s.client.clone());
    let status = eventually(
        "the policy to report the open circuit",
        Duration::from_secs(30),
        || async {
            let status = policies.get(&s.scope).await.ok()?.status?;
            let open = status
                .conditions
                .iter()
                .any(|c| c.type_ == policy_conditions::CIRCUIT_OPEN && c.status == "True");
            (open && status.waiting.len() == 4).then_some(status)
        },
    )
    .await;
    assert_eq!(
        (status.selected_nodes, status.unhealthy_nodes, status.in_flight),
        (10, 4, 0)
    );
    assert!(
        status
            .waiting
            .iter()
            .all(|w| w.reason == "CircuitOpen" && w.message.contains("4 of 10")),
        "{:?}",
        status.waiting
    );
    assert_eq!(status.budget.unwrap().remaining, 0);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        s.remediations().await.is_empty(),
        "nothing new starts while the circuit is open"
    );
    for node in &nodes[..4] {
        assert!(!is_unschedulable(&s.node(node).await));
    }
    controller.stop().await;
}

#[tokio::test]
async fn one_at_a_time_and_two_per_hour_starts_exactly_two_of_three_and_reports_the_next_slot() {
    let s = Scenario::new(10).await;
    let nodes = s.nodes();
    s.policy(serde_json::json!({"safety": {"maxConcurrent": 1, "maxUnhealthy": "50%", "rate": {"limit": 2, "per": "1h"}}})).await;
    let controller = RunningController::start(&s.scope).await;
    for node in &nodes[..3] {
        s.break_gpu(node).await;
    }
    // Sample in-flight remediations throughout: never more than one at any instant.
    let started = Instant::now();
    let mut most_in_flight = 0;
    let status = loop {
        let remediations = s.remediations().await;
        let in_flight = remediations
            .iter()
            .filter(|r| {
                !r.status
                    .as_ref()
                    .map(|st| st.phase)
                    .unwrap_or_default()
                    .is_terminal()
            })
            .count();
        most_in_flight = most_in_flight.max(in_flight);
        // Action None holds each drained node (and its concurrency slot) for a person: be one.
        for held in remediations
            .iter()
            .filter(|r| r.status.as_ref().is_some_and(|st| st.phase == Phase::Verifying))
        {
            s.set_unschedulable(&held.spec.node_name, false).await;
        }
        let finished = remediations
            .iter()
            .filter(|r| r.status.as_ref().is_some_and(|st| st.phase == Phase::Succeeded))
            .count();
        let policy = Api::<GpuRemediationPolicy>::all(s.client.clone())
            .get(&s.scope)
            .await
            .unwrap();
        // The third node's `for` may elapse after the first two have finished (they have no pods),
        // and a status written while the second was still in flight names concurrency: wait until
        // the policy lists it as waiting for the rate.
        if finished == 2
            && let Some(status) = policy.status.filter(|st| {
                st.budget.as_ref().is_some_and(|b| b.next_slot_at.is_some())
                    && st.waiting.iter().any(|w| w.reason == "DeferredByRate")
            })
        {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "two remediations did not finish: {remediations:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(most_in_flight, 1);
    assert_eq!(s.remediations().await.len(), 2);
    let budget = status.budget.unwrap();
    assert_eq!((budget.started_in_window, budget.remaining), (2, 0));
    assert_eq!(status.waiting.len(), 1);
    assert_eq!(status.waiting[0].reason, "DeferredByRate");
    controller.stop().await;
}

#[tokio::test]
async fn a_condition_flapping_faster_than_for_starts_nothing() {
    let s = Scenario::new(2).await;
    let nodes = s.nodes();
    s.policy(
        serde_json::json!({"triggers": [{"conditionType": "GpuHealthy", "status": "False", "for": "4s"}]}),
    )
    .await;
    let controller = RunningController::start(&s.scope).await;
    fault::flap(&s.client, &nodes[0], "XID79", 4, Duration::from_millis(1500))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(s.remediations().await.is_empty());
    assert!(!is_unschedulable(&s.node(&nodes[0]).await));
    controller.stop().await;
}

#[tokio::test]
async fn manual_mode_waits_for_approval_and_then_proceeds() {
    let s = Scenario::new(2).await;
    let nodes = s.nodes();
    let broken = nodes[0].clone();
    let controller = s
        .enforce_and_break(serde_json::json!({"mode": "Manual"}), &broken)
        .await;
    let waiting = s
        .wait_phase(&broken, Phase::AwaitingApproval, Duration::from_secs(30))
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !is_unschedulable(&s.node(&broken).await),
        "nothing happens before approval"
    );
    let patch = serde_json::json!({"metadata": {"annotations": {
        APPROVED_ANNOTATION: "true", APPROVED_BY_ANNOTATION: "alice",
    }}});
    Api::<GpuRemediation>::all(s.client.clone())
        .patch(
            &waiting.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .unwrap();
    let held = s
        .wait_phase(&broken, Phase::Verifying, Duration::from_secs(30))
        .await;
    assert!(is_unschedulable(&s.node(&broken).await));
    let status = held.status.expect("a status");
    assert_eq!(
        status.approved_by.as_deref(),
        Some("alice"),
        "the status names the approver"
    );
    assert!(status.approved_at.is_some(), "and when the approval was seen");
    controller.stop().await;
}

#[tokio::test]
async fn a_node_failing_again_past_one_attempt_per_hour_requires_a_person_and_proceeds_once_approved() {
    let s = Scenario::new(2).await;
    let broken = s.nodes()[0].clone();
    s.policy(serde_json::json!({"safety": {"maxUnhealthy": "100%", "maxAttemptsPerNode": {"count": 1, "per": "1h"}}}))
        .await;
    let controller = RunningController::start(&s.scope).await;

    // The first episode is remediated (action None holds the node) and recovers.
    s.break_gpu(&broken).await;
    let first = s
        .wait_phase(&broken, Phase::Verifying, Duration::from_secs(30))
        .await;
    s.heal_gpu(&broken).await;
    s.wait_phase(&broken, Phase::Succeeded, Duration::from_secs(30))
        .await;
    assert!(
        !is_unschedulable(&s.node(&broken).await),
        "recovery uncordoned it"
    );

    // The second episode within the hour is one recycle too many. It opens no sooner than a
    // minute after the first record (`fleet::episodes::EPISODE_FLOOR`).
    s.break_gpu(&broken).await;
    let second = eventually(
        "the second episode's remediation in ManualRequired",
        Duration::from_secs(90),
        || async {
            s.remediations().await.into_iter().find(|r| {
                r.spec.node_name == broken
                    && r.name_any() != first.name_any()
                    && r.status
                        .as_ref()
                        .is_some_and(|st| st.phase == Phase::ManualRequired)
            })
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let node = s.node(&broken).await;
    assert!(
        !is_unschedulable(&node) && !has_our_taint(&node),
        "nothing is touched before a person acts"
    );
    let message = second
        .status
        .as_ref()
        .and_then(|st| st.message.clone())
        .unwrap_or_default();
    assert!(
        message.contains("within 1h")
            && message.contains("maxAttemptsPerNode 1")
            && message.contains(&format!("{APPROVED_ANNOTATION}=true")),
        "{message}"
    );
    let policy = Api::<GpuRemediationPolicy>::all(s.client.clone())
        .get(&s.scope)
        .await
        .unwrap()
        .status
        .unwrap();
    assert_eq!(policy.in_flight, 0, "ManualRequired is not in flight");
    assert_eq!(
        policy.budget.unwrap().started_in_window,
        1,
        "nor counted against the rate"
    );
    assert_eq!(
        events_about(&s.client, &second.name_any())
            .await
            .get("AttemptsExhausted"),
        Some(&1),
        "one Event"
    );
    let still = s
        .remediations()
        .await
        .into_iter()
        .find(|r| r.name_any() == second.name_any())
        .and_then(|r| r.status)
        .map(|st| st.phase);
    assert_eq!(still, Some(Phase::ManualRequired), "left alone");

    // A person approves: it proceeds like an admitted remediation.
    let patch = serde_json::json!({"metadata": {"annotations": {APPROVED_ANNOTATION: "true"}}});
    Api::<GpuRemediation>::all(s.client.clone())
        .patch(&second.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let approved = eventually(
        "the approved remediation to cordon",
        Duration::from_secs(30),
        || async {
            s.remediations().await.into_iter().find(|r| {
                r.name_any() == second.name_any()
                    && r.status
                        .as_ref()
                        .is_some_and(|st| st.phase_history.iter().any(|t| t.phase == Phase::Cordoned))
            })
        },
    )
    .await;
    assert!(
        is_unschedulable(&s.node(&broken).await),
        "cordoned after approval"
    );
    let history: Vec<Phase> = approved
        .status
        .unwrap()
        .phase_history
        .iter()
        .map(|t| t.phase)
        .collect();
    assert_eq!(
        &history[..4],
        &[
            Phase::Pending,
            Phase::ManualRequired,
            Phase::Pending,
            Phase::Cordoned
        ],
        "{history:?}"
    );
    controller.stop().await;
}

#[tokio::test]
async fn a_restart_mid_drain_resumes_the_same_remediation_without_resetting_the_rate_window() {
    let (s, broken, _) = scenario::pinned::pinned_behind_a_closed_budget().await;
    let nodes = s.nodes();
    let first = s.enforce_and_break(serde_json::json!({"drain": {"timeout": "6s", "onTimeout": "ForceDelete"}, "safety": {"maxUnhealthy": "100%", "rate": {"limit": 1, "per": "1h"}}}), &broken).await;
    let draining = s
        .wait_phase(&broken, Phase::Draining, Duration::from_secs(30))
        .await;
    first.stop().await;

    // A second node breaks while no controller runs; the rate window (1 per hour) is full.
    s.break_gpu(&nodes[1]).await;
    let second = RunningController::start(&s.scope).await;
    let done = s
        .wait_phase(&broken, Phase::Verifying, Duration::from_secs(60))
        .await;
    assert_eq!(
        done.name_any(),
        draining.name_any(),
        "the same remediation resumed"
    );
    let history = done.status.unwrap().phase_history;
    assert_eq!(
        history.iter().filter(|t| t.phase == Phase::Draining).count(),
        1,
        "{history:?}"
    );
    assert_eq!(
        history.iter().filter(|t| t.phase == Phase::Cordoned).count(),
        1,
        "{history:?}"
    );
    // A person releases the held node (action None), freeing its concurrency slot: only the
    // rate window holds the second node back now.
    s.set_unschedulable(&broken, false).await;
    s.wait_phase(&broken, Phase::Succeeded, Duration::from_secs(30))
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        s.remediations().await.len(),
        1,
        "the rate window still counts the first remediation"
    );
    let status = Api::<GpuRemediationPolicy>::all(s.client.clone())
        .get(&s.scope)
        .await
        .unwrap()
        .status
        .unwrap();
    assert_eq!(status.budget.unwrap().started_in_window, 1);
    assert_eq!(status.waiting[0].reason, "DeferredByRate");
    second.stop().await;
}

#[tokio::test]
async fn each_change_is_announced_by_one_event_not_one_per_pass() {
    let (s, nodes, controller) = four_of_ten_broken_before_the_controller().await;
    eventually("the circuit to open", Duration::from_secs(30), || async {
        let events = events_about(&s.client, &s.scope).await;
        (events.get("CircuitOpen").copied().unwrap_or(0) >= 1).then_some(())
    })
    .await;
    // Passes keep running (pod polls, resyncs, other tests' events): the announcements must not.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let events = events_about(&s.client, &s.scope).await;
    // The nodes a pass holds back are said in one Event that names them all.
    assert_eq!(
        events.get("CircuitOpen"),
        Some(&2),
        "one for the breaker, one for the nodes it holds back: {events:?}"
    );
    let held_notes = scenario::event_notes(&s.client, &s.scope, "CircuitOpen").await;
    assert!(
        nodes[..4].iter().all(|node| held_notes
            .iter()
            .any(|note| note.starts_with("4 at once") && note.contains(node.as_str()))),
        "{held_notes:?}"
    );
    controller.stop().await;
}
