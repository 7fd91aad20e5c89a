//! The drain's decisions: which pods to ask to leave now, what the server's answers mean for the
//! status (progress and blockers, in the server's words), the verdict against `drain.timeout`,
//! `onTimeout`, and the hand-over once the node is empty. Also the dry run's record.
//!
//! A drain ends when every pod that had to leave is gone, with one exception (`unreachable`):
//! while the node's `Ready` condition is `Unknown`, a pod already terminating whose
//! `deletionTimestamp` is more than `drain.unreachableAfter` in the past counts as gone (no
//! kubelet will report it gone); a pod not yet terminating is still evicted under its budget, and
//! on a node whose `Ready` is `True` or `False` every pod is waited for.

use std::collections::{BTreeSet, HashMap};

use gpu_remediation_api::{
    GpuRemediation, GpuRemediationStatus, Phase,
    constants::{reasons, remediation_conditions},
    policy::{Action, OnDrainTimeout, Strategy},
    remediation::{Blocker, DrainStatus, PolicySnapshot},
};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::events::EventType;

mod blockers;
mod dry_run;
mod force;
pub(super) mod notice;
mod unreachable;

use super::{
    Ask, Decision, EvictionAnswer, Facts, Identity, Next, Note, Pass, Seen, Settlement,
    diagnostics::{self, Gate},
    eviction_round,
    status::{self, enter, set_condition},
};
use crate::{
    drain::{Leaving, Plan},
    time::{plus, signed},
};
use blockers::{blocked_by, blocker, budgets_named, waiting_for};
pub(super) use dry_run::dry_run;
use force::force_delete;

/// One step of a drain in `Cordoned`, `Draining` or `Blocked`.
pub(super) fn advance(
    pass: &Pass<'_, '_>,
    mut status: GpuRemediationStatus,
    release_at: Option<Timestamp>,
) -> Decision {
    let (remediation, rules, seen, facts) = pass.parts();
    let now = facts.now;
    if status::has_true(&status, remediation_conditions::DRAINED) {
        let before = status.phase;
        return diagnosed_hand_over(pass, status, before, Vec::new());
    }
    let Some(plan) = seen.pods else {
        // The acting layer lists pods for every draining phase; without them, look again.
        return Decision::Settle(status::unchanged(status, false, Next::At(now)));
    };
    let grace = grace_period(rules);
    // Asked in this step, answered or not: never asked twice.
    let asked: BTreeSet<&str> = seen
        .answers
        .evictions
        .iter()
        .map(|(p, _)| p.uid.as_str())
        .chain(seen.answers.evictions_unanswered.iter().map(String::as_str))
        .collect();
    // The checkpoint notice first: pods wanting it get it before any of them is evicted; those
    // given it wait for their window (see `notice`).
    let (window, waiting) = match notice::of_pass(plan, rules, &status, seen.answers, now) {
        notice::Step::Give { pods, evict_at } => return Decision::Ask(Ask::Notice { pods, evict_at }),
        notice::Step::Evict { window, waiting } => (window, waiting),
    };
    let round = eviction_round::plan(
        plan.to_evict()
            .filter(|pod| !asked.contains(pod.uid.as_str()) && !waiting.contains(&pod.uid)),
        &eviction_round::Room {
            budgets: seen.budgets,
            in_flight: seen.in_flight,
            asked_at: seen.asked_at,
            backoff: seen.pace.eviction_backoff,
            now,
        },
    );
    let due = round.send;
    if !due.is_empty() {
        return Decision::Ask(Ask::Evict { pods: due, grace });
    }

    let before = status.phase;
    let mut notes = Vec::new();
    if before == Phase::Cordoned {
        enter(
            &mut status,
            Phase::Draining,
            "evicting pods through the Eviction API",
            now,
        );
        notes.push(Note::phase(
            before,
            &status,
            reasons::PHASE_CHANGED,
            EventType::Normal,
        ));
    }
    let mut drained = record_answers(
        plan,
        seen,
        &round.held,
        &status.drain.clone().unwrap_or_default(),
        (crate::drain::cost::fault_began(remediation, now), now),
    );
    if !rules.ladder.is_empty() {
        for_the_step(&mut drained, seen, status.drain.as_ref());
    }
    drained.notice_since = window.since.map(Time);
    let skipped = unreachable::skipped(rules, plan, facts);
    drained.pods_remaining = drained.pods_remaining.saturating_sub(skipped.count);
    let remaining = drained.pods_remaining;
    status.drain = Some(drained);
    let skipped_said = unreachable::said(&skipped, rules);

    let started = status::deadline_base(&status, Phase::Draining, now);
    let deadline = plus(started, signed(rules.drain.timeout.as_std()));
    let terminating = plan.leaving.len() > plan.to_evict().count();
    let evicted_now = seen
        .answers
        .evictions
        .iter()
        .any(|(_, a)| matches!(a, EvictionAnswer::Accepted));
    let has_blockers = status.drain.as_ref().is_some_and(|d| !d.blockers.is_empty());
    let look = if has_blockers && !terminating && !evicted_now {
        plus(now, seen.pace.eviction_backoff)
    } else {
        plus(now, seen.pace.pod_poll)
    };
    let notice_due = (!waiting.is_empty()).then_some(window.until);
    let next = Next::At(look)
        .or_at(release_at)
        .or_at(skipped.next)
        .or_at(notice_due);

    if remaining == 0 {
        let total = status.drain.as_ref().map_or(0, |d| d.pods_total);
        let message = format!("all {total} pods that had to leave are gone{skipped_said}");
        notes.extend(unreachable::note(&skipped, &message));
        set_condition(
            &mut status,
            remediation_conditions::DRAINED,
            true,
            "Drained",
            &message,
            now,
        );
        status.message = Some(message);
        return diagnosed_hand_over(pass, status, before, notes);
    }
    if skipped.count > 0 {
        status.message = Some(format!("{remaining} pods left to leave{skipped_said}"));
    }
    if let Some(said) = notice::said(&window, &waiting) {
        status.message = Some(said);
    }
    if now < deadline {
        return Decision::Settle(Settlement {
            release: None,
            status,
            notes,
            drop_finalizer: false,
            next: next.or_at(Some(deadline)),
        });
    }
    on_timeout(remediation, rules, plan, seen, facts, status, notes, next)
}

/// The drain passed `drain.timeout` with pods left: `onTimeout` decides.
#[allow(
    clippy::too_many_arguments,
    reason = "the round's observations, passed on as they are"
)]
fn on_timeout(
    remediation: &GpuRemediation,
    rules: &PolicySnapshot,
    plan: &Plan,
    seen: &Seen<'_>,
    facts: &Facts<'_>,
    mut status: GpuRemediationStatus,
    mut notes: Vec<Note>,
    next: Next,
) -> Decision {
    let now = facts.now;
    let before = status.phase;
    let remaining = status.drain.as_ref().map_or(0, |d| d.pods_remaining);
    match rules.drain.on_timeout {
        OnDrainTimeout::Block => {
            let message = format!(
                "drain timed out after {} with {remaining} pods left; the node stays cordoned and evictions \
                 keep being retried{}; a person decides (free the budget, delete the pods, or delete this record)",
                rules.drain.timeout,
                blocked_by(&status)
            );
            Decision::Settle(block(status, notes, &message, next, now))
        }
        OnDrainTimeout::ForceDelete => force_delete(rules, plan, seen, status, notes, next, now),
        OnDrainTimeout::Proceed
            if remediation.spec.action == Action::Replace
                && rules.replacement.strategy == Strategy::DeleteNode =>
        {
            let message = format!(
                "drain timed out after {} with {remaining} pods left; onTimeout Proceed with strategy DeleteNode \
                 would let the pod garbage collector remove them with no disruption budget, so the node stays \
                 cordoned{}; remove the pods by hand, or use onTimeout ForceDelete with the optional force-delete role",
                rules.drain.timeout,
                blocked_by(&status)
            );
            Decision::Settle(block(status, notes, &message, next, now))
        }
        OnDrainTimeout::Proceed if let Some(protected) = protected_left(remediation, rules, plan, seen) => {
            let message = format!(
                "drain timed out after {} with {remaining} pods left; onTimeout Proceed never removes a pod a \
                 disruption budget protects, and the next step ({}) would take down {protected}, so the node stays \
                 cordoned and evictions keep being retried{}; free the budget, remove the pods by hand, or use \
                 onTimeout ForceDelete",
                rules.drain.timeout,
                next_step(remediation, rules, &status),
                blocked_by(&status)
            );
            Decision::Settle(block(status, notes, &message, next, now))
        }
        OnDrainTimeout::Proceed => {
            let message = format!(
                "drain timed out after {} with {remaining} pods left; proceeding (onTimeout: Proceed){}",
                rules.drain.timeout,
                blocked_by(&status)
            );
            set_condition(
                &mut status,
                remediation_conditions::DRAINED,
                true,
                reasons::DRAIN_TIMEOUT,
                &message,
                now,
            );
            status.message = Some(message.clone());
            notes.push(Note::new(reasons::DRAIN_TIMEOUT, EventType::Warning, &message));
            let pass = &Pass {
                remediation,
                rules,
                seen,
                facts,
            };
            diagnosed_hand_over(pass, status, before, notes)
        }
    }
}

/// With `onTimeout: Proceed`, the pods still to leave that a disruption budget protects, as a
/// person reads them (`ns/pod (budget ns/b)`), when the step after the drain takes the node's pods
/// down without asking their budgets: a reboot (the action, or any ladder rung: a reset or reboot
/// kills what runs, a replacement removes the node) or a replacement. `None` when nothing is
/// protected, or the action holds the node (`None`): then Proceed goes on, budgets intact.
fn protected_left(
    remediation: &GpuRemediation,
    rules: &PolicySnapshot,
    plan: &Plan,
    seen: &Seen<'_>,
) -> Option<String> {
    let disrupts = remediation.spec.action != Action::None || !rules.ladder.is_empty();
    if !disrupts {
        return None;
    }
    let protected: Vec<String> = plan
        .to_evict()
        .filter_map(|pod| {
            let budgets = crate::drain::covering_budgets(pod, seen.budgets);
            (!budgets.is_empty())
                .then(|| format!("{}/{} (budget {})", pod.namespace, pod.name, budgets.join(", ")))
        })
        .collect();
    (!protected.is_empty()).then(|| protected.join(", "))
}

/// The step after the drain, as a person reads it: the ladder step left open (a drain re-entered
/// after an escalation), else the rung the ladder starts at (as `hand_over` opens it), else the
/// action.
fn next_step(remediation: &GpuRemediation, rules: &PolicySnapshot, status: &GpuRemediationStatus) -> String {
    if rules.ladder.is_empty() {
        return format!("{:?}", remediation.spec.action);
    }
    let step = status.steps.last().filter(|s| s.end.is_none()).map_or_else(
        || rules.ladder[super::ladder_evidence::start_index(remediation, rules)].step,
        |open| open.step,
    );
    format!("ladder step {step}")
}

/// Enters `Blocked` (once, with an Event) or updates its message; evictions keep being retried.
fn block(
    mut status: GpuRemediationStatus,
    mut notes: Vec<Note>,
    message: &str,
    next: Next,
    now: Timestamp,
) -> Settlement {
    let before = status.phase;
    if before == Phase::Blocked {
        status.message = Some(message.to_owned());
    } else {
        enter(&mut status, Phase::Blocked, message, now);
        notes.push(Note::phase(
            before,
            &status,
            reasons::DRAIN_TIMEOUT,
            EventType::Warning,
        ));
    }
    Settlement {
        release: None,
        status,
        notes,
        drop_finalizer: false,
        next,
    }
}

/// With a ladder: the pods this pass's evictions took (the step records them) and the drain's
/// scope, this pass's or the one `previous` kept.
fn for_the_step(drained: &mut DrainStatus, seen: &Seen<'_>, previous: Option<&DrainStatus>) {
    drained.evicted.extend(
        seen.answers
            .evictions
            .iter()
            .filter(|(_, answer)| matches!(answer, EvictionAnswer::Accepted))
            .map(|(pod, _)| pod.key()),
    );
    drained
        .evicted
        .truncate(gpu_remediation_api::ladder::STEP_PODS_MAX);
    drained.scope = seen
        .drain_scope
        .map(str::to_owned)
        .or_else(|| previous.and_then(|d| d.scope.clone()));
}

/// What this round's answers (and the earlier blockers of pods not asked again, and the pods held
/// for their budget's room) make of the drain's progress; `(fault_began, now)`: when the fault
/// began (`drain::cost::fault_began`), and this pass's time.
fn record_answers(
    plan: &Plan,
    seen: &Seen<'_>,
    held: &[(Leaving, String)],
    previous: &DrainStatus,
    (fault_began, now): (Timestamp, Timestamp),
) -> DrainStatus {
    let earlier = |pod: &Leaving| previous.blockers.iter().find(|b| b.pod == pod.key()).cloned();
    let mut evicted = 0_u32;
    let mut gone = 0_u32;
    let mut cost = previous.gpu_seconds;
    let mut asked: HashMap<String, Option<Blocker>> = HashMap::new();
    for (pod, answer) in &seen.answers.evictions {
        let since = earlier(pod).and_then(|b| b.since).unwrap_or(Time(now));
        let refusal = match answer {
            EvictionAnswer::Accepted => {
                evicted += 1;
                cost = cost.saturating_add(crate::drain::cost::of_eviction(pod.gpus, fault_began, now));
                None
            }
            EvictionAnswer::Gone => {
                gone += 1;
                None
            }
            EvictionAnswer::Refused(answer) => Some(blocker(pod, answer, seen.budgets, since)),
            EvictionAnswer::Unanswered(error) => Some(Blocker {
                pod: pod.key(),
                pdb: None,
                code: 0,
                message: format!("the eviction got no answer: {error}"),
                since: Some(since),
            }),
        };
        asked.insert(pod.key(), refusal);
    }
    // A pod held for its budget waits on it (named, so the budget's change wakes this drain),
    // keeping the server's words if it refused this pod under that budget before.
    for (pod, budget) in held {
        let kept = earlier(pod).filter(|b| b.pdb.as_deref() == Some(budget.as_str()));
        asked.insert(
            pod.key(),
            Some(kept.unwrap_or_else(|| waiting_for(pod, budget, now))),
        );
    }
    // A pod asked this round has its new answer; one not asked keeps its earlier blocker.
    let blockers = plan
        .to_evict()
        .filter_map(|pod| asked.remove(&pod.key()).unwrap_or_else(|| earlier(pod)))
        .collect();
    let leaving = count(plan.leaving.len());
    DrainStatus {
        pods_total: previous.pods_total.max(leaving),
        pods_evicted: previous.pods_evicted + evicted,
        pods_remaining: leaving.saturating_sub(gone),
        blockers,
        would_evict: Vec::new(),
        evicted: previous.evicted.clone(),
        scope: None,
        // Recorded once, when the drain first acts: a restarted gang's new members are not ours.
        gangs: if previous.gangs.is_empty() {
            seen.gangs.to_vec()
        } else {
            previous.gangs.clone()
        },
        notice_since: previous.notice_since.clone(),
        gpu_seconds: cost,
    }
}

/// After the drain, before the step that destroys the node's state: the diagnostics the policy
/// asks for run first, once, bounded by their timeout (see `lifecycle::diagnostics`); then the
/// hand-over.
fn diagnosed_hand_over(
    pass: &Pass<'_, '_>,
    mut status: GpuRemediationStatus,
    before: Phase,
    mut notes: Vec<Note>,
) -> Decision {
    let (remediation, rules, seen, facts) = pass.parts();
    let Identity::Same(node) = facts.identity else {
        unreachable!("a drain on a node that is not the admitted one was cancelled before")
    };
    let looked = (seen.answers.diagnostics.as_deref(), seen.diagnostics);
    let (gate, record) = diagnostics::gate(remediation, rules, node, &status, looked, facts.now);
    status.diagnostics = record;
    match gate {
        Gate::Proceed(ended) => {
            if ended.is_some() {
                // A refused create given up, or retried until it passed: its refusal is over.
                status.refusal = None;
            }
            notes.extend(ended);
            Decision::Settle(hand_over(remediation, rules, facts, status, before, notes))
        }
        Gate::Ask => Decision::Ask(Ask::Diagnose),
        Gate::Wait {
            message,
            deadline,
            note: started,
        } => match super::replacement::waiting(status, message, seen, facts, deadline) {
            Decision::Settle(mut settled) => {
                notes.extend(started);
                settled.notes.splice(0..0, notes);
                Decision::Settle(settled)
            }
            ask @ Decision::Ask(_) => ask,
        },
        Gate::Retry { words, deadline } => {
            let refusal = status::refusal(&status, &words, facts.now);
            let next = super::retry_at(facts, seen, &refusal, deadline);
            let mut settled = status::refused(status, refusal, next);
            settled.notes.splice(0..0, notes);
            Decision::Settle(settled)
        }
    }
}

/// After the drain: with a ladder, its first step starts (in `Replacing`); else `action: None`
/// holds the node in `Verifying`; `Replace`/`Reboot` go to `Replacing`, whose trigger follows at once.
fn hand_over(
    remediation: &GpuRemediation,
    rules: &PolicySnapshot,
    facts: &Facts<'_>,
    mut status: GpuRemediationStatus,
    before: Phase,
    mut notes: Vec<Note>,
) -> Settlement {
    let (phase, message) = match remediation.spec.action {
        _ if !rules.ladder.is_empty() => {
            let drained = status.drain.clone().unwrap_or_default();
            // A step already open escalated from a GPU-scoped reset: its whole-node drain is done,
            // and it starts now.
            let reopened = status.steps.last_mut().filter(|s| s.end.is_none()).map(|open| {
                open.start = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(facts.now);
                open.evicted_pods.clone_from(&drained.evicted);
                open.step
            });
            let step = if let Some(step) = reopened {
                step
            } else {
                let mut first = super::ladder::first_step(remediation, rules, facts.now);
                first.evicted_pods.clone_from(&drained.evicted);
                first.message = drained.scope.clone().or_else(|| {
                    (first.step == gpu_remediation_api::ladder::Rung::ResetGpu)
                        .then(|| super::ladder::WHOLE_NODE_DRAINED.to_owned())
                });
                let step = first.step;
                super::ladder::open(&mut status, first);
                step
            };
            let scope = drained.scope.map(|s| format!(" ({s})")).unwrap_or_default();
            (
                Phase::Replacing,
                format!("drained{scope}; ladder step {step} starts"),
            )
        }
        Action::None => (
            Phase::Verifying,
            "drained; action None: the node stays cordoned and waits for a person (uncordon it) or for \
             recovery (its trigger clears for release.healthyFor)"
                .to_owned(),
        ),
        action @ (Action::Replace | Action::Reboot) => (
            Phase::Replacing,
            format!("drained; replacing the node ({action:?})"),
        ),
    };
    let from = status.phase;
    enter(&mut status, phase, &message, facts.now);
    notes.push(Note::phase(
        if from == before { before } else { from },
        &status,
        reasons::PHASE_CHANGED,
        EventType::Normal,
    ));
    Settlement {
        release: None,
        status,
        notes,
        drop_finalizer: false,
        next: if phase == Phase::Replacing {
            Next::At(facts.now)
        } else {
            Next::Idle.or_at(facts.release_at())
        },
    }
}

/// The grace period pods leave with: the policy's, except that 0 (an immediate delete) needs the
/// policy's explicit `allowZeroGracePeriod` (a snapshot from before that rule falls back to each
/// pod's own).
pub(super) fn grace_period(rules: &PolicySnapshot) -> Option<i64> {
    rules
        .drain
        .grace_period_seconds
        .filter(|&g| g != 0 || rules.drain.allow_zero_grace_period)
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests;
