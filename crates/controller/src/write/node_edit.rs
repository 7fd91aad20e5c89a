//! Node edits: cordon, release, quarantine and the other changes the controller makes to a
//! `Node`, each over one version of it (see the parent module's header and [`crate::node_patch`]).

use std::sync::atomic::{AtomicBool, Ordering};

use k8s_openapi::api::core::v1::Node;
use kube::api::Patch;

use super::{Verb, WriteError, Writer, patch_params};
use crate::{
    cordon,
    cordon::NodeRef,
    observe::{CachedNode, NodeView},
    quarantine,
    read::{Scope, api},
};

/// How many times a node edit is retried after a conflict before giving up for this pass.
const NODE_CONFLICT_RETRIES: usize = 5;

/// Why cordoning or releasing a node failed.
#[derive(Debug, thiserror::Error)]
pub enum EditNodeError {
    /// The write was refused.
    #[error("editing node {node} failed: {source}")]
    Write {
        /// The node.
        node: String,
        /// What went wrong.
        #[source]
        source: WriteError,
    },
    /// Others kept writing the node between our read and our replace.
    #[error("editing node {node} kept conflicting with other writers ({NODE_CONFLICT_RETRIES} tries)")]
    KeptConflicting {
        /// The node.
        node: String,
    },
}

/// What a node edit found.
#[derive(Debug, Clone)]
pub enum NodeEdit {
    /// The node as written (or as read, when nothing needed to change).
    Written(Box<Node>),
    /// No node of that name.
    Gone,
    /// A node of that name with another UID: not ours to edit.
    Replaced,
}

impl Writer {
    /// Cordons `node` for `remediation` (see `cordon::cordon`), only if it is still the node of
    /// the admitted UID; `seen` is the node as the watch last delivered it (see
    /// [`Self::edit_node`]).
    pub async fn cordon_node(
        &self,
        node: &NodeRef,
        seen: Option<&CachedNode>,
        remediation: &str,
    ) -> Result<NodeEdit, EditNodeError> {
        self.edit_node(node, seen, |n| cordon::cordon(n, remediation))
            .await
    }

    /// Releases what `remediation` owns on `node` (see `cordon::release`) and the quarantine
    /// of its `policy` it took over (see `quarantine::taint::lift`), only if it is still the node
    /// of the admitted UID; `remember_cancel` also notes a person's cancel on it. A node that is
    /// gone needs no release. With the manager of a cordon left in place because another party laid
    /// it again over ours (`cordon::cordon_laid_by_another`).
    pub async fn release_node(
        &self,
        node: &NodeRef,
        seen: Option<&CachedNode>,
        remediation: &str,
        policy: &str,
        remember_cancel: bool,
    ) -> Result<(NodeEdit, Option<String>), EditNodeError> {
        let kept_for = std::sync::Mutex::new(None);
        let edit = self
            .edit_node(node, seen, |n| {
                let kept = cordon::would_lift_cordon(n, remediation)
                    .then(|| cordon::cordon_laid_by_another(n))
                    .flatten();
                let released = cordon::release(n, remediation);
                let lifted = quarantine::taint::lift(n, policy);
                let remembered = remember_cancel && cordon::remember_cancelled(n, remediation);
                *kept_for.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = kept;
                released || lifted || remembered
            })
            .await?;
        Ok((
            edit,
            kept_for
                .into_inner()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        ))
    }

    /// Quarantines `node` for `policy` (see `quarantine::taint::quarantine`), only if it is still
    /// the node of that UID; with whether the node changed (already quarantined: it did not).
    pub async fn quarantine_node(
        &self,
        node: &NodeRef,
        seen: Option<&CachedNode>,
        policy: &str,
    ) -> Result<(NodeEdit, bool), EditNodeError> {
        self.edit_node_changing(node, seen, |n| quarantine::taint::quarantine(n, policy))
            .await
    }

    /// Lifts `policy`'s quarantine from `node` (see `quarantine::taint::lift`); another owner's
    /// is left as it is. With whether the node changed (nothing of ours on it: it did not).
    pub async fn lift_quarantine(
        &self,
        node: &NodeRef,
        seen: Option<&CachedNode>,
        policy: &str,
    ) -> Result<(NodeEdit, bool), EditNodeError> {
        self.edit_node_changing(node, seen, |n| quarantine::taint::lift(n, policy))
            .await
    }

    /// [`Self::edit_node`], with whether the edit changed the node as last read: an edit that
    /// found nothing to do wrote nothing, and its caller announces nothing.
    pub async fn edit_node_changing(
        &self,
        target: &NodeRef,
        seen: Option<&CachedNode>,
        edit: impl Fn(&mut Node) -> bool,
    ) -> Result<(NodeEdit, bool), EditNodeError> {
        let changed = AtomicBool::new(false);
        let answer = self
            .edit_node(target, seen, |n| {
                let edited = edit(n);
                changed.store(edited, Ordering::Relaxed);
                edited
            })
            .await?;
        Ok((answer, changed.load(Ordering::Relaxed)))
    }

    /// Edits a node, only if it is still the node of the admitted UID. `edit` changes the node it
    /// is given and says whether it changed anything; it may be called more than once (on the node
    /// as `seen`, then as read), and what it did last is what was written.
    ///
    /// First over `seen` (the node as the watch last delivered it), sent as a merge patch
    /// preconditioned on that resourceVersion: one request. When there is no `seen` node of the
    /// admitted UID, when `edit` finds nothing to change in it (the cache may be behind) or changes
    /// more than a patch carries, or when the server answers 409 (it is behind), a
    /// read-modify-replace preconditioned on the read's resourceVersion and the admitted UID
    /// (carried in the replaced object: the server refuses a replace whose UID differs from the
    /// stored node's).
    ///
    /// An edit that would lift a cordon from `seen` is always decided over a fresh read: only the
    /// server's record of who manages `spec.unschedulable` (which the cache prunes) tells our cordon
    /// from one a person laid again over our note (`cordon::cordon_laid_by_another`), and every
    /// edit that lifts a cordon asks it. One GET more for such an edit, none for any other.
    pub async fn edit_node(
        &self,
        target: &NodeRef,
        seen: Option<&CachedNode>,
        edit: impl Fn(&mut Node) -> bool,
    ) -> Result<NodeEdit, EditNodeError> {
        let name = target.name.as_str();
        let api = api::<Node>(&self.client, Scope::Cluster, &());
        let failed = |source: WriteError| EditNodeError::Write {
            node: name.to_owned(),
            source,
        };
        // The edit is made over the node as the cache holds it, rebuilt as a `Node`: what the merge
        // patch compares is all there (`observe::cached_node`). Boxed: the future holds it across
        // the write.
        let seen = seen
            .filter(|node| target.uid.is_none() || node.node_uid() == target.uid.as_deref())
            .map(|node| Box::new(node.to_node()));
        if let Some(seen) = seen.as_deref() {
            let mut edited = seen.clone();
            if edit(&mut edited) && !lifts_cordon(seen, &edited) {
                let patched = self
                    .send(Verb::Patch, "nodes", |stamp| {
                        stamp.annotate(&mut edited);
                        let patch = crate::node_patch::merge_patch(seen, &edited);
                        let api = &api;
                        async move {
                            match patch {
                                Some(patch) => api
                                    .patch(name, &patch_params(), &Patch::Merge(&patch))
                                    .await
                                    .map(Some),
                                None => Ok(None),
                            }
                        }
                    })
                    .await;
                match patched {
                    Ok(Some(mut written)) => {
                        Self::keep(&mut written);
                        self.record(&written);
                        return Ok(NodeEdit::Written(Box::new(written)));
                    }
                    // Not a change a patch carries: read and replace below.
                    Ok(None) => {}
                    // Someone wrote since the watch's version: read it and edit again.
                    Err(WriteError::Api(kube::Error::Api(status))) if status.is_conflict() => {}
                    Err(WriteError::Api(kube::Error::Api(status))) if status.is_not_found() => {
                        return Ok(NodeEdit::Gone);
                    }
                    Err(error) => return Err(failed(error)),
                }
            }
        }
        for _ in 0..NODE_CONFLICT_RETRIES {
            let Some(mut node) = api.get_opt(name).await.map_err(|e| failed(e.into()))? else {
                return Ok(NodeEdit::Gone);
            };
            if target.uid.is_some() && node.metadata.uid != target.uid {
                return Ok(NodeEdit::Replaced);
            }
            if !edit(&mut node) {
                // Nothing to write: the node as read is still fresher than the cache.
                Self::keep(&mut node);
                self.record(&node);
                return Ok(NodeEdit::Written(Box::new(node)));
            }
            // `node` carries the resourceVersion of our read: the replace fails on any write since.
            match self.replace(&(), &node).await {
                Ok(written) => return Ok(NodeEdit::Written(Box::new(written))),
                Err(WriteError::Api(kube::Error::Api(status))) if status.is_conflict() => {}
                Err(WriteError::Api(kube::Error::Api(status))) if status.is_not_found() => {
                    return Ok(NodeEdit::Gone);
                }
                Err(error) => return Err(failed(error)),
            }
        }
        Err(EditNodeError::KeptConflicting {
            node: name.to_owned(),
        })
    }
}

/// Whether `edited` is schedulable where `before` was cordoned.
fn lifts_cordon(before: &Node, edited: &Node) -> bool {
    cordon::is_unschedulable(before) && !cordon::is_unschedulable(edited)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use gpu_remediation_api::constants::QUARANTINE_TAINT_KEY;

    use super::super::tests::{body_json, ops, reply};
    use super::*;
    use crate::leader::Fence;

    fn node(tainted: bool) -> serde_json::Value {
        let taints = if tainted {
            serde_json::json!([{"key": QUARANTINE_TAINT_KEY, "effect": "NoSchedule"}])
        } else {
            serde_json::json!([])
        };
        serde_json::json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "gpu-1", "uid": "uid-1", "resourceVersion": "7",
                         "annotations": {gpu_remediation_api::constants::QUARANTINED_BY_ANNOTATION: "p"}},
            "spec": {"taints": taints},
        })
    }

    #[tokio::test]
    async fn a_quarantine_edit_that_finds_nothing_to_do_writes_nothing_and_says_so() {
        let (ops, mut handle) = ops(Fence::standalone());
        let server = tokio::spawn(async move {
            let (request, respond) = handle.next_request().await.expect("the read");
            assert_eq!(request.method(), http::Method::GET);
            respond.send_response(reply(200, &node(true)));
            // Already quarantined: no replace follows.
            tokio::time::timeout(Duration::from_millis(300), handle.next_request())
                .await
                .is_err()
        });
        let target = target("uid-1");
        let (edit, changed) = ops.quarantine_node(&target, None, "p").await.unwrap();
        assert!(matches!(edit, NodeEdit::Written(_)));
        assert!(!changed, "nothing changed, nothing to announce");
        assert!(server.await.unwrap(), "no write was sent");
    }

    #[tokio::test]
    async fn a_lift_that_removes_our_taint_writes_once_and_says_it_changed_the_node() {
        let (ops, mut handle) = ops(Fence::standalone());
        let server = tokio::spawn(async move {
            let (_, respond) = handle.next_request().await.expect("the read");
            respond.send_response(reply(200, &node(true)));
            let (request, respond) = handle.next_request().await.expect("the replace");
            let method = request.method().clone();
            let body = body_json(request).await;
            respond.send_response(reply(200, &body));
            (method, body)
        });
        let target = target("uid-1");
        let (_, changed) = ops.lift_quarantine(&target, None, "p").await.unwrap();
        assert!(changed);
        let (method, body) = server.await.unwrap();
        assert_eq!(method, http::Method::PUT);
        assert_eq!(body["metadata"]["resourceVersion"], "7");
        assert_eq!(body["spec"]["taints"], serde_json::json!([]));
    }

    fn target(uid: &str) -> NodeRef {
        NodeRef {
            name: "gpu-1".into(),
            uid: Some(uid.into()),
        }
    }

    fn seen(tainted: bool) -> Node {
        serde_json::from_value(node(tainted)).unwrap()
    }

    #[tokio::test]
    async fn a_cordon_over_the_node_as_seen_is_one_patch_preconditioned_on_its_version() {
        let (ops, mut handle) = ops(Fence::standalone());
        let server = tokio::spawn(async move {
            let (request, respond) = handle.next_request().await.expect("the patch");
            let (method, uri) = (request.method().clone(), request.uri().to_string());
            let content_type = request.headers()[http::header::CONTENT_TYPE].clone();
            let body = body_json(request).await;
            respond.send_response(reply(200, &node(true)));
            let more = tokio::time::timeout(Duration::from_millis(300), handle.next_request()).await;
            (method, uri, content_type, body, more.is_err())
        });
        let target = target("uid-1");
        let edit = ops
            .cordon_node(&target, Some(&CachedNode::from(seen(false))), "gpu-1-abc")
            .await
            .unwrap();
        assert!(matches!(edit, NodeEdit::Written(_)));
        let (method, uri, content_type, body, alone) = server.await.unwrap();
        assert_eq!(method, http::Method::PATCH);
        assert!(uri.starts_with("/api/v1/nodes/gpu-1?"), "{uri}");
        assert_eq!(content_type, "application/merge-patch+json");
        assert_eq!(body["metadata"]["resourceVersion"], "7");
        assert_eq!(body["spec"]["unschedulable"], true);
        assert!(alone, "no read before or after");
    }

    #[tokio::test]
    async fn a_patch_over_a_version_the_server_has_moved_past_is_redone_over_a_fresh_read() {
        let (ops, mut handle) = ops(Fence::standalone());
        let server = tokio::spawn(async move {
            let (request, respond) = handle.next_request().await.expect("the patch");
            assert_eq!(request.method(), http::Method::PATCH);
            let conflict = serde_json::json!({
                "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 409, "reason": "Conflict",
                "message": "the object has been modified",
            });
            respond.send_response(reply(409, &conflict));
            let (request, respond) = handle.next_request().await.expect("the read");
            assert_eq!(request.method(), http::Method::GET);
            let mut fresh = node(false);
            fresh["metadata"]["resourceVersion"] = "9".into();
            respond.send_response(reply(200, &fresh));
            let (request, respond) = handle.next_request().await.expect("the replace");
            let method = request.method().clone();
            let body = body_json(request).await;
            respond.send_response(reply(200, &body));
            (method, body)
        });
        let target = target("uid-1");
        let edit = ops
            .cordon_node(&target, Some(&CachedNode::from(seen(false))), "gpu-1-abc")
            .await
            .unwrap();
        assert!(matches!(edit, NodeEdit::Written(_)));
        let (method, body) = server.await.unwrap();
        assert_eq!(method, http::Method::PUT);
        assert_eq!(body["metadata"]["resourceVersion"], "9");
        assert_eq!(body["spec"]["unschedulable"], true);
    }

    /// Every edit that lifts a cordon asks the server who manages it, whichever edit it is.
    #[tokio::test]
    async fn an_edit_lifting_a_cordon_seen_in_the_cache_is_decided_over_a_fresh_read() {
        let (ops, mut handle) = ops(Fence::standalone());
        let server = tokio::spawn(async move {
            let (request, respond) = handle.next_request().await.expect("the read");
            let first = request.method().clone();
            let mut fresh = node(false);
            fresh["spec"]["unschedulable"] = true.into();
            fresh["metadata"]["resourceVersion"] = "9".into();
            respond.send_response(reply(200, &fresh));
            let (request, respond) = handle.next_request().await.expect("the replace");
            let method = request.method().clone();
            let body = body_json(request).await;
            respond.send_response(reply(200, &body));
            (first, method, body)
        });
        let mut cordoned = seen(false);
        cordoned.spec.get_or_insert_default().unschedulable = Some(true);
        let uncordon = |n: &mut Node| {
            let spec = n.spec.get_or_insert_default();
            spec.unschedulable.take() == Some(true)
        };
        let edit = ops
            .edit_node(&target("uid-1"), Some(&CachedNode::from(cordoned)), uncordon)
            .await
            .unwrap();
        assert!(matches!(edit, NodeEdit::Written(_)));
        let (first, method, body) = server.await.unwrap();
        assert_eq!(first, http::Method::GET, "no patch over the cached node");
        assert_eq!(method, http::Method::PUT);
        assert_eq!(body["metadata"]["resourceVersion"], "9");
        assert!(body["spec"].get("unschedulable").is_none(), "{body}");
    }

    #[tokio::test]
    async fn a_node_seen_with_another_uid_is_not_patched_but_read() {
        let (ops, mut handle) = ops(Fence::standalone());
        let server = tokio::spawn(async move {
            let (request, respond) = handle.next_request().await.expect("the read");
            let method = request.method().clone();
            let mut other = node(false);
            other["metadata"]["uid"] = "uid-2".into();
            respond.send_response(reply(200, &other));
            method
        });
        let target = target("uid-2-admitted");
        let edit = ops
            .cordon_node(&target, Some(&CachedNode::from(seen(false))), "gpu-1-abc")
            .await
            .unwrap();
        assert!(matches!(edit, NodeEdit::Replaced));
        assert_eq!(server.await.unwrap(), http::Method::GET);
    }
}
