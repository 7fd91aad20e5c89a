//! Replacement: after the drain, make the broken node go away (and, where the strategy says so, a
//! new one come), then verify it happened.
//!
//! Decisions pure, effects in one place (zookeeper-operator's `reconcile_zk` style): each
//! `spec.replacement.strategy` is a module of pure builders, and [`act`] is the one acting half
//! that reads what they need, calls them, and hands what they return to the one writer.
//!
//! | strategy | its builder ([`plan::Plan`]) writes | module |
//! |---|---|---|
//! | `DeleteNode` | a delete of the Node, of the UID admitted | [`delete_node`] |
//! | `DeleteMachine` | a delete of the node's Cluster API Machine, once its `status.nodeRef` names the node | [`delete_machine`] |
//! | `DeleteNodeClaim` | a delete of the Karpenter `NodeClaim` whose status names the node (name and provider ID) | [`delete_node_claim`] |
//! | `Template` | a create of the policy's template object, owned by the remediation | [`create_template`] |
//!
//! What was read for a look turns into the verification's [`Observation`] purely too: for the
//! delete strategies by [`deletion_observed`] (and [`node_reference_observed`] when the node was
//! gone at the trigger), for a template by [`create_template::observe`]. The remediated node is
//! read once per trigger and once per look, whatever the strategy ([`act`]).
//!
//! How the controller uses it (phase `Replacing`, then `Verifying`):
//!
//! 1. `Replacing`: `replacers.for_strategy(policy.spec.replacement.strategy).trigger(&remediation,
//!    &policy.spec.replacement)`; record the returned reference in `status.replacement` and move
//!    to `Verifying` (a trigger that wrote to the remediation returns it as written, and the status
//!    write that follows is made over that version). `trigger` is idempotent: calling it again
//!    after a crash finds the same object (or finds it gone) instead of acting twice. A builder's
//!    refusal (a Machine or `NodeClaim` that does not corroborate the node) writes nothing and is
//!    the trigger's error, which the lifecycle turns into an Event and the status.
//! 2. `Verifying`, on every reconcile: `observe(&remediation, &reference, triggered_at)` (with
//!    `triggered_at` = [`replacing_since`] of the status) then
//!    [`verify::judge`] with whether the node's triggers cleared, the trigger time and the policy's
//!    timeout: `Waiting` (requeue), `Succeeded` or `Failed { reason }`.
//!
//! Every write goes through the writer, which checks the fence first. Action `None` never reaches
//! this module: the controller stops after the drain and keeps the node cordoned; `Reboot` is a
//! `Template` (see [`template`] for a Self Node Remediation example).

pub mod create_template;
pub mod delete_machine;
pub mod delete_node;
pub mod delete_node_claim;
pub mod plan;
pub mod template;
pub mod verify;

#[cfg(test)]
pub(crate) mod fixtures;

use gpu_remediation_api::{GpuRemediation, object_reference::ObjectReference};
use jiff::Timestamp;
use k8s_openapi::{api::core::v1::Node, apimachinery::pkg::apis::meta::v1::ObjectMeta};

pub use verify::{Observation, Presence, Progress, ReplacementNode, Reported, Verification, judge};

use crate::{leader::FenceError, observe::NodeView};

pub use gpu_remediation_api::constants::REPLACEMENT_SELECTOR_ANNOTATION;

/// Why a replacement could not be triggered.
#[derive(Debug, thiserror::Error)]
pub enum TriggerReplacementError {
    /// This replica may not act now.
    #[error("not acting: {0}")]
    Fenced(#[from] FenceError),
    /// An API call failed.
    #[error("{action}: {source}")]
    Api {
        /// What was being done, e.g. `deleting Machine ns/m-1`.
        action: String,
        /// The error.
        source: kube::Error,
    },
    /// Others kept writing the object between our read and our delete.
    #[error("{action}: others kept writing it between our read and our delete")]
    KeptConflicting {
        /// What was being done.
        action: String,
    },
    /// The node lacks a Cluster API annotation, so its Machine cannot be found.
    #[error("node {node} has no {annotation} annotation: is it managed by Cluster API?")]
    NotAClusterApiNode {
        /// The node.
        node: String,
        /// The missing annotation.
        annotation: &'static str,
    },
    /// The API server does not serve the kind the strategy needs.
    #[error("the API server serves no {kind} in group {group}: is it installed?")]
    KindNotServed {
        /// API group.
        group: String,
        /// Kind.
        kind: String,
    },
    /// No Karpenter `NodeClaim` names the node.
    #[error("no NodeClaim has status.nodeName {node}: is the node managed by Karpenter?")]
    NodeClaimNotFound {
        /// The node.
        node: String,
    },
    /// The Machine the node's annotation names does not name the node back (`status.nodeRef`):
    /// a node's own annotations are not enough to delete another object.
    #[error("Machine {machine} is not node {node}'s ({why}): nothing was deleted")]
    MachineNotTheNodes {
        /// The Machine, `namespace/name`.
        machine: String,
        /// The node.
        node: String,
        /// What does not match.
        why: String,
    },
    /// The `NodeClaim` naming the node does not carry the node's provider ID.
    #[error("NodeClaim {claim} is not node {node}'s ({why}): nothing was deleted")]
    NodeClaimNotTheNodes {
        /// The claim.
        claim: String,
        /// The node.
        node: String,
        /// What does not match.
        why: String,
    },
    /// The object to delete was read without a UID, so no delete can be pinned to it.
    #[error("{kind} {name} was read without a UID: nothing identifies what to delete")]
    Unidentified {
        /// Kind.
        kind: String,
        /// Name (with namespace, if any).
        name: String,
    },
    /// The policy's template cannot be rendered.
    #[error("invalid replacement template: {0}")]
    Template(#[from] template::RenderTemplateError),
    /// The template's kind is namespaced and the template names no namespace.
    #[error("the template's kind {kind} is namespaced: set metadata.namespace in the template")]
    TemplateNeedsNamespace {
        /// Kind.
        kind: String,
    },
    /// The template's kind is cluster-scoped and the template names a namespace.
    #[error("the template's kind {kind} is cluster-scoped: remove metadata.namespace from the template")]
    TemplateNamespaceNotAllowed {
        /// Kind.
        kind: String,
    },
    /// A previous attempt's object holds the name the template must use (see
    /// `create_template::previous_attempt`): it was deleted, and the create waits for it to go.
    #[error(
        "{kind} {name} of the previous attempt (remediation {owner}) holds the name: deleted it, creating ours once it is gone"
    )]
    PreviousAttemptGoing {
        /// Kind.
        kind: String,
        /// Name (with namespace, if any).
        name: String,
        /// The previous attempt's remediation.
        owner: String,
    },
    /// An object with the rendered name exists and belongs to someone else.
    #[error("{kind} {name} already exists and is not owned by this remediation")]
    TemplateNameTaken {
        /// Kind.
        kind: String,
        /// Name (with namespace, if any).
        name: String,
    },
}

/// Why a replacement could not be observed.
#[derive(Debug, thiserror::Error)]
pub enum ObserveReplacementError {
    /// An API call failed.
    #[error("{action}: {source}")]
    Api {
        /// What was being read.
        action: String,
        /// The error.
        source: kube::Error,
    },
    /// The recorded reference cannot be resolved (its kind is no longer served).
    #[error("the API server serves no {kind} in {api_version}")]
    KindNotServed {
        /// API version.
        api_version: String,
        /// Kind.
        kind: String,
    },
}

/// A replacement started.
#[derive(Debug, Clone)]
pub struct Triggered {
    /// The object that carries it out (for `status.replacement`).
    pub reference: ObjectReference,
    /// The remediation as the trigger wrote it, if it did (`DeleteMachine` records the replacement
    /// Machines' selector on it), under the version it was given: the status write that follows
    /// is made over this version, not the one before the trigger's own write.
    pub rewritten: Option<GpuRemediation>,
}

/// The remediated node as the trigger's builders see it: the node admitted (a node re-registered
/// under the same name since is another machine, and ours is gone).
#[derive(Debug, Clone, Copy)]
pub enum AdmittedNode<'a> {
    /// No node of that name.
    Gone,
    /// A node of that name with another UID than the one admitted.
    Another {
        /// Its UID.
        uid: &'a str,
    },
    /// The node admitted (or, for a record from before UIDs were kept, the node of that name).
    Present(&'a Node),
}

impl<'a> AdmittedNode<'a> {
    /// What `found`, the node read by name, is to `remediation`.
    #[must_use]
    pub fn of(remediation: &GpuRemediation, found: Option<&'a Node>) -> Self {
        let Some(node) = found else {
            return Self::Gone;
        };
        let uid = node.node_uid().unwrap_or_default();
        match remediation.spec.node_uid.as_deref() {
            Some(admitted) if admitted != uid => Self::Another { uid },
            _ => Self::Present(node),
        }
    }

    /// Why nothing is left to do when the node is not the one admitted (`None` when it is).
    #[must_use]
    pub fn gone_because(&self, name: &str) -> Option<String> {
        match self {
            Self::Gone => Some(format!("node {name} is gone already")),
            Self::Another { uid } => Some(format!(
                "node {name} is another machine (UID {uid}) than the one admitted: ours is gone"
            )),
            Self::Present(_) => None,
        }
    }
}

/// What a delete strategy observes: the target is the object of the recorded UID (`found`, read by
/// the reference's name), `node` the remediated node's presence, `replacement` what the strategy
/// knows of the node replacing it.
#[must_use]
pub fn deletion_observed(
    found: Option<&ObjectMeta>,
    reference: &ObjectReference,
    node: Presence,
    replacement: ReplacementNode,
) -> Observation {
    Observation {
        target: presence(found, reference.uid.as_deref()),
        node,
        reported: Reported::Nothing,
        replacement,
    }
}

/// What a delete strategy observes when its reference is the remediated node itself (it was gone
/// when the replacement was triggered): the node's presence is the target's.
#[must_use]
pub fn node_reference_observed(node: Presence) -> Observation {
    Observation {
        target: node,
        node,
        reported: Reported::Nothing,
        replacement: ReplacementNode::NotExpected,
    }
}

/// Whether the object whose metadata was read (if any) is the one recorded with `uid`.
#[must_use]
pub fn presence(found: Option<&ObjectMeta>, uid: Option<&str>) -> Presence {
    match found {
        None => Presence::Gone,
        Some(meta) if uid.is_some() && meta.uid.as_deref() != uid => Presence::Gone,
        Some(meta) if meta.deletion_timestamp.is_some() => Presence::Deleting,
        Some(_) => Presence::Present,
    }
}

/// Whether the remediated node, read by name, is still the node that was remediated: a node with
/// another UID than the one admitted is a new machine, and the old one is gone. A record from
/// before UIDs were kept falls back to the creation time: a node created after the trigger is new.
#[must_use]
pub fn node_presence(
    found: Option<&ObjectMeta>,
    admitted_uid: Option<&str>,
    triggered_at: Timestamp,
) -> Presence {
    if admitted_uid.is_some() {
        return presence(found, admitted_uid);
    }
    let Some(meta) = found else {
        return Presence::Gone;
    };
    // Creation timestamps have whole seconds: compare with the trigger's second.
    let trigger_second = Timestamp::from_second(triggered_at.as_second()).unwrap_or(triggered_at);
    if meta
        .creation_timestamp
        .as_ref()
        .is_some_and(|created| created.0 >= trigger_second)
    {
        return Presence::Gone;
    }
    presence(Some(meta), None)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    fn meta(uid: &str, created: i64, deleting: bool) -> ObjectMeta {
        ObjectMeta {
            uid: Some(uid.to_owned()),
            creation_timestamp: Some(Time(Timestamp::from_second(created).expect("timestamp"))),
            deletion_timestamp: deleting
                .then(|| Time(Timestamp::from_second(created + 1).expect("timestamp"))),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn an_object_with_another_uid_is_not_ours_so_ours_is_gone() {
        assert_eq!(presence(Some(&meta("b", 0, false)), Some("a")), Presence::Gone);
        assert_eq!(presence(Some(&meta("a", 0, false)), Some("a")), Presence::Present);
        assert_eq!(presence(Some(&meta("a", 0, true)), Some("a")), Presence::Deleting);
        assert_eq!(presence(None, Some("a")), Presence::Gone);
    }

    #[test]
    fn a_node_recreated_under_the_same_name_after_the_trigger_counts_as_gone() {
        let triggered_at =
            Timestamp::from_second(1_000).expect("timestamp") + jiff::SignedDuration::from_millis(400);
        assert_eq!(
            node_presence(Some(&meta("n", 1_000, false)), None, triggered_at),
            Presence::Gone
        );
        assert_eq!(
            node_presence(Some(&meta("n", 999, false)), None, triggered_at),
            Presence::Present
        );
        assert_eq!(
            node_presence(Some(&meta("n", 10, true)), None, triggered_at),
            Presence::Deleting
        );
    }

    #[test]
    fn a_node_with_another_uid_than_the_admitted_one_is_gone_whenever_it_was_made() {
        let triggered_at = Timestamp::from_second(1_000).expect("timestamp");
        assert_eq!(
            node_presence(Some(&meta("new", 10, false)), Some("old"), triggered_at),
            Presence::Gone
        );
        assert_eq!(
            node_presence(Some(&meta("old", 2_000, false)), Some("old"), triggered_at),
            Presence::Present
        );
    }
}
