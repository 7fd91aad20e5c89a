//! The node cache: every node by name, as a [`CachedNode`], kept from the node watch's events as
//! kube's reflector keeps objects (a list's nodes replace the store's at its end; an update or a
//! deletion applies at once), for a type of our own (see [`super::cached_node`]), the texts the
//! fleet's nodes repeat kept once ([`SharedText`]).

use std::{
    collections::HashMap,
    sync::{Arc, RwLock},
};

use k8s_openapi::api::core::v1::Node;
use kube::runtime::watcher;
use tokio::sync::watch;

use super::{
    cached_node::{CachedNode, NodeView},
    shared_text::SharedText,
};

type ByName = HashMap<Box<str>, Arc<CachedNode>>;

/// The nodes the watch delivered, shared by the watch's task (which applies its events) and every
/// pass (which reads). Clones share the one store.
#[derive(Clone)]
pub struct NodeStore {
    nodes: Arc<RwLock<Nodes>>,
    /// `true` once the first list has ended; the sender goes with the watch's task.
    listed: watch::Receiver<bool>,
}

#[derive(Default)]
struct Nodes {
    current: ByName,
    /// The nodes of a list under way, which replace `current` when it ends.
    listing: Option<ByName>,
}

/// The end of the store the node watch writes into.
pub struct NodeStoreWriter {
    nodes: Arc<RwLock<Nodes>>,
    listed: watch::Sender<bool>,
    /// The texts the store's nodes share.
    texts: SharedText,
}

/// A store and its writer: the store is ready once the writer has applied a list's end.
#[must_use]
pub fn node_store() -> (NodeStore, NodeStoreWriter) {
    let nodes = Arc::new(RwLock::new(Nodes::default()));
    let (listed, ready) = watch::channel(false);
    (
        NodeStore {
            nodes: nodes.clone(),
            listed: ready,
        },
        NodeStoreWriter {
            nodes,
            listed,
            texts: SharedText::default(),
        },
    )
}

fn kept(node: &Node, texts: &mut SharedText) -> (Box<str>, Arc<CachedNode>) {
    let cached = CachedNode::sharing(node.clone(), texts);
    (cached.node_name().into(), Arc::new(cached))
}

impl NodeStoreWriter {
    /// Applies one of the watch's events (its nodes already pruned by the watch).
    pub fn apply(&mut self, event: &watcher::Event<Node>) {
        let mut nodes = self
            .nodes
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match event {
            watcher::Event::Init => nodes.listing = Some(ByName::new()),
            watcher::Event::InitApply(node) => {
                let (name, cached) = kept(node, &mut self.texts);
                nodes.listing.get_or_insert_default().insert(name, cached);
            }
            watcher::Event::InitDone => {
                if let Some(mut listed) = nodes.listing.take() {
                    listed.shrink_to_fit();
                    nodes.current = listed;
                }
                drop(nodes);
                self.listed.send_replace(true);
            }
            watcher::Event::Apply(node) => {
                let (name, cached) = kept(node, &mut self.texts);
                nodes.current.insert(name, cached);
            }
            watcher::Event::Delete(node) => {
                nodes
                    .current
                    .remove(node.metadata.name.as_deref().unwrap_or_default());
            }
        }
    }
}

impl NodeStore {
    /// The node named `name`, as last delivered.
    #[must_use]
    pub fn get(&self, name: &str) -> Option<Arc<CachedNode>> {
        self.read().current.get(name).cloned()
    }

    /// Every node, as last delivered.
    #[must_use]
    pub fn state(&self) -> Vec<Arc<CachedNode>> {
        self.read().current.values().cloned().collect()
    }

    /// How many nodes the store holds.
    #[must_use]
    pub fn len(&self) -> usize {
        self.read().current.len()
    }

    /// Whether the store holds no node.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits for the first list's end; an error if the watch's task went before it.
    pub async fn wait_until_ready(&self) -> Result<(), watch::error::RecvError> {
        self.listed.clone().wait_for(|listed| *listed).await.map(|_| ())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Nodes> {
        self.nodes
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn node(name: &str, version: &str) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                resource_version: Some(version.into()),
                ..ObjectMeta::default()
            },
            ..Node::default()
        }
    }

    #[tokio::test]
    async fn a_list_replaces_the_nodes_at_its_end_and_updates_apply_at_once() {
        let (store, mut writer) = node_store();
        writer.apply(&watcher::Event::Init);
        writer.apply(&watcher::Event::InitApply(node("a", "1")));
        writer.apply(&watcher::Event::InitApply(node("b", "1")));
        assert!(store.is_empty(), "a list's nodes wait for its end");
        writer.apply(&watcher::Event::InitDone);
        store.wait_until_ready().await.expect("listed");
        assert_eq!(store.len(), 2);

        writer.apply(&watcher::Event::Apply(node("a", "2")));
        assert_eq!(
            store
                .get("a")
                .and_then(|n| n.version().map(str::to_owned))
                .as_deref(),
            Some("2")
        );
        writer.apply(&watcher::Event::Delete(node("b", "1")));
        assert!(store.get("b").is_none());

        // A relist: the nodes it does not show go at its end, not before.
        writer.apply(&watcher::Event::Init);
        writer.apply(&watcher::Event::InitApply(node("c", "3")));
        assert!(store.get("a").is_some());
        writer.apply(&watcher::Event::InitDone);
        let mut names: Vec<_> = store.state().iter().map(|n| n.node_name().to_owned()).collect();
        names.sort();
        assert_eq!(names, ["c"]);
    }

    #[tokio::test]
    async fn readiness_fails_when_the_writer_goes_before_a_list_ends() {
        let (store, writer) = node_store();
        drop(writer);
        assert!(store.wait_until_ready().await.is_err());
    }
}
