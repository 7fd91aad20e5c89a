//! Unit tests of a node that recovers before the hand-over (its trigger clear for
//! `release.healthyFor` while it is cordoned or drained, as after a ladder step whose validation
//! failed): without a validation the recovery releases it; with one, the recovery is evidence and
//! only the Job's pass releases the node, while a failed one leaves the drain (and the ladder) to
//! go on. Found by the demo: a reset that left the GPU broken but the node reporting healthy was
//! released as "recovered" once the next step's drain began.

use gpu_remediation_api::{
    GpuRemediation, GpuRemediationPolicySpec, GpuRemediationStatus, Phase,
    constants::CORDONED_BY_ANNOTATION,
    object_reference::ObjectReference,
    policy::Action,
    remediation::{PhaseTransition, PolicySnapshot},
    validation::{ValidationOutcome, ValidationRecord},
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::{Answers, Ask, CancelReason, Decision, decide};
use crate::test_fixtures::{at, node, remediation};

const NAME: &str = "gpu-1-r";

fn rules(validation: bool) -> PolicySnapshot {
    let mut spec = serde_json::json!({
        "nodeSelector": {"matchLabels": {"g": "a"}},
        "triggers": [{"conditionType": "GpuHealthy", "status": "False"}],
        "action": "Replace",
        "release": {"healthyFor": "5s"},
        "replacement": {"strategy": "DeleteNode", "timeout": "10m"},
    });
    if validation {
        spec["validation"] = serde_json::json!({"job": {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"namespace": "ops"}, "spec": {"template": {"spec": {"containers": [{"name": "d", "image": "dcgm"}]}}}},
            "timeout": "1m"});
    }
    let spec: GpuRemediationPolicySpec = serde_json::from_value(spec).unwrap();
    crate::fleet::snapshot_of(&gpu_remediation_api::GpuRemediationPolicy::new("p", spec))
}

/// A record draining its cordoned node, with `validation` as the status holds it.
fn draining(validation: Option<ValidationRecord>) -> GpuRemediation {
    let mut r = remediation(NAME, "gpu-1", "p", Some(at(0)), Action::Replace);
    r.spec.node_uid = Some("uid-gpu-1".into());
    r.status = Some(GpuRemediationStatus {
        phase: Phase::Draining,
        phase_history: vec![PhaseTransition {
            phase: Phase::Draining,
            at: Time(at(100)),
            message: None,
        }],
        validation,
        ..GpuRemediationStatus::default()
    });
    r
}

/// Decides for `record` on its node, cordoned by it and healthy since long ago.
fn decide_on(record: &GpuRemediation, rules: &PolicySnapshot, answers: &Answers) -> Decision {
    let mut n = node("gpu-1", None);
    n.spec.get_or_insert_with(Default::default).unschedulable = Some(true);
    n.metadata.annotations = Some([(CORDONED_BY_ANNOTATION.to_owned(), NAME.to_owned())].into());
    let seen = crate::test_fixtures::seen(Some(&n), answers);
    decide(record, Some(rules), &seen, at(200))
}

fn ended(outcome: ValidationOutcome) -> ValidationRecord {
    ValidationRecord {
        namespace: "ops".into(),
        job: format!("{NAME}-validate"),
        uid: Some("u".into()),
        start: Time(at(150)),
        end: Some(Time(at(160))),
        outcome: Some(outcome),
        duration_seconds: Some(10),
        message: Some("reported".into()),
    }
}

fn cancelled(decision: &Decision) -> bool {
    matches!(decision, Decision::Settle(s) if s.status.phase == Phase::Cancelled && s.release.is_some())
}

#[test]
fn without_a_validation_a_recovery_before_the_hand_over_releases_the_node() {
    let decision = decide_on(&draining(None), &rules(false), &Answers::default());
    assert!(cancelled(&decision), "{decision:?}");
    let Decision::Settle(settled) = decision else {
        unreachable!()
    };
    assert_eq!(
        settled.status.message.as_deref(),
        Some(CancelReason::Recovered.message())
    );
}

#[test]
fn with_a_validation_a_recovery_asks_for_the_job_and_keeps_the_node_while_it_runs() {
    let rules = rules(true);
    let asked = decide_on(&draining(None), &rules, &Answers::default());
    assert!(matches!(asked, Decision::Ask(Ask::Validate(None))), "{asked:?}");
    let created = Answers {
        validation: Some(Box::new(Ok(ObjectReference {
            api_version: "batch/v1".into(),
            kind: "Job".into(),
            name: format!("{NAME}-validate"),
            namespace: Some("ops".into()),
            uid: Some("u".into()),
        }))),
        ..Answers::default()
    };
    let waiting = decide_on(&draining(None), &rules, &created);
    let Decision::Settle(settled) = waiting else {
        panic!("{waiting:?}")
    };
    assert!(settled.release.is_none(), "not released while the Job runs");
    assert_ne!(settled.status.phase, Phase::Cancelled);
    assert_eq!(
        settled.status.validation.map(|v| v.job),
        Some(format!("{NAME}-validate")),
        "the run is recorded"
    );
}

#[test]
fn a_failed_validation_of_a_recovery_keeps_the_node_and_the_drain_goes_on_a_passed_one_releases_it() {
    let rules = rules(true);
    for outcome in [ValidationOutcome::Failed, ValidationOutcome::TimedOut] {
        let decision = decide_on(&draining(Some(ended(outcome))), &rules, &Answers::default());
        assert!(
            !cancelled(&decision),
            "{outcome:?}: released a node its validation failed: {decision:?}"
        );
        assert!(
            !matches!(decision, Decision::Ask(Ask::Validate(_))),
            "{outcome:?}: never validated twice for one recovery"
        );
    }
    let passed = decide_on(
        &draining(Some(ended(ValidationOutcome::Passed))),
        &rules,
        &Answers::default(),
    );
    assert!(cancelled(&passed), "{passed:?}");
}
