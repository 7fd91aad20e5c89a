//! The phase machine: from what is observed about one remediation, its node and the time, the one
//! next step to take. Pure; `remediation` carries the step out.
//!
//! ```text
//! Pending ─┬─ DryRun mode ──────────────────────────────► DryRun (terminal, nothing changed)
//!          ├─ Manual mode ─► AwaitingApproval ─ approved ─┐
//!          └──────────────────────────────────────────────┴─► Cordoned ─► Draining ─┬─► (Blocked) ─┐
//!                                                                                    └─────────────┴─► hand-over
//! before hand-over: node gone, uncordoned by a person, recovered for release.healthyFor ─► Cancelled
//! born past maxAttemptsPerNode: Pending ─► ManualRequired (nothing touched) ─ approved, then
//!                                 admitted by the budget (fleet) ─► Pending ─► Cordoned ─► ...
//! hand-over, action None: ─► Verifying (holds the node cordoned) ─┬─ recovered for release.healthyFor:
//!                                                                 │  uncordon what we own ─► Succeeded
//!                                                                 └─ a person uncordons ─► Succeeded
//! ```

use gpu_remediation_api::{
    Phase,
    constants::reasons,
    policy::{Action, Mode, OnDrainTimeout},
};
use jiff::{SignedDuration, Timestamp};

use crate::time::plus;

/// Who holds the node's cordon, as its annotations and spec say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cordon {
    /// The node is schedulable.
    None,
    /// Unschedulable, and our annotation names this remediation: ours to lift.
    Ours,
    /// Unschedulable, but it was before we came (or someone else's): never ours to lift.
    Theirs,
}

/// The node as the phase machine needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeState {
    /// Who holds its cordon.
    pub cordon: Cordon,
}

/// Whether the node is still broken, under its policy's triggers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Health {
    /// A trigger holds (or is pending).
    Broken,
    /// No trigger holds, since this time (`None`: the condition is gone altogether).
    Recovered(Option<Timestamp>),
    /// The policy is gone, so nothing says what broken means any more.
    PolicyGone,
}

/// Everything the next step depends on.
#[derive(Clone, Debug)]
#[allow(
    clippy::struct_excessive_bools,
    reason = "each flag is one independent observed fact"
)]
pub struct Observed {
    /// The recorded phase.
    pub phase: Phase,
    /// The remediation's mode.
    pub mode: Mode,
    /// The remediation's action (`None` holds the drained node in `Verifying`).
    pub action: Action,
    /// Whether the record is being deleted.
    pub deleting: bool,
    /// Whether the record still carries our finalizer.
    pub has_finalizer: bool,
    /// Whether a person approved it (`gpuremediation.dev/approved=true`).
    pub approved: bool,
    /// Whether it was created for a node past `maxAttemptsPerNode` and has not been admitted
    /// since (after a person's approval): it must enter `ManualRequired` and touch nothing.
    pub attempts_exhausted: bool,
    /// The node, `None` when it no longer exists.
    pub node: Option<NodeState>,
    /// The node's health under the policy.
    pub health: Health,
    /// `release.healthyFor`.
    pub healthy_for: SignedDuration,
    /// Whether the drain already finished (condition `Drained`), waiting for the hand-over.
    pub drained: bool,
    /// The time of the decision.
    pub now: Timestamp,
}

/// Why a remediation is cancelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CancelReason {
    /// The node recovered and stayed healthy for `release.healthyFor`.
    Recovered,
    /// A person made the node schedulable again.
    UncordonedByPerson,
    /// The node no longer exists.
    NodeGone,
    /// The policy was deleted.
    PolicyGone,
}

impl CancelReason {
    /// The Event and condition reason.
    #[must_use]
    pub const fn reason(self) -> &'static str {
        match self {
            Self::Recovered => reasons::NODE_RECOVERED,
            Self::UncordonedByPerson => reasons::UNCORDONED_BY_PERSON,
            Self::NodeGone => reasons::NODE_GONE,
            Self::PolicyGone => "PolicyDeleted",
        }
    }

    /// A sentence for the status.
    #[must_use]
    pub const fn message(self) -> &'static str {
        match self {
            Self::Recovered => "the node recovered and stayed healthy for release.healthyFor; released",
            Self::UncordonedByPerson => {
                "a person uncordoned the node; the remediation stops and leaves it alone"
            }
            Self::NodeGone => "the node no longer exists",
            Self::PolicyGone => "the policy that governed this node was deleted; released",
        }
    }
}

/// Why a held `action: None` remediation ends `Succeeded`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// The node recovered and stayed healthy for `release.healthyFor`: we uncordon what we own.
    Recovered,
    /// A person made the node schedulable again.
    ReleasedByPerson,
}

impl FinishReason {
    /// The Event and condition reason.
    #[must_use]
    pub const fn reason(self) -> &'static str {
        match self {
            Self::Recovered => reasons::NODE_RECOVERED,
            Self::ReleasedByPerson => reasons::UNCORDONED_BY_PERSON,
        }
    }

    /// A sentence for the status.
    #[must_use]
    pub const fn message(self) -> &'static str {
        match self {
            Self::Recovered => {
                "action None: the node recovered and stayed healthy for release.healthyFor; released what we held"
            }
            Self::ReleasedByPerson => "action None: a person released the node (uncordoned it); finished",
        }
    }
}

/// The one next step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing to do (finished, or waiting for a person).
    Idle,
    /// Finished but still holding our finalizer: drop it.
    DropFinalizer,
    /// The record is being deleted before the hand-over: release what we own, then drop the
    /// finalizer.
    ReleaseForDeletion,
    /// Release what we own and end in `Cancelled`.
    Cancel(CancelReason),
    /// Mode `DryRun`: record what would happen, end in `DryRun`.
    RecordDryRun,
    /// Mode `Manual`: enter `AwaitingApproval`.
    AwaitApproval,
    /// The node used up `maxAttemptsPerNode`: enter `ManualRequired`, touching nothing.
    RequireManual,
    /// Make the node unschedulable, taint it, record ownership; enter `Cordoned`.
    Cordon,
    /// Enter or continue `Draining` (or `Blocked`).
    Drain,
    /// The drain finished: hand over to the action.
    HandOver,
    /// Phase `Replacing`: trigger the replacement (idempotent), record its object, enter
    /// `Verifying`.
    TriggerReplacement,
    /// Phase `Verifying`: look at the replacement and judge it.
    VerifyReplacement,
    /// Nothing to do until this time (a healthy node waiting out `release.healthyFor`) unless
    /// something changes first; the drain continues meanwhile.
    DrainUntilReleased(Timestamp),
    /// `action: None` after the drain: hold the node cordoned and wait for a person or for
    /// recovery (look again at the time given, when the node is healthy but not for long enough).
    HoldForPerson(Option<Timestamp>),
    /// Release what we own and end in `Succeeded`.
    Finish(FinishReason),
}

/// Whether `phase` comes before the hand-over, when cancelling still makes sense.
#[must_use]
pub const fn is_before_hand_over(phase: Phase) -> bool {
    matches!(
        phase,
        Phase::Pending | Phase::AwaitingApproval | Phase::Cordoned | Phase::Draining | Phase::Blocked
    )
}

/// Whether the node has been cordoned by the time of `phase`.
const fn is_cordoned_phase(phase: Phase) -> bool {
    matches!(phase, Phase::Cordoned | Phase::Draining | Phase::Blocked)
}

/// The next step for a remediation.
#[must_use]
pub fn next_step(observed: &Observed) -> Step {
    let phase = observed.phase;
    if phase == Phase::ManualRequired {
        // Not finished for good: a person's approval brings it back to `Pending` through the
        // budget (fleet), so it keeps its finalizer until it is deleted.
        return if observed.deleting && observed.has_finalizer {
            Step::DropFinalizer
        } else {
            Step::Idle
        };
    }
    if phase.is_terminal() {
        return if observed.has_finalizer {
            Step::DropFinalizer
        } else {
            Step::Idle
        };
    }
    if is_held(phase, observed.action) {
        return next_held_step(observed);
    }
    if !is_before_hand_over(phase) {
        // Replacing and Verifying: the node is meant to go now, so neither its absence nor a
        // deleted record cancels anything; the replacement module carries it to the end.
        return match (observed.deleting, observed.health, phase) {
            (true, _, _) => Step::DropFinalizer,
            (false, Health::PolicyGone, _) => Step::Idle,
            (false, _, Phase::Replacing) => Step::TriggerReplacement,
            (false, _, _) => Step::VerifyReplacement,
        };
    }
    if observed.deleting {
        return Step::ReleaseForDeletion;
    }
    let Some(node) = observed.node else {
        return Step::Cancel(CancelReason::NodeGone);
    };
    if is_cordoned_phase(phase) && node.cordon == Cordon::None {
        return Step::Cancel(CancelReason::UncordonedByPerson);
    }
    let mut release_at = None;
    match observed.health {
        Health::PolicyGone => return Step::Cancel(CancelReason::PolicyGone),
        Health::Recovered(None) => return Step::Cancel(CancelReason::Recovered),
        Health::Recovered(Some(since)) => {
            let at = plus(since, observed.healthy_for);
            if at <= observed.now {
                return Step::Cancel(CancelReason::Recovered);
            }
            release_at = Some(at);
        }
        Health::Broken => {}
    }
    match phase {
        Phase::Pending if observed.attempts_exhausted => Step::RequireManual,
        Phase::Pending => match observed.mode {
            Mode::DryRun => Step::RecordDryRun,
            Mode::Manual if !observed.approved => Step::AwaitApproval,
            Mode::Manual | Mode::Enforce => Step::Cordon,
        },
        Phase::AwaitingApproval if observed.approved => Step::Cordon,
        Phase::AwaitingApproval => Step::Idle,
        _ if observed.drained => Step::HandOver,
        _ => release_at.map_or(Step::Drain, Step::DrainUntilReleased),
    }
}

/// Whether `phase` is a drained `action: None` remediation holding its node for a person or for
/// recovery. It is not terminal, so it counts as in flight.
#[must_use]
pub fn is_held(phase: Phase, action: Action) -> bool {
    phase == Phase::Verifying && action == Action::None
}

/// The next step of a held `action: None` remediation: it ends `Succeeded` when the node
/// recovers for `release.healthyFor` or a person uncordons it, and waits otherwise.
fn next_held_step(observed: &Observed) -> Step {
    if observed.deleting {
        return Step::ReleaseForDeletion;
    }
    let Some(node) = observed.node else {
        return Step::Cancel(CancelReason::NodeGone);
    };
    if node.cordon == Cordon::None {
        return Step::Finish(FinishReason::ReleasedByPerson);
    }
    match observed.health {
        Health::PolicyGone => Step::Cancel(CancelReason::PolicyGone),
        Health::Recovered(None) => Step::Finish(FinishReason::Recovered),
        Health::Recovered(Some(since)) => {
            let at = plus(since, observed.healthy_for);
            if at <= observed.now {
                Step::Finish(FinishReason::Recovered)
            } else {
                Step::HoldForPerson(Some(at))
            }
        }
        Health::Broken => Step::HoldForPerson(None),
    }
}

/// What the drain found on the node, after this round of evictions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DrainState {
    /// Pods that must leave and are still there.
    pub remaining: u32,
    /// When the drain started (entered `Draining`).
    pub started: Timestamp,
    /// `drain.timeout`.
    pub timeout: SignedDuration,
    /// `drain.onTimeout`.
    pub on_timeout: OnDrainTimeout,
    /// The time.
    pub now: Timestamp,
}

/// Where a drain goes from here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrainVerdict {
    /// Every pod that had to leave is gone.
    Drained,
    /// Keep evicting and waiting; check again at the timeout.
    Continue {
        /// When the drain times out.
        deadline: Timestamp,
    },
    /// Past the timeout with `Block`: enter `Blocked`, keep evicting.
    Blocked,
    /// Past the timeout with `ForceDelete`: delete the remaining pods.
    ForceDelete,
    /// Past the timeout with `Proceed`: hand over with the pods still there.
    Proceed,
}

/// The drain's verdict.
#[must_use]
pub fn drain_verdict(state: DrainState) -> DrainVerdict {
    if state.remaining == 0 {
        return DrainVerdict::Drained;
    }
    let deadline = plus(state.started, state.timeout);
    if state.now < deadline {
        return DrainVerdict::Continue { deadline };
    }
    match state.on_timeout {
        OnDrainTimeout::Block => DrainVerdict::Blocked,
        OnDrainTimeout::ForceDelete => DrainVerdict::ForceDelete,
        OnDrainTimeout::Proceed => DrainVerdict::Proceed,
    }
}

/// What the hand-over does with a drained node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandOver {
    /// `action: None`: hold the node cordoned (phase `Verifying`) until a person acts or it
    /// recovers.
    Hold,
    /// `Replace` or `Reboot`: the replacement module takes over.
    Replace,
}

/// The hand-over for an action.
#[must_use]
pub const fn hand_over(action: Action) -> HandOver {
    match action {
        Action::None => HandOver::Hold,
        Action::Replace | Action::Reboot => HandOver::Replace,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn observed(phase: Phase) -> Observed {
        Observed {
            phase,
            mode: Mode::Enforce,
            action: Action::Replace,
            deleting: false,
            has_finalizer: true,
            approved: false,
            attempts_exhausted: false,
            node: Some(NodeState {
                cordon: if is_cordoned_phase(phase) {
                    Cordon::Ours
                } else {
                    Cordon::None
                },
            }),
            health: Health::Broken,
            healthy_for: SignedDuration::from_secs(60),
            drained: false,
            now: at(1000),
        }
    }

    #[test]
    fn an_enforced_remediation_cordons_then_drains() {
        assert_eq!(next_step(&observed(Phase::Pending)), Step::Cordon);
        assert_eq!(next_step(&observed(Phase::Cordoned)), Step::Drain);
        assert_eq!(next_step(&observed(Phase::Draining)), Step::Drain);
        assert_eq!(next_step(&observed(Phase::Blocked)), Step::Drain);
    }

    #[test]
    fn a_dry_run_only_records() {
        let o = Observed {
            mode: Mode::DryRun,
            ..observed(Phase::Pending)
        };
        assert_eq!(next_step(&o), Step::RecordDryRun);
    }

    #[test]
    fn a_manual_remediation_waits_for_approval_then_cordons() {
        let o = Observed {
            mode: Mode::Manual,
            ..observed(Phase::Pending)
        };
        assert_eq!(next_step(&o), Step::AwaitApproval);
        let o = Observed {
            mode: Mode::Manual,
            ..observed(Phase::AwaitingApproval)
        };
        assert_eq!(next_step(&o), Step::Idle);
        let o = Observed {
            mode: Mode::Manual,
            approved: true,
            ..observed(Phase::AwaitingApproval)
        };
        assert_eq!(next_step(&o), Step::Cordon);
    }

    #[test]
    fn a_remediation_born_past_its_attempts_requires_a_person_and_touches_nothing() {
        let o = Observed {
            attempts_exhausted: true,
            ..observed(Phase::Pending)
        };
        assert_eq!(next_step(&o), Step::RequireManual);
        let o = Observed {
            attempts_exhausted: true,
            approved: true,
            ..observed(Phase::Pending)
        };
        assert_eq!(
            next_step(&o),
            Step::RequireManual,
            "approval alone does not bypass the budget: the fleet admits it first"
        );
    }

    #[test]
    fn a_manual_required_remediation_waits_and_keeps_its_finalizer_until_deleted() {
        let o = Observed {
            approved: true,
            ..observed(Phase::ManualRequired)
        };
        assert_eq!(next_step(&o), Step::Idle);
        let o = Observed {
            deleting: true,
            ..observed(Phase::ManualRequired)
        };
        assert_eq!(next_step(&o), Step::DropFinalizer);
    }

    #[test]
    fn a_remediation_admitted_after_approval_cordons() {
        let o = Observed {
            approved: true,
            ..observed(Phase::Pending)
        };
        assert_eq!(next_step(&o), Step::Cordon);
    }

    #[test]
    fn a_node_a_person_uncordons_cancels_the_remediation() {
        let o = Observed {
            node: Some(NodeState { cordon: Cordon::None }),
            ..observed(Phase::Draining)
        };
        assert_eq!(next_step(&o), Step::Cancel(CancelReason::UncordonedByPerson));
    }

    #[test]
    fn a_node_cordoned_by_someone_else_is_not_an_uncordon() {
        let o = Observed {
            node: Some(NodeState {
                cordon: Cordon::Theirs,
            }),
            ..observed(Phase::Draining)
        };
        assert_eq!(next_step(&o), Step::Drain);
    }

    #[test]
    fn a_vanished_node_cancels() {
        let o = Observed {
            node: None,
            ..observed(Phase::Draining)
        };
        assert_eq!(next_step(&o), Step::Cancel(CancelReason::NodeGone));
    }

    #[test]
    fn a_node_healthy_for_less_than_healthy_for_keeps_draining_until_then() {
        let o = Observed {
            health: Health::Recovered(Some(at(990))),
            ..observed(Phase::Draining)
        };
        assert_eq!(next_step(&o), Step::DrainUntilReleased(at(1050)));
    }

    #[test]
    fn a_node_healthy_for_healthy_for_is_released() {
        let o = Observed {
            health: Health::Recovered(Some(at(940))),
            ..observed(Phase::Draining)
        };
        assert_eq!(next_step(&o), Step::Cancel(CancelReason::Recovered));
        let o = Observed {
            health: Health::Recovered(Some(at(940))),
            ..observed(Phase::Pending)
        };
        assert_eq!(next_step(&o), Step::Cancel(CancelReason::Recovered));
    }

    #[test]
    fn a_record_deleted_before_the_hand_over_releases_the_node() {
        let o = Observed {
            deleting: true,
            ..observed(Phase::Draining)
        };
        assert_eq!(next_step(&o), Step::ReleaseForDeletion);
    }

    #[test]
    fn a_finished_remediation_only_drops_its_finalizer() {
        assert_eq!(next_step(&observed(Phase::Cancelled)), Step::DropFinalizer);
        let o = Observed {
            has_finalizer: false,
            deleting: true,
            ..observed(Phase::Succeeded)
        };
        assert_eq!(next_step(&o), Step::Idle);
    }

    #[test]
    fn a_drained_remediation_hands_over() {
        let o = Observed {
            drained: true,
            ..observed(Phase::Draining)
        };
        assert_eq!(next_step(&o), Step::HandOver);
    }

    #[test]
    fn a_replacement_continues_when_the_node_goes_as_it_is_meant_to() {
        let o = Observed {
            node: None,
            ..observed(Phase::Replacing)
        };
        assert_eq!(next_step(&o), Step::TriggerReplacement);
        let o = Observed {
            node: None,
            ..observed(Phase::Verifying)
        };
        assert_eq!(next_step(&o), Step::VerifyReplacement);
    }

    #[test]
    fn a_record_deleted_during_the_replacement_only_drops_its_finalizer() {
        let o = Observed {
            deleting: true,
            ..observed(Phase::Verifying)
        };
        assert_eq!(next_step(&o), Step::DropFinalizer);
    }

    fn drain(remaining: u32, now: i64, on_timeout: OnDrainTimeout) -> DrainState {
        DrainState {
            remaining,
            started: at(0),
            timeout: SignedDuration::from_secs(60),
            on_timeout,
            now: at(now),
        }
    }

    #[test]
    fn a_drain_with_no_pod_left_is_drained_even_past_its_timeout() {
        assert_eq!(
            drain_verdict(drain(0, 500, OnDrainTimeout::Block)),
            DrainVerdict::Drained
        );
    }

    #[test]
    fn a_drain_before_its_timeout_continues_until_the_deadline() {
        assert_eq!(
            drain_verdict(drain(2, 59, OnDrainTimeout::Block)),
            DrainVerdict::Continue { deadline: at(60) }
        );
    }

    #[test]
    fn a_drain_past_its_timeout_does_what_on_timeout_says() {
        assert_eq!(
            drain_verdict(drain(1, 60, OnDrainTimeout::Block)),
            DrainVerdict::Blocked
        );
        assert_eq!(
            drain_verdict(drain(1, 60, OnDrainTimeout::ForceDelete)),
            DrainVerdict::ForceDelete
        );
        assert_eq!(
            drain_verdict(drain(1, 60, OnDrainTimeout::Proceed)),
            DrainVerdict::Proceed
        );
    }

    #[test]
    fn action_none_holds_after_the_drain_and_replace_hands_over() {
        assert_eq!(hand_over(Action::None), HandOver::Hold);
        assert_eq!(hand_over(Action::Replace), HandOver::Replace);
    }

    fn held() -> Observed {
        Observed {
            action: Action::None,
            drained: true,
            node: Some(NodeState { cordon: Cordon::Ours }),
            ..observed(Phase::Verifying)
        }
    }

    #[test]
    fn a_drained_action_none_remediation_waits_while_the_node_is_broken() {
        assert_eq!(next_step(&held()), Step::HoldForPerson(None));
    }

    #[test]
    fn a_held_node_healthy_for_less_than_healthy_for_is_looked_at_again_then() {
        let o = Observed {
            health: Health::Recovered(Some(at(990))),
            ..held()
        };
        assert_eq!(next_step(&o), Step::HoldForPerson(Some(at(1050))));
    }

    #[test]
    fn a_held_node_that_recovered_for_healthy_for_is_released_and_succeeds() {
        let o = Observed {
            health: Health::Recovered(Some(at(940))),
            ..held()
        };
        assert_eq!(next_step(&o), Step::Finish(FinishReason::Recovered));
        let o = Observed {
            health: Health::Recovered(Some(at(940))),
            node: Some(NodeState {
                cordon: Cordon::Theirs,
            }),
            ..held()
        };
        assert_eq!(
            next_step(&o),
            Step::Finish(FinishReason::Recovered),
            "a person's cordon is left in place by the release, but we finish"
        );
    }

    #[test]
    fn a_held_node_a_person_uncordons_succeeds_as_released_by_a_person() {
        let o = Observed {
            node: Some(NodeState { cordon: Cordon::None }),
            ..held()
        };
        assert_eq!(next_step(&o), Step::Finish(FinishReason::ReleasedByPerson));
    }

    #[test]
    fn a_replacement_in_verifying_is_not_held() {
        let o = Observed {
            drained: true,
            ..observed(Phase::Verifying)
        };
        assert_eq!(next_step(&o), Step::VerifyReplacement);
    }
}
