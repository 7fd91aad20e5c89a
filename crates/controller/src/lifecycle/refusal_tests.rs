//! Unit tests of how the lifecycle weighs a refused request: a permanent refusal fails the step at
//! once with the server's words; a transient one is asked again after a growing backoff, until
//! the step's deadline.

use gpu_remediation_api::{
    GpuRemediation, GpuRemediationPolicySpec, GpuRemediationStatus, Phase,
    policy::Action,
    remediation::{PhaseTransition, PolicySnapshot},
};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::{Answers, CordonAnswer, Decision, Next, Words, decide};
use crate::{
    retry::Cause,
    test_fixtures::{at, node, remediation},
};

fn rules() -> PolicySnapshot {
    let spec: GpuRemediationPolicySpec = serde_json::from_value(serde_json::json!({
        "nodeSelector": {"matchLabels": {"g": "a"}},
        "triggers": [{"conditionType": "GpuHealthy", "status": "False", "for": "60s"}],
        "action": "Replace",
        "drain": {"timeout": "10m"},
        "replacement": {"strategy": "DeleteNode", "timeout": "10m"},
    }))
    .unwrap();
    let policy = gpu_remediation_api::GpuRemediationPolicy::new("p", spec);
    crate::fleet::snapshot_of(&policy)
}

fn record(phase: Phase) -> GpuRemediation {
    let mut r = remediation("gpu-1-r", "gpu-1", "p", Some(at(0)), Action::Replace);
    r.spec.node_uid = Some("uid-gpu-1".into());
    r.status = Some(GpuRemediationStatus {
        phase,
        phase_history: vec![PhaseTransition {
            phase,
            at: Time(at(100)),
            message: None,
        }],
        ..GpuRemediationStatus::default()
    });
    r
}

fn decide_with(record: &GpuRemediation, answers: &Answers, now: Timestamp) -> Decision {
    let n = node("gpu-1", Some(at(0)));
    let seen = crate::test_fixtures::seen(Some(&n), answers);
    decide(record, Some(&rules()), &seen, now)
}

fn cordon_refused(words: Words) -> Answers {
    Answers {
        cordon: Some(CordonAnswer::Refused(words)),
        ..Answers::default()
    }
}

fn settled(decision: Decision) -> super::Settlement {
    match decision {
        Decision::Settle(settlement) => settlement,
        Decision::Ask(ask) => panic!("asked {ask:?}"),
    }
}

#[test]
fn a_cordon_forbidden_fails_at_once_with_the_servers_words() {
    let words = Words::answered("cordoning node gpu-1".into(), 403, "nodes is forbidden".into());
    let settlement = settled(decide_with(
        &record(Phase::Pending),
        &cordon_refused(words),
        at(101),
    ));
    assert_eq!(settlement.status.phase, Phase::Failed);
    let message = settlement.status.message.unwrap_or_default();
    assert!(message.contains("nodes is forbidden"), "{message}");
    assert!(message.contains("last word"), "{message}");
}

#[test]
fn an_undecodable_answer_fails_at_once_and_no_answer_is_retried() {
    let decode = Words {
        action: "cordoning node gpu-1".into(),
        message: "Error deserializing response".into(),
        cause: Cause::Decode,
    };
    let failed = settled(decide_with(
        &record(Phase::Pending),
        &cordon_refused(decode),
        at(101),
    ));
    assert_eq!(failed.status.phase, Phase::Failed);
    let unreachable = Words {
        action: "cordoning node gpu-1".into(),
        message: "connection refused".into(),
        cause: Cause::Connection,
    };
    let retried = settled(decide_with(
        &record(Phase::Pending),
        &cordon_refused(unreachable),
        at(101),
    ));
    assert_eq!(retried.status.phase, Phase::Pending);
    assert!(retried.status.refusal.is_some());
}

#[test]
fn a_transient_cordon_refusal_is_asked_again_later_the_longer_it_lasts() {
    let words = || Words::answered("cordoning node gpu-1".into(), 503, "etcd unavailable".into());
    let first = settled(decide_with(
        &record(Phase::Pending),
        &cordon_refused(words()),
        at(101),
    ));
    assert_eq!(first.status.phase, Phase::Pending);
    let Next::At(first_retry) = first.next else {
        panic!("{:?}", first.next)
    };
    let early = first_retry.duration_since(at(101));
    assert!(early <= SignedDuration::from_secs(2), "{early:?}");
    // The refusal has lasted five minutes: the wait has grown, up to the cap.
    let mut lasting = record(Phase::Pending);
    lasting.status.as_mut().unwrap().refusal = first.status.refusal.clone();
    let later = settled(decide_with(&lasting, &cordon_refused(words()), at(401)));
    let Next::At(later_retry) = later.next else {
        panic!("{:?}", later.next)
    };
    let waited = later_retry.duration_since(at(401));
    assert!(
        waited >= SignedDuration::from_secs(30) && waited <= SignedDuration::from_secs(60),
        "{waited:?}"
    );
}

#[test]
fn a_replacement_the_server_refuses_with_a_404_fails_at_once() {
    let mut replacing = record(Phase::Replacing);
    replacing.status.as_mut().unwrap().conditions.clear();
    let words = Words::answered(
        "triggering the replacement (Template)".into(),
        404,
        "the server could not find the requested resource".into(),
    );
    let answers = Answers {
        trigger: Some(Err(words)),
        ..Answers::default()
    };
    let settlement = settled(decide_with(&replacing, &answers, at(101)));
    assert_eq!(
        settlement.status.phase,
        Phase::Failed,
        "{:?}",
        settlement.status.message
    );
    assert!(
        settlement
            .status
            .message
            .unwrap_or_default()
            .contains("could not find the requested resource")
    );
    // A conflict is asked again.
    let answers = Answers {
        trigger: Some(Err(Words::answered(
            "triggering the replacement (Template)".into(),
            409,
            "conflict".into(),
        ))),
        ..Answers::default()
    };
    let retried = settled(decide_with(&replacing, &answers, at(101)));
    assert_eq!(retried.status.phase, Phase::Replacing);
}
