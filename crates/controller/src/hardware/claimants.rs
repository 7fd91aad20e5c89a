//! The claimants index: which node's inventory lists each GPU serial, kept from the nodes the watch
//! saw change, so that the conflict check at admission (`trust::Claims`: does another live node list
//! the failed serial?) need not search every node's inventory in the fault's path. That search
//! costs 12 ms at 50,000 nodes measured alone, and profiled as most of a pass on a busy machine
//! (docs/benchmarks.md).
//!
//! The index answers one question, conservatively: may any node other than these list one of these
//! serials? A *no* is exact; a *maybe* (a real conflict, a board that moved since the last rebuild,
//! two serials whose hashes meet) sends the caller to the walk, which is exact. So entries are
//! never taken out between rebuilds: a serial a node stopped listing, or a node that went, leaves a
//! claim that can cost a walk and never hides one. The loop builds it afresh when the node watch
//! lists afresh (a node may have changed unseen) and when stale claims have doubled it
//! ([`Claimants::stale`]); not at the periodic resync, which a conservative index does not need.
//!
//! Memory: one hash map entry per listed serial (16 bytes of key and value): at 50,000 nodes of 8
//! GPUs, 400,000 entries, about 9 MB with the map's spare room (an estimate; the controller's idle
//! RSS there moved from 392.2 to 397.0 MiB between runs, docs/benchmarks.md).
//!
//! Serials are read from the inventory text without building the ledger's GPUs, and more widely
//! than `ledger::inventory_of` reads them (any entry with a serial, whatever else it holds):
//! whatever the ledger counts as listed, the index has seen. IO-free.

use std::{
    borrow::Cow,
    collections::{BTreeSet, HashMap, hash_map::Entry},
    sync::Arc,
};

use gpu_remediation_api::constants::GPU_INVENTORY_ANNOTATION;
use serde::Deserialize;

use crate::{observe::NodeView, observe::hash_one};

/// The value of a serial listed by more than one node (or by a node whose name hashes to it).
const SHARED: u64 = u64::MAX;

/// Which node lists each serial (see the module's header).
#[derive(Clone, Debug, Default)]
pub struct Claimants {
    /// Each serial seen listed, hashed, to the name (hashed) of the one node that listed it, or
    /// [`SHARED`].
    by_serial: HashMap<u64, u64>,
    /// How many serials it held when built.
    built: usize,
}

/// The fewest serials [`Claimants::stale`] lets the index grow by before a rebuild.
const STALE_GROWTH_MIN: usize = 4096;

/// One entry of the agent's inventory, as far as the index reads it.
#[derive(Deserialize)]
struct Listed<'a> {
    #[serde(borrow, default)]
    serial: Option<Cow<'a, str>>,
}

impl Claimants {
    /// An index of `nodes` alone (those being deleted claim nothing, as in `Claims::of`).
    #[must_use]
    pub fn of<N: NodeView>(nodes: &[Arc<N>]) -> Self {
        let mut index = Self {
            by_serial: HashMap::with_capacity(nodes.len() * 8),
            built: 0,
        };
        for node in nodes.iter().filter(|n| n.deleting().is_none()) {
            index.note(node);
        }
        index.built = index.by_serial.len();
        index
    }

    /// Adds the serials `node` lists now (what it listed before stays: see the module's header).
    pub fn note(&mut self, node: &(impl NodeView + ?Sized)) {
        let Some(text) = node.annotation(GPU_INVENTORY_ANNOTATION) else {
            return;
        };
        // Unreadable as a list: the ledger reads no GPU from it either.
        let Ok(listed) = serde_json::from_str::<Vec<Listed<'_>>>(text) else {
            return;
        };
        let name = hash_one(node.node_name());
        for serial in listed.iter().filter_map(|l| l.serial.as_deref()) {
            match self.by_serial.entry(hash_one(serial)) {
                Entry::Vacant(entry) => {
                    entry.insert(name);
                }
                Entry::Occupied(mut entry) => {
                    if *entry.get() != name {
                        entry.insert(SHARED);
                    }
                }
            }
        }
    }

    /// Whether no node but those named in `nodes` lists any of `serials` (`false`: some other node
    /// may; ask the fleet).
    #[must_use]
    pub fn none_but<'a>(&self, serials: &BTreeSet<String>, nodes: impl IntoIterator<Item = &'a str>) -> bool {
        let nodes: BTreeSet<u64> = nodes.into_iter().map(hash_one).collect();
        serials.iter().all(|serial| {
            self.by_serial
                .get(&hash_one(serial.as_str()))
                .is_none_or(|node| *node != SHARED && nodes.contains(node))
        })
    }

    /// Whether the serials noted since it was built (new boards, and the stale claims of boards
    /// that left) have doubled it, and by at least [`STALE_GROWTH_MIN`]: time to build it afresh,
    /// so that its memory follows the fleet's.
    #[must_use]
    pub fn stale(&self) -> bool {
        self.by_serial.len() >= self.built + self.built.max(STALE_GROWTH_MIN)
    }

    /// How many serials the index holds.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_serial.len()
    }
}

#[cfg(test)]
#[path = "claimants_tests.rs"]
mod tests;
