//! A node as the controller's cache keeps it ([`CachedNode`]), and the reads decisions make of a
//! node ([`NodeView`]), answered alike by a cached node and by a `Node` read from the server.
//!
//! Kubernetes' `Node` type is made to carry everything a node may say: its metadata, spec and
//! status hold some sixty fields inline, and its maps are B-trees whose every leaf has room for
//! eleven entries. The cache keeps tens of thousands of nodes and reads a handful of fields of
//! each, so it keeps them in a shape of its own: the fields below, each string boxed to its length,
//! the labels and annotations as sorted slices, the conditions and `nodeInfo` with the texts a
//! fleet repeats kept once for the whole cache (`node_status`; measured in `cache_cost_tests`).
//!
//! Decisions read a node through [`NodeView`] only, so the same planner runs on the cache's nodes
//! (the controller) and on nodes read from the server (`kubectl gpu explain`, and the tests, which
//! build `Node`s). A node edit is made over [`NodeView::to_node`]: it rebuilds what the merge patch
//! compares (labels, annotations, `unschedulable`, taints, the resourceVersion), see
//! `node_patch`.
//!
//! What a cached node keeps is what `relevant::prune_node` keeps; the property test
//! (`cached_node_tests`) checks that every read answers on the cached node as on the pruned one.

use std::{
    collections::{BTreeMap, hash_map::DefaultHasher},
    hash::{Hash, Hasher},
};

use gpu_remediation_api::selector::Labels;
use k8s_openapi::{
    api::core::v1::{Node, NodeSpec, NodeStatus, Taint},
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
};

use super::{
    node_status::{CachedCondition, CachedNodeInfo, NodeConditionRef, NodeConditions, NodeInfoRef},
    relevant::prune_node,
    shared_text::SharedText,
};

/// What decisions read of a node. Every read of a node outside the writers' edits goes through
/// these; a field a new decision needs is added here, to both kinds, and to the property test.
pub trait NodeView {
    /// `metadata.name` (empty when unset, which the server never sends).
    fn node_name(&self) -> &str;
    /// `metadata.uid`.
    fn node_uid(&self) -> Option<&str>;
    /// `metadata.resourceVersion`.
    fn version(&self) -> Option<&str>;
    /// `metadata.creationTimestamp`.
    fn created(&self) -> Option<&Time>;
    /// `metadata.deletionTimestamp`: the node is being deleted.
    fn deleting(&self) -> Option<&Time>;
    /// The node's labels (those the cache keeps: the ones policies read, and ours).
    fn node_labels(&self) -> &dyn Labels;
    /// The value of label `key`.
    fn label(&self, key: &str) -> Option<&str> {
        self.node_labels().label(key)
    }
    /// A hash of the node's labels: the same for the same labels, whichever kind holds them.
    fn labels_hash(&self) -> u64;
    /// The value of annotation `key` (the cache keeps only ours).
    fn annotation(&self, key: &str) -> Option<&str>;
    /// Whether `holds` holds for the key and value of an annotation the node carries.
    fn any_annotation(&self, holds: &mut dyn FnMut(&str, &str) -> bool) -> bool;
    /// `spec.unschedulable`, unset read as `false`.
    fn unschedulable(&self) -> bool;
    /// `spec.taints`.
    fn taints(&self) -> &[Taint];
    /// `spec.providerID`.
    fn provider_id(&self) -> Option<&str>;
    /// `status.conditions`, without their heartbeat times.
    fn conditions(&self) -> NodeConditions<'_>;
    /// The condition of type `type_`, if the node reports one.
    fn condition(&self, type_: &str) -> Option<NodeConditionRef<'_>> {
        self.conditions().get(type_)
    }
    /// `status.nodeInfo`: the system UUID, the boot ID, and the four fields `safety.suspect` may
    /// name (kernel, kubelet, OS image, container runtime).
    fn node_info(&self) -> Option<NodeInfoRef<'_>>;
    /// The node as a `Node` holding what the cache keeps: the base of an edit (`write::node_edit`).
    fn to_node(&self) -> Node;
}

/// A node behind a reference, an `Arc` or a `Box` reads as the node (the caches hand out `Arc`s,
/// planners pass references, the writer returns what it wrote boxed).
macro_rules! view_through {
    ($($pointer:ty),*) => {$(
        impl<N: NodeView + ?Sized> NodeView for $pointer {
            fn node_name(&self) -> &str {
                (**self).node_name()
            }
            fn node_uid(&self) -> Option<&str> {
                (**self).node_uid()
            }
            fn version(&self) -> Option<&str> {
                (**self).version()
            }
            fn created(&self) -> Option<&Time> {
                (**self).created()
            }
            fn deleting(&self) -> Option<&Time> {
                (**self).deleting()
            }
            fn node_labels(&self) -> &dyn Labels {
                (**self).node_labels()
            }
            fn labels_hash(&self) -> u64 {
                (**self).labels_hash()
            }
            fn annotation(&self, key: &str) -> Option<&str> {
                (**self).annotation(key)
            }
            fn any_annotation(&self, holds: &mut dyn FnMut(&str, &str) -> bool) -> bool {
                (**self).any_annotation(holds)
            }
            fn unschedulable(&self) -> bool {
                (**self).unschedulable()
            }
            fn taints(&self) -> &[Taint] {
                (**self).taints()
            }
            fn provider_id(&self) -> Option<&str> {
                (**self).provider_id()
            }
            fn conditions(&self) -> NodeConditions<'_> {
                (**self).conditions()
            }
            fn node_info(&self) -> Option<NodeInfoRef<'_>> {
                (**self).node_info()
            }
            fn to_node(&self) -> Node {
                (**self).to_node()
            }
        }
    )*};
}

view_through!(&N, std::sync::Arc<N>, Box<N>);

static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

/// Label pairs hashed in their (key) order.
fn hash_pairs<'a>(pairs: impl Iterator<Item = (&'a str, &'a str)>) -> u64 {
    let mut hasher = DefaultHasher::new();
    for (key, value) in pairs {
        key.hash(&mut hasher);
        value.hash(&mut hasher);
    }
    hasher.finish()
}

impl NodeView for Node {
    fn node_name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    fn node_uid(&self) -> Option<&str> {
        self.metadata.uid.as_deref()
    }

    fn version(&self) -> Option<&str> {
        self.metadata.resource_version.as_deref()
    }

    fn created(&self) -> Option<&Time> {
        self.metadata.creation_timestamp.as_ref()
    }

    fn deleting(&self) -> Option<&Time> {
        self.metadata.deletion_timestamp.as_ref()
    }

    fn node_labels(&self) -> &dyn Labels {
        self.metadata.labels.as_ref().unwrap_or(&NO_LABELS)
    }

    fn labels_hash(&self) -> u64 {
        hash_pairs(
            self.metadata
                .labels
                .iter()
                .flatten()
                .map(|(k, v)| (k.as_str(), v.as_str())),
        )
    }

    fn annotation(&self, key: &str) -> Option<&str> {
        self.metadata.annotations.as_ref()?.get(key).map(String::as_str)
    }

    fn any_annotation(&self, holds: &mut dyn FnMut(&str, &str) -> bool) -> bool {
        self.metadata
            .annotations
            .iter()
            .flatten()
            .any(|(k, v)| holds(k, v))
    }

    fn unschedulable(&self) -> bool {
        self.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false)
    }

    fn taints(&self) -> &[Taint] {
        self.spec
            .as_ref()
            .and_then(|s| s.taints.as_deref())
            .unwrap_or_default()
    }

    fn provider_id(&self) -> Option<&str> {
        self.spec.as_ref()?.provider_id.as_deref()
    }

    fn conditions(&self) -> NodeConditions<'_> {
        NodeConditions::Full(
            self.status
                .as_ref()
                .and_then(|s| s.conditions.as_deref())
                .unwrap_or_default(),
        )
    }

    fn node_info(&self) -> Option<NodeInfoRef<'_>> {
        self.status.as_ref()?.node_info.as_ref().map(NodeInfoRef::from)
    }

    fn to_node(&self) -> Node {
        self.clone()
    }
}

/// A string map kept as one sorted slice, each string boxed to its length: a cached node's labels
/// or annotations (a B-tree leaf holds room for eleven pairs, whatever it holds).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pairs(Box<[(Box<str>, Box<str>)]>);

impl Pairs {
    /// The value of `key`.
    #[must_use]
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .binary_search_by(|(k, _)| (**k).cmp(key))
            .ok()
            .map(|i| &*self.0[i].1)
    }

    /// Whether there are none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The pairs as a label map (`None` when there are none, as a pruned node holds them).
    fn to_map(&self) -> Option<BTreeMap<String, String>> {
        (!self.is_empty()).then(|| {
            self.0
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
    }
}

impl From<BTreeMap<String, String>> for Pairs {
    /// A B-tree iterates in key order: the slice comes out sorted.
    fn from(map: BTreeMap<String, String>) -> Self {
        Self(
            map.into_iter()
                .map(|(k, v)| (k.into_boxed_str(), v.into_boxed_str()))
                .collect(),
        )
    }
}

impl Labels for Pairs {
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key)
    }
}

/// A node as the cache keeps it: what [`NodeView`] reads, nothing else.
#[derive(Clone, Debug, PartialEq)]
pub struct CachedNode {
    name: Box<str>,
    uid: Option<Box<str>>,
    resource_version: Option<Box<str>>,
    created: Option<Time>,
    deleting: Option<Time>,
    labels: Pairs,
    annotations: Pairs,
    unschedulable: Option<bool>,
    provider_id: Option<Box<str>>,
    taints: Box<[Taint]>,
    conditions: Box<[CachedCondition]>,
    node_info: Option<CachedNodeInfo>,
}

impl From<Node> for CachedNode {
    /// [`CachedNode::sharing`] with a table of its own: the node's texts shared with no other.
    fn from(node: Node) -> Self {
        Self::sharing(node, &mut SharedText::default())
    }
}

impl CachedNode {
    /// Prunes `node` as the cache does (`prune_node`) and keeps what is left in the cache's shape,
    /// the texts of its status shared through `texts`.
    pub fn sharing(mut node: Node, texts: &mut SharedText) -> Self {
        prune_node(&mut node);
        let boxed = String::into_boxed_str;
        let metadata = node.metadata;
        let spec = node.spec.unwrap_or_default();
        let status = node.status.unwrap_or_default();
        Self {
            name: boxed(metadata.name.unwrap_or_default()),
            uid: metadata.uid.map(boxed),
            resource_version: metadata.resource_version.map(boxed),
            created: metadata.creation_timestamp,
            deleting: metadata.deletion_timestamp,
            labels: metadata.labels.map(Pairs::from).unwrap_or_default(),
            annotations: metadata.annotations.map(Pairs::from).unwrap_or_default(),
            unschedulable: spec.unschedulable,
            provider_id: spec.provider_id.map(boxed),
            taints: spec.taints.unwrap_or_default().into_boxed_slice(),
            conditions: status
                .conditions
                .iter()
                .flatten()
                .map(|c| CachedCondition::new(c, texts))
                .collect(),
            node_info: status.node_info.as_ref().map(|i| CachedNodeInfo::new(i, texts)),
        }
    }
}

impl NodeView for CachedNode {
    fn node_name(&self) -> &str {
        &self.name
    }

    fn node_uid(&self) -> Option<&str> {
        self.uid.as_deref()
    }

    fn version(&self) -> Option<&str> {
        self.resource_version.as_deref()
    }

    fn created(&self) -> Option<&Time> {
        self.created.as_ref()
    }

    fn deleting(&self) -> Option<&Time> {
        self.deleting.as_ref()
    }

    fn node_labels(&self) -> &dyn Labels {
        &self.labels
    }

    fn labels_hash(&self) -> u64 {
        hash_pairs(self.labels.0.iter().map(|(k, v)| (&**k, &**v)))
    }

    fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.get(key)
    }

    fn any_annotation(&self, holds: &mut dyn FnMut(&str, &str) -> bool) -> bool {
        self.annotations.0.iter().any(|(k, v)| holds(k, v))
    }

    fn unschedulable(&self) -> bool {
        self.unschedulable.unwrap_or(false)
    }

    fn taints(&self) -> &[Taint] {
        &self.taints
    }

    fn provider_id(&self) -> Option<&str> {
        self.provider_id.as_deref()
    }

    fn conditions(&self) -> NodeConditions<'_> {
        NodeConditions::Cached(&self.conditions)
    }

    fn node_info(&self) -> Option<NodeInfoRef<'_>> {
        self.node_info.as_ref().map(NodeInfoRef::from)
    }

    fn to_node(&self) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(self.name.to_string()),
                uid: self.uid.as_deref().map(str::to_owned),
                resource_version: self.resource_version.as_deref().map(str::to_owned),
                creation_timestamp: self.created.clone(),
                deletion_timestamp: self.deleting.clone(),
                labels: self.labels.to_map(),
                annotations: self.annotations.to_map(),
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec {
                unschedulable: self.unschedulable,
                provider_id: self.provider_id.as_deref().map(str::to_owned),
                taints: some_list(&self.taints),
                ..NodeSpec::default()
            }),
            status: Some(NodeStatus {
                conditions: (!self.conditions.is_empty()).then(|| {
                    self.conditions
                        .iter()
                        .map(CachedCondition::to_condition)
                        .collect()
                }),
                node_info: self.node_info.as_ref().map(CachedNodeInfo::to_info),
                ..NodeStatus::default()
            }),
        }
    }
}

/// A list as a `Node` holds it: absent when empty.
fn some_list<T: Clone>(list: &[T]) -> Option<Vec<T>> {
    (!list.is_empty()).then(|| list.to_vec())
}

/// Nodes compared by what the cache keeps of them (the lifecycle's identity of a node, in tests).
impl PartialEq for dyn NodeView + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.to_node() == other.to_node()
    }
}

/// A node shown by its name, UID and resourceVersion.
impl std::fmt::Debug for dyn NodeView + '_ {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeView")
            .field("name", &self.node_name())
            .field("uid", &self.node_uid())
            .field("version", &self.version())
            .finish()
    }
}
