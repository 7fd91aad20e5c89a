//! Whether a triggered replacement has finished: pure, from what was observed and the time.
//!
//! - `DeleteNode`, `DeleteMachine`, `DeleteNodeClaim`: succeeded when the deleted object *and*
//!   the node are gone and, where the strategy knows a replacement is coming (a Cluster API
//!   `MachineSet` restores its replicas), when that replacement's node is Ready.
//! - `DeleteNode` in particular: succeeded only once a replacement was seen to join
//!   ([`replacement_seen`]: a Ready node the policy selects, another machine than the deleted one,
//!   created at or after the delete). A node gone with none seen by `replacement.timeout` ends
//!   [`Progress::GoneUnseen`]: nothing is held any more, but nothing proves the capacity came back,
//!   so slow start does not count it as a success.
//! - `Template`: succeeded when the object reports done (a `Succeeded`/`Ready`/`Complete`-style
//!   condition or phase), when the node is healthy again, or when the node is gone; failed when it
//!   reports failure or is deleted before reporting done.
//! - Any strategy: failed with reason [`REPLACEMENT_TIMEOUT`] once `replacement.timeout` has
//!   passed since the trigger, naming what was still awaited.

use std::time::Duration;

use crate::observe::NodeView;
use gpu_remediation_api::{GpuRemediationStatus, Phase, policy::Strategy};
use jiff::Timestamp;

/// Condition/Event reason: the replacement did not finish within `replacement.timeout`.
pub const REPLACEMENT_TIMEOUT: &str = "ReplacementTimeout";
/// Condition/Event reason: the template's object reported failure, or vanished before success.
pub const REPLACEMENT_FAILED: &str = "ReplacementFailed";
/// Condition/Event reason: the replacement finished.
pub const REPLACED: &str = "Replaced";
/// Condition/Event reason: `DeleteNode` ended with the node gone but no replacement seen to join
/// within `replacement.timeout` (not a proven success).
pub const REPLACEMENT_NOT_SEEN: &str = "ReplacementNotSeen";

/// Whether an object exists, as far as the remediation is concerned (an object with the same name
/// but another UID is a different object: ours is gone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presence {
    /// It exists and is not being deleted.
    Present,
    /// It exists with a deletion timestamp (finalizers still running).
    Deleting,
    /// It does not exist.
    Gone,
}

/// What a template's object says about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reported {
    /// The strategy has no object that reports (the delete strategies).
    Nothing,
    /// Not done yet.
    InProgress,
    /// Done, with the condition or phase that said so.
    Done(String),
    /// Failed, with the condition or phase and its message.
    Failed(String),
}

/// The node that replaces the remediated one, where the strategy can tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplacementNode {
    /// No one-to-one replacement is expected (a node group or Karpenter provisions for pending
    /// pods on its own schedule), so none is awaited.
    NotExpected,
    /// One is expected and has not joined yet.
    Awaited,
    /// One joined: its node name and whether it is Ready.
    Joined {
        /// The new node.
        node: String,
        /// Whether its `Ready` condition is `True`.
        ready: bool,
    },
}

/// One look at a triggered replacement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observation {
    /// The object named by the remediation's `status.replacement`.
    pub target: Presence,
    /// The remediated node.
    pub node: Presence,
    /// What a template's object reports.
    pub reported: Reported,
    /// The replacement node.
    pub replacement: ReplacementNode,
}

/// Everything the verdict depends on.
#[derive(Debug, Clone)]
pub struct Verification<'a> {
    /// The policy's strategy.
    pub strategy: Strategy,
    /// The latest observation.
    pub observation: &'a Observation,
    /// Whether the node's triggers have cleared (as the controller's detection says).
    pub node_healthy: bool,
    /// When the replacement was triggered (entry into `Replacing`).
    pub triggered_at: Timestamp,
    /// The policy's `replacement.timeout`.
    pub timeout: Duration,
    /// Now.
    pub now: Timestamp,
}

/// The verdict on a replacement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// Still going; the message says what is awaited.
    Waiting {
        /// For a person.
        message: String,
    },
    /// Finished; the remediation succeeds.
    Succeeded {
        /// For a person.
        message: String,
    },
    /// `DeleteNode`: the node is gone but no replacement was seen to join within
    /// `replacement.timeout`. The remediation ends (it holds nothing) with reason
    /// [`REPLACEMENT_NOT_SEEN`], which slow start does not count as a success.
    GoneUnseen {
        /// For a person.
        message: String,
    },
    /// Finished badly; the remediation fails with this reason.
    Failed {
        /// [`REPLACEMENT_TIMEOUT`] or [`REPLACEMENT_FAILED`].
        reason: &'static str,
        /// For a person.
        message: String,
    },
}

/// Judges a replacement. See the module docs for the rules.
#[must_use]
pub fn judge(verification: &Verification<'_>) -> Progress {
    let observation = verification.observation;
    let verdict = match verification.strategy {
        Strategy::Template => judge_template(observation, verification.node_healthy),
        Strategy::DeleteNode | Strategy::DeleteMachine | Strategy::DeleteNodeClaim => {
            judge_deletion(observation)
        }
    };
    let gone_awaiting = verification.strategy == Strategy::DeleteNode
        && observation.node == Presence::Gone
        && observation.target == Presence::Gone
        && observation.replacement == ReplacementNode::Awaited;
    match verdict {
        Progress::Waiting { message } if gone_awaiting && timed_out(verification) => Progress::GoneUnseen {
            message: format!(
                "gone, replacement not seen: the node was deleted but no new Ready node the policy selects joined \
                 within {}s ({message})",
                verification.timeout.as_secs()
            ),
        },
        Progress::Waiting { message } if timed_out(verification) => Progress::Failed {
            reason: REPLACEMENT_TIMEOUT,
            message: format!(
                "the replacement did not finish within {}s: {message}",
                verification.timeout.as_secs()
            ),
        },
        other => other,
    }
}

fn timed_out(verification: &Verification<'_>) -> bool {
    let timeout = jiff::SignedDuration::try_from(verification.timeout).unwrap_or(jiff::SignedDuration::MAX);
    let deadline = verification
        .triggered_at
        .checked_add(timeout)
        .unwrap_or(Timestamp::MAX);
    verification.now >= deadline
}

fn judge_template(observation: &Observation, node_healthy: bool) -> Progress {
    match &observation.reported {
        Reported::Failed(what) => {
            return Progress::Failed {
                reason: REPLACEMENT_FAILED,
                message: format!("the template's object reported {what}"),
            };
        }
        Reported::Done(what) => {
            return Progress::Succeeded {
                message: format!("the template's object reported {what}"),
            };
        }
        Reported::Nothing | Reported::InProgress => {}
    }
    if node_healthy {
        return Progress::Succeeded {
            message: "the node is healthy again".to_owned(),
        };
    }
    if observation.node == Presence::Gone {
        return Progress::Succeeded {
            message: "the node was replaced: it is gone".to_owned(),
        };
    }
    if observation.target == Presence::Gone {
        return Progress::Failed {
            reason: REPLACEMENT_FAILED,
            message: "the template's object was deleted before it reported done".to_owned(),
        };
    }
    Progress::Waiting {
        message: "waiting for the template's object to report done or the node to recover".to_owned(),
    }
}

fn judge_deletion(observation: &Observation) -> Progress {
    match (observation.target, observation.node) {
        (Presence::Gone, Presence::Gone) => {}
        (Presence::Gone, _) => {
            return Progress::Waiting {
                message: "waiting for the node to be deleted".to_owned(),
            };
        }
        (_, _) => {
            return Progress::Waiting {
                message: "waiting for the replaced object to be deleted".to_owned(),
            };
        }
    }
    match &observation.replacement {
        ReplacementNode::NotExpected => Progress::Succeeded {
            message: "the node is gone".to_owned(),
        },
        ReplacementNode::Joined { node, ready: true } => Progress::Succeeded {
            message: format!("the node is gone and its replacement {node} is Ready"),
        },
        ReplacementNode::Joined { node, ready: false } => Progress::Waiting {
            message: format!("the node is gone; waiting for its replacement {node} to be Ready"),
        },
        ReplacementNode::Awaited => Progress::Waiting {
            message: "the node is gone; waiting for a replacement to join".to_owned(),
        },
    }
}

/// The replacement a `DeleteNode` awaits, from the nodes seen: a node `selects` (the policy's
/// selector), another machine than the deleted one (not its UID `deleted_uid`; a node re-registered
/// under the same name counts), created at or after `deleted_at` (the delete). The earliest Ready
/// one if any joined Ready, else the earliest joined; [`ReplacementNode::Awaited`] when none.
/// Creation times have whole seconds: the delete's second counts.
#[must_use]
pub fn replacement_seen<'n, N: NodeView + 'n>(
    nodes: impl IntoIterator<Item = &'n N>,
    selects: impl Fn(&N) -> bool,
    deleted_uid: Option<&str>,
    deleted_at: Timestamp,
) -> ReplacementNode {
    let deleted_at = Timestamp::from_second(deleted_at.as_second()).unwrap_or(deleted_at);
    let mut joined: Vec<(bool, Timestamp, &str)> = nodes
        .into_iter()
        .filter(|n| n.node_uid() != deleted_uid || deleted_uid.is_none())
        .filter(|n| n.deleting().is_none() && selects(n))
        .filter_map(|n| {
            let created = n.created()?.0;
            (created >= deleted_at).then_some((!node_is_ready(n), created, n.node_name()))
        })
        .collect();
    joined.sort_unstable();
    joined
        .first()
        .map_or(ReplacementNode::Awaited, |(not_ready, _, name)| {
            ReplacementNode::Joined {
                node: (*name).to_owned(),
                ready: !not_ready,
            }
        })
}

/// When the replacement was triggered: the last entry into `Replacing` in the phase history (the
/// `triggered_at` that [`Verification`] and `act::Replacing::observe` take).
#[must_use]
pub fn replacing_since(status: &GpuRemediationStatus) -> Option<Timestamp> {
    status
        .phase_history
        .iter()
        .rev()
        .find(|transition| transition.phase == Phase::Replacing)
        .map(|transition| transition.at.0)
}

/// Whether a node's `Ready` condition is `True`.
#[must_use]
pub fn node_is_ready(node: &(impl NodeView + ?Sized)) -> bool {
    node.condition("Ready").is_some_and(|c| c.status == "True")
}

#[cfg(test)]
#[path = "verify_tests.rs"]
mod tests;
