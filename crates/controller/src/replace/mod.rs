//! Replacement: after the drain, make the broken node go away (and, where the strategy says so, a
//! new one come), then verify it happened.
//!
//! One small trait, [`Replace`], with one implementation per `spec.replacement.strategy`:
//!
//! | strategy | [`Replace::trigger`] deletes or creates | module |
//! |---|---|---|
//! | `DeleteNode` | the Node | [`delete_node`] |
//! | `DeleteMachine` | the node's Cluster API Machine | [`delete_machine`] |
//! | `DeleteNodeClaim` | the Karpenter `NodeClaim` whose status names the node | [`delete_node_claim`] |
//! | `Template` | the policy's template object, owned by the remediation | [`create_template`] |
//!
//! How the controller uses it (phase `Replacing`, then `Verifying`):
//!
//! 1. `Replacing`: `replacers.for_strategy(policy.spec.replacement.strategy).trigger(&remediation,
//!    &policy.spec.replacement)`; record the returned reference in `status.replacement` and move
//!    to `Verifying` (a trigger that wrote to the remediation returns it as written, and the status
//!    write that follows is made over that version). `trigger` is idempotent: calling it again after a crash finds the same object
//!    (or finds it gone) instead of acting twice.
//! 2. `Verifying`, on every reconcile: `observe(&remediation, &reference, triggered_at)` (with
//!    `triggered_at` = [`replacing_since`] of the status) then
//!    [`verify::judge`] with whether the node's triggers cleared, the trigger time and the policy's
//!    timeout: `Waiting` (requeue), `Succeeded` or `Failed { reason }`.
//!
//! Every mutating call here checks the [`Fence`] first. Action `None` never reaches this module:
//! the controller stops after the drain and keeps the node cordoned; `Reboot` is a `Template` (see
//! [`template`] for a Self Node Remediation example).

pub mod create_template;
pub mod delete_machine;
pub mod delete_node;
pub mod delete_node_claim;
pub mod template;
pub mod verify;

use futures::future::BoxFuture;
use gpu_remediation_api::{
    GpuRemediation,
    object_reference::ObjectReference,
    policy::{Replacement, Strategy},
};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

pub use verify::{Observation, Presence, Progress, ReplacementNode, Reported, Verification, judge};

use crate::{
    leader::FenceError,
    read::{ReadApi, Reader},
    write::Writer,
};

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
    /// An object with the rendered name exists and belongs to someone else.
    #[error("{kind} {name} already exists and is not owned by this remediation")]
    TemplateNameTaken {
        /// Kind.
        kind: String,
        /// Name (with namespace, if any).
        name: String,
    },
}

impl crate::write::DeleteStampedError {
    /// This error as a [`TriggerReplacementError`] of the step `action` (e.g. `deleting node n1`).
    pub(crate) fn during(self, action: String) -> TriggerReplacementError {
        use crate::write::{DeleteStampedError, WriteError};
        match self {
            Self::Write(WriteError::Fenced(fenced)) => TriggerReplacementError::Fenced(fenced),
            Self::Write(WriteError::Api(source)) => TriggerReplacementError::Api { action, source },
            DeleteStampedError::KeptConflicting => TriggerReplacementError::KeptConflicting { action },
        }
    }
}

impl TriggerReplacementError {
    /// The HTTP status the server answered, if it did.
    #[must_use]
    pub fn code(&self) -> Option<u16> {
        match self {
            Self::Api {
                source: kube::Error::Api(status),
                ..
            } => Some(status.code),
            _ => None,
        }
    }
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

impl ObserveReplacementError {
    /// The HTTP status the server answered, if it did.
    #[must_use]
    pub fn code(&self) -> Option<u16> {
        match self {
            Self::Api {
                source: kube::Error::Api(status),
                ..
            } => Some(status.code),
            _ => None,
        }
    }
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

impl From<ObjectReference> for Triggered {
    fn from(reference: ObjectReference) -> Self {
        Self {
            reference,
            rewritten: None,
        }
    }
}

/// One replacement strategy.
pub trait Replace: Send + Sync {
    /// Starts the replacement of `remediation`'s node under the policy's `replacement` settings
    /// and returns the object that carries it out (for `status.replacement`). Idempotent.
    fn trigger<'a>(
        &'a self,
        remediation: &'a GpuRemediation,
        replacement: &'a Replacement,
    ) -> BoxFuture<'a, Result<Triggered, TriggerReplacementError>>;

    /// Looks at a triggered replacement. `remediation` must be current (its annotations are read);
    /// `triggered_at` is when `Replacing` was entered.
    fn observe<'a>(
        &'a self,
        remediation: &'a GpuRemediation,
        reference: &'a ObjectReference,
        triggered_at: Timestamp,
    ) -> BoxFuture<'a, Result<Observation, ObserveReplacementError>>;
}

/// One of each strategy, sharing a client and the fence.
pub struct Replacers {
    delete_node: delete_node::DeleteNode,
    delete_machine: delete_machine::DeleteMachine,
    delete_node_claim: delete_node_claim::DeleteNodeClaim,
    template: create_template::CreateTemplate,
}

impl Replacers {
    /// All strategies, writing through `writer` (and reading through its reader).
    #[must_use]
    pub fn new(writer: Writer) -> Self {
        let kube = Kube {
            reader: writer.reader(),
            writer,
        };
        Self {
            delete_node: delete_node::DeleteNode::new(kube.clone()),
            delete_machine: delete_machine::DeleteMachine::new(kube.clone()),
            delete_node_claim: delete_node_claim::DeleteNodeClaim::new(kube.clone()),
            template: create_template::CreateTemplate::new(kube),
        }
    }

    /// The implementation of `strategy`.
    #[must_use]
    pub fn for_strategy(&self, strategy: Strategy) -> &dyn Replace {
        match strategy {
            Strategy::DeleteNode => &self.delete_node,
            Strategy::DeleteMachine => &self.delete_machine,
            Strategy::DeleteNodeClaim => &self.delete_node_claim,
            Strategy::Template => &self.template,
        }
    }
}

/// What every strategy acts through: the one writer, and reads.
#[derive(Clone)]
pub(crate) struct Kube {
    pub(crate) writer: Writer,
    pub(crate) reader: Reader,
}

impl Kube {
    /// [`Writer::delete_stamped_in`]: the object of `uid` only, the claim stamped first.
    pub(crate) async fn delete_stamped<K: crate::write::Writable>(
        &self,
        read: &ReadApi<K>,
        name: &str,
        uid: Option<&str>,
        params: &kube::api::DeleteParams,
    ) -> Result<crate::write::Deleted, crate::write::DeleteStampedError> {
        self.writer.delete_stamped_in(read, name, uid, params).await
    }

    /// The version of `group`'s `kind` the API server prefers, found by discovery: the
    /// Cluster API and Karpenter CRDs move between versions, so none is hard-coded. A group or
    /// kind the server does not serve is `KindNotServed`, any other failure an API error.
    pub(crate) async fn served_resource(
        &self,
        group: &str,
        kind: &str,
    ) -> Result<kube::api::ApiResource, TriggerReplacementError> {
        let not_served = || TriggerReplacementError::KindNotServed {
            group: group.to_owned(),
            kind: kind.to_owned(),
        };
        let served = match self.reader.group(group).await {
            Ok(served) => served,
            Err(kube::Error::Discovery(_)) => return Err(not_served()),
            Err(source) => {
                return Err(TriggerReplacementError::Api {
                    action: format!("discovering API group {group}"),
                    source,
                });
            }
        };
        served
            .recommended_kind(kind)
            .map(|(resource, _)| resource)
            .ok_or_else(not_served)
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
