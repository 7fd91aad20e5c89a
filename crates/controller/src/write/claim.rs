//! The leader claim on the wire: how each write the controller makes carries its claim on the
//! leader Lease (`<holder>/<leaseTransitions>`, see [`crate::leader::Fence::claim`]) so that the fence admission
//! policy (`manifests/controller/fence-policy.yaml`) can refuse it when the claim is not current.
//!
//! - creates, updates and patches carry it as the `gpuremediation.dev/claim` annotation, and the
//!   object the label `gpuremediation.dev/fenced=<the Lease's namespace>`, which lets the policy
//!   refuse writes to it while that Lease is missing ([`Stamp::annotate`]); status writes in the status itself (`status.claim`), because the API server
//!   drops metadata changes sent to a custom resource's status subresource before admission;
//! - a delete carries no object, so [`delete_stamped`] first writes the claim onto the object (an
//!   update the policy checks) and then deletes with that write's resourceVersion as a
//!   precondition: the policy checks the stored object's claim, so a delete whose last fenced
//!   write is stale is refused, and nobody's write can slip in between.
//!
//! Without leader election there is no claim and nothing is stamped (the policy is installed only
//! with leader election).

use std::sync::Arc;

use gpu_remediation_api::constants::{CLAIM_ANNOTATION, FENCED_LABEL};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{
    Api, Resource, ResourceExt as _,
    api::{DeleteParams, PostParams, Preconditions},
};
use serde_json::Value;

use super::{Verb, Writable, WriteError, Writer};

/// How many times a stamp-then-delete is retried when the object changed in between.
const DELETE_CONFLICT_RETRIES: usize = 5;

/// What a write under a claim carries, as [`Writer::send`] hands it to the request: the claim
/// (`None` without leader election or once it is no longer current) and the namespace of the
/// Lease it is on, the value of the `gpuremediation.dev/fenced` label.
#[derive(Debug, Clone)]
pub struct Stamp {
    /// The claim, `<holder>/<leaseTransitions>`.
    pub claim: Option<Arc<str>>,
    /// The Lease's namespace (`None`: no label).
    pub fenced: Option<Arc<str>>,
}

impl Stamp {
    /// Puts the claim on `object` as its claim annotation, and the fenced label naming the Lease's
    /// namespace (when known); returns whether that changed it. No claim (no leader election)
    /// leaves the object as it is.
    pub fn annotate<K: Resource>(&self, object: &mut K) -> bool {
        self.annotate_meta(object.meta_mut())
    }

    /// [`Stamp::annotate`] on the metadata of a merge patch: the annotation and label are added
    /// to the patch's `metadata`.
    pub fn annotate_patch(&self, patch: &mut Value) {
        let mut meta = ObjectMeta::default();
        if !self.annotate_meta(&mut meta) {
            return;
        }
        let stamped = [("labels", meta.labels), ("annotations", meta.annotations)];
        for (field, entries) in stamped {
            for (key, value) in entries.into_iter().flatten() {
                patch["metadata"][field][key] = Value::String(value);
            }
        }
    }

    fn annotate_meta(&self, meta: &mut ObjectMeta) -> bool {
        let Some(claim) = self.claim.as_deref() else {
            return false;
        };
        let mut labelled = true;
        if let Some(namespace) = self.fenced.as_deref() {
            let labels = meta.labels.get_or_insert_with(Default::default);
            labelled = labels.get(FENCED_LABEL).map(String::as_str) == Some(namespace);
            if !labelled {
                labels.insert(FENCED_LABEL.to_owned(), namespace.to_owned());
            }
        }
        let annotations = meta.annotations.get_or_insert_with(Default::default);
        if annotations.get(CLAIM_ANNOTATION).map(String::as_str) == Some(claim) {
            return !labelled;
        }
        annotations.insert(CLAIM_ANNOTATION.to_owned(), claim.to_owned());
        true
    }
}

/// What [`delete_stamped`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deleted {
    /// The delete was accepted (the object may linger behind finalizers).
    Deleted,
    /// No such object, or one of another UID (ours is gone).
    Gone,
}

/// Deletes `name` (only the object of `uid`, when given) so that the fence admission policy sees
/// our claim: reads it, writes the current claim onto it unless it carries it already, then
/// deletes with the resourceVersion of that write (or read) as a precondition. A write by anyone
/// in between makes the delete conflict; it is then redone from the read, a few times. Both writes
/// take the writer's one path (fence, claim, counts).
pub(super) async fn delete_stamped<K>(
    writer: &Writer,
    api: &Api<K>,
    name: &str,
    uid: Option<&str>,
    params: &DeleteParams,
) -> Result<Deleted, DeleteStampedError>
where
    K: Writable,
{
    let resource = api
        .resource_url()
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .to_owned();
    for _ in 0..DELETE_CONFLICT_RETRIES {
        let Some(mut object) = api.get_opt(name).await.map_err(WriteError::from)? else {
            return Ok(Deleted::Gone);
        };
        if uid.is_some() && object.uid().as_deref() != uid {
            return Ok(Deleted::Gone);
        }
        let stamped = writer
            .send(Verb::Replace, &resource, |stamp| {
                let changed = stamp.annotate(&mut object);
                // `object` carries the resourceVersion of our read: the update fails on any write since.
                async move {
                    if changed {
                        api.replace(name, &PostParams::default(), &object).await
                    } else {
                        Ok(object)
                    }
                }
            })
            .await;
        let object = match stamped {
            Ok(stamped) => stamped,
            Err(WriteError::Api(kube::Error::Api(status))) if status.is_conflict() => continue,
            Err(WriteError::Api(kube::Error::Api(status))) if status.is_not_found() => {
                return Ok(Deleted::Gone);
            }
            Err(error) => return Err(error.into()),
        };
        let mut params = params.clone();
        params.preconditions = Some(Preconditions {
            uid: object.uid(),
            resource_version: object.resource_version(),
        });
        let deleted = writer
            .send(Verb::Delete, &resource, |_| async {
                api.delete(name, &params).await
            })
            .await;
        match deleted {
            Ok(_) => return Ok(Deleted::Deleted),
            Err(WriteError::Api(kube::Error::Api(status))) if status.is_not_found() => {
                return Ok(Deleted::Gone);
            }
            Err(WriteError::Api(kube::Error::Api(status))) if status.is_conflict() => {}
            Err(error) => return Err(error.into()),
        }
    }
    Err(DeleteStampedError::KeptConflicting)
}

/// Why [`delete_stamped`] did not delete.
#[derive(Debug, thiserror::Error)]
pub enum DeleteStampedError {
    /// The fence or the API server refused.
    #[error(transparent)]
    Write(#[from] WriteError),
    /// Others kept writing the object between our read and our delete.
    #[error(
        "others kept writing the object between our read and our delete ({DELETE_CONFLICT_RETRIES} tries)"
    )]
    KeptConflicting,
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Node;
    use serde_json::json;

    use super::*;

    fn stamp(claim: Option<&str>, fenced: Option<&str>) -> Stamp {
        Stamp {
            claim: claim.map(Arc::from),
            fenced: fenced.map(Arc::from),
        }
    }

    fn annotate(node: &mut Node, claim: Option<&str>, fenced: Option<&str>) -> bool {
        stamp(claim, fenced).annotate(node)
    }

    #[test]
    fn a_patch_carries_the_same_stamp_and_none_without_a_claim() {
        let mut patch = json!({"spec": {"unschedulable": true}});
        stamp(None, Some("ns")).annotate_patch(&mut patch);
        assert_eq!(patch, json!({"spec": {"unschedulable": true}}));
        stamp(Some("replica-a/3"), Some("ns")).annotate_patch(&mut patch);
        assert_eq!(
            patch,
            json!({
                "spec": {"unschedulable": true},
                "metadata": {
                    "labels": {FENCED_LABEL: "ns"},
                    "annotations": {CLAIM_ANNOTATION: "replica-a/3"},
                },
            })
        );
        let mut unlabelled = json!({});
        stamp(Some("replica-a/3"), None).annotate_patch(&mut unlabelled);
        assert_eq!(
            unlabelled,
            json!({"metadata": {"annotations": {CLAIM_ANNOTATION: "replica-a/3"}}})
        );
    }

    #[test]
    fn a_claim_is_written_once_and_only_with_leader_election() {
        let mut node = Node::default();
        assert!(
            !annotate(&mut node, None, None),
            "no claim without leader election"
        );
        assert!(node.metadata.annotations.is_none());
        assert!(annotate(&mut node, Some("replica-a/3"), Some("ns")));
        assert!(
            !annotate(&mut node, Some("replica-a/3"), Some("ns")),
            "already carried"
        );
        assert!(annotate(&mut node, Some("replica-b/4"), Some("ns")));
        assert_eq!(
            node.annotations().get(CLAIM_ANNOTATION).map(String::as_str),
            Some("replica-b/4")
        );
        assert_eq!(node.labels().get(FENCED_LABEL).map(String::as_str), Some("ns"));
    }

    #[test]
    fn an_object_claimed_before_the_label_existed_gets_it() {
        let mut node = Node::default();
        node.annotations_mut()
            .insert(CLAIM_ANNOTATION.to_owned(), "replica-a/3".to_owned());
        assert!(
            annotate(&mut node, Some("replica-a/3"), Some("ns")),
            "the label is new"
        );
        assert!(!annotate(&mut node, Some("replica-a/3"), Some("ns")));
        assert!(
            !annotate(&mut node, Some("replica-a/3"), None),
            "no Lease namespace: no label"
        );
    }
}
