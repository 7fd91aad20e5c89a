//! Unit tests of `drain`.

use crate::test_fixtures::at;
use k8s_openapi::{
    api::policy::v1::{PodDisruptionBudgetSpec, PodDisruptionBudgetStatus},
    apimachinery::pkg::apis::meta::v1::LabelSelector,
};
use kube::api::ObjectMeta;

use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::core::Status;

use super::{force::stuck_terminating, *};

fn pod() -> Leaving {
    Leaving {
        uid: "u".into(),
        ..crate::test_fixtures::leaving("web-0", "web")
    }
}

fn budget(name: &str, allowed: i32) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("work".into()),
            ..ObjectMeta::default()
        },
        spec: Some(PodDisruptionBudgetSpec {
            selector: Some(LabelSelector {
                match_labels: Some([("app".to_owned(), "web".to_owned())].into()),
                ..LabelSelector::default()
            }),
            ..PodDisruptionBudgetSpec::default()
        }),
        status: Some(PodDisruptionBudgetStatus {
            disruptions_allowed: allowed,
            ..PodDisruptionBudgetStatus::default()
        }),
    }
}

#[test]
fn a_blocker_names_the_budget_the_server_names_or_those_that_cover_the_pod() {
    let named = Status {
        code: 429,
        message: "Cannot evict pod as it would violate the pod's disruption budget.".into(),
        ..Status::default()
    };
    let b = blocker(&pod(), &named, &[budget("web", 0)], Time(at(0)));
    assert_eq!(
        (b.pod.as_str(), b.pdb.as_deref(), b.code),
        ("work/web-0", Some("work/web"), 429)
    );
    let several = Status {
        code: 500,
        message:
            "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."
                .into(),
        ..Status::default()
    };
    let b = blocker(&pod(), &several, &[budget("a", 1), budget("b", 1)], Time(at(0)));
    assert_eq!(b.pdb.as_deref(), Some("work/a,work/b"));
    assert_eq!(b.code, 500);
}

#[test]
fn a_blocker_names_the_pods_its_budget_still_counts_as_evicted() {
    let refused: Status = serde_json::from_value(serde_json::json!({
        "code": 429,
        "message": "Cannot evict pod as it would violate the pod's disruption budget.",
        "details": {"causes": [{
            "reason": "DisruptionBudget",
            "message": "The disruption budget web needs 3 healthy pods and has 3 currently",
        }]},
    }))
    .unwrap();
    let mut spent = budget("web", 0);
    spent.status.as_mut().unwrap().disrupted_pods = Some(
        [
            ("web-2".to_owned(), Time(at(30))),
            ("web-1".to_owned(), Time(at(10))),
        ]
        .into(),
    );
    let b = blocker(&pod(), &refused, &[spent], Time(at(40)));
    assert!(
        b.message.ends_with(&format!(
            "; the budget still counts web-1, web-2 as evicted (granted since {}): it is given back once \
             they are gone, or by the disruption controller 2 minutes after the grant if a deletion was lost",
            at(10)
        )),
        "{}",
        b.message
    );
}

#[test]
fn a_pod_just_past_its_grace_period_is_not_stuck_until_the_kubelet_has_had_its_slack() {
    let mut going = pod();
    assert!(!stuck_terminating(&going, at(100)), "a running pod is not stuck");
    going.terminating = true;
    going.gone_by = Some(at(10));
    assert!(!stuck_terminating(&going, at(11)), "one second past the deadline");
    assert!(stuck_terminating(&going, at(20)), "ten seconds past the deadline");
}

#[test]
fn blockers_name_each_budget_once() {
    let b = |pdb: &str| Blocker {
        pod: "work/p".into(),
        pdb: Some(pdb.into()),
        code: 500,
        message: String::new(),
        since: None,
    };
    assert_eq!(
        budgets_named(&[b("work/a,work/b"), b("work/a,work/b"), b("work/c")]),
        ["work/a", "work/b", "work/c"]
    );
}

fn proceed_rules(ladder: &[gpu_remediation_api::ladder::Rung]) -> PolicySnapshot {
    let spec: gpu_remediation_api::GpuRemediationPolicySpec = serde_json::from_value(serde_json::json!({
        "nodeSelector": {"matchLabels": {"g": "a"}},
        "triggers": [{"conditionType": "GpuHealthy", "status": "False", "for": "60s"}],
        "drain": {"onTimeout": "Proceed"},
        "replacement": {"strategy": "Template", "template": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "y"}}},
    }))
    .unwrap();
    let mut rules = crate::fleet::snapshot_of(&gpu_remediation_api::GpuRemediationPolicy::new("p", spec));
    rules.ladder = ladder
        .iter()
        .map(|rung| {
            serde_json::from_value(serde_json::json!({"step": rung.as_str(), "timeout": "5m"})).unwrap()
        })
        .collect();
    rules
}

fn seen_with<'a>(budgets: &'a [PodDisruptionBudget], answers: &'a super::super::Answers) -> Seen<'a> {
    static NONE: std::sync::LazyLock<std::collections::BTreeMap<String, u32>> =
        std::sync::LazyLock::new(std::collections::BTreeMap::new);
    Seen {
        node: None,
        pods: None,
        drain_scope: None,
        gangs: &[],
        budgets,
        in_flight: &NONE,
        asked_at: &|_| None,
        replacement: None,
        validation: None,
        diagnostics: None,
        answers,
        pace: super::super::Pace {
            pod_poll: jiff::SignedDuration::from_secs(1),
            eviction_backoff: jiff::SignedDuration::from_secs(5),
            replacement_poll: jiff::SignedDuration::from_secs(2),
        },
    }
}

#[test]
fn proceed_never_takes_down_a_pod_a_budget_protects_on_a_reboot_or_any_ladder_rung() {
    use gpu_remediation_api::ladder::Rung;
    let plan = Plan {
        leaving: vec![pod()],
        staying: Vec::new(),
    };
    let answers = super::super::Answers::default();
    let budgets = [budget("web", 0)];
    let seen = seen_with(&budgets, &answers);
    let record = |action| crate::test_fixtures::remediation("r", "gpu-1", "p", Some(at(0)), action);
    for (action, ladder) in [
        (Action::Reboot, &[][..]),
        (Action::Replace, &[][..]),
        (Action::Replace, &[Rung::ResetGpu, Rung::Reboot][..]),
        (Action::Replace, &[Rung::Reboot, Rung::HandOff][..]),
    ] {
        let protected = protected_left(&record(action), &proceed_rules(ladder), &plan, &seen);
        assert_eq!(
            protected.as_deref(),
            Some("work/web-0 (budget work/web)"),
            "{action:?} {ladder:?}"
        );
    }
    // Holding the node (action None) takes nothing down: Proceed goes on.
    assert_eq!(
        protected_left(&record(Action::None), &proceed_rules(&[]), &plan, &seen),
        None
    );
    // A pod no budget protects does not hold a reboot back, nor one already terminating.
    let none = seen_with(&[], &answers);
    assert_eq!(
        protected_left(&record(Action::Reboot), &proceed_rules(&[]), &plan, &none),
        None
    );
    let terminating = Plan {
        leaving: vec![Leaving {
            terminating: true,
            ..pod()
        }],
        staying: Vec::new(),
    };
    assert_eq!(
        protected_left(&record(Action::Reboot), &proceed_rules(&[]), &terminating, &seen),
        None
    );
}

#[test]
fn the_next_step_a_drain_names_is_the_step_left_open_else_the_rung_the_ladder_starts_at() {
    use super::super::ladder_record::new_record;
    use gpu_remediation_api::ladder::{Rung, StepOutcome};
    let record = |action| crate::test_fixtures::remediation("r", "gpu-1", "p", Some(at(0)), action);
    let replace = record(Action::Replace);
    let ladder = proceed_rules(&[Rung::Reboot, Rung::Replace]);
    let mut status = GpuRemediationStatus::default();
    assert_eq!(next_step(&replace, &ladder, &status), "ladder step Reboot");
    // A reset without a failed GPU to reset starts a rung higher.
    let reset_first = proceed_rules(&[Rung::ResetGpu, Rung::Reboot]);
    assert_eq!(next_step(&replace, &reset_first, &status), "ladder step Reboot");
    // Re-entered after an escalation: the step opened by it comes next, not the ladder's first.
    let mut rebooted = new_record(Rung::Reboot, at(1));
    rebooted.end = Some(Time(at(2)));
    rebooted.outcome = Some(StepOutcome::TimedOut);
    status.steps = vec![rebooted, new_record(Rung::Replace, at(2))];
    assert_eq!(next_step(&replace, &ladder, &status), "ladder step Replace");
    // No ladder: the action.
    assert_eq!(
        next_step(&record(Action::Reboot), &proceed_rules(&[]), &status),
        "Reboot"
    );
}

/// A Reboot policy with the default drain (`onTimeout: Block`, `timeout: 30m`,
/// `unreachableAfter: 5m`).
fn block_rules() -> PolicySnapshot {
    let spec: gpu_remediation_api::GpuRemediationPolicySpec = serde_json::from_value(serde_json::json!({
        "nodeSelector": {"matchLabels": {"g": "a"}},
        "triggers": [{"conditionType": "GpuHealthy", "status": "False", "for": "60s"}],
        "action": "Reboot",
    }))
    .unwrap();
    crate::fleet::snapshot_of(&gpu_remediation_api::GpuRemediationPolicy::new("p", spec))
}

/// The broken node `gpu-1` with its `Ready` condition `ready`.
fn node_ready(ready: &str) -> k8s_openapi::api::core::v1::Node {
    let mut node = crate::test_fixtures::node("gpu-1", Some(at(0)));
    let conditions = node.status.as_mut().unwrap().conditions.as_mut().unwrap();
    conditions.push(k8s_openapi::api::core::v1::NodeCondition {
        type_: "Ready".into(),
        status: ready.into(),
        ..k8s_openapi::api::core::v1::NodeCondition::default()
    });
    node
}

/// `web-0`, its eviction accepted at 0 (its `deletionTimestamp`: 0 plus a 30 s grace period).
fn evicted() -> Leaving {
    Leaving {
        terminating: true,
        gone_by: Some(at(30)),
        ..pod()
    }
}

/// One drain step at `now` on a node whose `Ready` is `ready`, the drain begun at 0.
fn drain_step(ready: &str, leaving: Leaving, now: Timestamp) -> Decision {
    let rules = block_rules();
    let remediation = crate::test_fixtures::remediation("r", "gpu-1", "p", Some(at(0)), Action::Reboot);
    let node = node_ready(ready);
    let plan = Plan {
        leaving: vec![leaving],
        staying: Vec::new(),
    };
    let answers = super::super::Answers::default();
    let mut seen = seen_with(&[], &answers);
    seen.node = Some(&node);
    seen.pods = Some(&plan);
    let facts = Facts {
        name: "r".into(),
        node: crate::cordon::NodeRef {
            name: "gpu-1".into(),
            uid: None,
        },
        identity: Identity::Same(&node),
        health: super::super::Health::Broken,
        healthy_for: jiff::SignedDuration::from_mins(5),
        now,
    };
    let mut status = GpuRemediationStatus::default();
    enter(&mut status, Phase::Draining, "evicting", at(0));
    advance(
        &Pass {
            remediation: &remediation,
            rules: &rules,
            seen: &seen,
            facts: &facts,
        },
        status,
        None,
    )
}

fn settled(decision: Decision) -> Settlement {
    match decision {
        Decision::Settle(settled) => settled,
        Decision::Ask(ask) => panic!("asked {ask:?}"),
    }
}

#[test]
fn on_an_unreachable_node_a_pod_terminating_past_unreachable_after_counts_gone() {
    // Deleted at 30 (its deletionTimestamp): waited for until 30 + 5m.
    let waiting = settled(drain_step("Unknown", evicted(), at(330)));
    assert_eq!(waiting.status.phase, Phase::Draining);
    assert_eq!(waiting.status.drain.as_ref().unwrap().pods_remaining, 1);
    assert!(
        matches!(waiting.next, Next::At(t) if t <= at(331)),
        "looked at again once the bound passes: {:?}",
        waiting.next
    );
    let done = settled(drain_step("Unknown", evicted(), at(331)));
    assert_eq!(done.status.phase, Phase::Replacing, "{:?}", done.status.message);
    assert_eq!(done.status.drain.as_ref().unwrap().pods_remaining, 0);
    let skipped: Vec<&Note> = done
        .notes
        .iter()
        .filter(|n| n.reason == reasons::UNREACHABLE_PODS_SKIPPED)
        .collect();
    assert_eq!(skipped.len(), 1, "{:?}", done.notes);
    assert!(skipped[0].text.contains("1 counted gone"), "{}", skipped[0].text);
    assert!(
        done.status
            .conditions
            .iter()
            .any(|c| c.type_ == remediation_conditions::DRAINED && c.message.contains("1 counted gone")),
        "{:?}",
        done.status.conditions
    );
}

#[test]
fn a_pod_not_terminating_on_an_unreachable_node_is_still_evicted_under_its_budget() {
    match drain_step("Unknown", pod(), at(10_000)) {
        Decision::Ask(Ask::Evict { pods, .. }) => assert_eq!(pods.len(), 1),
        other => panic!("expected an eviction, got {other:?}"),
    }
}

#[test]
fn on_a_reachable_node_a_pod_stuck_terminating_still_blocks_the_drain() {
    for ready in ["True", "False"] {
        let stuck = settled(drain_step(ready, evicted(), at(10_000)));
        assert_eq!(stuck.status.phase, Phase::Blocked, "Ready={ready}");
        assert_eq!(stuck.status.drain.as_ref().unwrap().pods_remaining, 1);
        assert!(
            stuck
                .notes
                .iter()
                .all(|n| n.reason != reasons::UNREACHABLE_PODS_SKIPPED),
            "Ready={ready}"
        );
    }
    // Past the bound but unreachable: no longer waited for.
    let gone = settled(drain_step("Unknown", evicted(), at(10_000)));
    assert_eq!(gone.status.phase, Phase::Replacing);
}

#[test]
fn each_accepted_eviction_adds_its_gpus_times_the_seconds_since_admission_to_the_drains_cost() {
    let eight = Leaving { gpus: 8, ..pod() };
    let gone = Leaving {
        name: "web-1".into(),
        uid: "u1".into(),
        gpus: 4,
        ..pod()
    };
    let answers = super::super::Answers {
        evictions: vec![
            (eight.clone(), EvictionAnswer::Accepted),
            (gone.clone(), EvictionAnswer::Gone),
        ],
        ..super::super::Answers::default()
    };
    let seen = seen_with(&[], &answers);
    let plan = Plan {
        leaving: vec![eight, gone],
        staying: Vec::new(),
    };
    let previous = DrainStatus {
        gpu_seconds: 100,
        ..DrainStatus::default()
    };
    // Admitted at 0, evicted at 30: 8 GPUs x 30 s on top of what earlier passes counted; the pod
    // found gone was not evicted by this drain and costs nothing.
    let drained = record_answers(&plan, &seen, &[], &previous, (at(0), at(30)));
    assert_eq!(drained.gpu_seconds, 100 + 240);
    // A pass with no accepted eviction keeps the cost.
    let none = super::super::Answers::default();
    let kept = record_answers(&plan, &seen_with(&[], &none), &[], &drained, (at(0), at(60)));
    assert_eq!(kept.gpu_seconds, 340);
}
