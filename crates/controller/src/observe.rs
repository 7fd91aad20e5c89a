//! Observe: the caches the controller decides from, and the signal that something worth a new
//! pass changed.
//!
//! Five watches ([`watches`]) feed the stores: policies (optionally narrowed by a label selector, so
//! several controllers can share a cluster in tests), remediations, hardware records and disruption
//! budgets in kube's reflector stores, and Nodes in a store of our own ([`node_store`]). Nodes and
//! PDBs are pruned as they arrive (no managedFields, images, heartbeat times, capacity lists, other
//! controllers' annotations; [`relevant`]; and of a node's labels only those the policies read and
//! ours, [`labels`]), and a node is kept in a shape of our own holding only what decisions read
//! ([`CachedNode`], read through [`NodeView`]), so memory grows with what decisions read, not with
//! what kubelets and feature discovery write. The node watch starts once the
//! policies are listed, and lists afresh when a policy reads a label it did not keep. Pods are never
//! cached: `act::remediation` lists one node's pods when it drains it.
//!
//! A watch event wakes the controller only when something a decision reads changed (a
//! fingerprint per object), so kubelet status churn and other controllers' node annotations do
//! not cause passes.
//!
//! The policy and remediation watches read untyped objects and decode each one
//! ([`undecodable::Decoder`]): an object stored out of range (before a schema bound existed) is
//! left out and reported, and never fails the watch, nor the readiness that waits for its list.
//!
//! Writes the controller makes are visible at once through the writer's overlays
//! ([`overlay::Overlays`]): a remediation created or updated in one pass is seen by the next
//! even before its watch event arrives, so the budget never counts a remediation late and a phase
//! is never repeated from a stale cache. The writer records into them; the caches only read.

use std::{
    collections::{BTreeSet, HashMap},
    sync::{Arc, Mutex},
};

use futures::StreamExt;
use gpu_remediation_api::{GpuHardwareRecord, GpuRemediation, GpuRemediationPolicy};
use jiff::Timestamp;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::{
    Api, Client, ResourceExt,
    runtime::{
        WatchStreamExt,
        reflector::{self, Store},
        watcher,
    },
};
use tokio::sync::{Notify, watch};

pub use cached_node::{CachedNode, NodeView};
pub use node_status::{NodeConditionRef, NodeConditions, NodeInfoRef};
use node_store::NodeStore;
use overlay::{Overlay, Overlays};

#[cfg(test)]
mod cache_cost_tests;
pub mod cached_node;
#[cfg(test)]
mod cached_node_tests;
pub mod initial_list;
pub mod labels;
pub mod node_status;
pub mod node_store;
pub mod overlay;
mod relevant;
pub mod shared_text;
pub mod undecodable;
mod watches;

use relevant::{budget_fingerprint, policy_fingerprint, prune_budget, remediation_fingerprint};
pub(crate) use relevant::{hash_of, hash_one};
pub use relevant::{is_ours, prune_node};
pub use undecodable::Undecodable;
use watches::{
    Waker, key_of, spawn_decoding_reflector, spawn_node_reflector, spawn_reflector, wake_on_change,
};

/// The stores the controller reads, shared by every pass.
#[derive(Clone)]
pub struct Caches {
    /// Policies in scope.
    pub policies: Store<GpuRemediationPolicy>,
    /// All remediations (filtered to known policies by the passes).
    pub remediations: Store<GpuRemediation>,
    /// All nodes, pruned, as the cache keeps them ([`CachedNode`]).
    pub nodes: NodeStore,
    /// Which of the nodes' labels `nodes` keeps, and whether that covers what the policies read.
    pub node_labels: labels::NodeLabels,
    /// All disruption budgets, pruned.
    pub budgets: Store<PodDisruptionBudget>,
    /// All hardware records (one per GPU serial or host with a failure on record).
    pub hardware_records: Store<GpuHardwareRecord>,
    /// Our own writes to remediations, until their watch catches up.
    pub written_remediations: Overlay<GpuRemediation>,
    /// Our own writes to nodes (cordon, release), until their watch catches up.
    pub written_nodes: Overlay<CachedNode>,
    /// Our own writes to hardware records, until their watch catches up (the ledger's next sync
    /// may start before it does, see `hardware::act::Ledger`).
    pub written_hardware_records: Overlay<GpuHardwareRecord>,
    /// What changed since the loop last looked.
    pub changes: Changes,
    /// Policies and remediations stored in a shape the controller cannot decode, left out of the
    /// stores above and reported.
    pub undecodable: Undecodable,
    /// When the budget watch last saw each budget list each pod as disrupted.
    pub disrupted: Disrupted,
    /// Counts the changes the budget watch delivers: a drain with evictions still unanswered wakes
    /// on it, so that a budget showing room is used at once (`remediation::evictions`).
    pub budget_changes: watch::Receiver<u64>,
}

/// When the budget watch last saw each budget (`namespace/name`) list each pod among its
/// `disruptedPods`: the server's grant of an eviction writes it there, so the drain planner knows
/// from it which of its evictions a budget's status counts (`lifecycle::eviction_round`). Every
/// version the watch delivers is recorded, not only the one the cache ends up holding. Entries go
/// after the disruption controller's own horizon.
#[derive(Clone, Debug, Default)]
pub struct Disrupted {
    seen: Arc<Mutex<HashMap<(String, String), Timestamp>>>,
}

impl Disrupted {
    /// Records the pods `budget` lists as disrupted, seen `now`.
    pub fn record(&self, budget: &PodDisruptionBudget, now: Timestamp) {
        let Some(listed) = budget.status.as_ref().and_then(|s| s.disrupted_pods.as_ref()) else {
            return;
        };
        let key = key_of(budget);
        let mut seen = self
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let horizon = crate::time::minus(now, jiff::SignedDuration::from_mins(10));
        seen.retain(|_, at| *at > horizon);
        for pod in listed.keys() {
            seen.insert((key.clone(), pod.clone()), now);
        }
    }

    /// When budget `key` was last seen listing `pod`.
    #[must_use]
    pub fn last_listed(&self, key: &str, pod: &str) -> Option<Timestamp> {
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&(key.to_owned(), pod.to_owned()))
            .copied()
    }
}

/// What the watches saw change since the loop last took it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changed {
    /// A policy or remediation changed, or a watch listed afresh: every remediation may have
    /// something to do.
    pub anything: bool,
    /// Nodes that changed (or went), by name: they concern only the remediations of those nodes
    /// (a fleet whose nodes report their status every few seconds must not make every draining
    /// remediation list its pods each time).
    pub nodes: BTreeSet<String>,
    /// The node watch listed afresh: any node may have changed, not only those in `nodes`
    /// (`fleet::index` and `hardware::claimants` index the fleet afresh).
    pub nodes_listed: bool,
    /// The loop's periodic resync: what is kept from the changes alone is taken afresh as a
    /// safety net (`fleet::index`, the first-seen stamps), as if the node watch had listed afresh.
    pub resync: bool,
    /// Disruption budgets that changed, as `namespace/name`: they concern only the remediations
    /// whose evictions they refuse.
    pub budgets: BTreeSet<String>,
}

impl Changed {
    /// Everything, as after a start.
    #[must_use]
    pub fn everything() -> Self {
        Self {
            anything: true,
            nodes: BTreeSet::new(),
            nodes_listed: true,
            resync: true,
            budgets: BTreeSet::new(),
        }
    }

    /// Whether any node may have changed unseen, or the loop resyncs: the node index and the
    /// first-seen stamps look at every node.
    #[must_use]
    pub fn every_node(&self) -> bool {
        self.nodes_listed || self.resync
    }

    /// Adds `other` to this.
    pub fn merge(&mut self, other: Self) {
        self.anything |= other.anything;
        self.nodes.extend(other.nodes);
        self.nodes_listed |= other.nodes_listed;
        self.resync |= other.resync;
        self.budgets.extend(other.budgets);
    }
}

/// The watches' record of what changed, shared with the loop.
#[derive(Clone, Debug, Default)]
pub struct Changes {
    changed: Arc<Mutex<Changed>>,
}

impl Changes {
    fn note(&self, edit: impl FnOnce(&mut Changed)) {
        edit(
            &mut self
                .changed
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
    }

    /// What changed since the last call.
    #[must_use]
    pub fn take(&self) -> Changed {
        std::mem::take(
            &mut *self
                .changed
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }
}

/// Why the caches could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartCachesError {
    /// A reflector's writer went away before its first list completed.
    #[error("a watch stopped before its initial list completed")]
    WriterDropped,
}

impl Caches {
    /// Starts the five watches on the runtime and returns their stores once every initial list has
    /// completed, so no pass decides from a partial view (the nodes' list after the policies', whose
    /// label keys it keeps). `wake` is notified on every relevant
    /// change.
    /// Our own writes are read from `overlays` (the writer's), and undecodable objects are
    /// recorded in `undecodable` (whose findings the caller reports).
    pub async fn start(
        client: &Client,
        policy_selector: Option<&str>,
        overlays: &Overlays,
        undecodable: Undecodable,
        wake: Arc<Notify>,
    ) -> Result<Self, StartCachesError> {
        let config = || watcher::Config::default().any_semantic();
        let mut policy_config = config();
        let mut remediation_config = config();
        if let Some(selector) = policy_selector {
            // Records carry their policy's labels (see `fleet::new_remediation`).
            policy_config = policy_config.labels(selector);
            remediation_config = remediation_config.labels(selector);
        }
        let written_remediations = overlays.remediations.clone();
        let written_nodes = overlays.nodes.clone();
        let written_hardware_records = overlays.hardware_records.clone();
        let changes = Changes::default();
        let anything = |changes: &Changes| {
            let changes = changes.clone();
            move |_: Option<String>| changes.note(|c| c.anything = true)
        };
        let policies = spawn_decoding_reflector(
            client,
            &undecodable,
            policy_config,
            |_| {},
            policy_fingerprint,
            Waker::new(wake.clone(), anything(&changes)),
            None,
        );
        let remediations = spawn_decoding_reflector(
            client,
            &undecodable,
            remediation_config,
            |r: &mut GpuRemediation| r.managed_fields_mut().clear(),
            remediation_fingerprint,
            Waker::new(wake.clone(), anything(&changes)),
            Some(written_remediations.clone()),
        );
        let disrupted = Disrupted::default();
        let (count_budget_change, budget_changes) = watch::channel(0_u64);
        // A version's listing is recorded once the version is in the store (after `reflect`), so
        // that budgets read after a listing was read count that listing (`remediation::step`).
        let (budgets, budget_writer) = reflector::store();
        let budget_events = watcher(Api::<PodDisruptionBudget>::all(client.clone()), config())
            .default_backoff()
            .modify(prune_budget)
            .reflect(budget_writer)
            .inspect({
                let disrupted = disrupted.clone();
                move |event| {
                    if let Ok(watcher::Event::Apply(budget) | watcher::Event::InitApply(budget)) = event {
                        disrupted.record(budget, Timestamp::now());
                    }
                }
            });
        let budget_waker = Waker::new(wake.clone(), {
            let changes = changes.clone();
            move |key: Option<String>| {
                match key {
                    Some(key) => changes.note(|c| {
                        c.budgets.insert(key);
                    }),
                    None => changes.note(|c| c.anything = true),
                }
                count_budget_change.send_modify(|count| *count = count.wrapping_add(1));
            }
        });
        tokio::spawn(wake_on_change(
            budget_events,
            budget_fingerprint,
            budget_waker,
            None::<Overlay<PodDisruptionBudget>>,
        ));
        let hardware_records = spawn_reflector(
            watcher(Api::<GpuHardwareRecord>::all(client.clone()), config()).default_backoff(),
            |r: &mut GpuHardwareRecord| r.managed_fields_mut().clear(),
            |r: &GpuHardwareRecord| hash_of(&r.spec),
            Waker::new(wake.clone(), anything(&changes)),
            Some(written_hardware_records.clone()),
        );
        // The nodes' labels the policies read are known once the policies are listed: the nodes
        // are listed keeping those (`labels`).
        policies
            .wait_until_ready()
            .await
            .map_err(|_| StartCachesError::WriterDropped)?;
        let (node_labels, relist) =
            labels::NodeLabels::keeping(labels::keys_read_by_all(policies.state().iter().map(|p| &p.spec)));
        let nodes = spawn_node_reflector(client, &node_labels, relist, &changes, wake, &written_nodes);
        for ready in [
            hardware_records.wait_until_ready().await,
            remediations.wait_until_ready().await,
            budgets.wait_until_ready().await,
        ] {
            ready.map_err(|_| StartCachesError::WriterDropped)?;
        }
        nodes
            .wait_until_ready()
            .await
            .map_err(|_| StartCachesError::WriterDropped)?;
        Ok(Self {
            policies,
            remediations,
            nodes,
            node_labels,
            budgets,
            hardware_records,
            written_remediations,
            written_nodes,
            written_hardware_records,
            changes,
            undecodable,
            disrupted,
            budget_changes,
        })
    }

    /// Caches holding exactly these objects, reading `writer`'s overlays, with no watch behind them
    /// (the acting modules' unit tests).
    #[cfg(test)]
    #[must_use]
    pub fn fixed(
        overlays: &Overlays,
        policies: Vec<GpuRemediationPolicy>,
        remediations: Vec<GpuRemediation>,
        nodes: Vec<k8s_openapi::api::core::v1::Node>,
    ) -> Self {
        fn store_of<K>(objects: Vec<K>) -> Store<K>
        where
            K: kube::Resource<DynamicType = ()> + Clone + std::fmt::Debug + Send + Sync + 'static,
        {
            let (store, mut writer) = reflector::store();
            for object in objects {
                writer.apply_watcher_event(&watcher::Event::Apply(object));
            }
            store
        }
        Self {
            policies: store_of(policies),
            remediations: store_of(remediations),
            nodes: {
                let (store, mut writer) = node_store::node_store();
                for node in nodes {
                    writer.apply(&watcher::Event::Apply(node));
                }
                store
            },
            node_labels: labels::NodeLabels::keeping_all(),
            budgets: store_of(Vec::new()),
            hardware_records: store_of(Vec::new()),
            written_remediations: overlays.remediations.clone(),
            written_nodes: overlays.nodes.clone(),
            written_hardware_records: overlays.hardware_records.clone(),
            changes: Changes::default(),
            undecodable: Undecodable::new().0,
            disrupted: Disrupted::default(),
            budget_changes: watch::channel(0).1,
        }
    }

    /// Every remediation, with our own recent writes laid over the cache.
    #[must_use]
    pub fn remediations(&self) -> Vec<Arc<GpuRemediation>> {
        self.written_remediations.merge(self.remediations.state())
    }

    /// Every hardware record, with our own recent writes laid over the cache.
    #[must_use]
    pub fn hardware_records(&self) -> Vec<Arc<GpuHardwareRecord>> {
        self.written_hardware_records.merge(self.hardware_records.state())
    }

    /// The node named `name`, if it exists.
    #[must_use]
    pub fn node(&self, name: &str) -> Option<Arc<CachedNode>> {
        self.written_nodes.pick(name, self.nodes.get(name))
    }

    /// The nodes of `names` that exist, with our own recent writes laid over the cache.
    #[must_use]
    pub fn nodes_named(&self, names: &[String]) -> Vec<Arc<CachedNode>> {
        names.iter().filter_map(|name| self.node(name)).collect()
    }

    /// The names of the nodes we wrote whose watch events have not come yet.
    #[must_use]
    pub fn written_node_names(&self) -> Vec<String> {
        self.written_nodes.names()
    }

    /// Every node, with our own recent writes laid over the cache.
    #[must_use]
    pub fn all_nodes(&self) -> Vec<Arc<CachedNode>> {
        self.written_nodes.merge(self.nodes.state())
    }

    /// The policy named `name`, if it is in scope.
    #[must_use]
    pub fn policy(&self, name: &str) -> Option<Arc<GpuRemediationPolicy>> {
        self.policies.get(&reflector::ObjectRef::new(name))
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    #[test]
    fn every_budget_version_seen_records_the_pods_it_lists_as_disrupted() {
        let at = |s: i64| Timestamp::from_second(1_800_000_000 + s).unwrap();
        let mut budget = PodDisruptionBudget::default();
        budget.metadata.name = Some("web".into());
        budget.metadata.namespace = Some("work".into());
        let disrupted = Disrupted::default();
        disrupted.record(&budget, at(0));
        assert_eq!(disrupted.last_listed("work/web", "web-0"), None);
        budget.status = Some(k8s_openapi::api::policy::v1::PodDisruptionBudgetStatus {
            disrupted_pods: Some([("web-0".to_owned(), Time(at(1)))].into()),
            ..Default::default()
        });
        disrupted.record(&budget, at(2));
        // The next version no longer lists it (the disruption controller saw it terminating):
        // the record of having seen it stays.
        budget.status = Some(k8s_openapi::api::policy::v1::PodDisruptionBudgetStatus::default());
        disrupted.record(&budget, at(3));
        assert_eq!(disrupted.last_listed("work/web", "web-0"), Some(at(2)));
        assert_eq!(disrupted.last_listed("other/web", "web-0"), None);
    }
}
