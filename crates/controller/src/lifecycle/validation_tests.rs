use gpu_remediation_api::validation::Validation;
use serde_json::json;

use super::*;
use crate::replace::{Presence, ReplacementNode, Reported};

fn rules(validation: bool) -> PolicySnapshot {
    PolicySnapshot {
        generation: None,
        triggers: Vec::new(),
        drain: gpu_remediation_api::policy::Drain::default(),
        replacement: gpu_remediation_api::policy::Replacement::default(),
        release: gpu_remediation_api::policy::Release::default(),
        ladder: Vec::new(),
        validation: validation.then(|| Validation {
            job: json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"namespace": "ops"},
                "spec": {"template": {"spec": {"containers": [{"name": "diag", "image": "dcgm"}],
                    "tolerations": [{"key": "a", "operator": "Exists"}]}}}}),
            timeout: gpu_remediation_api::Duration::from_secs(60),
            new_nodes: None,
        }),
        diagnostics: None,
    }
}

fn at(second: i64) -> Timestamp {
    Timestamp::from_second(1_000_000 + second).unwrap()
}

fn created() -> ObjectReference {
    ObjectReference {
        api_version: "batch/v1".into(),
        kind: "Job".into(),
        name: "r-validate-reboot".into(),
        namespace: Some("ops".into()),
        uid: Some("u-1".into()),
    }
}

fn running() -> ValidationRecord {
    let (_, record) = gate(&rules(true), None, Some(&Ok(created())), None, at(0));
    record.expect("a record once the Job is created")
}

#[allow(
    clippy::unnecessary_wraps,
    reason = "the gate takes the acting layer's look as it comes, a Result"
)]
/// A Job as the acting layer saw it (the diagnostics' tests see Jobs alike).
pub(in crate::lifecycle) fn seen(reported: Reported, target: Presence) -> Result<Observation, Words> {
    Ok(Observation {
        target,
        node: Presence::Present,
        reported,
        replacement: ReplacementNode::NotExpected,
    })
}

#[test]
fn without_validation_the_evidence_alone_releases() {
    assert_eq!(
        gate(&rules(false), None, None, None, at(0)),
        (Gate::Release(None), None)
    );
}

#[test]
fn with_validation_the_job_is_asked_for_then_recorded_and_waited_on() {
    assert_eq!(gate(&rules(true), None, None, None, at(0)).0, Gate::Ask);
    let record = running();
    assert_eq!(
        (record.job.as_str(), record.namespace.as_str()),
        ("r-validate-reboot", "ops")
    );
    assert_eq!((record.outcome, record.start.0), (None, at(0)));
    let (verdict, kept) = gate(
        &rules(true),
        Some(&record),
        None,
        Some(&seen(Reported::InProgress, Presence::Present)),
        at(10),
    );
    assert!(
        matches!(verdict, Gate::Wait { deadline, .. } if deadline == at(60)),
        "{verdict:?}"
    );
    assert_eq!(kept, Some(record));
}

#[test]
fn a_job_that_completes_passes_with_its_duration() {
    let (verdict, kept) = gate(
        &rules(true),
        Some(&running()),
        None,
        Some(&seen(
            Reported::Done("condition Complete=True".into()),
            Presence::Present,
        )),
        at(7),
    );
    let kept = kept.unwrap();
    assert_eq!(
        (kept.outcome, kept.duration_seconds),
        (Some(ValidationOutcome::Passed), Some(7))
    );
    assert!(
        matches!(&verdict, Gate::Release(Some(words)) if words.contains("passed in 7s")),
        "{verdict:?}"
    );
}

#[test]
fn a_job_that_fails_or_is_deleted_is_evidence_against_the_step() {
    for (reported, target) in [
        (
            Reported::Failed("condition Failed=True".into()),
            Presence::Present,
        ),
        (Reported::InProgress, Presence::Gone),
    ] {
        let (verdict, kept) = gate(
            &rules(true),
            Some(&running()),
            None,
            Some(&seen(reported, target)),
            at(5),
        );
        assert_eq!(kept.unwrap().outcome, Some(ValidationOutcome::Failed));
        assert!(
            matches!(
                verdict,
                Gate::Against {
                    outcome: StepOutcome::Permanent,
                    ..
                }
            ),
            "{verdict:?}"
        );
    }
}

#[test]
fn a_job_silent_past_its_timeout_times_out_and_a_refused_look_waits_until_then() {
    let refused = Err(Words::answered("looking".into(), 503, "busy".into()));
    let (verdict, _) = gate(&rules(true), Some(&running()), None, Some(&refused), at(30));
    assert!(matches!(verdict, Gate::Refused(_)), "{verdict:?}");
    let (verdict, kept) = gate(&rules(true), Some(&running()), None, Some(&refused), at(60));
    assert_eq!(kept.unwrap().outcome, Some(ValidationOutcome::TimedOut));
    assert!(
        matches!(
            verdict,
            Gate::Against {
                outcome: StepOutcome::TimedOut,
                ..
            }
        ),
        "{verdict:?}"
    );
}

#[test]
fn the_job_is_pinned_to_the_node_tolerates_every_taint_and_runs_once_within_the_timeout() {
    let job = job_object(&rules(true), "gpu-node-1-abc", Some(Rung::Reboot)).unwrap();
    assert_eq!(job["metadata"]["name"], "gpu-node-1-abc-validate-reboot");
    let pod = &job["spec"]["template"]["spec"];
    assert_eq!(pod["nodeName"], "{{nodeName}}");
    assert_eq!(pod["restartPolicy"], "Never");
    assert_eq!(pod["tolerations"].as_array().unwrap().len(), 2);
    assert_eq!(pod["tolerations"][1], json!({"operator": "Exists"}));
    assert_eq!(job["spec"]["template"]["metadata"]["labels"][POD_LABEL], "true");
    assert_eq!(
        (
            job["spec"]["backoffLimit"].as_i64(),
            job["spec"]["activeDeadlineSeconds"].as_u64()
        ),
        (Some(0), Some(60))
    );
    assert_eq!(job["spec"]["ttlSecondsAfterFinished"], json!(86_400));
    let long = job_object(&rules(true), &"x".repeat(80), Some(Rung::ResetGpu)).unwrap();
    assert!(long["metadata"]["name"].as_str().unwrap().len() <= super::node_job::JOB_NAME_MAX);
    assert!(job_object(&rules(false), "r", Some(Rung::Reboot)).is_none());
    let stepless = job_object(&rules(true), "gpu-node-1-abc", None).unwrap();
    assert_eq!(stepless["metadata"]["name"], "gpu-node-1-abc-validate");
}
