//! Unit tests of `fleet`.

use crate::test_fixtures::at;
use gpu_remediation_api::{
    GpuRemediationPolicySpec, GpuRemediationStatus, Phase,
    constants::{APPROVED_ANNOTATION, ATTEMPTS_EXHAUSTED_ANNOTATION, REMEDIATION_FINALIZER},
    policy::{Action, Trigger},
    remediation::PhaseTransition,
    selector::{IntOrPercent, NodeSelector},
};
use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};
use kube::api::ObjectMeta;

use super::{candidates::readmitted_status, *};
use crate::record_name::remediation_name;
use k8s_openapi::api::core::v1::Node;

fn policy(name: &str, group: &str) -> Arc<GpuRemediationPolicy> {
    let spec: GpuRemediationPolicySpec = serde_json::from_value(serde_json::json!({
        "nodeSelector": {"matchLabels": {"group": group}},
        "triggers": [{"conditionType": "GpuHealthy", "status": "False", "for": "60s"}],
        "action": "None",
        "safety": {"maxUnhealthy": "100%"},
    }))
    .unwrap();
    let mut p = GpuRemediationPolicy::new(name, spec);
    p.metadata.generation = Some(1);
    Arc::new(p)
}

/// A node of `group`, broken since `broken_since` (healthy without), shared with `expiry`'s tests.
pub(super) fn node(name: &str, group: &str, broken_since: Option<i64>) -> Arc<Node> {
    let condition = NodeCondition {
        type_: "GpuHealthy".into(),
        status: if broken_since.is_some() { "False" } else { "True" }.into(),
        reason: Some(
            if broken_since.is_some() {
                "XID79"
            } else {
                "GpusHealthy"
            }
            .into(),
        ),
        last_transition_time: Some(Time(at(broken_since.unwrap_or(0)))),
        ..NodeCondition::default()
    };
    Arc::new(Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some([("group".to_owned(), group.to_owned())].into()),
            ..ObjectMeta::default()
        },
        spec: None,
        status: Some(NodeStatus {
            conditions: Some(vec![condition]),
            ..NodeStatus::default()
        }),
    })
}

/// A record of `node` under `policy` in `phase`, its episode begun at `since` (shared with the
/// index's tests).
pub(crate) fn existing(
    node: &str,
    policy: &str,
    since: i64,
    phase: Phase,
    created: i64,
) -> Arc<GpuRemediation> {
    let mut r = crate::test_fixtures::remediation(
        &remediation_name(node, policy, at(since)),
        node,
        policy,
        Some(at(since)),
        Action::None,
    );
    r.metadata.creation_timestamp = Some(Time(at(created)));
    r.status = Some(GpuRemediationStatus {
        phase,
        ..GpuRemediationStatus::default()
    });
    Arc::new(r)
}

#[test]
fn a_node_broken_for_longer_than_for_gets_a_remediation_with_its_trigger_recorded() {
    let fleet = plan(
        &[policy("p", "a")],
        &[node("n1", "a", Some(0)), node("n2", "a", None)],
        &[],
        at(60),
    );
    let plan = &fleet.policies[0];
    assert_eq!(plan.create.len(), 1);
    let created = &plan.create[0];
    assert_eq!(created.spec.node_name, "n1");
    assert_eq!(created.spec.trigger.reason, "XID79");
    assert_eq!(created.spec.trigger.since, Some(Time(at(0))));
    assert_eq!(created.spec.action, Action::None);
    assert_eq!(created.finalizers(), [REMEDIATION_FINALIZER.to_owned()]);
    assert_eq!(plan.status.selected_nodes, 2);
    assert_eq!(plan.status.unhealthy_nodes, 1);
    assert_eq!(plan.status.in_flight, 1);
}

#[test]
fn a_node_still_within_for_is_not_remediated_and_the_plan_wakes_when_it_would_be() {
    let fleet = plan(&[policy("p", "a")], &[node("n1", "a", Some(10))], &[], at(60));
    assert!(fleet.policies[0].create.is_empty());
    assert_eq!(fleet.wake_at, Some(at(70)));
}

#[test]
fn a_node_with_a_remediation_in_flight_gets_no_second_one() {
    let rems = [existing("n1", "p", 0, Phase::Draining, 60)];
    let fleet = plan(&[policy("p", "a")], &[node("n1", "a", Some(0))], &rems, at(100));
    assert!(fleet.policies[0].create.is_empty());
    assert_eq!(fleet.policies[0].status.in_flight, 1);
}

#[test]
fn a_finished_remediation_is_not_repeated_within_the_same_episode_but_is_in_a_new_one() {
    let rems = [existing("n1", "p", 0, Phase::Cancelled, 60)];
    let same = plan(&[policy("p", "a")], &[node("n1", "a", Some(0))], &rems, at(1000));
    assert!(same.policies[0].create.is_empty());
    let new_episode = plan(
        &[policy("p", "a")],
        &[node("n1", "a", Some(500))],
        &rems,
        at(1000),
    );
    assert_eq!(new_episode.policies[0].create.len(), 1);
    assert_eq!(
        new_episode.policies[0].create[0]
            .spec
            .previous_incident
            .as_ref()
            .map(|t| t.0),
        Some(at(0)),
        "the new record names when the node's previous incident started"
    );
}

fn one_attempt_per_day(name: &str, group: &str) -> Arc<GpuRemediationPolicy> {
    let mut p = (*policy(name, group)).clone();
    p.spec.safety.max_attempts_per_node.count = 1;
    p.spec.safety.max_concurrent = IntOrPercent::Int(1);
    Arc::new(p)
}

fn manual_required(node: &str, since: i64, created: i64, approved: bool) -> Arc<GpuRemediation> {
    let mut r = (*existing(node, "p", since, Phase::ManualRequired, created)).clone();
    r.annotations_mut().insert(
        ATTEMPTS_EXHAUSTED_ANNOTATION.to_owned(),
        "1 remediations of this node within 24h reach maxAttemptsPerNode 1".to_owned(),
    );
    r.status.as_mut().unwrap().phase_history.push(PhaseTransition {
        phase: Phase::ManualRequired,
        at: Time(at(created)),
        message: None,
    });
    if approved {
        r.annotations_mut()
            .insert(APPROVED_ANNOTATION.to_owned(), "true".to_owned());
    }
    Arc::new(r)
}

#[test]
fn a_node_due_one_recycle_too_many_gets_a_manual_required_record_that_counts_nowhere() {
    let rems = [existing("n1", "p", 0, Phase::Succeeded, 60)];
    let fleet = plan(
        &[one_attempt_per_day("p", "a")],
        &[node("n1", "a", Some(500))],
        &rems,
        at(1000),
    );
    let plan = &fleet.policies[0];
    assert!(plan.create.is_empty());
    assert_eq!(plan.manual_required.len(), 1);
    let record = &plan.manual_required[0];
    assert_eq!(record.spec.node_name, "n1");
    assert_eq!(record.name_any(), remediation_name("n1", "p", at(500)));
    assert!(
        record
            .annotations()
            .get(ATTEMPTS_EXHAUSTED_ANNOTATION)
            .is_some_and(|m| m.contains("maxAttemptsPerNode 1")),
        "{:?}",
        record.annotations()
    );
    assert!(
        plan.status.waiting.is_empty(),
        "its record says why, not the waiting list"
    );
    assert_eq!(plan.status.in_flight, 0);
    assert_eq!(plan.status.budget.as_ref().unwrap().started_in_window, 1);
}

#[test]
fn a_manual_required_record_waits_for_a_person_and_is_not_repeated() {
    let rems = [
        existing("n1", "p", 0, Phase::Succeeded, 60),
        manual_required("n1", 500, 900, false),
    ];
    let fleet = plan(
        &[one_attempt_per_day("p", "a")],
        &[node("n1", "a", Some(500))],
        &rems,
        at(1000),
    );
    let plan = &fleet.policies[0];
    assert!(plan.create.is_empty() && plan.manual_required.is_empty() && plan.readmit.is_empty());
    assert_eq!(plan.status.in_flight, 0);
    assert_eq!(
        plan.status.budget.as_ref().unwrap().started_in_window,
        1,
        "the ManualRequired record does not count against the rate"
    );
}

#[test]
fn an_approved_manual_required_record_goes_back_to_pending_when_the_budget_has_room() {
    let rems = [
        existing("n1", "p", 0, Phase::Succeeded, 60),
        manual_required("n1", 500, 900, true),
    ];
    let fleet = plan(
        &[one_attempt_per_day("p", "a")],
        &[node("n1", "a", Some(500))],
        &rems,
        at(1000),
    );
    let plan = &fleet.policies[0];
    assert!(plan.create.is_empty() && plan.manual_required.is_empty());
    assert_eq!(plan.readmit.len(), 1);
    let (record, status) = &plan.readmit[0];
    assert_eq!(record.name_any(), remediation_name("n1", "p", at(500)));
    assert_eq!(status.phase, Phase::Pending);
    assert_eq!(status.phase_history.last().map(|t| t.at.0), Some(at(1000)));
    assert_eq!(plan.status.in_flight, 1);
}

#[test]
fn an_approved_manual_required_record_still_waits_for_a_concurrency_slot() {
    let rems = [
        existing("n1", "p", 0, Phase::Succeeded, 60),
        manual_required("n1", 500, 900, true),
        existing("n2", "p", 800, Phase::Draining, 850),
    ];
    let fleet = plan(
        &[one_attempt_per_day("p", "a")],
        &[node("n1", "a", Some(500)), node("n2", "a", Some(800))],
        &rems,
        at(1000),
    );
    let plan = &fleet.policies[0];
    assert!(plan.readmit.is_empty() && plan.create.is_empty() && plan.manual_required.is_empty());
    assert_eq!(plan.status.waiting.len(), 1);
    assert_eq!(plan.status.waiting[0].reason, reasons::DEFERRED_CONCURRENCY);
}

#[test]
fn a_record_admitted_after_approval_counts_like_any_other() {
    let mut r = (*manual_required("n1", 500, 900, true)).clone();
    assert!(crate::lifecycle::status::awaits_person_past_attempts(&r));
    let status = readmitted_status(&r, at(1000));
    r.status = Some(status);
    assert!(!crate::lifecycle::status::awaits_person_past_attempts(&r));
    let counted = started("p", &[Arc::new(r)], at(2000));
    assert_eq!(
        counted[0].at,
        at(1000),
        "the rate window counts it from its readmission, not from its creation"
    );
}

#[test]
fn the_same_episode_always_gets_the_same_name() {
    let a = remediation_name("gpu-1", "p", at(0));
    assert_eq!(a, remediation_name("gpu-1", "p", at(0)));
    assert_ne!(a, remediation_name("gpu-1", "p", at(1)));
    assert!(a.starts_with("gpu-1-") && a.len() == "gpu-1-".len() + 6);
}

#[test]
fn nodes_of_another_policys_selector_are_not_counted() {
    let fleet = plan(
        &[policy("p", "a"), policy("q", "b")],
        &[node("n1", "a", Some(0)), node("n2", "b", None)],
        &[],
        at(60),
    );
    assert_eq!(fleet.policies[0].status.selected_nodes, 1);
    assert_eq!(fleet.policies[1].status.selected_nodes, 1);
    assert!(fleet.policies[1].create.is_empty());
}

#[test]
fn a_losing_policy_reports_overlap_naming_the_winner() {
    let fleet = plan(
        &[policy("a-first", "a"), policy("b-second", "a")],
        &[node("n1", "a", None)],
        &[],
        at(60),
    );
    let loser = &fleet.policies[1];
    let overlap = loser
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == policy_conditions::OVERLAP)
        .unwrap();
    assert_eq!(overlap.status, "True");
    assert!(overlap.message.contains("a-first"), "{}", overlap.message);
    assert_eq!(loser.status.selected_nodes, 0);
}

#[test]
fn four_of_ten_failing_under_thirty_percent_opens_the_circuit_and_says_why() {
    let nodes: Vec<_> = (0..10)
        .map(|i| node(&format!("n{i}"), "a", (i < 4).then_some(0)))
        .collect();
    let mut p = (*policy("p", "a")).clone();
    p.spec.safety.max_unhealthy = IntOrPercent::Percent("30%".into());
    p.spec.safety.max_concurrent = IntOrPercent::Int(10);
    let fleet = plan(&[Arc::new(p)], &nodes, &[], at(60));
    let plan = &fleet.policies[0];
    assert!(plan.create.is_empty());
    assert_eq!(plan.circuit_change, Some(true));
    assert_eq!(plan.status.waiting.len(), 4);
    assert!(
        plan.status
            .waiting
            .iter()
            .all(|w| w.reason == reasons::CIRCUIT_OPEN)
    );
    assert_eq!(plan.newly_waiting.len(), 4);
    let circuit = plan
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == policy_conditions::CIRCUIT_OPEN)
        .unwrap();
    assert_eq!(circuit.status, "True");
    assert!(circuit.message.contains("4 of 10"), "{}", circuit.message);
}

#[test]
fn a_node_still_waiting_for_the_same_reason_is_not_announced_again() {
    let mut p = (*policy("p", "a")).clone();
    let nodes = [node("n1", "a", Some(0)), node("n2", "a", Some(5))];
    let first = plan(&[Arc::new(p.clone())], &nodes, &[], at(70));
    assert_eq!(first.policies[0].newly_waiting.len(), 1);
    p.status = Some(first.policies[0].status.clone());
    let rems = [existing("n1", "p", 0, Phase::Draining, 70)];
    let second = plan(&[Arc::new(p)], &nodes, &rems, at(71));
    assert!(second.policies[0].newly_waiting.is_empty());
    assert_eq!(second.policies[0].status.waiting[0].node, "n2");
}

#[test]
fn unchanged_conditions_keep_their_transition_time() {
    let previous = [condition(
        &[],
        "Paused",
        false,
        "Running".into(),
        String::new(),
        None,
        at(0),
    )];
    let again = condition(
        &previous,
        "Paused",
        false,
        "Running".into(),
        String::new(),
        None,
        at(50),
    );
    assert_eq!(again.last_transition_time, Time(at(0)));
    let flipped = condition(
        &previous,
        "Paused",
        true,
        "Paused".into(),
        String::new(),
        None,
        at(50),
    );
    assert_eq!(flipped.last_transition_time, Time(at(50)));
}

#[test]
fn an_unlabelled_node_is_selected_by_an_empty_selector_unless_opted_out() {
    let mut p = (*policy("p", "a")).clone();
    p.spec.node_selector = NodeSelector::default();
    let mut opted = (*node("n2", "b", Some(0))).clone();
    opted.labels_mut().insert(
        gpu_remediation_api::constants::OPT_OUT_LABEL.into(),
        "true".into(),
    );
    let fleet = plan(
        &[Arc::new(p)],
        &[node("n1", "b", None), Arc::new(opted)],
        &[],
        at(60),
    );
    assert_eq!(fleet.policies[0].status.selected_nodes, 1);
    assert!(fleet.policies[0].create.is_empty());
}

#[test]
fn finished_remediations_older_than_the_history_ttl_are_expired_and_others_kept() {
    let mut p = (*policy("p", "a")).clone();
    p.spec.history.ttl = gpu_remediation_api::Duration::from_secs(3600);
    let with_history = |r: Arc<GpuRemediation>, at_secs: i64| {
        let mut r = (*r).clone();
        let status = r.status.as_mut().unwrap();
        status
            .phase_history
            .push(gpu_remediation_api::remediation::PhaseTransition {
                phase: status.phase,
                at: Time(at(at_secs)),
                message: None,
            });
        Arc::new(r)
    };
    let rems = [
        with_history(existing("old", "p", 0, Phase::Succeeded, 0), 100),
        with_history(existing("recent", "p", 0, Phase::Cancelled, 0), 4000),
        with_history(existing("running", "p", 0, Phase::Draining, 0), 100),
        with_history(existing("other", "q", 0, Phase::Succeeded, 0), 100),
    ];
    let fleet = plan::<Node>(&[Arc::new(p)], &[], &rems, at(5000));
    assert_eq!(fleet.policies[0].expired, vec![rems[0].name_any()]);
}

#[test]
fn an_invalid_policy_starts_nothing_and_says_why() {
    let mut p = (*policy("p", "a")).clone();
    p.spec.triggers.clear();
    let fleet = plan(&[Arc::new(p)], &[node("n1", "a", Some(0))], &[], at(60));
    let plan = &fleet.policies[0];
    assert!(plan.create.is_empty());
    let ready = plan
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == policy_conditions::READY)
        .unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", reasons::INVALID)
    );
    let invalid = plan
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == policy_conditions::INVALID)
        .unwrap();
    assert_eq!(invalid.status, "True");
    assert!(invalid.message.contains("spec.triggers"), "{}", invalid.message);
}

#[test]
fn a_trigger_action_overrides_the_policy_action() {
    let mut p = (*policy("p", "a")).clone();
    p.spec.triggers = vec![Trigger {
        action: Some(Action::Replace),
        ..p.spec.triggers[0].clone()
    }];
    let fleet = plan(&[Arc::new(p)], &[node("n1", "a", Some(0))], &[], at(60));
    assert_eq!(fleet.policies[0].create[0].spec.action, Action::Replace);
}

#[test]
fn ten_thousand_waiting_nodes_make_a_status_the_server_takes_listing_the_longest_waiting() {
    let p = policy("p", "a");
    let nodes: Vec<Arc<Node>> = (0..10_000)
        .map(|i| node(&format!("gpu-node-{i:05}"), "a", Some(10_000 - i)))
        .collect();
    let fleet = plan(&[p], &nodes, &[], at(20_000));
    let plan = &fleet.policies[0];
    assert_eq!(
        plan.create.len(),
        1,
        "maxConcurrent 1 admits the longest unhealthy"
    );
    let status = &plan.status;
    assert_eq!(status.waiting_total, 9_999);
    assert_eq!(
        status.waiting.len(),
        gpu_remediation_api::policy::WAITING_LISTED_MAX as usize
    );
    assert_eq!(
        status.waiting[0].node, "gpu-node-09998",
        "the longest waiting first"
    );
    assert_eq!(status.waiting[99].node, "gpu-node-09899");
    let bytes = serde_json::to_vec(status).unwrap().len();
    // The API server takes a request of at most 1.5 MiB; a status this size is a small write.
    assert!(bytes < 64 * 1024, "{bytes} bytes");
    assert_eq!(
        plan.newly_waiting.len(),
        100,
        "an Event per node listed, not per node waiting"
    );
}
