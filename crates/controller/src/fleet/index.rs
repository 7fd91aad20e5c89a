//! The node index: which nodes a pass must look at, kept up to date from the names of the nodes the
//! watch saw change, so that a pass over a fleet of 50,000 healthy nodes costs what its few
//! notable ones cost, not a walk of all of them. IO-free: the loop feeds it what changed and lends
//! it the cache to read nodes from.
//!
//! A node is *notable* when a decision may concern it: one of its conditions has the type and
//! status of a live policy's trigger (it is unhealthy, pending or signalling), it carries anything
//! of ours (an annotation or taint in `gpuremediation.dev/`, or a label the controller writes) but
//! the reports every installed node carries ([`REPORTS`]), it is cordoned, or it is being deleted. (Other labels in our group, such as a fleet's own selector
//! label or `gpuremediation.dev/exclude`, are the fleet's: they choose the governing policy, which
//! the census counts.) Every other node is healthy and untouched by every policy, and a plan only
//! counts it: the [`Census`] holds those counts, taken again when a node joins, leaves or is
//! relabelled, or a policy's spec changes. The candidates a pass plans over are the notable nodes,
//! every node a remediation names (finished ones too: slow start reads how they fared) and every
//! node we wrote whose watch event has not come yet; `fleet::plan_with` over them is the plan over
//! the whole fleet (the property tests in `index_tests.rs` check this over random fleets).
//!
//! A node whose trigger's condition turned to another status less than
//! [`RECOVERY_SETTLE`] ago (by its transition time) is a candidate too, so that the plan counts
//! recoveries arriving together as one burst (`recovering`).

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::Arc,
};

use gpu_remediation_api::{
    GpuRemediation, GpuRemediationPolicy,
    constants::{
        GPU_FIRST_SEEN_ANNOTATION, GPU_INVENTORY_ANNOTATION, GPU_PODS_ANNOTATION, REPEAT_OFFENDER_LABEL,
    },
    ladder::HAND_OFF_LABEL,
};
use jiff::Timestamp;
use kube::ResourceExt as _;

use super::{
    Census,
    recovering::{RECOVERY_SETTLE, recent_recovery},
};
use crate::observe::{NodeView, hash_of, hash_one, is_ours};

/// The node labels the controller writes (each beside an annotation of ours, but a label left
/// alone must still be seen to be taken back).
const WRITTEN_LABELS: [&str; 2] = [REPEAT_OFFENDER_LABEL, HAND_OFF_LABEL];

/// Annotations of ours that describe a node rather than mark a decision about it: the agent's
/// reports (its GPUs, the pods on them) and the first-seen stamps of its serials. Every node of an
/// installed fleet carries them, so they make no node notable (were they to, every pass would plan
/// over the whole fleet: 71 ms at 50,000 nodes, against 0.06 ms, `pass_cost_tests`). A plan reads
/// them only for the nodes it admits, which are notable by their trigger; the stamps are kept by
/// the ledger's sync from the changed nodes (`act::hardware`).
pub const REPORTS: [&str; 3] = [
    GPU_INVENTORY_ANNOTATION,
    GPU_FIRST_SEEN_ANNOTATION,
    GPU_PODS_ANNOTATION,
];

/// What changed in the node cache since the index last looked.
#[derive(Clone, Copy, Debug)]
pub enum NodeChanges<'a> {
    /// Anything may have: the watch listed afresh, or the loop resyncs.
    Everything,
    /// These nodes changed, appeared or went.
    Nodes(&'a BTreeSet<String>),
}

/// The notable nodes and the census of all of them.
#[derive(Debug, Default)]
pub struct NodeIndex {
    /// The live policies' names and specs, hashed, as last indexed: another set indexes afresh.
    policies: Option<u64>,
    /// The trigger conditions of every live policy, as (type, status).
    signals: Vec<(String, String)>,
    /// Each node's labels hashed, by its name hashed: a change makes the census stale. (Names are
    /// kept hashed to spare 50,000 strings; the resync indexes afresh in case two names collide.)
    labels: HashMap<u64, u64>,
    /// The nodes a pass must look at.
    notable: BTreeSet<String>,
    /// The counts of every node; `None` once a node joined, left or was relabelled.
    census: Option<Arc<Census>>,
    /// The nodes that may be recovering, with when their trigger's condition turned: candidates
    /// until [`RECOVERY_SETTLE`] after.
    recovered: BTreeMap<String, Timestamp>,
}

impl NodeIndex {
    /// Brings the index up to date with `news` under `policies` at `now`: `node` reads one node
    /// from the cache (`None`: it is gone), `every_node` the whole cache.
    pub fn refresh<N: NodeView>(
        &mut self,
        policies: &[Arc<GpuRemediationPolicy>],
        news: NodeChanges<'_>,
        now: Timestamp,
        node: impl Fn(&str) -> Option<Arc<N>>,
        every_node: impl FnOnce() -> Vec<Arc<N>>,
    ) {
        let horizon = crate::time::minus(now, crate::time::signed(RECOVERY_SETTLE));
        self.recovered.retain(|_, at| *at > horizon);
        let key = policies_key(policies);
        let names = match news {
            NodeChanges::Nodes(names) if self.policies == Some(key) => names,
            _ => {
                let nodes = every_node();
                self.rebuild(key, policies, &nodes, horizon);
                return;
            }
        };
        for name in names {
            let name_hash = hash_one(name);
            let Some(node) = node(name) else {
                if self.labels.remove(&name_hash).is_some() {
                    self.census = None;
                }
                self.notable.remove(name);
                self.recovered.remove(name);
                continue;
            };
            let labels = node.labels_hash();
            if self.labels.insert(name_hash, labels) != Some(labels) {
                self.census = None;
            }
            match recent_recovery(&node, &self.signals, horizon) {
                Some(at) => self.recovered.insert(name.clone(), at),
                None => self.recovered.remove(name),
            };
            if self.is_notable(&node) {
                self.notable.insert(name.clone());
            } else {
                self.notable.remove(name);
            }
        }
        if self.census.is_none() {
            self.census = Some(Arc::new(Census::take(policies, &every_node())));
        }
    }

    fn rebuild<N: NodeView>(
        &mut self,
        key: u64,
        policies: &[Arc<GpuRemediationPolicy>],
        nodes: &[Arc<N>],
        horizon: Timestamp,
    ) {
        self.policies = Some(key);
        self.signals = policies
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .flat_map(|p| &p.spec.triggers)
            .map(|t| (t.condition_type.clone(), t.status.as_str().to_owned()))
            .collect();
        self.signals.sort();
        self.signals.dedup();
        self.labels = nodes
            .iter()
            .map(|n| (hash_one(n.node_name()), n.labels_hash()))
            .collect();
        self.notable = nodes
            .iter()
            .filter(|n| self.is_notable(n))
            .map(|n| n.node_name().to_owned())
            .collect();
        self.recovered = nodes
            .iter()
            .filter_map(|n| {
                Some((
                    n.node_name().to_owned(),
                    recent_recovery(n, &self.signals, horizon)?,
                ))
            })
            .collect();
        self.census = Some(Arc::new(Census::take(policies, nodes)));
    }

    /// Whether a decision may concern `node` (see the module's header).
    fn is_notable(&self, node: &(impl NodeView + ?Sized)) -> bool {
        node.deleting().is_some()
            || node.unschedulable()
            || node.taints().iter().any(|t| is_ours(&t.key))
            || node.any_annotation(&mut |k, _| is_ours(k) && !REPORTS.contains(&k))
            || WRITTEN_LABELS.iter().any(|k| node.label(k).is_some())
            || node.conditions().iter().any(|c| {
                self.signals
                    .iter()
                    .any(|(type_, status)| c.type_ == *type_ && c.status == *status)
            })
    }

    /// The counts of every node (empty before the first refresh).
    #[must_use]
    pub fn census(&self) -> Arc<Census> {
        self.census.clone().unwrap_or_default()
    }

    /// The names of the nodes a pass plans over: the notable ones, those recovering (see the
    /// module's header), those `remediations` name, and those in `written` (our writes the watch
    /// has not shown yet).
    #[must_use]
    pub fn candidates<'a>(
        &'a self,
        remediations: &'a [Arc<GpuRemediation>],
        written: &'a [String],
    ) -> BTreeSet<&'a str> {
        self.notable
            .iter()
            .chain(self.recovered.keys())
            .map(String::as_str)
            .chain(remediations.iter().map(|r| r.spec.node_name.as_str()))
            .chain(written.iter().map(String::as_str))
            .collect()
    }

    /// How many nodes are notable now.
    #[must_use]
    pub fn notable(&self) -> usize {
        self.notable.len()
    }
}

/// The live policies' names and specs, hashed in name order.
fn policies_key(policies: &[Arc<GpuRemediationPolicy>]) -> u64 {
    let mut live: Vec<(String, u64)> = policies
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| (p.name_any(), hash_of(&p.spec)))
        .collect();
    live.sort();
    hash_one(&live)
}

#[cfg(test)]
#[path = "index_tests.rs"]
mod tests;
