//! Validation before release, pure: once a repair shows its evidence, a policy with
//! `spec.validation` runs its Job on the node, and only the Job's success lets the node back into
//! service; a Job that fails, is deleted, or outlasts `validation.timeout` is evidence against the
//! repair. [`gate`] maps the open record, the server's answer to the create and the Job as
//! observed to the next step; [`job_object`] renders the Job pinned to the node.
//!
//! ```text
//! evidence ─► no validation ─────────────────────────────────► release
//!          └► Job created ─► Complete ───────────────────────► release (record: Job, Passed, seconds)
//!                         └► Failed / deleted / past timeout ─► evidence against the step (ladder climbs)
//! ```

use gpu_remediation_api::{
    ladder::{Rung, StepOutcome},
    object_reference::ObjectReference,
    remediation::PolicySnapshot,
    text::truncate,
    validation::{MESSAGE_MAX, POD_LABEL, ValidationOutcome, ValidationRecord},
};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};

use super::Words;
use crate::{
    replace::{Observation, Presence, Reported},
    time::{plus, signed},
};

/// The longest a validation Job's name may be (its pods carry it in the `job-name` label).
const JOB_NAME_MAX: usize = 63;

/// What the gate says now.
#[derive(Clone, Debug, PartialEq)]
pub enum Gate {
    /// Release: no validation is configured (`None`), or the Job passed (its words).
    Release(Option<String>),
    /// Create the Job.
    Ask,
    /// The Job runs: look again at the latest at this time.
    Wait {
        /// For a person.
        message: String,
        /// When the Job's time is up.
        deadline: Timestamp,
    },
    /// The create, or a look at the Job, was refused: weighed as a step's refusal.
    Refused(Words),
    /// The Job failed or timed out: evidence against the step.
    Against {
        /// `Permanent` for a failure, `TimedOut` past the timeout.
        outcome: StepOutcome,
        /// Why, for a person.
        message: String,
    },
}

/// The gate for a step whose evidence is in: `record` is the validation it runs (if any),
/// `answer` the server's answer to this pass's create, `observed` the Job as read this pass. The
/// record to keep comes back with the verdict.
#[must_use]
pub fn gate(
    rules: &PolicySnapshot,
    record: Option<&ValidationRecord>,
    answer: Option<&Result<ObjectReference, Words>>,
    observed: Option<&Result<Observation, Words>>,
    now: Timestamp,
) -> (Gate, Option<ValidationRecord>) {
    let Some(validation) = &rules.validation else {
        return (Gate::Release(None), None);
    };
    let timeout = signed(validation.timeout.as_std());
    let Some(record) = record else {
        return match answer {
            None => (Gate::Ask, None),
            Some(Err(words)) => (Gate::Refused(words.clone()), None),
            Some(Ok(reference)) => {
                let record = ValidationRecord {
                    namespace: reference.namespace.clone().unwrap_or_default(),
                    job: reference.name.clone(),
                    uid: reference.uid.clone(),
                    start: Time(now),
                    end: None,
                    outcome: None,
                    duration_seconds: None,
                    message: None,
                };
                let message = format!(
                    "validation Job {}/{} created; the node stays cordoned until it passes",
                    record.namespace, record.job
                );
                (
                    Gate::Wait {
                        message,
                        deadline: plus(now, timeout),
                    },
                    Some(record),
                )
            }
        };
    };
    let shown = format!("validation Job {}/{}", record.namespace, record.job);
    let deadline = plus(record.start.0, timeout);
    let ended = |outcome, what: String| {
        let mut ended = record.clone();
        ended.end = Some(Time(now));
        ended.outcome = Some(outcome);
        ended.duration_seconds = u32::try_from(now.duration_since(record.start.0).as_secs()).ok();
        ended.message = Some(truncate(&what, MESSAGE_MAX));
        ended
    };
    if let Some(outcome) = record.outcome {
        // Judged in an earlier pass (a status written between two of its looks).
        let what = record.message.clone().unwrap_or_default();
        return (verdict(&shown, outcome, record, &what), Some(record.clone()));
    }
    let judged = match observed {
        Some(Ok(observation)) => match &observation.reported {
            Reported::Done(what) => Some((ValidationOutcome::Passed, format!("reported {what}"))),
            Reported::Failed(what) => Some((ValidationOutcome::Failed, format!("reported {what}"))),
            Reported::Nothing | Reported::InProgress if observation.target == Presence::Gone => Some((
                ValidationOutcome::Failed,
                "was deleted before it reported".to_owned(),
            )),
            Reported::Nothing | Reported::InProgress => None,
        },
        Some(Err(_)) | None => None,
    };
    let judged = judged.or_else(|| {
        (now >= deadline).then(|| {
            (
                ValidationOutcome::TimedOut,
                format!(
                    "reported nothing within validation.timeout ({})",
                    validation.timeout
                ),
            )
        })
    });
    if let Some((outcome, what)) = judged {
        let ended = ended(outcome, what.clone());
        return (verdict(&shown, outcome, &ended, &what), Some(ended));
    }
    if let Some(Err(words)) = observed {
        return (Gate::Refused(words.clone()), Some(record.clone()));
    }
    let message = format!(
        "{shown} runs since {}; the node stays cordoned until it passes",
        record.start.0
    );
    (Gate::Wait { message, deadline }, Some(record.clone()))
}

fn verdict(shown: &str, outcome: ValidationOutcome, record: &ValidationRecord, what: &str) -> Gate {
    let seconds = record.duration_seconds.unwrap_or_default();
    match outcome {
        ValidationOutcome::Passed => Gate::Release(Some(format!("{shown} passed in {seconds}s ({what})"))),
        ValidationOutcome::Failed => Gate::Against {
            outcome: StepOutcome::Permanent,
            message: format!("{shown} failed after {seconds}s ({what}): the repair is not proven"),
        },
        ValidationOutcome::TimedOut => Gate::Against {
            outcome: StepOutcome::TimedOut,
            message: format!("{shown} {what}: the repair is not proven"),
        },
    }
}

/// How long a finished validation Job (and its pod, with its log) stays for a person to read
/// before the Job controller removes it (`ttlSecondsAfterFinished`): the record keeps its outcome,
/// and the lifecycle has read it long before (a Job gone before its outcome was read counts as a
/// failed validation, never as a pass).
pub const FINISHED_JOB_KEPT: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// The validation Job for `remediation`'s step `rung`: the policy's Job named
/// `<remediation>-validate-<step>` unless it names itself, its pod pinned to the node
/// (`nodeName: {{nodeName}}`, rendered with the template), tolerating every taint (the node is
/// cordoned and tainted by us), never restarted, one try unless the Job says otherwise, bounded by
/// the timeout, removed by the Job controller [`FINISHED_JOB_KEPT`] after it finished unless it
/// says otherwise, and labelled [`POD_LABEL`].
#[must_use]
pub fn job_object(rules: &PolicySnapshot, remediation: &str, rung: Rung) -> Option<Value> {
    let validation = rules.validation.as_ref()?;
    let mut job = validation.job.clone();
    let unnamed = job
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty);
    if unnamed {
        let suffix = format!("-validate-{}", rung.as_str().to_ascii_lowercase());
        let room = JOB_NAME_MAX.saturating_sub(suffix.len());
        let stem: String = remediation.chars().take(room).collect();
        job["metadata"]["name"] = json!(format!("{}{suffix}", stem.trim_end_matches(['-', '.'])));
    }
    let spec = &mut job["spec"];
    if spec.get("backoffLimit").is_none() {
        spec["backoffLimit"] = json!(0);
    }
    if spec.get("activeDeadlineSeconds").is_none() {
        spec["activeDeadlineSeconds"] = json!(validation.timeout.as_std().as_secs().max(1));
    }
    if spec.get("ttlSecondsAfterFinished").is_none() {
        spec["ttlSecondsAfterFinished"] = json!(FINISHED_JOB_KEPT.as_secs());
    }
    let template = &mut spec["template"];
    template["metadata"]["labels"][POD_LABEL] = json!("true");
    let pod = &mut template["spec"];
    pod["nodeName"] = json!(gpu_remediation_api::constants::template_placeholders::NODE_NAME);
    pod["restartPolicy"] = json!("Never");
    let tolerations = &mut pod["tolerations"];
    if !tolerations.is_array() {
        *tolerations = json!([]);
    }
    if let Value::Array(list) = tolerations {
        list.push(json!({"operator": "Exists"}));
    }
    Some(job)
}

/// The reference to look at the Job `record` names.
#[must_use]
pub fn reference(record: &ValidationRecord) -> ObjectReference {
    ObjectReference {
        api_version: "batch/v1".to_owned(),
        kind: "Job".to_owned(),
        name: record.job.clone(),
        namespace: Some(record.namespace.clone()),
        uid: record.uid.clone(),
    }
}

#[cfg(test)]
#[path = "validation_tests.rs"]
mod tests;
