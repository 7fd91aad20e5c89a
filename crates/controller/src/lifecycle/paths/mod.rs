//! Random paths through the lifecycle: a small model of the cluster (one node that can recover,
//! break, vanish or come back under a new UID; pods that leave, get stuck terminating or are
//! refused with 429, 500, 403, 422 or no answer; a replacement that finishes, fails, vanishes or
//! is refused (permanently, 403/422, failing at once; or transiently, 409/503, asked again after
//! a backoff); a person who cordons, uncordons, approves, deletes or hand-edits the record; time
//! that jumps past every timeout) answers [`decide`]'s asks, and after every settlement the
//! lifecycle's invariants are checked:
//!
//! 1. every terminal phase except `Failed` and `ManualRequired` leaves no cordon or taint of ours
//!    on the admitted node if it still stands;
//! 2. a cordon we did not make is never lifted;
//! 3. no node effect targets another UID than the one admitted, and a template (which acts on the
//!    node by name) is never triggered while another node holds the name;
//! 4. every phase in flight reaches a terminal phase or a phase a person is asked to act on
//!    (`Blocked`, `AwaitingApproval`, a held `Verifying`) within its policy's deadlines, and
//!    nothing in flight waits without a next look;
//! 5. no pod is deleted except under `onTimeout: ForceDelete` past the drain's timeout, and
//!    nothing leaves with grace 0 unless the policy allows it;
//! 6. a record counts from its admission whatever happens later: its phase history only grows;
//! 7. no eviction is asked under a disruption budget beyond the room it has when the server gets
//!    it (the planner spends each budget exactly: a 429 only in a genuine race);
//! 8. on a ladder: a step's object is created only on the admitted node, every step that ends
//!    has an outcome and an end, at most one step is open, and a remediation succeeds by a repair
//!    step only with its evidence (a reset: the failed GPU listed by the agent; a reboot: a boot ID
//!    other than the one before it). Invariants 1 to 7 hold on every rung (a hand-off, like
//!    `Failed`, keeps the cordon for a person);
//! 9. an eviction asked and not yet answered is never asked again: the acting layer decides again
//!    while evictions are in the server (at each answer and each change of a budget), so some
//!    passes here hold answers back for a decision or more, as a slow server does;
//! 10. every status the lifecycle writes is one `provenance::judge` finds its own (no path that
//!     only the controller walks is ever held as tampered);
//! 11. no node leaves our cordon or taint without recorded evidence of health (the status says it
//!     recovered, with its `GpuHealthy` indeed `True`, or that its replacement finished) unless a
//!     person acted (deleted the record or the policy, or uncordoned the node); a `Failed` or
//!     `ManualRequired` record keeps them (invariant 1's converse, checked at each release);
//! 12. with `spec.diagnostics`, no step that destroys the node's state (a reset, a reboot, a
//!     replacement) is asked for before the diagnostics ended (collected, failed, the node
//!     unreachable, or timed out no earlier than their timeout), their Job is created at most once
//!     and only on the admitted node; and they never block the repair: past every deadline the
//!     remediation still ends or asks a person (invariant 4, with one more look for the wait);
//! 13. under `onTimeout: Block`, a drain ends with pods still on the node only when the node is
//!     unreachable (`Ready=Unknown`: the kubelet stopped reporting, which the world draws) and
//!     each of them has been terminating past its `deletionTimestamp` by more than
//!     `drain.unreachableAfter`. It fails on a drain that skips terminating pods on a reachable
//!     node (found in 0.40 s) and on one that ignores the bound (0.27 s).
//!
//! 14. under `drain.notice`, a pod that wants the checkpoint notice (drawn: a gang member or opted
//!     in) is evicted only after it was given it, or after the server refused it, and only once it
//!     checkpointed or the notice's window (from the drain's first notice) ran out; each pod is
//!     given it at most once, and told the window's end. It fails on a drain that does not wait
//!     (found in 0.12 s) and on one that never gives the notice (0.15 s).
//!
//! `PROPTEST_CASES` sets the number of paths (100,000 by default).

mod answer;
mod draw;
mod invariants;
mod ladder_paths;
mod world;

use answer::answer;
use draw::{Event, Setup, event, setup};
use gpu_remediation_api::{
    GpuRemediation, GpuRemediationStatus, Phase,
    constants::{CORDONED_BY_ANNOTATION, PRE_CORDONED_ANNOTATION},
    object_reference::ObjectReference,
    policy::{Action, Mode, OnDrainTimeout, Strategy},
    remediation::PolicySnapshot,
};
use invariants::{
    check_node, check_release_proven, check_steps, diagnosed_before_destruction, drained_or_unreachable,
    on_legacy, own_status,
};
use jiff::SignedDuration;
use proptest::prelude::{ProptestConfig, any, prop, prop_assert, proptest};
use world::{Mood, NAME, Pod, World, refusal, words};

use gpu_remediation_api::ladder::{HANDED_OFF_BY_ANNOTATION, Rung, StepOutcome};

use super::{
    Answers, Ask, CordonAnswer, Decision, EvictionAnswer, Next, Pace, Seen, Settlement, decide, status,
};
use crate::{cordon, drain::Leaving, replace::Reported};

/// A violated invariant, with the path so far.
type Violation = String;

/// Runs one pass: decide, answer asks from the world, settle, check the invariants.
fn pass(world: &mut World, mood: Mood) -> Result<(), Violation> {
    let Some(record) = world.record.clone() else {
        return Ok(());
    };
    let mut dated = record.clone();
    dated.status = Some(status::with_admission(
        record.status.clone().unwrap_or_default(),
        record.metadata.creation_timestamp.as_ref().map(|t| t.0),
    ));
    let before = dated.status.clone().unwrap_or_default();
    let rules = record
        .spec
        .policy_snapshot
        .clone()
        .or_else(|| world.policy_exists.then(|| world.rules.clone()));
    let plan = world.plan();
    let step_object = rules
        .as_ref()
        .is_some_and(|rules| super::ladder::looked_at(&before, rules).is_some());
    let legacy = rules.as_ref().is_none_or(|rules| rules.ladder.is_empty());
    let observed = ((before.phase == Phase::Verifying && before.replacement.is_some() && legacy)
        || step_object)
        .then(|| world.observation(&record, mood));
    let diagnosing = before.diagnostics.as_ref().is_some_and(|r| r.outcome.is_none());
    let diagnostics = diagnosing.then(|| world.diagnostics_job(mood));
    // A reset's drain is GPU-scoped in the model whenever the ladder allows it (the model's plan
    // is not narrowed: the scope's effect on the later steps is what is checked).
    let scope = rules
        .as_ref()
        .and_then(|rules| super::ladder_evidence::reset_scope(&record, rules, &before))
        .map(|gpus| {
            format!(
                "{}: only the pods holding {} leave",
                super::ladder::GPU_SCOPED,
                gpus.join(", ")
            )
        });
    let asked = world.asked_at.clone();
    let asked_at = move |uid: &str| asked.get(uid).copied();
    let mut answers = Answers::default();
    let node = world.node.clone();
    // The budget as the watch saw it when the pass began; grants in this pass are in flight.
    let budgets = world.budgets();
    // Answers the server has given that the acting layer has not yet heard (invariant 9).
    let mut unheard: Vec<(Leaving, EvictionAnswer)> = Vec::new();
    for _ in 0..12 {
        answers.evictions_unanswered = unheard.iter().map(|(pod, _)| pod.uid.clone()).collect();
        // An eviction unanswered keeps its budget's room reserved whatever its answer will be.
        let granted = answers
            .evictions
            .iter()
            .filter(|(_, a)| matches!(a, EvictionAnswer::Accepted))
            .count()
            + unheard.len();
        let in_flight = if budgets.is_empty() || granted == 0 {
            std::collections::BTreeMap::new()
        } else {
            [("work/web".to_owned(), u32::try_from(granted).unwrap_or(u32::MAX))].into()
        };
        let seen = Seen {
            node: node.as_ref().map(|n| n as &dyn crate::observe::NodeView),
            pods: Some(&plan),
            drain_scope: scope.as_deref(),
            gangs: &[],
            budgets: &budgets,
            in_flight: &in_flight,
            asked_at: &asked_at,
            replacement: observed.as_ref(),
            validation: None,
            diagnostics: diagnostics.as_ref(),
            answers: &answers,
            pace: Pace {
                pod_poll: SignedDuration::from_secs(1),
                eviction_backoff: SignedDuration::from_secs(5),
                replacement_poll: SignedDuration::from_secs(2),
            },
        };
        match decide(&dated, rules.as_ref(), &seen, world.now) {
            Decision::Ask(Ask::Evict { pods, .. })
                if pods
                    .iter()
                    .any(|pod| answers.evictions_unanswered.contains(&pod.uid)) =>
            {
                return Err("an eviction asked again before its answer came".into());
            }
            Decision::Ask(ask) => {
                let evicting = matches!(ask, Ask::Evict { .. });
                answer(world, &record, rules.as_ref(), &before, ask, &mut answers, mood)?;
                // A slow server: the last answers of this round are not heard yet.
                if evicting && mood == Mood::Random && world.roll(3) == 0 {
                    let keep = answers
                        .evictions
                        .len()
                        .saturating_sub(1 + usize::try_from(world.roll(3)).unwrap_or(0));
                    unheard.extend(answers.evictions.split_off(keep));
                }
            }
            // The acting layer settles only once every eviction is answered: it hears one more
            // (or, with the dice, all of them) and decides again.
            Decision::Settle(_) if !unheard.is_empty() => {
                let heard = if world.roll(2) == 0 { unheard.len() } else { 1 };
                answers.evictions.extend(unheard.drain(..heard));
            }
            Decision::Settle(settlement) => return settle(world, &record, &before, &settlement),
        }
    }
    Err("the lifecycle kept asking".into())
}

fn settle(
    world: &mut World,
    record: &GpuRemediation,
    before: &GpuRemediationStatus,
    settlement: &Settlement,
) -> Result<(), Violation> {
    let admitted = record.spec.node_uid.clone();
    if let Some(release) = &settlement.release {
        check_release_proven(world, record, settlement)?;
        if release.node.uid != admitted {
            return Err(format!(
                "a release targets {:?}, not {admitted:?}",
                release.node.uid
            ));
        }
        if let Some(n) = world.node.as_mut()
            && n.metadata.uid == release.node.uid
        {
            cordon::release(n, NAME);
            if release.remember_cancel {
                cordon::remember_cancelled(n, NAME);
            }
        }
    }
    let after = &settlement.status;
    // 6: the history only grows, and the admission stays where it was.
    if !after.phase_history.starts_with(&before.phase_history) {
        return Err(format!(
            "the phase history was rewritten: {:?} → {:?}",
            before.phase_history, after.phase_history
        ));
    }
    check_steps(record, before, after, world.node.as_ref())?;
    drained_or_unreachable(world, before, after)?;
    // 4 (silence): a phase in flight that no person is asked to act on always looks again.
    let held =
        after.phase == Phase::Verifying && record.spec.action == Action::None && on_legacy(world, record);
    let person_visible = matches!(after.phase, Phase::Blocked | Phase::AwaitingApproval) || held;
    if !after.phase.is_terminal()
        && !person_visible
        && settlement.next == Next::Idle
        && !settlement.drop_finalizer
    {
        return Err(format!("{} waits with no next look", after.phase));
    }
    let mut updated = record.clone();
    updated.status = Some(after.clone());
    if settlement.drop_finalizer {
        updated.metadata.finalizers = None;
    }
    let gone = updated.metadata.deletion_timestamp.is_some() && updated.metadata.finalizers.is_none();
    world.record = (!gone).then_some(updated);
    check_node(world, after.phase)
}

/// A refusal's code: permanent (403, 422: the step fails at once) or transient (409, 503: asked
/// again after a backoff until its deadline), by the dice.
fn refused_code(world: &mut World) -> u16 {
    [403, 422, 409, 503][usize::try_from(world.roll(4)).unwrap_or(0)]
}

/// The longest any phase in flight may take under the model's policy, with room for the looks.
fn horizon() -> i64 {
    (30 + 20 + 5) * 60 * 2
}

fn walk(setup: &Setup, events: &[Event], dice: u64) -> Result<(), Violation> {
    let mut world = World::new(setup, dice);
    let mut path = Vec::new();
    for &event in events {
        world.happen(event);
        path.push(event);
        pass(&mut world, Mood::Random).map_err(|v| format!("{v}\n  after {path:?}"))?;
        own_status(&world, &path)?;
    }
    // 4 (deadlines): from here nobody helps and every request is refused; within the policy's
    // deadlines the remediation ends or asks a person. Each look is past every single deadline;
    // a ladder climbs one step per look (and may drain the whole node again after a GPU-scoped
    // reset), so the longest path (cordon, drain, the diagnostics' wait, four steps, a second
    // drain) needs eleven.
    for _ in 0..11 {
        world.now += SignedDuration::from_secs(horizon());
        pass(&mut world, Mood::Stubborn)
            .map_err(|v| format!("{v}\n  after {path:?} and the stubborn end"))?;
        own_status(&world, &path)?;
    }
    if let Some(record) = &world.record {
        let status = record.status.clone().unwrap_or_default();
        let held = status.phase == Phase::Verifying
            && record.spec.action == Action::None
            && on_legacy(&world, record);
        let person = matches!(status.phase, Phase::Blocked | Phase::AwaitingApproval) || held;
        if !status.phase.is_terminal() && !person {
            return Err(format!(
                "still {} past every deadline ({:?})\n  after {path:?}",
                status.phase, status.message
            ));
        }
    }
    Ok(())
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(100_000)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn every_random_path_keeps_the_lifecycle_invariants(
        setup in setup(),
        events in prop::collection::vec(event(), 0..16),
        dice in any::<u64>(),
    ) {
        if let Err(violation) = walk(&setup, &events, dice) {
            prop_assert!(false, "{violation}\n  setup {setup:?}");
        }
    }
}

#[test]
fn a_reboot_that_succeeds_releases_the_node_it_held() {
    let setup = Setup {
        action: Action::Reboot,
        mode: Mode::Enforce,
        strategy: Strategy::Template,
        on_timeout: OnDrainTimeout::Block,
        grace: None,
        allow_zero: false,
        pods: 0,
        snapshot: true,
        exhausted: false,
        ladder: Vec::new(),
        known_gpu: false,
        diagnostics: false,
    };
    let mut world = World::new(&setup, 7);
    // Cordon, drain (no pods) and hand over, trigger, and see the reboot done: 40 s apart.
    for _ in 0..4 {
        world.now += SignedDuration::from_secs(40);
        pass(&mut world, Mood::Calm).expect("no invariant breaks");
    }
    // Done while the GPU is still broken is no proof: the node stays held.
    let held = world
        .record
        .as_ref()
        .and_then(|r| r.status.as_ref())
        .expect("a status");
    assert_eq!(held.phase, Phase::Verifying);
    assert!(cordon::is_unschedulable(
        world.node.as_ref().expect("the node stands")
    ));
    // Healthy, then healthy for `release.healthyFor` (5 min): released.
    world.happen(Event::Recovers);
    pass(&mut world, Mood::Calm).expect("no invariant breaks");
    world.now += SignedDuration::from_mins(5);
    pass(&mut world, Mood::Calm).expect("no invariant breaks");
    let record = world.record.as_ref().expect("the record stays");
    let status = record.status.as_ref().expect("a status");
    assert_eq!(status.phase, Phase::Succeeded);
    assert_eq!(
        status.time_to_recovery_seconds,
        Some(4 * 40 + 300),
        "from the trigger's start to the node healthy for the dwell"
    );
    let node = world.node.as_ref().expect("the rebooted node stands");
    assert!(!cordon::is_unschedulable(node) && !cordon::has_taint(node));
}
