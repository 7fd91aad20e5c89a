//! What the lifecycle decides: one more request to put to the server, or how the pass ends (the
//! new status, what to give back, the Events, when to look again), and why a remediation is
//! cancelled.

use gpu_remediation_api::{GpuRemediationStatus, constants::reasons};
use jiff::Timestamp;

use super::{NodeRef, note::Note};
use crate::drain::Leaving;

/// One request to put to the server; its answer comes back in [`Answers`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ask {
    /// Make the node unschedulable and taint it, recording that this remediation did.
    Cordon(NodeRef),
    /// Evict these pods through the Eviction API.
    Evict {
        /// The pods.
        pods: Vec<Leaving>,
        /// The policy's grace period.
        grace: Option<i64>,
    },
    /// Give these pods the checkpoint notice (`drain.notice`): annotate each with the time its
    /// eviction comes, and say it in an Event.
    Notice {
        /// The pods.
        pods: Vec<Leaving>,
        /// When their eviction comes at the latest.
        evict_at: jiff::Timestamp,
    },
    /// Ask the server which of these pods' evictions would be refused, changing nothing.
    DryRunEvict(Vec<Leaving>),
    /// Delete these pods directly (`onTimeout: ForceDelete`).
    Delete {
        /// The pods.
        pods: Vec<Leaving>,
        /// The grace period to delete with (`Some(0)` only when the policy allows it).
        grace: Option<i64>,
    },
    /// Trigger the replacement (idempotent: the strategy finds an earlier attempt's object).
    TriggerReplacement,
    /// Create the ladder step's template object (idempotent, as the `Template` strategy).
    TriggerStep(gpu_remediation_api::ladder::Rung),
    /// Label the node for a person (the ladder's `HandOff`), keeping the cordon.
    HandOff(NodeRef),
    /// Create the policy's validation Job on the node for the step `Rung`, or for a recovery no
    /// step made (`action: None`), idempotent as the `Template` strategy.
    Validate(Option<gpu_remediation_api::ladder::Rung>),
    /// Create the policy's diagnostics Job on the node, before the step that destroys its state
    /// (idempotent, as the `Template` strategy).
    Diagnose,
}

/// When the remediation wants another look.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Only when something it watches changes (a person must act, or it is finished).
    Idle,
    /// At this time at the latest.
    At(Timestamp),
}

impl Next {
    /// The earlier of two looks.
    #[must_use]
    pub fn or_at(self, at: Option<Timestamp>) -> Self {
        match (self, at) {
            (Self::Idle, None) => Self::Idle,
            (Self::Idle, Some(at)) => Self::At(at),
            (Self::At(next), at) => Self::At(at.map_or(next, |at| next.min(at))),
        }
    }
}

/// Giving back what this remediation holds on its node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Release {
    /// The node, preconditioned on its admitted UID.
    pub node: NodeRef,
    /// A person deleted the record: remember on the node that this episode was cancelled, so it
    /// is not admitted again.
    pub remember_cancel: bool,
}

/// How a pass ends.
#[derive(Clone, Debug, PartialEq)]
pub struct Settlement {
    /// Give back what this remediation holds on the node, before the status is written.
    pub release: Option<Release>,
    /// The new status (written when it differs from the stored one).
    pub status: GpuRemediationStatus,
    /// Events to publish, in order.
    pub notes: Vec<Note>,
    /// Remove our finalizer after the status is written.
    pub drop_finalizer: bool,
    /// When to look again.
    pub next: Next,
}

/// What [`decide`] asks of the acting layer.
#[derive(Clone, Debug, PartialEq)]
#[allow(
    clippy::large_enum_variant,
    reason = "one decision at a time, consumed at once: boxing would only add an allocation"
)]
pub enum Decision {
    /// Put this to the server and decide again with its answer.
    Ask(Ask),
    /// End the pass.
    Settle(Settlement),
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
    /// A node of the same name with another UID replaced it.
    NodeReplaced,
    /// The policy was deleted and the record has no snapshot to follow.
    PolicyGone,
    /// A person deleted the record.
    DeletedByPerson,
}

impl CancelReason {
    /// The Event and condition reason.
    #[must_use]
    pub const fn reason(self) -> &'static str {
        match self {
            Self::Recovered => reasons::NODE_RECOVERED,
            Self::UncordonedByPerson => reasons::UNCORDONED_BY_PERSON,
            Self::NodeGone => reasons::NODE_GONE,
            Self::NodeReplaced => "NodeReplaced",
            Self::PolicyGone => "PolicyDeleted",
            Self::DeletedByPerson => "DeletedByPerson",
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
            Self::NodeReplaced => {
                "a node of the same name with another UID took its place: it is a different machine, \
                 and this remediation never touches it"
            }
            Self::PolicyGone => {
                "the policy that governed this node was deleted and the record holds no snapshot of it; released"
            }
            Self::DeletedByPerson => {
                "a person deleted this record: the node was released and this episode is not admitted again"
            }
        }
    }

    /// Whether the node still standing under the admitted UID gets back what we hold.
    pub(crate) const fn releases(self) -> bool {
        !matches!(self, Self::NodeGone | Self::NodeReplaced)
    }
}
