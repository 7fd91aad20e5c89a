//! The replacement's decisions (`Replacing`, then `Verifying`): trigger it, record its object or
//! the server's refusal, judge what is seen of it, and end it. Every refusal counts against
//! `replacement.timeout` from the entry into `Replacing`; a node still standing when it succeeds
//! (a reboot) gets back what the remediation held.

use gpu_remediation_api::{
    GpuRemediationStatus, Phase,
    constants::{reasons, remediation_conditions},
    ladder::Rung,
    object_reference::ObjectReference,
    policy::Strategy,
    remediation::PolicySnapshot,
};
use jiff::Timestamp;
use kube::runtime::events::EventType;

use super::{
    Ask, CancelReason, Decision, Facts, Health, Identity, Next, Pass, Seen, Words, cancel, ladder_evidence,
    status::{self, set_condition},
    validation::{self, Gate},
};
use crate::{
    replace::{self, Progress, Verification},
    time::{plus, signed},
};

/// One step of `Replacing` or `Verifying` (not the held `action: None`).
pub(super) fn advance(pass: &Pass<'_, '_>, status: GpuRemediationStatus) -> Decision {
    let (_, rules, _, facts) = pass.parts();
    let triggered_at = status::deadline_base(&status, Phase::Replacing, facts.now);
    let deadline = plus(triggered_at, signed(rules.replacement.timeout.as_std()));
    if status.phase == Phase::Replacing || status.replacement.is_none() {
        return trigger(pass, status, deadline);
    }
    verify(pass, status, triggered_at, deadline)
}

/// Triggers the replacement and records its object, or the refusal.
fn trigger(pass: &Pass<'_, '_>, mut status: GpuRemediationStatus, deadline: Timestamp) -> Decision {
    let (remediation, rules, seen, facts) = pass.parts();
    let Some(answer) = &seen.answers.trigger else {
        // Never act on a machine that is not the one admitted; a template acts on the node by
        // name, so it needs the node itself to be there.
        match (facts.identity, rules.replacement.strategy) {
            (Identity::Replaced, _) => return cancel(facts, status, CancelReason::NodeReplaced),
            (Identity::Gone, Strategy::Template) => return cancel(facts, status, CancelReason::NodeGone),
            _ => return Decision::Ask(Ask::TriggerReplacement),
        }
    };
    match answer {
        Ok(reference) => {
            let message = format!(
                "replacement triggered ({:?}, {:?}): {}",
                remediation.spec.action,
                rules.replacement.strategy,
                describe(reference)
            );
            status.replacement = Some(reference.clone());
            triggered(status, &message, facts.now)
        }
        Err(words) => refused(pass, status, words, deadline),
    }
}

/// The object that carries the replacement (or a ladder step) out exists: say so, and judge it from
/// the next pass on.
pub(super) fn triggered(mut status: GpuRemediationStatus, message: &str, now: Timestamp) -> Decision {
    status.refusal = None;
    set_condition(
        &mut status,
        remediation_conditions::REPLACEMENT_TRIGGERED,
        true,
        "Triggered",
        message,
        now,
    );
    Decision::Settle(status::move_to(
        status,
        Phase::Verifying,
        message,
        reasons::PHASE_CHANGED,
        EventType::Normal,
        now,
        Next::At(now),
    ))
}

/// Judges what was seen of the replacement.
fn verify(
    pass: &Pass<'_, '_>,
    status: GpuRemediationStatus,
    triggered_at: Timestamp,
    deadline: Timestamp,
) -> Decision {
    let (_, rules, seen, facts) = pass.parts();
    let Some(observed) = seen.replacement else {
        // The acting layer looks at the replacement in every `Verifying` pass.
        return Decision::Settle(status::unchanged(status, false, Next::At(facts.now)));
    };
    let observation = match observed {
        Ok(observation) => observation,
        Err(words) => return refused(pass, status, words, deadline),
    };
    match judged(
        rules,
        facts,
        observation,
        triggered_at,
        rules.replacement.timeout.as_std(),
    ) {
        Progress::Waiting { message } => waiting(status, message, seen, facts, deadline),
        Progress::Succeeded { message }
            if rules.replacement.strategy == Strategy::Template
                && matches!(facts.identity, Identity::Same(_)) =>
        {
            standing(pass, status, &message, deadline)
        }
        Progress::Succeeded { message } => replaced(status, message, facts),
        Progress::GoneUnseen { message } => gone_unseen(status, &message, facts),
        Progress::Failed { reason, message } => Decision::Settle(fail(status, reason, &message, facts.now)),
    }
}

/// A template's evidence (its object reported done, or the trigger cleared) on a node that still
/// stands is not proof: the node is released only once it has been healthy for
/// `release.healthyFor` with every failed GPU listed in its inventory again, and, with
/// `spec.validation`, once the validation Job passed (see `lifecycle::validation`). A Job that
/// fails ends the remediation `Failed`, the node cordoned; no proof within `replacement.timeout`
/// likewise.
fn standing(
    pass: &Pass<'_, '_>,
    mut status: GpuRemediationStatus,
    evidence: &str,
    deadline: Timestamp,
) -> Decision {
    let (remediation, rules, seen, facts) = pass.parts();
    let Identity::Same(node) = facts.identity else {
        unreachable!("judged standing only when the admitted node stands")
    };
    let release_at = facts.release_at();
    let listed = ladder_evidence::inventory_uuids(node);
    let silent: Vec<&str> = ladder_evidence::failed_gpus(remediation)
        .iter()
        .filter(|gpu| !listed.contains(&gpu.uuid))
        .map(|gpu| gpu.uuid.as_str())
        .collect();
    let lacking = match release_at {
        None => Some("the node is not healthy".to_owned()),
        Some(at) if at > facts.now => Some(format!("the node must stay healthy until {at}")),
        Some(_) if !silent.is_empty() => Some(format!(
            "{} not listed in the node's GPU inventory",
            silent.join(", ")
        )),
        Some(_) => None,
    };
    if let Some(lacking) = lacking {
        if facts.now >= deadline {
            let message = format!("{evidence}, but no proof within replacement.timeout: {lacking}");
            return Decision::Settle(fail(
                status,
                replace::verify::REPLACEMENT_TIMEOUT,
                &message,
                facts.now,
            ));
        }
        // Looked at again by the deadline, and when the node has been healthy long enough.
        let by = release_at
            .filter(|at| *at > facts.now)
            .map_or(deadline, |at| at.min(deadline));
        let message = format!("{evidence}; the node stays cordoned: {lacking}");
        return waiting(status, message, seen, facts, by);
    }
    let gate = validation::gate_seen(rules, &mut status.validation, seen, facts.now);
    match gate {
        Gate::Release(None) => replaced(status, evidence.to_owned(), facts),
        Gate::Release(Some(words)) => replaced(status, format!("{evidence}; {words}"), facts),
        Gate::Ask => Decision::Ask(Ask::Validate(Some(Rung::Reboot))),
        Gate::Refused(words) => refused(pass, status, &words, deadline),
        Gate::Against { message, .. } => Decision::Settle(fail(
            status,
            replace::verify::REPLACEMENT_FAILED,
            &format!("{evidence}; {message}"),
            facts.now,
        )),
        Gate::Wait { message, deadline } => waiting(status, message, seen, facts, deadline),
    }
}

/// `action: None`, the node healthy for `release.healthyFor` by itself: released at once, or, with
/// `spec.validation`, once the validation Job passed (a trigger that cleared is evidence, not
/// proof). A Job that fails, outlasts its timeout, or whose create is refused for good ends the
/// remediation `Failed` (`ValidationFailed`), the node cordoned for a person.
pub(super) fn recovered_unaided(pass: &Pass<'_, '_>, mut status: GpuRemediationStatus) -> Decision {
    const RECOVERED: &str = "action None: the node recovered and stayed healthy for release.healthyFor";
    let (_, rules, seen, facts) = pass.parts();
    let gate = validation::gate_seen(rules, &mut status.validation, seen, facts.now);
    let failed = |status: GpuRemediationStatus, message: &str| {
        Decision::Settle(fail(status, reasons::VALIDATION_FAILED, message, facts.now))
    };
    match gate {
        Gate::Release(words) => Decision::Settle(status::succeed(
            status,
            facts.release(false),
            &match words {
                None => format!("{RECOVERED}; released what we held"),
                Some(words) => format!("{RECOVERED}; {words}; released what we held"),
            },
            reasons::NODE_RECOVERED,
            facts.now,
        )),
        Gate::Ask => Decision::Ask(Ask::Validate(None)),
        Gate::Wait { message, deadline } => waiting(status, message, seen, facts, deadline),
        Gate::Against { message, .. } => failed(status, &format!("{RECOVERED}; {message}")),
        Gate::Refused(words) => {
            // Asked again, backed off, until the validation's own timeout past the recovery.
            let timeout = rules.validation.as_ref().map(|v| signed(v.timeout.as_std()));
            let deadline = facts
                .release_at()
                .zip(timeout)
                .map_or(facts.now, |(at, timeout)| plus(at, timeout));
            super::weigh_refusal(facts, seen, status, &words, deadline, |status, _| {
                failed(
                    status,
                    &format!("{RECOVERED}; {} was refused: {}", words.action, words.message),
                )
            })
        }
    }
}

/// The replacement's progress from what was seen: the node healthy only if it is the one admitted
/// and recovered. Shared by the plain replacement and the ladder's `Replace` step.
pub(super) fn judged(
    rules: &PolicySnapshot,
    facts: &Facts<'_>,
    observation: &replace::Observation,
    triggered_at: Timestamp,
    timeout: std::time::Duration,
) -> Progress {
    let node_healthy =
        matches!(facts.identity, Identity::Same(_)) && matches!(facts.health, Health::Recovered(_));
    replace::judge(&Verification {
        strategy: rules.replacement.strategy,
        observation,
        node_healthy,
        triggered_at,
        timeout,
        now: facts.now,
    })
}

/// Still waiting for the replacement: `message` in the status, looked at again after the poll
/// interval (or at `deadline`).
pub(super) fn waiting(
    mut status: GpuRemediationStatus,
    message: String,
    seen: &Seen<'_>,
    facts: &Facts<'_>,
    deadline: Timestamp,
) -> Decision {
    status.message = Some(message);
    status.refusal = None;
    let next = Next::At(plus(facts.now, seen.pace.replacement_poll)).or_at(Some(deadline));
    Decision::Settle(status::unchanged(status, false, next))
}

/// Replaced: `Succeeded`, releasing what the remediation holds on a node that stands.
pub(super) fn replaced(status: GpuRemediationStatus, message: String, facts: &Facts<'_>) -> Decision {
    let release = facts.release(false);
    let message = if release.is_some() {
        format!("{message}; the node stands and was released")
    } else {
        message
    };
    Decision::Settle(status::succeed(
        status,
        release,
        &message,
        replace::verify::REPLACED,
        facts.now,
    ))
}

/// `DeleteNode` ended with the node gone and no replacement seen: the record ends (it holds
/// nothing on a node that is gone) with reason `ReplacementNotSeen` in its `Complete` condition,
/// which slow start does not count as a success.
pub(super) fn gone_unseen(status: GpuRemediationStatus, message: &str, facts: &Facts<'_>) -> Decision {
    Decision::Settle(status::succeed(
        status,
        facts.release(false),
        message,
        replace::verify::REPLACEMENT_NOT_SEEN,
        facts.now,
    ))
}

/// Records a refused trigger or look; past `replacement.timeout` the remediation fails with the
/// server's words.
fn refused(
    pass: &Pass<'_, '_>,
    status: GpuRemediationStatus,
    words: &Words,
    deadline: Timestamp,
) -> Decision {
    let (_, rules, seen, facts) = pass.parts();
    super::weigh_refusal(facts, seen, status, words, deadline, |status, since| {
        let (reason, message) = match since {
            None => (
                replace::verify::REPLACEMENT_FAILED,
                format!(
                    "{} was refused: {} ({}); not asked again",
                    words.action,
                    words.message,
                    words.cause.describe()
                ),
            ),
            Some(since) => (
                replace::verify::REPLACEMENT_TIMEOUT,
                format!(
                    "the replacement did not finish within replacement.timeout ({}): {} was refused since {since}: {}",
                    rules.replacement.timeout, words.action, words.message
                ),
            ),
        };
        Decision::Settle(fail(status, reason, &message, facts.now))
    })
}

/// Ends the remediation `Failed`: the node stays cordoned, and the status says who must act.
fn fail(status: GpuRemediationStatus, reason: &str, message: &str, now: Timestamp) -> super::Settlement {
    let message = format!(
        "{message}. The node stays cordoned: a person must look at it (uncordon it once it is fixed, \
         or remove it); deleting this record also releases it"
    );
    status::move_to(
        status,
        Phase::Failed,
        &message,
        reason,
        EventType::Warning,
        now,
        Next::Idle,
    )
}

fn describe(reference: &ObjectReference) -> String {
    let name = reference
        .namespace
        .as_ref()
        .map_or_else(|| reference.name.clone(), |ns| format!("{ns}/{}", reference.name));
    format!("{} {name}", reference.kind)
}
