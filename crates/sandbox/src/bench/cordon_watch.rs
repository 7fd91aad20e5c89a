//! Watches a fleet's nodes and records, by the watching process's own clock, when each node was
//! first seen cordoned by the controller (unschedulable and carrying the remediation taint), and
//! the most nodes the controller held at any one instant: the latency benchmark reads the first,
//! the fault suite asserts the second against the policy's budget. It also records when each node
//! was seen turning faulty (`GpuHealthy=False`) and then quarantined (the quarantine taint), both
//! by the same watch, so that the time between is the controller's and not the harness's.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use gpu_remediation_api::constants::{QUARANTINE_TAINT_KEY, REMEDIATION_TAINT_KEY, node_conditions};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};

/// Whether `node` carries a taint of key `key`.
fn carries_taint(node: &Node, key: &str) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == key))
}

/// Whether `node` is cordoned by the controller: unschedulable with the remediation taint.
#[must_use]
pub fn is_held(node: &Node) -> bool {
    node.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false)
        && carries_taint(node, REMEDIATION_TAINT_KEY)
}

/// Milliseconds from `from` to each of `nodes` first held, by `first` (a [`CordonWatch::first_held`]),
/// sorted; a node never seen held has no sample.
#[must_use]
pub fn held_after_ms(first: &BTreeMap<String, Timestamp>, nodes: &[String], from: Timestamp) -> Vec<f64> {
    let mut samples: Vec<f64> = nodes
        .iter()
        .filter_map(|n| first.get(n))
        .map(|t| t.duration_since(from).as_secs_f64() * 1000.0)
        .collect();
    samples.sort_by(f64::total_cmp);
    samples
}

/// Whether `node` carries the controller's quarantine taint.
#[must_use]
pub fn is_quarantined(node: &Node) -> bool {
    carries_taint(node, QUARANTINE_TAINT_KEY)
}

/// Whether `node` reports a GPU fault (`GpuHealthy=False`), as the node agent writes it.
#[must_use]
pub fn is_faulty(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == node_conditions::GPU_HEALTHY && c.status == "False")
        })
}

/// When each node of a set was first seen entering it: a node counts again only after it was
/// seen leaving and then forgotten, so a state a node already had is never stamped as new.
#[derive(Default)]
struct Edges {
    now_in: BTreeSet<String>,
    first_in: BTreeMap<String, Timestamp>,
}

impl Edges {
    /// Records `node`'s state as seen at `now`; `listing` when it comes from the watch's (re)list,
    /// which shows a state, not its start.
    fn see(&mut self, node: &str, is_in: bool, now: Timestamp, listing: bool) {
        if !is_in {
            self.now_in.remove(node);
        } else if self.now_in.insert(node.to_owned()) && !listing {
            self.first_in.entry(node.to_owned()).or_insert(now);
        }
    }
}

#[derive(Default)]
struct State {
    listed: bool,
    held: BTreeSet<String>,
    first_held: BTreeMap<String, Timestamp>,
    most_held: usize,
    faulty: Edges,
    quarantined: Edges,
}

/// A running node watch.
pub struct CordonWatch {
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

/// The node watch never delivered its first complete list.
#[derive(Debug, thiserror::Error)]
#[error("the node watch ({selector}) did not list within {waited:?}")]
pub struct StartCordonWatchError {
    /// The label selector.
    pub selector: String,
    /// How long it waited.
    pub waited: Duration,
}

impl CordonWatch {
    /// Watches the nodes matching `selector`; returns once the first list is complete (within 60 s).
    pub async fn start(client: &Client, selector: &str) -> Result<Self, StartCordonWatchError> {
        Self::start_within(client, selector, Duration::from_secs(60)).await
    }

    /// [`Self::start`], waiting up to `waited` for the first list (tens of thousands of nodes take
    /// minutes to list from a loaded server).
    pub async fn start_within(
        client: &Client,
        selector: &str,
        waited: Duration,
    ) -> Result<Self, StartCordonWatchError> {
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        let nodes: Api<Node> = Api::all(client.clone());
        let config = watcher::Config::default().labels(selector);
        let task = tokio::spawn(async move {
            let mut events = std::pin::pin!(watcher(nodes, config).default_backoff());
            while let Some(event) = events.next().await {
                let Ok(event) = event else { continue };
                let now = Timestamp::now();
                let mut state = shared.lock().unwrap_or_else(PoisonError::into_inner);
                match event {
                    watcher::Event::Init => state.listed = false,
                    watcher::Event::InitDone => state.listed = true,
                    watcher::Event::InitApply(node) | watcher::Event::Apply(node) => {
                        let name = node.name_any();
                        let listing = !state.listed;
                        state.faulty.see(&name, is_faulty(&node), now, listing);
                        state.quarantined.see(&name, is_quarantined(&node), now, listing);
                        if is_held(&node) {
                            state.first_held.entry(name.clone()).or_insert(now);
                            state.held.insert(name);
                        } else {
                            state.held.remove(&name);
                        }
                    }
                    watcher::Event::Delete(node) => {
                        let name = node.name_any();
                        state.held.remove(&name);
                        state.faulty.see(&name, false, now, false);
                        state.quarantined.see(&name, false, now, false);
                    }
                }
                state.most_held = state.most_held.max(state.held.len());
            }
        });
        let watch = Self { state, task };
        let deadline = tokio::time::Instant::now() + waited;
        while !watch.lock().listed {
            if tokio::time::Instant::now() > deadline {
                return Err(StartCordonWatchError {
                    selector: selector.to_owned(),
                    waited,
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(watch)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// When each node was first seen held.
    #[must_use]
    pub fn first_held(&self) -> BTreeMap<String, Timestamp> {
        self.lock().first_held.clone()
    }

    /// Forgets when `nodes` were first held, turned faulty and were quarantined, so that the next
    /// time counts as their first (a benchmark reusing released nodes).
    pub fn forget_first_held(&self, nodes: &[String]) {
        let mut state = self.lock();
        for node in nodes {
            state.first_held.remove(node);
            state.faulty.first_in.remove(node);
            state.quarantined.first_in.remove(node);
        }
    }

    /// When each node was first seen quarantined since it was last forgotten.
    #[must_use]
    pub fn first_quarantined(&self) -> BTreeMap<String, Timestamp> {
        self.lock().quarantined.first_in.clone()
    }

    /// The nodes carrying the quarantine taint now.
    #[must_use]
    pub fn quarantined(&self) -> BTreeSet<String> {
        self.lock().quarantined.now_in.clone()
    }

    /// For each node seen turning faulty and then quarantined since it was last forgotten, the
    /// time between the two sightings, ms.
    #[must_use]
    pub fn fault_to_quarantine_ms(&self) -> BTreeMap<String, f64> {
        let state = self.lock();
        state
            .faulty
            .first_in
            .iter()
            .filter_map(|(node, faulted)| {
                let quarantined = state.quarantined.first_in.get(node)?;
                Some((
                    node.clone(),
                    quarantined.duration_since(*faulted).as_secs_f64() * 1000.0,
                ))
            })
            .collect()
    }

    /// The nodes held now.
    #[must_use]
    pub fn held(&self) -> BTreeSet<String> {
        self.lock().held.clone()
    }

    /// The most nodes held at any one instant.
    #[must_use]
    pub fn most_held(&self) -> usize {
        self.lock().most_held
    }
}

impl Drop for CordonWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_a_node_already_had_when_listed_is_not_stamped_as_its_start() {
        let mut edges = Edges::default();
        let t = |s: i64| Timestamp::from_second(s).expect("time");
        edges.see("listed-in", true, t(1), true);
        edges.see("listed-in", true, t(2), false);
        edges.see("entered", false, t(1), true);
        edges.see("entered", true, t(3), false);
        edges.see("entered", true, t(4), false);
        assert_eq!(edges.first_in.get("listed-in"), None);
        assert_eq!(edges.first_in.get("entered"), Some(&t(3)));
        // Left and entered again: the first entry stands until the bench forgets it.
        edges.see("entered", false, t(5), false);
        edges.see("entered", true, t(6), false);
        assert_eq!(edges.first_in.get("entered"), Some(&t(3)));
        edges.first_in.remove("entered");
        edges.see("entered", false, t(7), false);
        edges.see("entered", true, t(8), false);
        assert_eq!(edges.first_in.get("entered"), Some(&t(8)));
    }
}
