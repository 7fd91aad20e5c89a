use gpu_remediation_api::{
    constants::remediation_conditions,
    diagnostics::Diagnostics,
    ladder::LadderStep,
    policy::{Action, Drain, Release, Replacement},
};
use k8s_openapi::{
    api::core::v1::{NodeCondition, NodeStatus},
    apimachinery::pkg::apis::meta::v1::Condition,
};
use serde_json::json;

use super::*;
use crate::replace::{Presence, Reported};
use k8s_openapi::api::core::v1::Node;

fn rules(diagnostics: bool, ladder: &[Rung]) -> PolicySnapshot {
    PolicySnapshot {
        generation: None,
        triggers: Vec::new(),
        drain: Drain::default(),
        replacement: Replacement::default(),
        release: Release::default(),
        ladder: ladder
            .iter()
            .map(|rung| LadderStep {
                step: *rung,
                timeout: gpu_remediation_api::Duration::from_mins(5),
                template: rung
                    .has_template()
                    .then(|| json!({"apiVersion": "v1", "kind": "X"})),
            })
            .collect(),
        validation: None,
        diagnostics: diagnostics.then(|| Diagnostics {
            job: json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"namespace": "ops"},
                "spec": {"template": {"spec": {"containers": [{"name": "bug-report", "image": "ubuntu"}]}}}}),
            timeout: gpu_remediation_api::Duration::from_secs(60),
        }),
    }
}

fn remediation(action: Action) -> GpuRemediation {
    crate::test_fixtures::remediation("gpu-1-abc", "gpu-1", "p", None, action)
}

fn node(ready: &str) -> Node {
    Node {
        status: Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: ready.into(),
                ..NodeCondition::default()
            }]),
            ..NodeStatus::default()
        }),
        ..Node::default()
    }
}

fn at(second: i64) -> Timestamp {
    Timestamp::from_second(1_000_000 + second).unwrap()
}

/// Drained at `at(0)`, with `record` if any.
fn drained(record: Option<DiagnosticsRecord>) -> GpuRemediationStatus {
    GpuRemediationStatus {
        conditions: vec![Condition {
            type_: remediation_conditions::DRAINED.into(),
            status: "True".into(),
            last_transition_time: Time(at(0)),
            message: String::new(),
            reason: "Drained".into(),
            observed_generation: None,
        }],
        diagnostics: record,
        ..GpuRemediationStatus::default()
    }
}

fn created() -> ObjectReference {
    ObjectReference {
        api_version: "batch/v1".into(),
        kind: "Job".into(),
        name: "gpu-1-abc-diagnostics".into(),
        namespace: Some("ops".into()),
        uid: Some("u-1".into()),
    }
}

fn job(reported: Reported) -> Result<Observation, Words> {
    super::super::validation::tests::seen(reported, Presence::Present)
}

fn running(rules: &PolicySnapshot) -> DiagnosticsRecord {
    let status = drained(None);
    let (gate, record) = gate(
        &remediation(Action::Replace),
        rules,
        &node("True"),
        &status,
        (Some(&Ok(created())), None),
        at(1),
    );
    assert!(matches!(gate, Gate::Wait { note: Some(_), .. }), "{gate:?}");
    record.expect("a record once the Job is created")
}

#[test]
fn without_diagnostics_or_before_a_step_that_destroys_nothing_the_hand_over_goes_on_at_once() {
    let status = drained(None);
    for (rules, action) in [
        (rules(false, &[]), Action::Replace),
        (rules(true, &[]), Action::None),
        (rules(true, &[Rung::HandOff]), Action::Replace),
    ] {
        let (gate, record) = gate(
            &remediation(action),
            &rules,
            &node("True"),
            &status,
            (None, None),
            at(1),
        );
        assert_eq!(gate, Gate::Proceed(None));
        assert_eq!(record, None);
    }
}

#[test]
fn before_a_reboot_replace_or_reset_the_job_is_asked_for_once() {
    for (ladder, action) in [
        (vec![], Action::Replace),
        (vec![], Action::Reboot),
        (vec![Rung::ResetGpu, Rung::Replace], Action::Replace),
        (vec![Rung::Reboot], Action::Replace),
    ] {
        let rules = rules(true, &ladder);
        let (gate, _) = gate(
            &remediation(action),
            &rules,
            &node("True"),
            &drained(None),
            (None, None),
            at(1),
        );
        assert_eq!(gate, Gate::Ask, "{ladder:?} {action:?}");
    }
    let rules = rules(true, &[]);
    let record = running(&rules);
    assert_eq!(record.job, "gpu-1-abc-diagnostics");
    assert_eq!(record.outcome, None);
    let ended = node_job::ended(&record, DiagnosticsOutcome::Failed, "reported Failed", at(5));
    let (gate, kept) = gate(
        &remediation(Action::Replace),
        &rules,
        &node("True"),
        &drained(Some(ended.clone())),
        (None, None),
        at(6),
    );
    assert_eq!(gate, Gate::Proceed(None), "an ended run is never run again");
    assert_eq!(kept, Some(ended));
}

#[test]
fn the_step_waits_for_the_job_until_it_completes_fails_or_times_out_then_goes_on() {
    let rules = rules(true, &[]);
    let record = running(&rules);
    let status = drained(Some(record.clone()));
    let remediation = remediation(Action::Replace);
    let look = |observed: Option<&Result<Observation, Words>>, now| {
        gate(
            &remediation,
            &rules,
            &node("True"),
            &status,
            (None, observed),
            now,
        )
    };
    let (waiting, kept) = look(Some(&job(Reported::InProgress)), at(30));
    let Gate::Wait {
        deadline, note: None, ..
    } = waiting
    else {
        panic!("{waiting:?}")
    };
    assert_eq!(deadline, at(61), "the timeout counts from the Job's creation");
    assert_eq!(kept.as_ref(), Some(&record));
    for (observed, now, outcome) in [
        (
            job(Reported::Done("condition Complete=True".into())),
            at(20),
            DiagnosticsOutcome::Collected,
        ),
        (
            job(Reported::Failed("condition Failed=True".into())),
            at(20),
            DiagnosticsOutcome::Failed,
        ),
        (job(Reported::InProgress), at(61), DiagnosticsOutcome::TimedOut),
    ] {
        let (gate, ended) = look(Some(&observed), now);
        let ended = ended.expect("the record");
        assert_eq!(ended.outcome, Some(outcome));
        assert_eq!(ended.job, record.job);
        assert!(ended.duration_seconds.is_some());
        let Gate::Proceed(Some(note)) = gate else {
            panic!("{gate:?}")
        };
        assert!(note.text.contains("gpu-1-abc-diagnostics"), "{note:?}");
    }
    let unread = Err(Words::invalid("reading the Job".into(), "nope".into()));
    let (past, ended) = look(Some(&unread), at(61));
    assert!(
        matches!(past, Gate::Proceed(Some(_))),
        "an unread Job never blocks past the timeout"
    );
    assert_eq!(ended.unwrap().outcome, Some(DiagnosticsOutcome::TimedOut));
}

#[test]
fn an_unreachable_node_is_not_waited_for() {
    let rules = rules(true, &[]);
    let remediation = remediation(Action::Replace);
    let (gate_now, record) = gate(
        &remediation,
        &rules,
        &node("Unknown"),
        &drained(None),
        (None, None),
        at(1),
    );
    assert!(matches!(gate_now, Gate::Proceed(Some(_))), "{gate_now:?}");
    let record = record.unwrap();
    assert_eq!(record.outcome, Some(DiagnosticsOutcome::Unreachable));
    assert_eq!(record.job, "gpu-1-abc-diagnostics", "the Job it would have been");
    assert!(record.message.unwrap().contains("Ready=Unknown"));
    let status = drained(Some(running(&rules)));
    let (gate, ended) = gate(
        &remediation,
        &rules,
        &node("Unknown"),
        &status,
        (None, Some(&job(Reported::InProgress))),
        at(10),
    );
    assert!(matches!(gate, Gate::Proceed(Some(_))));
    assert_eq!(ended.unwrap().outcome, Some(DiagnosticsOutcome::Unreachable));
}

#[test]
fn a_refused_create_is_retried_within_the_timeout_and_then_ends_failed() {
    let rules = rules(true, &[]);
    let remediation = remediation(Action::Replace);
    let busy = Err(Words::answered(
        "creating the diagnostics Job".into(),
        503,
        "etcd busy".into(),
    ));
    let (retry, record) = gate(
        &remediation,
        &rules,
        &node("True"),
        &drained(None),
        (Some(&busy), None),
        at(10),
    );
    assert!(
        matches!(retry, Gate::Retry { deadline, .. } if deadline == at(60)),
        "{retry:?}"
    );
    assert_eq!(record, None);
    let (given_up, record) = gate(
        &remediation,
        &rules,
        &node("True"),
        &drained(None),
        (Some(&busy), None),
        at(60),
    );
    assert!(matches!(given_up, Gate::Proceed(Some(_))), "{given_up:?}");
    assert_eq!(record.unwrap().outcome, Some(DiagnosticsOutcome::Failed));
    let refused = Err(Words::invalid(
        "creating the diagnostics Job".into(),
        "forbidden".into(),
    ));
    let (at_once, record) = gate(
        &remediation,
        &rules,
        &node("True"),
        &drained(None),
        (Some(&refused), None),
        at(10),
    );
    assert!(
        matches!(at_once, Gate::Proceed(Some(_))),
        "a permanent refusal ends it at once"
    );
    assert!(record.unwrap().message.unwrap().contains("could not be created"));
}

#[test]
fn the_job_is_pinned_to_the_node_tolerates_every_taint_and_is_kept_a_day() {
    let job = job_object(&rules(true, &[]), "gpu-1-abc").unwrap();
    assert_eq!(job["metadata"]["name"], "gpu-1-abc-diagnostics");
    let pod = &job["spec"]["template"];
    assert_eq!(pod["metadata"]["labels"][POD_LABEL], "true");
    assert_eq!(pod["spec"]["nodeName"], "{{nodeName}}");
    assert_eq!(pod["spec"]["tolerations"], json!([{"operator": "Exists"}]));
    assert_eq!(job["spec"]["activeDeadlineSeconds"], 60);
    assert_eq!(job["spec"]["ttlSecondsAfterFinished"], 86_400);
    assert_eq!(job_object(&rules(false, &[]), "gpu-1-abc"), None);
}
