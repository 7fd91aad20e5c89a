//! The remediation lifecycle as a pure function: from a `GpuRemediation` (its spec, status and
//! the person's marks on it), the policy rules it was admitted under, what was seen of its node,
//! pods, budgets and replacement, the answers the server gave to this pass's requests, and the
//! time, [`decide`] returns either one more request to put to the server ([`Ask`]) or how the
//! pass ends ([`Settlement`]: the new status, what to give back, the Events, when to look again).
//!
//! No IO here and no clock: `remediation` observes, carries out asks and settlements, and writes.
//! A request's answer comes back as part of [`Seen::answers`], so the same function decides what
//! it means; the property test in `lifecycle::paths` drives it through random worlds.
//!
//! ```text
//! Pending ─┬─ DryRun mode ──────────────────────────────► DryRun (terminal, nothing changed)
//!          ├─ Manual mode ─► AwaitingApproval ─ approved ─┐
//!          └──────────────────────────────────────────────┴─► Cordoned ─► Draining ─┬─► (Blocked) ─┐
//!                                                                                    └─────────────┴─► hand-over
//! before hand-over: node gone or re-created (NodeReplaced), uncordoned by a person, recovered
//!   for release.healthyFor, record deleted (a person's cancel) ─► Cancelled
//! born past maxAttemptsPerNode: Pending ─► ManualRequired (nothing touched)
//! hand-over, action None: ─► Verifying (held) ─► Succeeded (recovered, or a person uncordoned)
//! hand-over, Replace/Reboot: ─► Replacing ─► Verifying ─► Succeeded (a standing node released) | Failed
//! ```
//!
//! Every phase in flight has a deadline from the policy snapshot: a cordon refused past
//! `drain.timeout` fails; a drain past `drain.timeout` follows `onTimeout` (and `Blocked` says who
//! must act); a replacement refused or unfinished past `replacement.timeout` fails.

mod decision;
pub mod diagnostics;
mod drain;
pub mod eviction_round;
pub mod ladder;
pub mod ladder_evidence;
mod ladder_record;
pub mod node_job;
pub mod note;
#[cfg(test)]
mod paths;
pub mod provenance;
#[cfg(test)]
mod recovery_tests;
#[cfg(test)]
mod refusal_tests;
mod replacement;
mod seen;
pub mod status;
pub mod validation;

use gpu_remediation_api::{
    GpuRemediation, GpuRemediationStatus, Phase,
    constants::{
        APPROVED_ANNOTATION, APPROVED_BY_ANNOTATION, ATTEMPTS_EXHAUSTED_ANNOTATION, REMEDIATION_FINALIZER,
        reasons,
    },
    policy::Mode,
    remediation::{PolicySnapshot, Refusal},
};
use jiff::{SignedDuration, Timestamp};
use kube::{ResourceExt, runtime::events::EventType};

use crate::{
    cordon,
    detect::{self, Verdict},
    time::{plus, signed},
};

pub use crate::cordon::{Cordon, NodeRef};
pub use decision::{Ask, CancelReason, Decision, Next, Release, Settlement};
pub use note::Note;
pub use seen::{Answers, CordonAnswer, EvictionAnswer, Health, Identity, Pace, Seen, Words};

/// The facts about the record and its node that every phase reads.
pub(crate) struct Facts<'a> {
    pub(crate) name: String,
    pub(crate) node: NodeRef,
    pub(crate) identity: Identity<'a>,
    pub(crate) health: Health,
    pub(crate) healthy_for: SignedDuration,
    pub(crate) now: Timestamp,
}

impl Facts<'_> {
    /// Who holds the cordon of the admitted node (`None` when it is not standing).
    pub(crate) fn cordon(&self) -> Option<Cordon> {
        match self.identity {
            Identity::Same(node) => Some(cordon::cordon_of(node, &self.name)),
            Identity::Replaced | Identity::Gone => None,
        }
    }

    /// When a recovered node is due for release, if it recovered.
    pub(crate) fn release_at(&self) -> Option<Timestamp> {
        match self.health {
            Health::Recovered(Some(since)) => Some(plus(since, self.healthy_for)),
            Health::Recovered(None) => Some(self.now),
            Health::Broken => None,
        }
    }

    /// Whether a person uncordoned the admitted node while it still carries our taint or notes:
    /// they took it over, and what we hold on it must go before they cordon it again (or ours
    /// would read as theirs).
    pub(crate) fn taken_over(&self) -> bool {
        match self.identity {
            Identity::Same(node) => {
                !cordon::is_unschedulable(node)
                    && (cordon::has_taint(node) || node.any_annotation(&mut |_, by| by == self.name))
            }
            Identity::Replaced | Identity::Gone => false,
        }
    }

    /// A release of the admitted node.
    pub(crate) fn release(&self, remember_cancel: bool) -> Option<Release> {
        matches!(self.identity, Identity::Same(_)).then(|| Release {
            node: self.node.clone(),
            remember_cancel,
        })
    }
}

/// The one decision for `remediation` now.
#[must_use]
pub fn decide(
    remediation: &GpuRemediation,
    rules: Option<&PolicySnapshot>,
    seen: &Seen<'_>,
    now: Timestamp,
) -> Decision {
    match decide_step(remediation, rules, seen, now) {
        Decision::Settle(mut settled) => {
            record_approval(remediation, &mut settled.status, now);
            if settled.status.phase == Phase::Succeeded && settled.status.time_to_recovery_seconds.is_none() {
                settled.status.time_to_recovery_seconds = remediation
                    .spec
                    .trigger
                    .since
                    .as_ref()
                    .and_then(|since| u64::try_from(now.duration_since(since.0).as_secs()).ok());
            }
            Decision::Settle(settled)
        }
        ask @ Decision::Ask(_) => ask,
    }
}

/// Records who approved the remediation, and when the controller first saw it, once.
fn record_approval(remediation: &GpuRemediation, status: &mut GpuRemediationStatus, now: Timestamp) {
    if status::approved(remediation) && status.approved_at.is_none() {
        status.approved_by = remediation.annotations().get(APPROVED_BY_ANNOTATION).cloned();
        status.approved_at = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now));
    }
}

fn decide_step(
    remediation: &GpuRemediation,
    rules: Option<&PolicySnapshot>,
    seen: &Seen<'_>,
    now: Timestamp,
) -> Decision {
    let status = remediation.status.clone().unwrap_or_default();
    let phase = status.phase;
    let deleting = remediation.metadata.deletion_timestamp.is_some();
    let has_finalizer = remediation
        .finalizers()
        .iter()
        .any(|f| f == REMEDIATION_FINALIZER);
    let facts = facts(remediation, rules, seen, now);
    if phase == Phase::Failed || ladder::handed_off(&status) {
        // A hand-off keeps the node cordoned for a person, as a failure does.
        return Decision::Settle(failed(&facts, status, deleting && has_finalizer));
    }
    if phase.is_terminal() {
        // ManualRequired is not finished for good: a person's approval brings it back through the
        // budget, so it keeps its finalizer until it is deleted.
        let drop = has_finalizer && (phase != Phase::ManualRequired || deleting);
        return Decision::Settle(status::unchanged(status, drop, Next::Idle));
    }
    if deleting {
        return cancel(&facts, status, CancelReason::DeletedByPerson);
    }
    let Some(rules) = rules else {
        return cancel(&facts, status, CancelReason::PolicyGone);
    };
    let pass = &Pass {
        remediation,
        rules,
        seen,
        facts: &facts,
    };
    match phase {
        Phase::Pending | Phase::AwaitingApproval | Phase::Cordoned | Phase::Draining | Phase::Blocked => {
            before_hand_over(pass, status)
        }
        Phase::Replacing | Phase::Verifying if !rules.ladder.is_empty() => {
            // A person uncordoned the node mid-step: let go of it at once.
            let_go_if_taken_over(ladder::advance(pass, status), &facts)
        }
        Phase::Verifying if remediation.spec.action == gpu_remediation_api::policy::Action::None => {
            held(pass, status)
        }
        Phase::Replacing | Phase::Verifying => {
            // A person uncordoned the node mid-replacement: let go of it at once.
            let_go_if_taken_over(replacement::advance(pass, status), &facts)
        }
        Phase::DryRun | Phase::Succeeded | Phase::Failed | Phase::ManualRequired | Phase::Cancelled => {
            unreachable!("terminal phases return above")
        }
    }
}

fn facts<'a>(
    remediation: &GpuRemediation,
    rules: Option<&PolicySnapshot>,
    seen: &Seen<'a>,
    now: Timestamp,
) -> Facts<'a> {
    let uid = remediation.spec.node_uid.clone();
    let identity = match seen.node {
        None => Identity::Gone,
        Some(node) if uid.is_some() && node.node_uid() != uid.as_deref() => Identity::Replaced,
        Some(node) => Identity::Same(node),
    };
    let health = match (identity, rules) {
        (Identity::Same(node), Some(rules)) => {
            match detect::evaluate(node.conditions(), &rules.triggers, now) {
                Verdict::Healthy { since } => Health::Recovered(since),
                Verdict::Pending { .. } | Verdict::Unhealthy { .. } => Health::Broken,
            }
        }
        _ => Health::Broken,
    };
    Facts {
        name: remediation.name_any(),
        node: NodeRef {
            name: remediation.spec.node_name.clone(),
            uid,
        },
        identity,
        health,
        healthy_for: rules.map_or(SignedDuration::ZERO, |r| signed(r.release.healthy_for.as_std())),
        now,
    }
}

/// Ends the remediation `Cancelled`, giving back what it holds on a node still standing.
pub(crate) fn cancel(facts: &Facts<'_>, mut status: GpuRemediationStatus, why: CancelReason) -> Decision {
    let before = status.phase;
    ladder::close(
        &mut status,
        gpu_remediation_api::ladder::StepOutcome::Superseded,
        why.message(),
        facts.now,
    );
    status::enter(&mut status, Phase::Cancelled, why.message(), facts.now);
    status::set_condition(
        &mut status,
        gpu_remediation_api::constants::remediation_conditions::COMPLETE,
        true,
        why.reason(),
        why.message(),
        facts.now,
    );
    if status::has_condition(
        &status,
        gpu_remediation_api::constants::remediation_conditions::CORDONED,
    ) {
        status::set_condition(
            &mut status,
            gpu_remediation_api::constants::remediation_conditions::CORDONED,
            false,
            why.reason(),
            "released",
            facts.now,
        );
    }
    status.refusal = None;
    let release = if why.releases() {
        facts.release(why == CancelReason::DeletedByPerson)
    } else {
        None
    };
    Decision::Settle(Settlement {
        release,
        notes: vec![Note::phase(before, &status, why.reason(), EventType::Normal)],
        status,
        drop_finalizer: true,
        next: Next::Idle,
    })
}

/// What one decision is made from, threaded through the phases' steps: the record, its rules,
/// what was seen and the facts drawn from them.
#[derive(Clone, Copy)]
struct Pass<'p, 'a> {
    remediation: &'p GpuRemediation,
    rules: &'p PolicySnapshot,
    seen: &'p Seen<'a>,
    facts: &'p Facts<'a>,
}

impl<'p, 'a> Pass<'p, 'a> {
    /// The four, in the order the struct names them.
    fn parts(
        &self,
    ) -> (
        &'p GpuRemediation,
        &'p PolicySnapshot,
        &'p Seen<'a>,
        &'p Facts<'a>,
    ) {
        (self.remediation, self.rules, self.seen, self.facts)
    }
}

/// `decision`, releasing the node at once if a person took it over (uncordoned it) meanwhile.
fn let_go_if_taken_over(decision: Decision, facts: &Facts<'_>) -> Decision {
    match decision {
        Decision::Settle(mut settled) if settled.release.is_none() && facts.taken_over() => {
            settled.release = facts.release(false);
            Decision::Settle(settled)
        }
        other => other,
    }
}

/// Everything before the hand-over: cordon, drain, and the ways it stops early.
fn before_hand_over(pass: &Pass<'_, '_>, mut status: GpuRemediationStatus) -> Decision {
    let (remediation, rules, seen, facts) = pass.parts();
    let phase = status.phase;
    match facts.identity {
        Identity::Gone => return cancel(facts, status, CancelReason::NodeGone),
        Identity::Replaced => return cancel(facts, status, CancelReason::NodeReplaced),
        Identity::Same(_) => {}
    }
    let cordoned_phase = matches!(phase, Phase::Cordoned | Phase::Draining | Phase::Blocked);
    if cordoned_phase && facts.cordon() == Some(Cordon::None) {
        return cancel(facts, status, CancelReason::UncordonedByPerson);
    }
    let release_at = facts.release_at();
    if release_at.is_some_and(|at| at <= facts.now) {
        // A recovery is evidence, not proof: with a validation, only its pass releases the node;
        // while it runs, or once it failed, the drain (and the ladder after it) goes on.
        let mut record = status.validation.clone();
        let gate = validation::gate_seen(rules, &mut record, seen, facts.now);
        status.validation = record;
        match gate {
            validation::Gate::Release(_) => return cancel(facts, status, CancelReason::Recovered),
            validation::Gate::Ask => return Decision::Ask(Ask::Validate(None)),
            validation::Gate::Wait { .. }
            | validation::Gate::Refused(_)
            | validation::Gate::Against { .. } => {}
        }
    }
    let approved = status::approved(remediation);
    match phase {
        Phase::Pending if status::awaits_person_past_attempts(remediation) => {
            Decision::Settle(require_manual(remediation, facts, status))
        }
        Phase::Pending if remediation.spec.mode == Mode::DryRun => drain::dry_run(seen, facts, status),
        Phase::Pending if remediation.spec.mode == Mode::Manual && !approved => {
            let message = format!(
                "waiting for a person to approve: kubectl gpu approve {0} (or kubectl annotate gpuremediation {0} \
                 {APPROVED_ANNOTATION}=true {APPROVED_BY_ANNOTATION}=<your user name>; approving needs the verb \
                 approve on gpuremediations)",
                facts.name
            );
            Decision::Settle(status::move_to(
                status,
                Phase::AwaitingApproval,
                &message,
                reasons::PHASE_CHANGED,
                EventType::Normal,
                facts.now,
                Next::Idle,
            ))
        }
        Phase::AwaitingApproval if !approved => {
            Decision::Settle(status::unchanged(status, false, Next::Idle))
        }
        Phase::Pending | Phase::AwaitingApproval => cordon_step(rules, seen, facts, status),
        _ => drain::advance(pass, status, release_at),
    }
}

/// The status of a record created past `maxAttemptsPerNode`: how many attempts in which window,
/// and how a person lets it proceed. Nothing is touched.
fn require_manual(
    remediation: &GpuRemediation,
    facts: &Facts<'_>,
    status: GpuRemediationStatus,
) -> Settlement {
    let why = remediation
        .annotations()
        .get(ATTEMPTS_EXHAUSTED_ANNOTATION)
        .map_or("this node used up maxAttemptsPerNode", String::as_str);
    let message = format!(
        "{why}. Nothing was touched. To proceed: kubectl gpu approve {0} (or kubectl annotate gpuremediation {0} \
         {APPROVED_ANNOTATION}=true {APPROVED_BY_ANNOTATION}=<your user name>); it then starts like an admitted \
         remediation, within maxConcurrent, rate and maxUnhealthy; or fix the node and leave this record",
        facts.name
    );
    status::move_to(
        status,
        Phase::ManualRequired,
        &message,
        reasons::ATTEMPTS_EXHAUSTED,
        EventType::Warning,
        facts.now,
        Next::Idle,
    )
}

/// Asks for the cordon, then records its answer. A refused cordon is retried, shown in status
/// and an Event, and fails the remediation once `drain.timeout` has passed since admission.
fn cordon_step(
    rules: &PolicySnapshot,
    seen: &Seen<'_>,
    facts: &Facts<'_>,
    mut status: GpuRemediationStatus,
) -> Decision {
    let Some(answer) = &seen.answers.cordon else {
        return Decision::Ask(Ask::Cordon(facts.node.clone()));
    };
    match answer {
        CordonAnswer::NodeGone => cancel(facts, status, CancelReason::NodeGone),
        CordonAnswer::NodeReplaced => cancel(facts, status, CancelReason::NodeReplaced),
        CordonAnswer::Cordoned { theirs } => {
            let message = if *theirs {
                "the node was already cordoned by someone else; it stays theirs, we added our taint"
            } else {
                "unschedulable and tainted by this remediation"
            };
            status.refusal = None;
            status::set_condition(
                &mut status,
                gpu_remediation_api::constants::remediation_conditions::CORDONED,
                true,
                "Cordoned",
                message,
                facts.now,
            );
            if status.policy_generation.is_none() {
                status.policy_generation = rules.generation;
            }
            // The drain starts in the next advance, in the loop's carrying lane.
            Decision::Settle(status::move_to(
                status,
                Phase::Cordoned,
                message,
                reasons::PHASE_CHANGED,
                EventType::Normal,
                facts.now,
                Next::At(facts.now),
            ))
        }
        CordonAnswer::Refused(words) => {
            let admitted = status::admitted_at(&status).unwrap_or(facts.now);
            let deadline = plus(admitted, signed(rules.drain.timeout.as_std()));
            weigh_refusal(facts, seen, status, words, deadline, |status, since| {
                let message = match since {
                    None => format!(
                        "the node could not be cordoned: {} ({}); a person must look at it",
                        words.message,
                        words.cause.describe()
                    ),
                    Some(_) => format!(
                        "the node could not be cordoned within drain.timeout ({}): {}; a person must look at it",
                        rules.drain.timeout, words.message
                    ),
                };
                Decision::Settle(status::move_to(
                    status,
                    Phase::Failed,
                    &message,
                    "CordonRefused",
                    EventType::Warning,
                    facts.now,
                    Next::Idle,
                ))
            })
        }
    }
}

/// Weighs a refused request: one refused for good (`give_up` gets `None`) or still refused at
/// `deadline` (`give_up` gets when the refusal began) is given up, with the refusal kept in the
/// status; else it is asked again at [`retry_at`].
pub(crate) fn weigh_refusal(
    facts: &Facts<'_>,
    seen: &Seen<'_>,
    mut status: GpuRemediationStatus,
    words: &Words,
    deadline: Timestamp,
    give_up: impl FnOnce(GpuRemediationStatus, Option<Timestamp>) -> Decision,
) -> Decision {
    let refusal = status::refusal(&status, words, facts.now);
    if !words.is_transient() || facts.now >= deadline {
        let since = words.is_transient().then_some(refusal.since.0);
        status.refusal = Some(refusal);
        return give_up(status, since);
    }
    let next = retry_at(facts, seen, &refusal, deadline);
    Decision::Settle(status::refused(status, refusal, next))
}

/// When a transiently refused request is asked again: backed off exponentially (with jitter, up
/// to `retry::CAP`) since the refusal began, from the replacement poll, and never after `deadline`.
pub(crate) fn retry_at(facts: &Facts<'_>, seen: &Seen<'_>, refusal: &Refusal, deadline: Timestamp) -> Next {
    let failing_for = facts.now.duration_since(refusal.since.0);
    let wait = crate::retry::backoff_since(seen.pace.replacement_poll, failing_for, &facts.name);
    Next::At(plus(facts.now, wait)).or_at(Some(deadline))
}

/// A `Failed` remediation keeps the node cordoned for a person. It gives back what it holds when
/// the person deletes the record, and lifts its taint when the person uncordons the node (they
/// took it over).
fn failed(facts: &Facts<'_>, status: GpuRemediationStatus, deleted: bool) -> Settlement {
    let mut settled = status::unchanged(status, deleted, Next::Idle);
    if deleted || facts.taken_over() {
        settled.release = facts.release(false);
    }
    settled
}

/// A drained `action: None` remediation holding its node: it ends `Succeeded` when the node
/// recovers for `release.healthyFor` (and, with `spec.validation`, passes the Job:
/// [`replacement::recovered_unaided`]) or a person uncordons it, and waits for them otherwise.
fn held(pass: &Pass<'_, '_>, status: GpuRemediationStatus) -> Decision {
    let facts = pass.facts;
    let cordon = match facts.identity {
        Identity::Gone => return cancel(facts, status, CancelReason::NodeGone),
        Identity::Replaced => return cancel(facts, status, CancelReason::NodeReplaced),
        Identity::Same(_) => facts.cordon(),
    };
    if cordon == Some(Cordon::None) {
        return Decision::Settle(status::succeed(
            status,
            facts.release(false),
            "action None: a person released the node (uncordoned it); finished",
            reasons::UNCORDONED_BY_PERSON,
            facts.now,
        ));
    }
    match facts.release_at() {
        Some(at) if at <= facts.now => replacement::recovered_unaided(pass, status),
        at => Decision::Settle(status::unchanged(status, false, Next::Idle.or_at(at))),
    }
}

/// A [`Refusal`] worded by the server, kept from when it first started.
pub(crate) fn dated(words: &Words, since: Timestamp) -> Refusal {
    Refusal {
        action: words.action.clone(),
        code: words.code(),
        message: words.message.clone(),
        since: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(since),
    }
}
