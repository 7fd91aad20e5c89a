//! Diagnostics before destruction, pure: once the node is drained and before the first step
//! that destroys its state (a GPU reset, a reboot, a replacement: `DeleteNode`, `DeleteMachine`,
//! `DeleteNodeClaim` or a template), a policy with `spec.diagnostics` runs its Job on the node,
//! once per remediation, and the step waits until the Job completes, fails, or
//! `diagnostics.timeout` passes. Then the step goes on, whatever the Job did: diagnostics never
//! keep a broken node in service and never block its repair past their timeout. [`gate`] maps
//! the record, the server's answer to the create and the Job as observed to what the hand-over
//! does now; [`job_object`] renders the Job pinned to the node.
//!
//! The rules:
//! - once per remediation: `status.diagnostics` set (whatever its outcome) is never run again (an
//!   escalation to a later step, a drain re-entered, does not collect twice);
//! - only before a step that destroys: a ladder starting at `HandOff`, and `action: None`, run none;
//! - an unreachable node is not waited for: when the node's `Ready` condition is `Unknown` (its
//!   kubelet stopped reporting), no pod can run there; the record ends `Unreachable` at once, or as
//!   soon as the node turns unreachable while its Job runs;
//! - a create the server refuses for good, or keeps refusing until the timeout, ends `Failed`; a Job
//!   that could not be read is waited for up to the timeout, never longer.
//!
//! ```text
//! drained ─► no diagnostics, or not before a destroying step ───────────────► step
//!         └► Ready=Unknown ─────────────────────────────────── Unreachable ─► step
//!         └► Job created ─┬► Complete ───────────────────────── Collected ───► step
//!                         ├► Failed / deleted ───────────────── Failed ──────► step
//!                         └► past diagnostics.timeout ───────── TimedOut ────► step
//! ```

use gpu_remediation_api::{
    GpuRemediation, GpuRemediationStatus,
    constants::remediation_conditions,
    diagnostics::{DiagnosticsOutcome, DiagnosticsRecord, POD_LABEL},
    ladder::Rung,
    node_job::JobRecord,
    object_reference::ObjectReference,
    policy::Action,
    remediation::PolicySnapshot,
};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{ResourceExt, runtime::events::EventType};
use serde_json::Value;

use super::{
    Note, Words,
    node_job::{self, Reading},
};
use crate::{
    observe::NodeView,
    replace::Observation,
    time::{plus, signed},
};

/// Event reason: the diagnostics Job was created on the node.
pub const STARTED: &str = "DiagnosticsStarted";
/// Event reason: the diagnostics Job completed.
pub const COLLECTED: &str = "DiagnosticsCollected";
/// Event reason: the diagnostics ended without a collection (failed, timed out, unreachable).
pub const NOT_COLLECTED: &str = "DiagnosticsNotCollected";
/// The name a diagnostics Job gets after its remediation's.
pub const JOB_SUFFIX: &str = "-diagnostics";

/// What the hand-over does now.
#[derive(Clone, Debug, PartialEq)]
pub enum Gate {
    /// Go on with the step; `Some`: the run ended in this pass (its Event).
    Proceed(Option<Note>),
    /// Create the Job.
    Ask,
    /// The Job runs (or its create is retried): look again at the latest at `deadline`.
    Wait {
        /// For a person.
        message: String,
        /// The earliest of the next look and the time the wait ends.
        deadline: Timestamp,
        /// The Event of this pass (the Job created).
        note: Option<Note>,
    },
    /// The create was refused for now: ask again, at the latest at `deadline` (when a refusal
    /// still there ends the run `Failed`).
    Retry {
        /// The server's words.
        words: Words,
        /// The end of the wait.
        deadline: Timestamp,
    },
}

/// What the acting layer brought this pass: the server's answer to the Job's create, and the Job
/// as read.
pub type Looks<'a> = (
    Option<&'a Result<ObjectReference, Words>>,
    Option<&'a Result<Observation, Words>>,
);

/// Whether the step after the drain destroys the node's state: the ladder's first step unless it
/// is `HandOff`, else `action: Reboot` or `Replace`.
#[must_use]
pub fn before_destruction(remediation: &GpuRemediation, rules: &PolicySnapshot) -> bool {
    if rules.ladder.is_empty() {
        return remediation.spec.action != Action::None;
    }
    let first = rules.ladder[super::ladder_evidence::start_index(remediation, rules)].step;
    first != Rung::HandOff
}

/// Whether the node's kubelet stopped reporting (`Ready=Unknown`): no pod can run there.
#[must_use]
pub fn unreachable(node: &(impl NodeView + ?Sized)) -> bool {
    super::ladder_evidence::ready(node) == Some("Unknown")
}

/// When the drain ended: the wait for diagnostics counts from then.
fn drained_at(status: &GpuRemediationStatus, now: Timestamp) -> Timestamp {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == remediation_conditions::DRAINED && c.status == "True")
        .map_or(now, |c| c.last_transition_time.0)
}

/// The gate before the first destroying step of `remediation` on `node`: `status` holds the record
/// (if any), `answer` the server's answer to this pass's create, `observed` the Job as read this
/// pass. The record to keep comes back with what to do.
#[must_use]
pub fn gate(
    remediation: &GpuRemediation,
    rules: &PolicySnapshot,
    node: &(impl NodeView + ?Sized),
    status: &GpuRemediationStatus,
    (answer, observed): Looks<'_>,
    now: Timestamp,
) -> (Gate, Option<DiagnosticsRecord>) {
    let record = status.diagnostics.as_ref();
    let (Some(diagnostics), true) = (&rules.diagnostics, before_destruction(remediation, rules)) else {
        return (Gate::Proceed(None), record.cloned());
    };
    if record.is_some_and(|r| r.outcome.is_some()) {
        return (Gate::Proceed(None), record.cloned());
    }
    let timeout = diagnostics.timeout;
    let Some(record) = record else {
        let since = drained_at(status, now);
        let deadline = plus(since, signed(timeout.as_std()));
        let planned = || {
            let job = job_object(rules, &remediation.name_any()).unwrap_or(Value::Null);
            JobRecord {
                namespace: job
                    .pointer("/metadata/namespace")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                job: job
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                uid: None,
                start: Time(since),
                end: None,
                outcome: None,
                duration_seconds: None,
                message: None,
            }
        };
        if unreachable(node) {
            let what =
                "not run: the node is unreachable (Ready=Unknown), no pod can run there; not waited for";
            return end(&planned(), DiagnosticsOutcome::Unreachable, what, now);
        }
        return match answer {
            None => (Gate::Ask, None),
            Some(Ok(reference)) => {
                let record: DiagnosticsRecord = node_job::started(reference, now);
                let message = format!(
                    "diagnostics Job {}/{} runs on the node before its state is destroyed (at most until {})",
                    record.namespace,
                    record.job,
                    plus(now, signed(timeout.as_std()))
                );
                let started = Note::new(STARTED, EventType::Normal, &message);
                let deadline = plus(now, signed(timeout.as_std()));
                (
                    Gate::Wait {
                        message,
                        deadline,
                        note: Some(started),
                    },
                    Some(record),
                )
            }
            Some(Err(words)) if words.is_transient() && now < deadline => (
                Gate::Retry {
                    words: words.clone(),
                    deadline,
                },
                None,
            ),
            Some(Err(words)) => {
                let what = format!(
                    "could not be created: {} ({})",
                    words.message,
                    words.cause.describe()
                );
                end(&planned(), DiagnosticsOutcome::Failed, &what, now)
            }
        };
    };
    let deadline = plus(record.start.0, signed(timeout.as_std()));
    let judged = match node_job::reading(observed) {
        Reading::Complete(what) => Some((DiagnosticsOutcome::Collected, what)),
        Reading::Failed(what) => Some((DiagnosticsOutcome::Failed, what)),
        Reading::Running if unreachable(node) => Some((
            DiagnosticsOutcome::Unreachable,
            "the node turned unreachable (Ready=Unknown) while the Job ran; not waited for".to_owned(),
        )),
        Reading::Running if now >= deadline => Some((
            DiagnosticsOutcome::TimedOut,
            format!("reported nothing within diagnostics.timeout ({timeout})"),
        )),
        Reading::Running => None,
    };
    if let Some((outcome, what)) = judged {
        return end(record, outcome, &what, now);
    }
    let unread = match observed {
        Some(Err(words)) => format!(" (it could not be read: {})", words.message),
        _ => String::new(),
    };
    let message = format!(
        "diagnostics Job {}/{} runs since {}{unread}; the next step waits for it until {deadline} at the latest",
        record.namespace, record.job, record.start.0
    );
    (
        Gate::Wait {
            message,
            deadline,
            note: None,
        },
        Some(record.clone()),
    )
}

/// The run ended now: the record and its Event.
fn end(
    record: &DiagnosticsRecord,
    outcome: DiagnosticsOutcome,
    what: &str,
    now: Timestamp,
) -> (Gate, Option<DiagnosticsRecord>) {
    let ended = node_job::ended(record, outcome, what, now);
    let seconds = ended.duration_seconds.unwrap_or_default();
    let shown = format!("diagnostics Job {}/{}", ended.namespace, ended.job);
    let (reason, type_, text) = match outcome {
        DiagnosticsOutcome::Collected => (
            COLLECTED,
            EventType::Normal,
            format!("{shown} collected in {seconds}s ({what}); the repair goes on"),
        ),
        _ => (
            NOT_COLLECTED,
            EventType::Warning,
            format!("{shown} {outcome:?} after {seconds}s ({what}); the repair goes on without it"),
        ),
    };
    (Gate::Proceed(Some(Note::new(reason, type_, &text))), Some(ended))
}

/// The diagnostics Job for `remediation`: the policy's Job named `<remediation>-diagnostics`
/// unless it names itself, pinned to the node as `node_job::job_object` renders it, its pods
/// labelled [`POD_LABEL`].
#[must_use]
pub fn job_object(rules: &PolicySnapshot, remediation: &str) -> Option<Value> {
    let diagnostics = rules.diagnostics.as_ref()?;
    Some(node_job::job_object(
        &diagnostics.job,
        diagnostics.timeout.as_std(),
        remediation,
        JOB_SUFFIX,
        POD_LABEL,
    ))
}

#[cfg(test)]
#[path = "diagnostics_tests.rs"]
mod tests;
