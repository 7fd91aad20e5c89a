//! What the lifecycle sees in one pass: the node (and who holds its cordon, whether it is the one
//! admitted, whether it recovered), its pods and budgets, and the server's answers to this pass's
//! asks.

use std::collections::{BTreeMap, BTreeSet};

use gpu_remediation_api::object_reference::ObjectReference;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::core::Status;

use crate::{
    drain::{Leaving, Plan},
    observe::NodeView,
    replace::Observation,
};

/// How long the lifecycle waits between looks, from the controller's settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pace {
    /// While pods terminate.
    pub pod_poll: SignedDuration,
    /// Before asking a refused eviction again (a budget's change wakes earlier).
    pub eviction_backoff: SignedDuration,
    /// Between looks at a replacement, and before asking a refused step again.
    pub replacement_poll: SignedDuration,
}

/// What the server answered to one eviction.
#[derive(Clone, Debug)]
pub enum EvictionAnswer {
    /// Accepted: the pod is terminating.
    Accepted,
    /// The pod is gone, or a new pod took its name.
    Gone,
    /// Refused, in the server's words (429 budget, 500 two budgets, 403 webhook or terminating
    /// namespace, 422, ...).
    Refused(Box<Status>),
    /// No answer (a transport error): asked again after the backoff.
    Unanswered(String),
}

/// A refusal as the server worded it (or one of our own checks), before it is dated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Words {
    /// What was asked.
    pub action: String,
    /// The server's message.
    pub message: String,
    /// What the failure is: whether asking again may pass (see `retry`).
    pub cause: crate::retry::Cause,
}

impl Words {
    /// The failure of `action` with `error`, classified by what it is (see `retry::cause_of`).
    #[must_use]
    pub fn of(action: String, error: &(dyn std::error::Error + 'static)) -> Self {
        Self {
            action,
            message: error.to_string(),
            cause: crate::retry::cause_of(error),
        }
    }

    /// The server's answer `code` to `action`, in its words.
    #[must_use]
    pub const fn answered(action: String, code: u16, message: String) -> Self {
        Self {
            action,
            message,
            cause: crate::retry::Cause::Answered(code),
        }
    }

    /// One of our own checks refusing `action` before anything was asked ([`Cause::Invalid`]:
    /// permanent, no HTTP status).
    ///
    /// [`Cause::Invalid`]: crate::retry::Cause::Invalid
    #[must_use]
    pub const fn invalid(action: String, message: String) -> Self {
        Self {
            action,
            message,
            cause: crate::retry::Cause::Invalid,
        }
    }

    /// The HTTP status, if the server answered.
    #[must_use]
    pub const fn code(&self) -> Option<u16> {
        match self.cause {
            crate::retry::Cause::Answered(code) => Some(code),
            _ => None,
        }
    }

    /// Whether asking again may pass (see `retry`).
    #[must_use]
    pub const fn is_transient(&self) -> bool {
        self.cause.is_transient()
    }
}

/// What the server answered to the cordon.
#[derive(Clone, Debug)]
pub enum CordonAnswer {
    /// Cordoned (or already); whether the cordon was someone else's before us.
    Cordoned {
        /// The node was unschedulable before we came: the cordon stays theirs.
        theirs: bool,
    },
    /// The node is gone.
    NodeGone,
    /// A node of that name with another UID stands there now.
    NodeReplaced,
    /// Refused.
    Refused(Words),
}

/// The answers to this pass's asks, fed back into [`decide`].
#[derive(Clone, Debug, Default)]
pub struct Answers {
    /// The cordon's.
    pub cordon: Option<CordonAnswer>,
    /// Each eviction asked and answered.
    pub evictions: Vec<(Leaving, EvictionAnswer)>,
    /// Evictions asked whose answers have not come yet, by pod UID: not asked again (the acting
    /// layer decides again as answers and budget changes come, and settles only once every
    /// eviction it asked is answered).
    pub evictions_unanswered: BTreeSet<String>,
    /// The pods given the checkpoint notice this pass (or found gone), by UID.
    pub noticed: BTreeSet<String>,
    /// The pods whose notice was refused this pass, by UID: not noticed again this pass, and
    /// evicted without one.
    pub notice_refused: BTreeSet<String>,
    /// Each dry-run eviction asked (mode `DryRun`).
    pub dry_run: Option<Vec<(Leaving, EvictionAnswer)>>,
    /// Each forced deletion asked.
    pub deletions: Vec<(Leaving, Result<(), Words>)>,
    /// The replacement's trigger.
    pub trigger: Option<Result<ObjectReference, Words>>,
    /// The ladder step's object.
    pub step: Option<Result<ObjectReference, Words>>,
    /// The hand-off label.
    pub hand_off: Option<Result<(), Words>>,
    /// The validation Job's create (boxed: the acting layer's future holds the answers across its
    /// awaits, and stays under clippy's large-future bound).
    pub validation: Option<Box<Result<ObjectReference, Words>>>,
    /// The diagnostics Job's create (boxed, as the validation's).
    pub diagnostics: Option<Box<Result<ObjectReference, Words>>>,
}

/// What was seen for this pass.
#[derive(Clone, Copy)]
pub struct Seen<'a> {
    /// The node read by name (`None`: no node of that name).
    pub node: Option<&'a dyn NodeView>,
    /// The node's pods, as the drain plans them (listed only in the phases that drain).
    pub pods: Option<&'a Plan>,
    /// With a ladder: which pods the plan takes and why (see `DrainStatus::scope`).
    pub drain_scope: Option<&'a str>,
    /// The gangs the drain touches, to record when it first acts (see `DrainStatus::gangs`;
    /// under `drain.gangs: Together` their members on other nodes are in `pods` too).
    pub gangs: &'a [gpu_remediation_api::gangs::GangRecord],
    /// The disruption budgets.
    pub budgets: &'a [PodDisruptionBudget],
    /// Evictions asked by this controller (any remediation, this pass included) that each budget's
    /// status, by `namespace/name`, does not count yet (see [`super::eviction_round::in_flight`]).
    pub in_flight: &'a BTreeMap<String, u32>,
    /// When each pod (by UID) was last asked to leave.
    pub asked_at: &'a (dyn Fn(&str) -> Option<Timestamp> + Sync),
    /// The replacement (or the ladder step's object), looked at in `Verifying`.
    pub replacement: Option<&'a Result<Observation, Words>>,
    /// The open step's validation Job, looked at while it runs (see `lifecycle::validation`).
    pub validation: Option<&'a Result<Observation, Words>>,
    /// The diagnostics Job, looked at while it runs (see `lifecycle::diagnostics`).
    pub diagnostics: Option<&'a Result<Observation, Words>>,
    /// The answers to the asks of this pass.
    pub answers: &'a Answers,
    /// The controller's pace.
    pub pace: Pace,
}

/// Whether the node is still broken under the snapshot's triggers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Health {
    /// A trigger holds (or is pending).
    Broken,
    /// No trigger holds, since this time (`None`: the condition is gone altogether).
    Recovered(Option<Timestamp>),
}

/// Whether the node seen by name is the node admitted.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Identity<'a> {
    /// The admitted node (same UID, or no UID was recorded).
    Same(&'a dyn NodeView),
    /// A node of that name with another UID: a different machine, never touched.
    Replaced,
    /// No node of that name.
    Gone,
}
