//! A node's heartbeat: its kubelet renews the node's Lease in `kube-node-lease` every interval, and
//! kube-controller-manager's node-lifecycle controller marks the node `Unknown` (then taints it
//! and evicts its pods) when renewals stop. One task per node, started at a staggered offset so a
//! thousand nodes spread their renewals over the interval instead of renewing in a burst.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::api::{Patch, PatchParams};

use super::node::renew_patch;

/// Renews `node`'s Lease every `interval` while `running` is set, until the task is aborted.
pub async fn run(
    leases: Api<Lease>,
    node: String,
    running: Arc<AtomicBool>,
    interval: Duration,
    offset: Duration,
) {
    tokio::time::sleep(offset).await;
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        if !running.load(Ordering::Relaxed) {
            continue;
        }
        let patch = renew_patch(Timestamp::now());
        if let Err(e) = leases
            .patch(&node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            tracing::warn!(%node, error = %e, "simulated kubelet: renewing the node lease failed");
        }
    }
}

/// Where in the interval node `index` of `count` renews, spreading renewals evenly.
#[must_use]
pub fn stagger(index: usize, count: usize, interval: Duration) -> Duration {
    let count = u32::try_from(count.max(1)).unwrap_or(u32::MAX);
    let index = u32::try_from(index).unwrap_or(u32::MAX) % count;
    interval / count * index
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewals_are_spread_over_the_interval() {
        let interval = Duration::from_secs(10);
        assert_eq!(stagger(0, 4, interval), Duration::ZERO);
        assert_eq!(stagger(1, 4, interval), Duration::from_millis(2500));
        assert_eq!(stagger(3, 4, interval), Duration::from_millis(7500));
    }

    #[test]
    fn a_lone_node_renews_at_once() {
        assert_eq!(stagger(0, 1, Duration::from_secs(10)), Duration::ZERO);
    }
}
