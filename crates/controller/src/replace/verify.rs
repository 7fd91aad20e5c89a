//! Whether a triggered replacement has finished: pure, from what was observed and the time.
//!
//! - `DeleteNode`, `DeleteMachine`, `DeleteNodeClaim`: succeeded when the deleted object *and*
//!   the node are gone and, where the strategy knows a replacement is coming (a Cluster API
//!   `MachineSet` restores its replicas), when that replacement's node is Ready.
//! - `Template`: succeeded when the object reports done (a `Succeeded`/`Ready`/`Complete`-style
//!   condition or phase), when the node is healthy again, or when the node is gone; failed when it
//!   reports failure or is deleted before reporting done.
//! - Any strategy: failed with reason [`REPLACEMENT_TIMEOUT`] once `replacement.timeout` has
//!   passed since the trigger, naming what was still awaited.

use std::time::Duration;

use gpu_remediation_api::{GpuRemediationStatus, Phase, policy::Strategy};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;

/// Condition/Event reason: the replacement did not finish within `replacement.timeout`.
pub const REPLACEMENT_TIMEOUT: &str = "ReplacementTimeout";
/// Condition/Event reason: the template's object reported failure, or vanished before success.
pub const REPLACEMENT_FAILED: &str = "ReplacementFailed";
/// Condition/Event reason: the replacement finished.
pub const REPLACED: &str = "Replaced";

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
    match verdict {
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
pub fn node_is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|status| status.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).expect("valid timestamp")
    }

    fn observed(target: Presence, node: Presence) -> Observation {
        Observation {
            target,
            node,
            reported: Reported::Nothing,
            replacement: ReplacementNode::NotExpected,
        }
    }

    fn judge_at(strategy: Strategy, observation: &Observation, node_healthy: bool, now: i64) -> Progress {
        judge(&Verification {
            strategy,
            observation,
            node_healthy,
            triggered_at: at(0),
            timeout: Duration::from_secs(600),
            now: at(now),
        })
    }

    fn is_waiting(progress: &Progress) -> bool {
        matches!(progress, Progress::Waiting { .. })
    }

    #[test]
    fn a_deleted_node_that_is_gone_is_replaced() {
        let gone = observed(Presence::Gone, Presence::Gone);
        assert!(matches!(
            judge_at(Strategy::DeleteNode, &gone, false, 5),
            Progress::Succeeded { .. }
        ));
    }

    #[test]
    fn a_node_still_terminating_is_not_yet_replaced() {
        let deleting = observed(Presence::Deleting, Presence::Deleting);
        assert!(is_waiting(&judge_at(Strategy::DeleteNode, &deleting, false, 5)));
    }

    #[test]
    fn a_deleted_machine_whose_node_lingers_is_not_yet_replaced() {
        let machine_gone = observed(Presence::Gone, Presence::Present);
        assert_eq!(
            judge_at(Strategy::DeleteMachine, &machine_gone, false, 5),
            Progress::Waiting {
                message: "waiting for the node to be deleted".to_owned()
            }
        );
    }

    /// Whether a `DeleteMachine` replacement observed as `observation` still waits at `now`.
    fn machine_waits(observation: &Observation, now: i64) -> bool {
        is_waiting(&judge_at(Strategy::DeleteMachine, observation, false, now))
    }

    #[test]
    fn a_machine_set_replacement_must_be_ready_before_success() {
        let mut observation = observed(Presence::Gone, Presence::Gone);
        observation.replacement = ReplacementNode::Awaited;
        assert!(machine_waits(&observation, 5));
        let joined = |ready| ReplacementNode::Joined {
            node: "gpu-9".to_owned(),
            ready,
        };
        observation.replacement = joined(false);
        assert!(machine_waits(&observation, 5));
        observation.replacement = joined(true);
        assert_eq!(
            judge_at(Strategy::DeleteMachine, &observation, false, 5),
            Progress::Succeeded {
                message: "the node is gone and its replacement gpu-9 is Ready".to_owned()
            }
        );
    }

    #[test]
    fn a_replacement_that_never_finishes_fails_at_the_timeout_naming_what_it_waited_for() {
        let mut observation = observed(Presence::Gone, Presence::Gone);
        observation.replacement = ReplacementNode::Awaited;
        assert!(machine_waits(&observation, 599));
        assert_eq!(
            judge_at(Strategy::DeleteMachine, &observation, false, 600),
            Progress::Failed {
                reason: REPLACEMENT_TIMEOUT,
                message: "the replacement did not finish within 600s: the node is gone; waiting for a replacement to join"
                    .to_owned()
            }
        );
    }

    #[test]
    fn a_finished_replacement_is_not_failed_by_a_late_look() {
        let gone = observed(Presence::Gone, Presence::Gone);
        assert!(matches!(
            judge_at(Strategy::DeleteNodeClaim, &gone, false, 10_000),
            Progress::Succeeded { .. }
        ));
    }

    #[test]
    fn a_template_object_reporting_done_succeeds() {
        let mut observation = observed(Presence::Present, Presence::Present);
        observation.reported = Reported::Done("condition Succeeded=True".to_owned());
        assert_eq!(
            judge_at(Strategy::Template, &observation, false, 5),
            Progress::Succeeded {
                message: "the template's object reported condition Succeeded=True".to_owned()
            }
        );
    }

    #[test]
    fn a_template_object_reporting_failure_fails() {
        let mut observation = observed(Presence::Present, Presence::Present);
        observation.reported = Reported::Failed("phase Failed".to_owned());
        assert!(matches!(
            judge_at(Strategy::Template, &observation, false, 5),
            Progress::Failed {
                reason: REPLACEMENT_FAILED,
                ..
            }
        ));
    }

    #[test]
    fn a_template_succeeds_when_the_node_is_healthy_again() {
        let mut observation = observed(Presence::Present, Presence::Present);
        observation.reported = Reported::InProgress;
        assert!(is_waiting(&judge_at(Strategy::Template, &observation, false, 5)));
        assert!(matches!(
            judge_at(Strategy::Template, &observation, true, 5),
            Progress::Succeeded { .. }
        ));
    }

    #[test]
    fn a_template_object_deleted_before_reporting_done_fails() {
        let observation = observed(Presence::Gone, Presence::Present);
        assert!(matches!(
            judge_at(Strategy::Template, &observation, false, 5),
            Progress::Failed {
                reason: REPLACEMENT_FAILED,
                ..
            }
        ));
    }

    #[test]
    fn a_template_that_never_reports_times_out() {
        let mut observation = observed(Presence::Present, Presence::Present);
        observation.reported = Reported::InProgress;
        assert!(matches!(
            judge_at(Strategy::Template, &observation, false, 600),
            Progress::Failed {
                reason: REPLACEMENT_TIMEOUT,
                ..
            }
        ));
    }

    #[test]
    fn the_trigger_time_is_the_last_entry_into_replacing() {
        use gpu_remediation_api::remediation::PhaseTransition;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let entered = |phase, seconds| PhaseTransition {
            phase,
            at: Time(at(seconds)),
            message: None,
        };
        let mut status = GpuRemediationStatus {
            phase_history: vec![entered(Phase::Cordoned, 1), entered(Phase::Draining, 2)],
            ..GpuRemediationStatus::default()
        };
        assert_eq!(replacing_since(&status), None);
        status.phase_history.push(entered(Phase::Replacing, 30));
        status.phase_history.push(entered(Phase::Verifying, 31));
        assert_eq!(replacing_since(&status), Some(at(30)));
    }

    #[test]
    fn a_node_is_ready_only_with_a_true_ready_condition() {
        use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};
        let with = |status: &str| Node {
            status: Some(NodeStatus {
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".to_owned(),
                    status: status.to_owned(),
                    ..NodeCondition::default()
                }]),
                ..NodeStatus::default()
            }),
            ..Node::default()
        };
        assert!(node_is_ready(&with("True")));
        assert!(!node_is_ready(&with("Unknown")));
        assert!(!node_is_ready(&Node::default()));
    }
}
