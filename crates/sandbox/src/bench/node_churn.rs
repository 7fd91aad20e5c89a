//! Nodes reporting their status, as kubelets do: every node's `Ready` condition has its
//! `lastHeartbeatTime` rewritten once per period (a status patch, spread evenly over the period),
//! so that the controller's node watch delivers a steady stream of changes of nodes that have
//! nothing to do with its remediations. The node-lifecycle controller reads the same heartbeat, so
//! bare nodes under churn also stay `Ready`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use futures::{StreamExt, stream};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};

/// How often the churn sends a slice of the period's patches.
const TICK: Duration = Duration::from_millis(100);

/// Patches in flight at once.
const CONCURRENCY: usize = 16;

/// A running churn; [`NodeChurn::stop`] ends it and says how many status writes it made.
pub struct NodeChurn {
    running: Arc<AtomicBool>,
    written: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

/// How many of `nodes` to patch per tick so that each is patched once per `period`.
#[must_use]
pub fn per_tick(nodes: usize, period: Duration) -> usize {
    let ticks = (period.as_millis() / TICK.as_millis()).max(1);
    let nodes = u128::try_from(nodes).unwrap_or(u128::MAX);
    usize::try_from(nodes.div_ceil(ticks))
        .unwrap_or(usize::MAX)
        .max(1)
}

async fn patch_one(api: Api<Node>, name: String, patch: serde_json::Value) -> bool {
    api.patch_status(&name, &PatchParams::default(), &Patch::Strategic(patch))
        .await
        .is_ok()
}

impl NodeChurn {
    /// Starts rewriting the status of every node in `nodes` once per `period`.
    #[must_use]
    pub fn start(client: Client, nodes: Vec<String>, period: Duration) -> Self {
        let running = Arc::new(AtomicBool::new(true));
        let written = Arc::new(AtomicU64::new(0));
        let api: Api<Node> = Api::all(client);
        let slice = per_tick(nodes.len(), period);
        let task = tokio::spawn({
            let (running, written) = (running.clone(), written.clone());
            async move {
                let mut ticks = tokio::time::interval(TICK);
                ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut next = 0;
                while running.load(Ordering::Relaxed) && !nodes.is_empty() {
                    ticks.tick().await;
                    let batch: Vec<&String> = (0..slice).map(|i| &nodes[(next + i) % nodes.len()]).collect();
                    next = (next + slice) % nodes.len();
                    let now = Timestamp::now().to_string();
                    let patch = serde_json::json!({"status": {"conditions": [
                        {"type": "Ready", "status": "True", "lastHeartbeatTime": now}
                    ]}});
                    // Built before they enter the stream: a closure making them inside it loses
                    // `Send` (a rustc limitation).
                    let patches: Vec<_> = batch
                        .into_iter()
                        .map(|name| patch_one(api.clone(), name.clone(), patch.clone()))
                        .collect();
                    let done = stream::iter(patches)
                        .buffer_unordered(CONCURRENCY)
                        .filter(|ok| std::future::ready(*ok))
                        .count()
                        .await;
                    written.fetch_add(u64::try_from(done).unwrap_or(0), Ordering::Relaxed);
                }
            }
        });
        Self {
            running,
            written,
            task,
        }
    }

    /// Stops the churn (after the slice in flight) and returns the status writes it made.
    pub async fn stop(self) -> u64 {
        self.running.store(false, Ordering::Relaxed);
        let _ = self.task.await;
        self.written.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_node_is_patched_once_per_period_spread_over_its_ticks() {
        assert_eq!(per_tick(1000, Duration::from_secs(10)), 10);
        assert_eq!(per_tick(1001, Duration::from_secs(10)), 11);
        assert_eq!(per_tick(5, Duration::from_secs(10)), 1);
        assert_eq!(per_tick(5, Duration::from_millis(10)), 5);
    }
}
