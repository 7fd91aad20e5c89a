//! The escalation ladder's decisions, after the drain (policies with `spec.ladder`; without one
//! the `replacement` module decides as it always did). The open step is the last of
//! `status.steps`; `Replacing` means its request is still to be made, `Verifying` that its
//! evidence is being judged:
//!
//! ```text
//! hand-over ─► step (Replacing) ─ object created ─► step (Verifying) ─┬─ evidence ─► Succeeded (released)
//!                                                                      └─ failure, fault back within
//!                                                                         the dwell, timeout ─► next step
//! HandOff ─► node labelled ─► ManualRequired (cordon kept, GPUs named)   no step left ─► Failed
//! ```
//!
//! - `ResetGpu` succeeds only when every failed GPU answers again in the agent's inventory under
//!   its UUID and the node has stayed healthy for `release.healthyFor`;
//! - `Reboot` only when `status.nodeInfo.bootID` changed, the node is `Ready`, and it has stayed
//!   healthy for the dwell (an object reporting done without a new boot ID is no proof);
//! - `Replace` as the replacement's verdict says (`replace::judge`).
//!
//! A step's object reporting failure, the fault coming back after the node was seen healthy in
//! the step, a refusal the server means (a 4xx other than 409/429), or the step's timeout ends it
//! and the next step starts. Transient refusals are retried within the step's timeout.

use gpu_remediation_api::{
    GpuRemediation, GpuRemediationStatus, Phase,
    constants::remediation_conditions,
    ladder::{HAND_OFF_LABEL, LadderStep, Rung, StepOutcome, StepRecord},
    policy::Strategy,
    remediation::PolicySnapshot,
};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::events::EventType;

use super::ladder_record::new_record;
pub(super) use super::ladder_record::{close, open};
pub use super::ladder_record::{handed_off, looked_at, newly_ended, replaced};
use super::{
    Ask, CancelReason, Decision, Facts, Health, Identity, Next, Pass, Settlement, Words, cancel,
    ladder_evidence::{self as evidence, boot_id, is_ready},
    replacement,
    status::{self, set_condition},
    validation::{self, Gate},
};
use crate::{
    replace::{self, Progress},
    time::{plus, signed},
};

/// Event reason: a step ended without proof and the next one starts.
pub const STEP_ESCALATED: &str = "StepEscalated";
/// Why a reset's drain took every pod of the node: which pods hold the failed GPU is not known.
pub const WHOLE_NODE_DRAINED: &str = "GPU-to-pod mapping unknown: whole node drained";
/// How the scope of a reset's drain limited to the failed GPU's pods begins.
pub const GPU_SCOPED: &str = "GPU-scoped drain";
/// Event reason: the last rung handed the node to a person.
pub const HANDED_OFF: &str = "HandedOff";

/// The record of the step that starts now: the first one at hand-over.
pub(super) fn first_step(remediation: &GpuRemediation, rules: &PolicySnapshot, now: Timestamp) -> StepRecord {
    let index = evidence::start_index(remediation, rules);
    new_record(rules.ladder[index].step, now)
}

/// One pass of the ladder in `Replacing` or `Verifying`.
pub(super) fn advance(pass: &Pass<'_, '_>, mut status: GpuRemediationStatus) -> Decision {
    let (remediation, rules, seen, facts) = pass.parts();
    let pass = &Pass {
        remediation,
        rules,
        seen,
        facts,
    };
    if status.steps.last().is_none_or(|s| s.end.is_some()) {
        // A status written by hand (or before the ladder): start where the trigger says.
        open(&mut status, first_step(remediation, rules, facts.now));
    }
    let record = status.steps.last().cloned().expect("a step is open");
    let Some(step) = evidence::step_of(rules, record.step).cloned() else {
        let message = format!("the ladder has no step {}", record.step);
        return escalate(pass, status, StepOutcome::Permanent, &message);
    };
    let deadline = plus(record.start.0, signed(step.timeout.as_std()));
    match facts.identity {
        Identity::Replaced if record.step != Rung::Replace => {
            return supersede(facts, status, CancelReason::NodeReplaced);
        }
        Identity::Gone if record.step != Rung::Replace => {
            return supersede(facts, status, CancelReason::NodeGone);
        }
        _ => {}
    }
    // `Verifying` without the step's object (a phase written by hand) asks for it first.
    let triggered = status.phase == Phase::Verifying
        && if record.step == Rung::Replace {
            status.replacement.is_some()
        } else {
            record.object.is_some()
        };
    match record.step {
        Rung::HandOff => hand_off(pass, status, deadline),
        _ if !triggered => trigger(pass, status, deadline),
        Rung::Replace => judge_replacement(pass, status, &step),
        Rung::ResetGpu | Rung::Reboot => judge_repair(pass, status, &record, deadline),
    }
}

/// The admitted machine is no longer there: the open step ends `Superseded` and the remediation is
/// cancelled for `reason`.
fn supersede(facts: &Facts<'_>, mut status: GpuRemediationStatus, reason: CancelReason) -> Decision {
    close(&mut status, StepOutcome::Superseded, reason.message(), facts.now);
    cancel(facts, status, reason)
}

/// Asks for the step's object (or the replacement), and records it or the refusal.
fn trigger(pass: &Pass<'_, '_>, mut status: GpuRemediationStatus, deadline: Timestamp) -> Decision {
    let (_, rules, seen, facts) = pass.parts();
    let rung = status.current_step.unwrap_or(Rung::Replace);
    let answer = if rung == Rung::Replace {
        &seen.answers.trigger
    } else {
        &seen.answers.step
    };
    let Some(answer) = answer else {
        // Never act on a machine that is not the one admitted (a template acts on the node by name).
        match (facts.identity, rules.replacement.strategy) {
            (Identity::Replaced, _) => return supersede(facts, status, CancelReason::NodeReplaced),
            (Identity::Gone, Strategy::Template) => return supersede(facts, status, CancelReason::NodeGone),
            _ => {}
        }
        return Decision::Ask(if rung == Rung::Replace {
            Ask::TriggerReplacement
        } else {
            Ask::TriggerStep(rung)
        });
    };
    match answer {
        Ok(reference) => {
            let message = format!(
                "step {rung}: {} {} created; judging it by its evidence",
                reference.kind, reference.name
            );
            let before_boot = match facts.identity {
                Identity::Same(node) => boot_id(node).map(str::to_owned),
                Identity::Replaced | Identity::Gone => None,
            };
            if let Some(open) = status.steps.last_mut() {
                open.object = Some(reference.clone());
                open.evidence.boot_id_before = before_boot;
            }
            if rung == Rung::Replace {
                status.replacement = Some(reference.clone());
            }
            replacement::triggered(status, &message, facts.now)
        }
        Err(words) => refused(pass, status, words, deadline),
    }
}

/// A refused request or look: retried within the step while it may pass, else the step ends.
fn refused(
    pass: &Pass<'_, '_>,
    status: GpuRemediationStatus,
    words: &Words,
    deadline: Timestamp,
) -> Decision {
    let (_, _, seen, facts) = pass.parts();
    super::weigh_refusal(
        facts,
        seen,
        status,
        words,
        deadline,
        |status, since| match since {
            None => {
                let message = format!(
                    "{} was refused: {} ({})",
                    words.action,
                    words.message,
                    words.cause.describe()
                );
                escalate(pass, status, StepOutcome::Permanent, &message)
            }
            Some(since) => {
                let message = format!(
                    "{} was refused since {since} until the step's timeout: {}",
                    words.action, words.message
                );
                escalate(pass, status, StepOutcome::Transient, &message)
            }
        },
    )
}

/// Judges a reset or a reboot by its object and the node's evidence.
#[allow(
    clippy::too_many_lines,
    reason = "one verdict per kind of evidence, in the order a person would check them"
)]
fn judge_repair(
    pass: &Pass<'_, '_>,
    mut status: GpuRemediationStatus,
    record: &StepRecord,
    deadline: Timestamp,
) -> Decision {
    let (remediation, rules, seen, facts) = pass.parts();
    let Identity::Same(node) = facts.identity else {
        unreachable!("a repair step on a node that is not the admitted one was cancelled above")
    };
    let observation = match seen.replacement {
        None => return Decision::Settle(status::unchanged(status, false, Next::At(facts.now))),
        Some(Err(words)) => return refused(pass, status, words, deadline),
        Some(Ok(observation)) => observation,
    };
    let rung = record.step;
    let object = record
        .object
        .as_ref()
        .map_or_else(|| "its object".to_owned(), |o| format!("{} {}", o.kind, o.name));
    match &observation.reported {
        replace::Reported::Failed(what) => {
            let message = format!("{object} reported {what}");
            return escalate(pass, status, StepOutcome::Permanent, &message);
        }
        replace::Reported::Nothing | replace::Reported::InProgress
            if observation.target == replace::Presence::Gone =>
        {
            let message = format!("{object} was deleted before it reported done");
            return escalate(pass, status, StepOutcome::Permanent, &message);
        }
        replace::Reported::Done(_) | replace::Reported::Nothing | replace::Reported::InProgress => {}
    }
    let done = matches!(observation.reported, replace::Reported::Done(_));
    let dwell = facts.healthy_for;
    let healthy_since = match facts.health {
        Health::Broken => {
            if record.evidence.healthy_since.is_some() {
                let message = "the fault came back within release.healthyFor after the node was healthy";
                return escalate(pass, status, StepOutcome::Permanent, message);
            }
            None
        }
        Health::Recovered(since) => Some(since.map_or(record.start.0, |s| s.max(record.start.0))),
    };
    // The open step's record, its evidence written as it is judged.
    let open = status.steps.last_mut().expect("a step is open");
    open.evidence.dwell_seconds = u32::try_from(dwell.as_secs()).ok();
    // What the step still lacks, in the words a person reads.
    let mut lacking = None;
    match rung {
        Rung::ResetGpu => {
            let listed = evidence::inventory_uuids(node);
            let failed = evidence::failed_gpus(remediation);
            open.evidence.gpus_answering = failed
                .iter()
                .filter(|gpu| listed.contains(&gpu.uuid))
                .map(|gpu| gpu.uuid.clone())
                .collect();
            let silent: Vec<&str> = failed
                .iter()
                .filter(|gpu| !listed.contains(&gpu.uuid))
                .map(|gpu| gpu.uuid.as_str())
                .collect();
            if failed.is_empty() {
                lacking = Some("the fault named no GPU, so no GPU can be seen answering".to_owned());
            } else if !silent.is_empty() {
                lacking = Some(format!(
                    "{} does not answer in the agent's inventory yet",
                    silent.join(", ")
                ));
            }
        }
        Rung::Reboot => {
            let now_boot = boot_id(node).map(str::to_owned);
            open.evidence.boot_id_after.clone_from(&now_boot);
            match (&record.evidence.boot_id_before, &now_boot) {
                (Some(before), Some(after)) if before != after => {}
                (None, _) => lacking = Some("the node reported no boot ID before the reboot".to_owned()),
                _ if done => {
                    lacking = Some(format!(
                        "{object} reported done but the node's boot ID did not change: no reboot is proven"
                    ));
                }
                _ => lacking = Some("the node's boot ID has not changed yet".to_owned()),
            }
            if lacking.is_none() && !is_ready(node) {
                lacking = Some("the rebooted node is not Ready yet".to_owned());
            }
        }
        Rung::Replace | Rung::HandOff => unreachable!("judged elsewhere"),
    }
    if lacking.is_none()
        && let Some(since) = healthy_since
    {
        match &open.evidence.healthy_since {
            // Healthy again since a later time: the fault came and went between two looks.
            Some(seen_since) if since > seen_since.0 => {
                let message = "the fault came back within release.healthyFor after the node was healthy";
                return escalate(pass, status, StepOutcome::Permanent, message);
            }
            Some(_) => {}
            None => open.evidence.healthy_since = Some(Time(since)),
        }
    }
    let proven_at = open
        .evidence
        .healthy_since
        .as_ref()
        .map(|since| plus(since.0, dwell));
    if let Some(at) = proven_at
        && lacking.is_none()
        && at <= facts.now
    {
        let gate = validation::gate_seen(rules, &mut open.evidence.validation, seen, facts.now);
        let validated = match gate {
            Gate::Release(words) => words,
            Gate::Ask => return Decision::Ask(Ask::Validate(Some(rung))),
            Gate::Refused(words) => {
                return refused(pass, status, &words, deadline);
            }
            Gate::Against { outcome, message } => {
                return escalate(pass, status, outcome, &message);
            }
            Gate::Wait { message, deadline } => {
                return replacement::waiting(
                    status,
                    format!("step {rung}: {message}"),
                    seen,
                    facts,
                    deadline,
                );
            }
        };
        let proven = match rung {
            Rung::ResetGpu => format!(
                "reset proven: {} answering under the same UUID and the node healthy for {}",
                open.evidence.gpus_answering.join(", "),
                rules.release.healthy_for
            ),
            _ => format!(
                "reboot proven: boot ID {} → {}, the node Ready and healthy for {}",
                open.evidence.boot_id_before.as_deref().unwrap_or("?"),
                open.evidence.boot_id_after.as_deref().unwrap_or("?"),
                rules.release.healthy_for
            ),
        };
        let message = match validated {
            Some(words) => format!("{proven}; {words}"),
            None => proven,
        };
        close(&mut status, StepOutcome::Succeeded, &message, facts.now);
        let release = facts.release(false);
        return Decision::Settle(status::succeed(
            status,
            release,
            &format!("{message}; the node was released"),
            replace::verify::REPLACED,
            facts.now,
        ));
    }
    if facts.now >= deadline {
        let message = format!(
            "no proof within the step's timeout: {}",
            lacking
                .as_deref()
                .unwrap_or("the node was not healthy for the dwell")
        );
        return escalate(pass, status, StepOutcome::TimedOut, &message);
    }
    let message = match (&lacking, proven_at) {
        (Some(lacking), _) => format!("step {rung}: {lacking}"),
        (None, Some(at)) => format!("step {rung}: proof seen; the node must stay healthy until {at}"),
        (None, None) => format!("step {rung}: waiting for the node to be healthy again"),
    };
    status.message = Some(message);
    status.refusal = None;
    let next = Next::At(plus(facts.now, seen.pace.replacement_poll))
        .or_at(Some(deadline))
        .or_at(proven_at.filter(|_| lacking.is_none()));
    Decision::Settle(status::unchanged(status, false, next))
}

/// Judges the `Replace` step with the replacement's verdict, bounded by the step's timeout.
fn judge_replacement(pass: &Pass<'_, '_>, mut status: GpuRemediationStatus, step: &LadderStep) -> Decision {
    let (_, rules, seen, facts) = pass.parts();
    let record = status.steps.last().cloned().expect("a step is open");
    let deadline = plus(record.start.0, signed(step.timeout.as_std()));
    let observation = match seen.replacement {
        None => return Decision::Settle(status::unchanged(status, false, Next::At(facts.now))),
        Some(Err(words)) => return refused(pass, status, words, deadline),
        Some(Ok(observation)) => observation,
    };
    match replacement::judged(rules, facts, observation, record.start.0, step.timeout.as_std()) {
        Progress::Waiting { message } => {
            replacement::waiting(status, format!("step Replace: {message}"), seen, facts, deadline)
        }
        Progress::Succeeded { message } => {
            close(&mut status, StepOutcome::Succeeded, &message, facts.now);
            replacement::replaced(status, message, facts)
        }
        Progress::GoneUnseen { message } => {
            close(&mut status, StepOutcome::Succeeded, &message, facts.now);
            replacement::gone_unseen(status, &message, facts)
        }
        Progress::Failed { reason, message } => {
            let outcome = if reason == replace::verify::REPLACEMENT_TIMEOUT {
                StepOutcome::TimedOut
            } else {
                StepOutcome::Permanent
            };
            escalate(pass, status, outcome, &message)
        }
    }
}

/// The last rung: label the node for a person, keep the cordon, end `ManualRequired` naming the
/// GPUs. A label the server keeps refusing is retried within the step; past its timeout the
/// remediation still ends `ManualRequired`, saying the label is missing.
fn hand_off(pass: &Pass<'_, '_>, mut status: GpuRemediationStatus, deadline: Timestamp) -> Decision {
    let (remediation, _, seen, facts) = pass.parts();
    let Some(answer) = &seen.answers.hand_off else {
        return Decision::Ask(Ask::HandOff(facts.node.clone()));
    };
    let gpus = evidence::name_gpus(remediation);
    let labelled = match answer {
        Ok(()) => format!("labelled {HAND_OFF_LABEL}=true"),
        Err(words) if facts.now < deadline && words.is_transient() => {
            let refusal = status::refusal(&status, words, facts.now);
            let next = super::retry_at(facts, seen, &refusal, deadline);
            return Decision::Settle(status::refused(status, refusal, next));
        }
        Err(words) => format!("the {HAND_OFF_LABEL} label could not be set ({})", words.message),
    };
    let message = format!(
        "handed off to a person: no step of the ladder repaired the node. It stays cordoned and {labelled}. \
         GPUs: {gpus}. Uncordon it once it is fixed, or remove it; deleting this record also releases it"
    );
    close(&mut status, StepOutcome::Succeeded, &message, facts.now);
    status.refusal = None;
    let mut settled = status::move_to(
        status,
        Phase::ManualRequired,
        &message,
        HANDED_OFF,
        EventType::Warning,
        facts.now,
        Next::Idle,
    );
    settled.drop_finalizer = false;
    Decision::Settle(settled)
}

/// Ends the open step with `outcome` and starts the next; with no step left the remediation
/// fails as a replacement that failed does (the node stays cordoned for a person).
fn escalate(
    pass: &Pass<'_, '_>,
    mut status: GpuRemediationStatus,
    outcome: StepOutcome,
    why: &str,
) -> Decision {
    let (_, rules, _, facts) = pass.parts();
    let from = status.current_step;
    close(&mut status, outcome, why, facts.now);
    status.refusal = None;
    let next = from.and_then(|rung| rules.ladder.iter().find(|s| s.step > rung));
    let Some(next) = next else {
        let message = format!(
            "step {} ended {outcome:?} ({why}) and the ladder has no step left. The node stays cordoned: a person \
             must look at it (uncordon it once it is fixed, or remove it); deleting this record also releases it",
            from.map_or("?", Rung::as_str)
        );
        return Decision::Settle(status::move_to(
            status,
            Phase::Failed,
            &message,
            replace::verify::REPLACEMENT_FAILED,
            EventType::Warning,
            facts.now,
            Next::Idle,
        ));
    };
    let message = format!(
        "step {} ended {outcome:?} ({why}); escalating to {}",
        from.map_or("?", Rung::as_str),
        next.step
    );
    open(&mut status, new_record(next.step, facts.now));
    status.replacement = None;
    let scoped = status
        .drain
        .as_ref()
        .and_then(|d| d.scope.as_deref())
        .is_some_and(|s| s.starts_with(GPU_SCOPED));
    if scoped && matches!(next.step, Rung::Reboot | Rung::Replace) {
        // The reset's drain took only the failed GPU's pods: the node's other pods leave now.
        let message = format!("{message}; the whole node is drained first");
        status.drain = None;
        set_condition(
            &mut status,
            remediation_conditions::DRAINED,
            false,
            STEP_ESCALATED,
            "the next step needs the whole node",
            facts.now,
        );
        let mut settled = status::move_to(
            status,
            Phase::Draining,
            &message,
            STEP_ESCALATED,
            EventType::Warning,
            facts.now,
            Next::At(facts.now),
        );
        settled.drop_finalizer = false;
        return Decision::Settle(settled);
    }
    let mut settled: Settlement = status::move_to(
        status,
        Phase::Replacing,
        &message,
        STEP_ESCALATED,
        EventType::Warning,
        facts.now,
        Next::At(facts.now),
    );
    settled.drop_finalizer = false;
    Decision::Settle(settled)
}
