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
    validation::{POD_LABEL, ValidationOutcome, ValidationRecord},
};
use jiff::Timestamp;
use serde_json::Value;

pub use super::node_job::{FINISHED_JOB_KEPT, reference};
use super::{
    Words,
    node_job::{self, Reading},
};
use crate::{
    replace::Observation,
    time::{plus, signed},
};

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

/// [`gate`] on what this pass saw (the answer to its create, the Job as read), the record it
/// returns kept in `record`.
pub(super) fn gate_seen(
    rules: &PolicySnapshot,
    record: &mut Option<ValidationRecord>,
    seen: &super::Seen<'_>,
    now: Timestamp,
) -> Gate {
    let (gate, kept) = gate(
        rules,
        record.as_ref(),
        seen.answers.validation.as_deref(),
        seen.validation,
        now,
    );
    *record = kept;
    gate
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
                let record: ValidationRecord = node_job::started(reference, now);
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
    if let Some(outcome) = record.outcome {
        // Judged in an earlier pass (a status written between two of its looks).
        let what = record.message.clone().unwrap_or_default();
        return (verdict(&shown, outcome, record, &what), Some(record.clone()));
    }
    let judged = match node_job::reading(observed) {
        Reading::Complete(what) => Some((ValidationOutcome::Passed, what)),
        Reading::Failed(what) => Some((ValidationOutcome::Failed, what)),
        Reading::Running => None,
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
        let ended = node_job::ended(record, outcome, &what, now);
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

/// The validation Job for `remediation`'s step `rung` (or, with none, for a recovery no step made):
/// the policy's Job named `<remediation>-validate-<step>` (`<remediation>-validate`) unless it
/// names itself, its pod pinned to the node
/// (`nodeName: {{nodeName}}`, rendered with the template), tolerating every taint (the node is
/// cordoned and tainted by us), never restarted, one try unless the Job says otherwise, bounded by
/// the timeout, removed by the Job controller [`FINISHED_JOB_KEPT`] after it finished unless it
/// says otherwise, and labelled [`POD_LABEL`].
#[must_use]
pub fn job_object(rules: &PolicySnapshot, remediation: &str, rung: Option<Rung>) -> Option<Value> {
    let validation = rules.validation.as_ref()?;
    let suffix = match rung {
        Some(rung) => format!("-validate-{}", rung.as_str().to_ascii_lowercase()),
        None => "-validate".to_owned(),
    };
    Some(node_job::job_object(
        &validation.job,
        validation.timeout.as_std(),
        remediation,
        &suffix,
        POD_LABEL,
    ))
}

#[cfg(test)]
#[path = "validation_tests.rs"]
pub(super) mod tests;
