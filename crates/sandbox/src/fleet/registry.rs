//! The fleet's nodes as its simulated kubelets and heartbeats see them: which nodes belong to the
//! fleet, their IPs, and whether each one's heartbeat and kubelet are running. Shared between
//! tasks.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

/// One simulated node.
#[derive(Debug, Clone)]
pub struct NodeEntry {
    /// Its internal IP, the `hostIP` of its pods.
    pub ip: String,
    /// Whether its heartbeat Lease is being renewed.
    pub heartbeat: Arc<AtomicBool>,
    /// Whether its kubelet handles its pods.
    pub kubelet: Arc<AtomicBool>,
}

/// Every node of a fleet, by name.
#[derive(Debug, Default)]
pub struct NodeRegistry {
    nodes: RwLock<BTreeMap<String, NodeEntry>>,
}

impl NodeRegistry {
    /// Adds a node whose heartbeat runs.
    pub fn insert(&self, name: &str, ip: &str) -> NodeEntry {
        let entry = NodeEntry {
            ip: ip.to_owned(),
            heartbeat: Arc::new(AtomicBool::new(true)),
            kubelet: Arc::new(AtomicBool::new(true)),
        };
        self.nodes
            .write()
            .expect("node registry lock")
            .insert(name.to_owned(), entry.clone());
        entry
    }

    /// The `hostIP` of node `name`, if it belongs to the fleet and its kubelet runs.
    pub fn kubelet_ip(&self, name: &str) -> Option<String> {
        self.nodes
            .read()
            .expect("node registry lock")
            .get(name)
            .filter(|e| e.kubelet.load(Ordering::Relaxed))
            .map(|e| e.ip.clone())
    }

    /// Every node name, sorted.
    pub fn names(&self) -> Vec<String> {
        self.nodes
            .read()
            .expect("node registry lock")
            .keys()
            .cloned()
            .collect()
    }

    /// Removes node `name` (its Node is gone), stopping its heartbeat and kubelet; `false` if it
    /// was not in the fleet.
    pub fn remove(&self, name: &str) -> bool {
        let removed = self.nodes.write().expect("node registry lock").remove(name);
        if let Some(entry) = &removed {
            entry.heartbeat.store(false, Ordering::Relaxed);
            entry.kubelet.store(false, Ordering::Relaxed);
        }
        removed.is_some()
    }

    /// Whether node `name` is in the fleet.
    pub fn contains(&self, name: &str) -> bool {
        self.nodes.read().expect("node registry lock").contains_key(name)
    }

    /// How many nodes the fleet has.
    pub fn len(&self) -> usize {
        self.nodes.read().expect("node registry lock").len()
    }

    /// Starts or stops node `name`'s heartbeat; `false` if the node is not in the fleet.
    pub fn set_heartbeat(&self, name: &str, running: bool) -> bool {
        match self.nodes.read().expect("node registry lock").get(name) {
            Some(entry) => {
                entry.heartbeat.store(running, Ordering::Relaxed);
                true
            }
            None => false,
        }
    }

    /// Starts or stops node `name`'s kubelet; `false` if the node is not in the fleet.
    pub fn set_kubelet(&self, name: &str, running: bool) -> bool {
        match self.nodes.read().expect("node registry lock").get(name) {
            Some(entry) => {
                entry.kubelet.store(running, Ordering::Relaxed);
                true
            }
            None => false,
        }
    }
}
