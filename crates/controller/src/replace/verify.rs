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

use gpu_remediation_api::{GpuRemediationStatus, Phase, policy::Strategy};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;

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
    // A deleted Node is replaced by whatever joins: one is always awaited (never "not expected").
    let awaited = Observation {
        replacement: ReplacementNode::Awaited,
        ..observation.clone()
    };
    let observation = if verification.strategy == Strategy::DeleteNode
        && observation.replacement == ReplacementNode::NotExpected
    {
        &awaited
    } else {
        observation
    };
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
                "gone, replacement not seen: the node was deleted but no new Ready node the policy selects joined                  within {}s ({message})",
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
pub fn replacement_seen<'n>(
    nodes: impl IntoIterator<Item = &'n Node>,
    selects: impl Fn(&Node) -> bool,
    deleted_uid: Option<&str>,
    deleted_at: Timestamp,
) -> ReplacementNode {
    let deleted_at = Timestamp::from_second(deleted_at.as_second()).unwrap_or(deleted_at);
    let mut joined: Vec<(bool, Timestamp, &str)> = nodes
        .into_iter()
        .filter(|n| n.metadata.uid.as_deref() != deleted_uid || deleted_uid.is_none())
        .filter(|n| n.metadata.deletion_timestamp.is_none() && selects(n))
        .filter_map(|n| {
            let created = n.metadata.creation_timestamp.as_ref()?.0;
            (created >= deleted_at).then_some((!node_is_ready(n), created, n.metadata.name.as_deref()?))
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
    fn a_deleted_node_that_is_gone_succeeds_only_once_a_replacement_joined_ready() {
        let mut gone = observed(Presence::Gone, Presence::Gone);
        // Nothing seen yet (the acting layer's "not expected" reads as awaited for DeleteNode).
        for replacement in [ReplacementNode::NotExpected, ReplacementNode::Awaited] {
            gone.replacement = replacement;
            assert_eq!(
                judge_at(Strategy::DeleteNode, &gone, false, 5),
                Progress::Waiting {
                    message: "the node is gone; waiting for a replacement to join".to_owned()
                }
            );
        }
        gone.replacement = ReplacementNode::Joined {
            node: "gpu-new".into(),
            ready: false,
        };
        assert!(is_waiting(&judge_at(Strategy::DeleteNode, &gone, false, 5)));
        gone.replacement = ReplacementNode::Joined {
            node: "gpu-new".into(),
            ready: true,
        };
        assert_eq!(
            judge_at(Strategy::DeleteNode, &gone, false, 5),
            Progress::Succeeded {
                message: "the node is gone and its replacement gpu-new is Ready".to_owned()
            }
        );
    }

    #[test]
    fn a_deleted_node_gone_with_no_replacement_by_the_timeout_ends_gone_unseen_not_failed() {
        let gone = Observation {
            replacement: ReplacementNode::Awaited,
            ..observed(Presence::Gone, Presence::Gone)
        };
        let Progress::GoneUnseen { message } = judge_at(Strategy::DeleteNode, &gone, false, 600) else {
            panic!("gone, unseen expected");
        };
        assert!(message.starts_with("gone, replacement not seen"), "{message}");
        // Still there at the timeout: that is a failure, as before.
        let lingering = observed(Presence::Deleting, Presence::Deleting);
        assert!(matches!(
            judge_at(Strategy::DeleteNode, &lingering, false, 600),
            Progress::Failed {
                reason: REPLACEMENT_TIMEOUT,
                ..
            }
        ));
    }

    fn joining(name: &str, uid: &str, created: i64, ready: bool, group: &str) -> Node {
        Node {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                uid: Some(uid.into()),
                creation_timestamp: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at(created))),
                labels: Some([("group".to_owned(), group.to_owned())].into()),
                ..kube::api::ObjectMeta::default()
            },
            spec: None,
            status: Some(k8s_openapi::api::core::v1::NodeStatus {
                conditions: Some(vec![k8s_openapi::api::core::v1::NodeCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn a_replacement_is_a_selected_node_of_another_uid_created_at_or_after_the_delete() {
        let selects = |n: &Node| {
            n.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("group"))
                .is_some_and(|g| g == "a")
        };
        let seen = |nodes: &[Node]| replacement_seen(nodes, selects, Some("old"), at(100));
        // Older nodes, other groups and the deleted machine itself are no replacement.
        let none = [
            joining("gpu-1", "uid-1", 50, true, "a"),
            joining("gpu-2", "uid-2", 150, true, "b"),
            joining("gpu-9", "old", 150, true, "a"),
        ];
        assert_eq!(seen(&none), ReplacementNode::Awaited);
        // Re-registered under the deleted node's name, not Ready yet; then another one Ready.
        let mut joined = vec![joining("gpu-9", "new", 100, false, "a")];
        assert_eq!(
            seen(&joined),
            ReplacementNode::Joined {
                node: "gpu-9".into(),
                ready: false
            }
        );
        joined.push(joining("gpu-10", "uid-10", 160, true, "a"));
        assert_eq!(
            seen(&joined),
            ReplacementNode::Joined {
                node: "gpu-10".into(),
                ready: true
            }
        );
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
