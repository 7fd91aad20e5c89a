//! The drain's decisions: which pods to ask to leave now, what the server's answers mean for the
//! status (progress and blockers, in the server's words), the verdict against `drain.timeout`,
//! `onTimeout`, and the hand-over once the node is empty. Also the dry run's record.

use std::{
    collections::{BTreeSet, HashMap},
    fmt::Write as _,
};

use gpu_remediation_api::{
    GpuRemediation, GpuRemediationStatus, Phase,
    constants::{reasons, remediation_conditions},
    policy::{Action, OnDrainTimeout, Strategy},
    remediation::{Blocker, DrainStatus, PolicySnapshot},
};
use jiff::Timestamp;
use k8s_openapi::{api::policy::v1::PodDisruptionBudget, apimachinery::pkg::apis::meta::v1::Time};
use kube::{core::Status, runtime::events::EventType};

use super::{
    Ask, Decision, EvictionAnswer, Facts, Next, Note, Seen, Settlement, eviction_round,
    status::{self, enter, set_condition},
};
use crate::{
    drain::{self, Leaving, Plan},
    time::{plus, signed},
};

/// One step of a drain in `Cordoned`, `Draining` or `Blocked`.
pub(super) fn advance(
    remediation: &GpuRemediation,
    rules: &PolicySnapshot,
    seen: &Seen<'_>,
    facts: &Facts<'_>,
    mut status: GpuRemediationStatus,
    release_at: Option<Timestamp>,
) -> Decision {
    let now = facts.now;
    if status::has_true(&status, remediation_conditions::DRAINED) {
        let before = status.phase;
        return Decision::Settle(hand_over(remediation, rules, facts, status, before, Vec::new()));
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
    let round = eviction_round::plan(
        plan.to_evict().filter(|pod| !asked.contains(pod.uid.as_str())),
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
        now,
    );
    if !rules.ladder.is_empty() {
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
            .or_else(|| status.drain.as_ref().and_then(|d| d.scope.clone()));
    }
    let remaining = drained.pods_remaining;
    status.drain = Some(drained);

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
    let next = Next::At(look).or_at(release_at);

    if remaining == 0 {
        let message = format!(
            "all {} pods that had to leave are gone",
            status.drain.as_ref().map_or(0, |d| d.pods_total)
        );
        set_condition(
            &mut status,
            remediation_conditions::DRAINED,
            true,
            "Drained",
            &message,
            now,
        );
        status.message = Some(message);
        return Decision::Settle(hand_over(remediation, rules, facts, status, before, notes));
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
            Decision::Settle(hand_over(remediation, rules, facts, status, before, notes))
        }
    }
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

/// How long past its `deletionTimestamp` a terminating pod may take to disappear before it counts
/// as stuck: a live kubelet reports the pod gone shortly after the grace period, later under load.
const KUBELET_SLACK: jiff::SignedDuration = jiff::SignedDuration::from_secs(10);

/// Whether a pod is terminating and still there `KUBELET_SLACK` past its deadline (a terminating pod
/// without a deadline is stuck at once).
fn stuck_terminating(pod: &Leaving, now: Timestamp) -> bool {
    pod.terminating && pod.gone_by.is_none_or(|by| by + KUBELET_SLACK <= now)
}

/// `onTimeout: ForceDelete`: delete the pods still running with the policy's grace period, and
/// pods stuck terminating with grace 0 only where the policy allows it. What cannot be removed
/// (a refused delete, a pod stuck terminating without the opt-in) leaves the drain `Blocked`
/// with the reason.
fn force_delete(
    rules: &PolicySnapshot,
    plan: &Plan,
    seen: &Seen<'_>,
    status: GpuRemediationStatus,
    notes: Vec<Note>,
    next: Next,
    now: Timestamp,
) -> Decision {
    let asked: BTreeSet<&str> = seen
        .answers
        .deletions
        .iter()
        .map(|(p, _)| p.uid.as_str())
        .collect();
    let running: Vec<Leaving> = plan
        .to_evict()
        .filter(|p| !asked.contains(p.uid.as_str()))
        .cloned()
        .collect();
    if !running.is_empty() {
        return Decision::Ask(Ask::Delete {
            pods: running,
            grace: grace_period(rules),
        });
    }
    // A pod still terminating well past its own deadline is stuck (its kubelet is gone or hung);
    // just past it, a live kubelet may still be reporting the pod gone.
    let stuck: Vec<&Leaving> = plan
        .leaving
        .iter()
        .filter(|p| stuck_terminating(p, now))
        .collect();
    if rules.drain.allow_zero_grace_period {
        let unasked: Vec<Leaving> = stuck
            .iter()
            .filter(|p| !asked.contains(p.uid.as_str()))
            .map(|p| (*p).clone())
            .collect();
        if !unasked.is_empty() {
            return Decision::Ask(Ask::Delete {
                pods: unasked,
                grace: Some(0),
            });
        }
    }
    let refused: Vec<String> = seen
        .answers
        .deletions
        .iter()
        .filter_map(|(pod, answer)| {
            answer
                .as_ref()
                .err()
                .map(|w| format!("{}: {}", pod.key(), w.message))
        })
        .collect();
    let deleted: Vec<String> = seen
        .answers
        .deletions
        .iter()
        .filter(|(_, answer)| answer.is_ok())
        .map(|(pod, _)| pod.key())
        .collect();
    let mut message = format!(
        "drain timed out after {} (onTimeout: ForceDelete)",
        rules.drain.timeout
    );
    if !deleted.is_empty() {
        let _ = write!(message, "; deleted directly: {}", deleted.join(", "));
    }
    if !refused.is_empty() {
        let _ = write!(
            message,
            "; the server refused to delete {} (does the controller have the optional force-delete role?)",
            refused.join("; ")
        );
    }
    let stuck_without_help = !stuck.is_empty() && !rules.drain.allow_zero_grace_period;
    if stuck_without_help {
        let names: Vec<String> = stuck.iter().map(|p| p.key()).collect();
        let _ = write!(
            message,
            "; pods stuck terminating past their grace period: {} (drain.allowZeroGracePeriod lets \
             ForceDelete remove them with grace 0; or remove them by hand)",
            names.join(", ")
        );
    }
    let mut notes = notes;
    if !deleted.is_empty() {
        notes.push(Note::new(reasons::DRAIN_TIMEOUT, EventType::Warning, &message));
    }
    if refused.is_empty() && !stuck_without_help {
        // Everything asked was granted: the pods are on their way out; look again soon.
        let mut status = status;
        status.message = Some(message);
        return Decision::Settle(Settlement {
            release: None,
            status,
            notes,
            drop_finalizer: false,
            next: Next::At(plus(now, seen.pace.pod_poll)),
        });
    }
    Decision::Settle(block(status, notes, &message, next, now))
}

/// What this round's answers (and the earlier blockers of pods not asked again, and the pods held
/// for their budget's room) make of the drain's progress.
fn record_answers(
    plan: &Plan,
    seen: &Seen<'_>,
    held: &[(Leaving, String)],
    previous: &DrainStatus,
    now: Timestamp,
) -> DrainStatus {
    let earlier = |pod: &Leaving| previous.blockers.iter().find(|b| b.pod == pod.key()).cloned();
    let mut evicted = 0_u32;
    let mut gone = 0_u32;
    let mut asked: HashMap<String, Option<Blocker>> = HashMap::new();
    for (pod, answer) in &seen.answers.evictions {
        let since = earlier(pod).and_then(|b| b.since).unwrap_or(Time(now));
        let refusal = match answer {
            EvictionAnswer::Accepted => {
                evicted += 1;
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
    }
}

/// The blocker of a pod not asked yet because its budget shows no room (code 0: no server answer).
fn waiting_for(pod: &Leaving, budget: &str, now: Timestamp) -> Blocker {
    Blocker {
        pod: pod.key(),
        pdb: Some(budget.to_owned()),
        code: 0,
        message: format!(
            "not asked yet: the disruption budget {budget} allows no more disruptions now (its status, less \
             the evictions already granted under it); asked as soon as its status shows room"
        ),
        since: Some(Time(now)),
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

/// Mode `DryRun`: asks the server which evictions would be refused, records what would happen,
/// and ends `DryRun` having changed nothing.
pub(super) fn dry_run(seen: &Seen<'_>, facts: &Facts<'_>, mut status: GpuRemediationStatus) -> Decision {
    let Some(plan) = seen.pods else {
        return Decision::Settle(status::unchanged(status, false, Next::At(facts.now)));
    };
    let Some(answers) = &seen.answers.dry_run else {
        return Decision::Ask(Ask::DryRunEvict(plan.to_evict().cloned().collect()));
    };
    let mut blockers: Vec<Blocker> = answers
        .iter()
        .filter_map(|(pod, answer)| match answer {
            EvictionAnswer::Refused(answer) => Some(blocker(pod, answer, seen.budgets, Time(facts.now))),
            EvictionAnswer::Unanswered(error) => Some(Blocker {
                pod: pod.key(),
                pdb: None,
                code: 0,
                message: format!("the dry-run eviction got no answer: {error}"),
                since: Some(Time(facts.now)),
            }),
            EvictionAnswer::Accepted | EvictionAnswer::Gone => None,
        })
        .collect();
    blockers.sort_by(|a, b| a.pod.cmp(&b.pod));
    let would_evict: Vec<String> = plan.to_evict().map(Leaving::key).collect();
    let refusing = budgets_named(&blockers);
    let message = if blockers.is_empty() {
        format!(
            "dry run: {} pods would be evicted; no disruption budget would refuse; nothing was changed",
            would_evict.len()
        )
    } else {
        format!(
            "dry run: {} pods would be evicted; {} evictions would be refused now (by {}); nothing was changed",
            would_evict.len(),
            blockers.len(),
            if refusing.is_empty() {
                "the server".to_owned()
            } else {
                refusing.join(", ")
            }
        )
    };
    status.drain = Some(DrainStatus {
        pods_total: count(would_evict.len()),
        pods_evicted: 0,
        pods_remaining: count(would_evict.len()),
        blockers,
        would_evict,
        evicted: Vec::new(),
        scope: None,
    });
    Decision::Settle(status::move_to(
        status,
        Phase::DryRun,
        &message,
        "DryRun",
        EventType::Normal,
        facts.now,
        Next::Idle,
    ))
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

/// A blocker from a refusal: the budget the server names (or those covering the pod) and the
/// server's words.
pub(super) fn blocker(
    pod: &Leaving,
    answer: &Status,
    budgets: &[PodDisruptionBudget],
    since: Time,
) -> Blocker {
    let named = drain::budget_named_in(answer);
    let pdb = named
        .as_ref()
        .map(|name| format!("{}/{name}", pod.namespace))
        .or_else(|| {
            let covering = drain::covering_budgets(pod, budgets);
            (!covering.is_empty()).then(|| covering.join(","))
        });
    let causes = answer.details.as_ref().map(|d| {
        d.causes
            .iter()
            .map(|c| c.message.as_str())
            .collect::<Vec<_>>()
            .join("; ")
    });
    let mut message = match causes {
        Some(causes) if !causes.is_empty() => format!("{} ({causes})", answer.message),
        _ => answer.message.clone(),
    };
    let refusing = named.and_then(|name| {
        budgets.iter().find(|b| {
            b.metadata.namespace.as_deref() == Some(pod.namespace.as_str())
                && b.metadata.name.as_deref() == Some(name.as_str())
        })
    });
    if let Some(spent) = refusing.and_then(spent_on) {
        message.push_str(&spent);
    }
    Blocker {
        pod: pod.key(),
        pdb,
        code: answer.code,
        message,
        since: Some(since),
    }
}

/// What a refusing budget has already granted: the pods its status still counts as evicted. An
/// eviction the API server granted but whose pod deletion was lost (the client went away between
/// the two) holds the budget until the disruption controller gives it back, 2 minutes later.
fn spent_on(budget: &PodDisruptionBudget) -> Option<String> {
    let disrupted = budget.status.as_ref()?.disrupted_pods.as_ref()?;
    let earliest = disrupted.values().map(|t| t.0).min()?;
    let mut pods: Vec<&str> = disrupted.keys().map(String::as_str).collect();
    pods.sort_unstable();
    Some(format!(
        "; the budget still counts {} as evicted (granted since {earliest}): it is given back once \
         they are gone, or by the disruption controller 2 minutes after the grant if a deletion was lost",
        pods.join(", ")
    ))
}

/// Each refusing budget once, sorted (a blocker may name several, comma-separated).
fn budgets_named(blockers: &[Blocker]) -> Vec<String> {
    let names: BTreeSet<String> = blockers
        .iter()
        .filter_map(|b| b.pdb.as_deref())
        .flat_map(|pdbs| pdbs.split(',').map(str::to_owned))
        .collect();
    names.into_iter().collect()
}

/// "; refused by a, b" for the blockers' budgets, or nothing.
fn blocked_by(status: &GpuRemediationStatus) -> String {
    let budgets = budgets_named(status.drain.as_ref().map_or(&[], |d| d.blockers.as_slice()));
    if budgets.is_empty() {
        String::new()
    } else {
        format!("; refused by {}", budgets.join(", "))
    }
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests;
