//! Watches a fleet's nodes and records, by the watching process's own clock, when each node was
//! first seen cordoned by the controller (unschedulable and carrying the remediation taint), and
//! the most nodes the controller held at any one instant: the latency benchmark reads the first,
//! the fault suite asserts the second against the policy's budget.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use gpu_remediation_api::constants::REMEDIATION_TAINT_KEY;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};

/// Whether `node` is cordoned by the controller: unschedulable with the remediation taint.
#[must_use]
pub fn is_held(node: &Node) -> bool {
    let spec = node.spec.as_ref();
    spec.and_then(|s| s.unschedulable).unwrap_or(false)
        && spec
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|ts| ts.iter().any(|t| t.key == REMEDIATION_TAINT_KEY))
}

#[derive(Default)]
struct State {
    listed: bool,
    held: BTreeSet<String>,
    first_held: BTreeMap<String, Timestamp>,
    most_held: usize,
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
                        if is_held(&node) {
                            state.first_held.entry(name.clone()).or_insert(now);
                            state.held.insert(name);
                        } else {
                            state.held.remove(&name);
                        }
                    }
                    watcher::Event::Delete(node) => {
                        state.held.remove(&node.name_any());
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

    /// Forgets when `nodes` were first held, so that the next time each is held counts as its
    /// first (a benchmark reusing released nodes).
    pub fn forget_first_held(&self, nodes: &[String]) {
        let mut state = self.lock();
        for node in nodes {
            state.first_held.remove(node);
        }
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
