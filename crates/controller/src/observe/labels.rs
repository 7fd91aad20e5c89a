//! Which of a node's labels the cache keeps: the keys decisions read, no others.
//!
//! A GPU node on a cloud carries a hundred-odd labels (GPU Feature Discovery's, Node Feature
//! Discovery's CPU flags, the cloud's and Karpenter's): about 22 KB a cached node, three times
//! everything else the cache keeps of it (`docs/plans/cache-labels.md`). The controller reads a
//! node's labels in four places only, all named by its policies or by our own group:
//!
//! - a policy's `nodeSelector` (which policy governs a node, what replaced a deleted one),
//! - its failure domains' `topologyKey` (`budget::domains`),
//! - its suspect attributes other than `nodeInfo.*` (`fleet::suspects`),
//! - our labels (`gpuremediation.dev/*`: opt-out, hand-off, repeat offender, fence).
//!
//! So the node watch keeps those keys ([`keys_read_by`]) and our group's, and a node whose label
//! was left out reads as one without it. That is the one danger: a selector `DoesNotExist` or
//! `NotIn` would match every node whose label was pruned. Hence the rules [`NodeLabels`] keeps:
//!
//! - The watch lists with the keys the policies name when it starts, and lists every node afresh
//!   when a policy names a key it does not keep (the keys only grow: a key kept too many costs
//!   memory, never a wrong answer; they shrink at the controller's next start).
//! - Nothing is decided from labels a completed list did not keep: [`NodeLabels::cover`] says
//!   whether the store holds every key the policies read, and the pass plans nothing until it does
//!   (one relist: seconds at 50,000 nodes, while a policy's new key is rolled out).
//!
//! Our own writes are kept whole in the writer's overlay (a superset of what the cache keeps).

use std::{
    collections::BTreeSet,
    sync::{Arc, Mutex, PoisonError},
};

use futures::{Stream, StreamExt};
use gpu_remediation_api::GpuRemediationPolicySpec;
use k8s_openapi::api::core::v1::Node;
use tokio::sync::watch;

use super::relevant::is_ours;

/// The node label keys `spec` reads: its selector's, its failure domains' and its suspect
/// attributes' (the `nodeInfo.*` ones are not labels).
#[must_use]
pub fn keys_read_by(spec: &GpuRemediationPolicySpec) -> BTreeSet<String> {
    let selector = &spec.node_selector;
    let mut keys: BTreeSet<String> = selector.match_labels.keys().cloned().collect();
    keys.extend(selector.match_expressions.iter().map(|e| e.key.clone()));
    keys.extend(spec.safety.failure_domains.iter().map(|d| d.topology_key.clone()));
    if let Some(suspect) = &spec.safety.suspect {
        keys.extend(
            suspect
                .attributes()
                .into_iter()
                .filter(|a| !a.starts_with("nodeInfo.")),
        );
    }
    keys
}

/// The keys every policy of `specs` reads.
#[must_use]
pub fn keys_read_by_all<'a>(
    specs: impl IntoIterator<Item = &'a GpuRemediationPolicySpec>,
) -> BTreeSet<String> {
    specs.into_iter().flat_map(keys_read_by).collect()
}

/// Which labels a list keeps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kept {
    /// Every label (unit tests' caches, which hold nodes as built).
    All,
    /// Our group's, and these keys.
    Keys(Arc<BTreeSet<String>>),
}

impl Kept {
    /// Whether a label of `key` is kept.
    #[must_use]
    pub fn keeps(&self, key: &str) -> bool {
        match self {
            Self::All => true,
            Self::Keys(keys) => is_ours(key) || keys.contains(key),
        }
    }

    /// Whether every one of `keys` is kept.
    #[must_use]
    pub fn covers(&self, keys: &BTreeSet<String>) -> bool {
        keys.iter().all(|key| self.keeps(key))
    }

    /// Leaves on `node` only the labels kept (`None` when none is, which holds no map).
    pub fn prune(&self, node: &mut Node) {
        if matches!(self, Self::All) {
            return;
        }
        if let Some(labels) = node.metadata.labels.as_mut() {
            labels.retain(|key, _| self.keeps(key));
            if labels.is_empty() {
                node.metadata.labels = None;
            }
        }
    }
}

/// Whether the cache holds what the policies read of the nodes' labels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Coverage {
    /// The store's nodes keep every key asked for.
    Covered,
    /// A list keeping these keys (not kept by the last one) was asked for just now.
    Relisting(BTreeSet<String>),
    /// A list keeping these keys is under way (asked for by an earlier call).
    Listing(BTreeSet<String>),
}

/// The node watch's label keys, shared by the watch (which prunes with them and says when a list
/// completed) and the pass (which asks for keys and learns whether the store holds them).
#[derive(Clone, Debug)]
pub struct NodeLabels {
    state: Arc<Mutex<State>>,
    relist: Arc<watch::Sender<u64>>,
}

#[derive(Debug)]
struct State {
    /// What the next list keeps: grows when a policy names a key not kept.
    asked: Kept,
    /// What the list under way keeps.
    listing: Kept,
    /// What the last completed list kept: every node in the store carries these. `None` until the
    /// first list completes.
    listed: Option<Kept>,
}

impl NodeLabels {
    /// Keys for a watch that lists with `keys` (and ours) first; with the receiver the watch
    /// restarts its list on ([`relisting`]).
    #[must_use]
    pub fn keeping(keys: BTreeSet<String>) -> (Self, watch::Receiver<u64>) {
        Self::new(Kept::Keys(Arc::new(keys)), None)
    }

    /// Every label kept, and a store that holds them (the unit tests' fixed caches).
    #[must_use]
    pub fn keeping_all() -> Self {
        Self::new(Kept::All, Some(Kept::All)).0
    }

    fn new(kept: Kept, listed: Option<Kept>) -> (Self, watch::Receiver<u64>) {
        let (relist, receiver) = watch::channel(0);
        let state = State {
            asked: kept.clone(),
            listing: kept,
            listed,
        };
        (
            Self {
                state: Arc::new(Mutex::new(state)),
                relist: Arc::new(relist),
            },
            receiver,
        )
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the store holds every key in `wanted`; when the keys asked for do not include them
    /// all, asks the watch to list afresh keeping them too.
    #[must_use = "a pass plans only when the store covers what it reads"]
    pub fn cover(&self, wanted: &BTreeSet<String>) -> Coverage {
        let mut state = self.state();
        if state.listed.as_ref().is_some_and(|listed| listed.covers(wanted)) {
            return Coverage::Covered;
        }
        let missing: BTreeSet<String> = wanted
            .iter()
            .filter(|key| !state.listed.as_ref().is_some_and(|listed| listed.keeps(key)))
            .cloned()
            .collect();
        if state.asked.covers(wanted) {
            return Coverage::Listing(missing);
        }
        if let Kept::Keys(asked) = &state.asked {
            let grown: BTreeSet<String> = asked.iter().chain(wanted).cloned().collect();
            state.asked = Kept::Keys(Arc::new(grown));
        }
        drop(state);
        self.relist.send_modify(|asked| *asked = asked.wrapping_add(1));
        Coverage::Relisting(missing)
    }

    /// Whether the store holds every key `spec` reads.
    #[must_use]
    pub fn covers(&self, spec: &GpuRemediationPolicySpec) -> bool {
        self.state()
            .listed
            .as_ref()
            .is_some_and(|listed| listed.covers(&keys_read_by(spec)))
    }

    /// What a list starting now keeps (the watch calls this as it starts each list of its own).
    #[must_use]
    pub fn start_listing(&self) -> Kept {
        let mut state = self.state();
        state.listing = state.asked.clone();
        state.listing.clone()
    }

    /// The list under way has completed and is in the store (the watch calls this after the
    /// reflector has taken the list's end).
    pub fn listed(&self) {
        let mut state = self.state();
        state.listed = Some(state.listing.clone());
    }
}

/// The events of `start()`'s stream, started afresh whenever `relist` changes (its first event is
/// then the new stream's `Init`: the reflector rebuilds its store from the new list and keeps the
/// old one until that list is done). After `relist`'s sender is gone, the stream under way goes on.
pub fn relisting<S, F>(mut start: F, relist: watch::Receiver<u64>) -> impl Stream<Item = S::Item>
where
    F: FnMut() -> S,
    S: Stream,
{
    let current = Box::pin(start());
    futures::stream::unfold(
        (current, Some(relist), start),
        |(mut current, mut relist, mut start)| async move {
            loop {
                let asked = async {
                    match relist.as_mut() {
                        Some(relist) => relist.changed().await.is_ok(),
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    biased;
                    asked = asked => {
                        if asked {
                            current = Box::pin(start());
                        } else {
                            relist = None;
                        }
                    }
                    item = current.next() => return item.map(|item| (item, (current, relist, start))),
                }
            }
        },
    )
}

#[cfg(test)]
#[path = "labels_tests.rs"]
mod tests;
