//! The replacement's decisions (`Replacing`, then `Verifying`): trigger it, record its object or
//! the server's refusal, judge what is seen of it, and end it. Every refusal counts against
//! `replacement.timeout` from the entry into `Replacing`; a node still standing when it succeeds
//! (a reboot) gets back what the remediation held.

use gpu_remediation_api::{
    GpuRemediation, GpuRemediationStatus, Phase,
    constants::{reasons, remediation_conditions},
    object_reference::ObjectReference,
    policy::Strategy,
    remediation::PolicySnapshot,
};
use jiff::Timestamp;
use kube::runtime::events::EventType;

use super::{
    Ask, CancelReason, Decision, Facts, Health, Identity, Next, Pass, Seen, Words, cancel,
    status::{self, set_condition},
};
use crate::{
    replace::{self, Progress, Verification},
    time::{plus, signed},
};

/// One step of `Replacing` or `Verifying` (not the held `action: None`).
pub(super) fn advance(pass: &Pass<'_, '_>, status: GpuRemediationStatus) -> Decision {
    let (remediation, rules, seen, facts) = pass.parts();
    let triggered_at = status::deadline_base(&status, Phase::Replacing, facts.now);
    let deadline = plus(triggered_at, signed(rules.replacement.timeout.as_std()));
    if status.phase == Phase::Replacing || status.replacement.is_none() {
        return trigger(remediation, rules, seen, facts, status, deadline);
    }
    verify(rules, seen, facts, status, triggered_at, deadline)
}

/// Triggers the replacement and records its object, or the refusal.
fn trigger(
    remediation: &GpuRemediation,
    rules: &PolicySnapshot,
    seen: &Seen<'_>,
    facts: &Facts<'_>,
    mut status: GpuRemediationStatus,
    deadline: Timestamp,
) -> Decision {
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
        Err(words) => refused(rules, seen, facts, status, words, deadline),
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
    rules: &PolicySnapshot,
    seen: &Seen<'_>,
    facts: &Facts<'_>,
    status: GpuRemediationStatus,
    triggered_at: Timestamp,
    deadline: Timestamp,
) -> Decision {
    let Some(observed) = seen.replacement else {
        // The acting layer looks at the replacement in every `Verifying` pass.
        return Decision::Settle(status::unchanged(status, false, Next::At(facts.now)));
    };
    let observation = match observed {
        Ok(observation) => observation,
        Err(words) => return refused(rules, seen, facts, status, words, deadline),
    };
    match judged(
        rules,
        facts,
        observation,
        triggered_at,
        rules.replacement.timeout.as_std(),
    ) {
        Progress::Waiting { message } => waiting(status, message, seen, facts, deadline),
        Progress::Succeeded { message } => replaced(status, message, facts),
        Progress::GoneUnseen { message } => gone_unseen(status, &message, facts),
        Progress::Failed { reason, message } => Decision::Settle(fail(status, reason, &message, facts.now)),
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
    rules: &PolicySnapshot,
    seen: &Seen<'_>,
    facts: &Facts<'_>,
    mut status: GpuRemediationStatus,
    words: &Words,
    deadline: Timestamp,
) -> Decision {
    let refusal = status::refusal(&status, words, facts.now);
    if !words.is_transient() {
        let message = format!(
            "{} was refused: {} ({}); not asked again",
            words.action,
            words.message,
            words.cause.describe()
        );
        status.refusal = Some(refusal);
        return Decision::Settle(fail(
            status,
            replace::verify::REPLACEMENT_FAILED,
            &message,
            facts.now,
        ));
    }
    if facts.now >= deadline {
        let message = format!(
            "the replacement did not finish within replacement.timeout ({}): {} was refused since {}: {}",
            rules.replacement.timeout, words.action, refusal.since.0, words.message
        );
        status.refusal = Some(refusal);
        return Decision::Settle(fail(
            status,
            replace::verify::REPLACEMENT_TIMEOUT,
            &message,
            facts.now,
        ));
    }
    let next = super::retry_at(facts, seen, &refusal, deadline);
    Decision::Settle(status::refused(status, refusal, next))
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
