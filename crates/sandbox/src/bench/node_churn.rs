//! Nodes reporting their status, as a fleet's kubelets and node agents do: node status patches at
//! a steady pace, so that the controller's node watch delivers a stream of changes of nodes that
//! have nothing to do with its remediations.
//!
//! Two mixes ([`Mix`]). `Kubelet`: every write rewrites the `Ready` condition's
//! `lastHeartbeatTime`, as a kubelet's status report does when nothing changed (the node-lifecycle
//! controller reads the same heartbeat, so bare nodes under churn also stay `Ready`). `Fleet`: what
//! a GPU fleet sends in steady state: kubelet reports and our agent's resyncs in equal shares (the
//! agent applies its unchanged `GpuHealthy=True` condition again at each resync, a new heartbeat
//! and nothing else), and one write in [`REAL_CHANGE_EVERY`] a real change: the agent's healthy
//! condition with a new message (its status, reason and transition time unchanged), content the
//! controller must decode and judge, not only a heartbeat.
//!
//! The pace is a rate over the whole list (each node written in turn), sent in slices every
//! [`TICK`] ([`Pace`] carries the fractions over); a server that cannot keep up slows the churn
//! down, and [`NodeChurn::written`] says what it reached.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use futures::{StreamExt, stream};
use gpu_remediation_api::constants::{gpu_reasons, node_conditions};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};

/// How often the churn sends a slice of its writes.
const TICK: Duration = Duration::from_millis(100);

/// Patches in flight at once.
const CONCURRENCY: usize = 32;

/// In the `Fleet` mix, one write in this many is a real change (the rest heartbeats only).
pub const REAL_CHANGE_EVERY: u64 = 100;

/// The period at which a real fleet's kubelets and agents each write a node's status when nothing
/// changes: the kubelet's `nodeStatusReportFrequency` and the agent's `--resync`, both 5 minutes
/// by default.
pub const REAL_FLEET_PERIOD: Duration = Duration::from_secs(300);

/// What a churn's writes are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mix {
    /// Kubelet status reports only: the `Ready` condition's heartbeat.
    Kubelet,
    /// Kubelet reports and agent resyncs in equal shares, one write in [`REAL_CHANGE_EVERY`] a
    /// real change of the agent's condition.
    Fleet,
}

/// One status write of a churn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Write {
    /// The kubelet's report: `Ready=True` with a new heartbeat.
    KubeletReport,
    /// The agent's resync: its unchanged `GpuHealthy=True` with a new heartbeat.
    AgentResync,
    /// The agent's condition with a new message (a real change of content, not of status).
    AgentDetail,
}

/// The `seq`th write of a churn of `mix`.
#[must_use]
pub fn write_for(mix: Mix, seq: u64) -> Write {
    match mix {
        Mix::Kubelet => Write::KubeletReport,
        Mix::Fleet if seq % REAL_CHANGE_EVERY == REAL_CHANGE_EVERY - 1 => Write::AgentDetail,
        Mix::Fleet if seq.is_multiple_of(2) => Write::KubeletReport,
        Mix::Fleet => Write::AgentResync,
    }
}

/// The message of the agent's healthy condition on a fleet node; [`Write::AgentDetail`] adds the
/// write's sequence number to it.
pub const HEALTHY_MESSAGE: &str = "all 8 GPUs healthy";

/// The agent's `GpuHealthy=True` condition as a node of a GPU fleet carries it from the start
/// (transition time `since`, heartbeat `now`).
#[must_use]
pub fn healthy_condition(message: &str, since: Timestamp, now: Timestamp) -> serde_json::Value {
    serde_json::json!({
        "type": node_conditions::GPU_HEALTHY,
        "status": "True",
        "reason": gpu_reasons::HEALTHY,
        "message": message,
        "lastHeartbeatTime": now.to_string(),
        "lastTransitionTime": since.to_string(),
    })
}

/// The strategic merge patch of `write` (conditions merge by type: the other conditions and the
/// fields the patch leaves out stay as they are).
#[must_use]
pub fn patch_of(write: Write, seq: u64, now: Timestamp) -> serde_json::Value {
    let condition = match write {
        Write::KubeletReport => serde_json::json!({
            "type": "Ready", "status": "True", "lastHeartbeatTime": now.to_string(),
        }),
        Write::AgentResync => serde_json::json!({
            "type": node_conditions::GPU_HEALTHY, "status": "True", "lastHeartbeatTime": now.to_string(),
        }),
        Write::AgentDetail => serde_json::json!({
            "type": node_conditions::GPU_HEALTHY, "status": "True", "lastHeartbeatTime": now.to_string(),
            "message": format!("{HEALTHY_MESSAGE} (reading {seq})"),
        }),
    };
    serde_json::json!({"status": {"conditions": [condition]}})
}

/// A running churn; [`NodeChurn::stop`] ends it and says how many status writes it made.
pub struct NodeChurn {
    running: Arc<AtomicBool>,
    written: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

/// Whole writes per tick for a rate that need not be a whole number of them per tick: the fraction
/// left over is carried to the next tick, so that the rate is kept on average.
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    per_tick: f64,
    owed: f64,
}

impl Pace {
    /// `per_second` writes a second.
    #[must_use]
    pub fn new(per_second: f64) -> Self {
        Self {
            per_tick: per_second * TICK.as_secs_f64(),
            owed: 0.0,
        }
    }

    /// Each of `nodes` once per `period` (a period under one tick counts as one tick).
    #[must_use]
    pub fn of_period(nodes: usize, period: Duration) -> Self {
        #[allow(clippy::cast_precision_loss, reason = "fleet sizes are far below 2^52")]
        let nodes = nodes as f64;
        Self::new(nodes / period.max(TICK).as_secs_f64())
    }

    /// The writes to send this tick.
    pub fn next_slice(&mut self) -> usize {
        self.owed += self.per_tick;
        // A sum of tenths is not exact in binary: 1,001 over 100 ticks must be 1,001, not 1,000.
        let whole = (self.owed + 1e-9).floor();
        self.owed -= whole;
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "a whole, non-negative number of writes per tick"
        )]
        let slice = whole as usize;
        slice
    }
}

async fn patch_one(api: Api<Node>, name: String, patch: serde_json::Value) -> bool {
    api.patch_status(&name, &PatchParams::default(), &Patch::Strategic(patch))
        .await
        .is_ok()
}

impl NodeChurn {
    /// Starts rewriting the `Ready` heartbeat of every node in `nodes` once per `period`.
    #[must_use]
    pub fn start(client: Client, nodes: Vec<String>, period: Duration) -> Self {
        let pace = Pace::of_period(nodes.len(), period);
        Self::spawn(client, nodes, pace, Mix::Kubelet)
    }

    /// Starts writing the status of the nodes in `nodes` in turn, `per_second` writes a second
    /// over all of them, of `mix`.
    #[must_use]
    pub fn at_rate(client: Client, nodes: Vec<String>, per_second: f64, mix: Mix) -> Self {
        Self::spawn(client, nodes, Pace::new(per_second), mix)
    }

    fn spawn(client: Client, nodes: Vec<String>, mut pace: Pace, mix: Mix) -> Self {
        let running = Arc::new(AtomicBool::new(true));
        let written = Arc::new(AtomicU64::new(0));
        let api: Api<Node> = Api::all(client);
        let task = tokio::spawn({
            let (running, written) = (running.clone(), written.clone());
            async move {
                let mut ticks = tokio::time::interval(TICK);
                ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut next = 0;
                let mut seq: u64 = 0;
                while running.load(Ordering::Relaxed) && !nodes.is_empty() {
                    ticks.tick().await;
                    let now = Timestamp::now();
                    // Built before they enter the stream: a closure making them inside it loses
                    // `Send` (a rustc limitation).
                    let slice = pace.next_slice();
                    let mut patches = Vec::with_capacity(slice);
                    for _ in 0..slice {
                        let patch = patch_of(write_for(mix, seq), seq, now);
                        patches.push(patch_one(api.clone(), nodes[next].clone(), patch));
                        next = (next + 1) % nodes.len();
                        seq += 1;
                    }
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

    /// The status writes the server accepted so far.
    #[must_use]
    pub fn written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
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

    /// The writes `pace` sends over `ticks` ticks.
    fn over(mut pace: Pace, ticks: usize) -> usize {
        (0..ticks).map(|_| pace.next_slice()).sum()
    }

    #[test]
    fn each_node_is_patched_once_per_period_spread_over_its_ticks() {
        let mut pace = Pace::of_period(1000, Duration::from_secs(10));
        assert!((0..100).all(|_| pace.next_slice() == 10));
        assert_eq!(over(Pace::of_period(1001, Duration::from_secs(10)), 100), 1001);
        assert_eq!(over(Pace::of_period(5, Duration::from_secs(10)), 100), 5);
        assert_eq!(
            over(Pace::of_period(5, Duration::from_millis(10)), 1),
            5,
            "a period under a tick is a tick"
        );
    }

    #[test]
    fn a_rate_that_is_no_whole_number_per_tick_is_kept_on_average() {
        assert_eq!(over(Pace::new(333.0), 10), 333);
        assert_eq!(over(Pace::new(1000.0), 10), 1000);
        assert_eq!(over(Pace::new(7.0), 10), 7, "7 a second: 7 of 10 ticks send one");
        assert_eq!(over(Pace::new(0.5), 25), 1);
    }

    #[test]
    fn the_fleet_mix_is_half_kubelet_half_agent_with_one_real_change_in_a_hundred() {
        let writes: Vec<Write> = (0..10 * REAL_CHANGE_EVERY)
            .map(|s| write_for(Mix::Fleet, s))
            .collect();
        let count = |w: Write| writes.iter().filter(|&&x| x == w).count();
        assert_eq!(count(Write::AgentDetail), 10);
        assert_eq!(count(Write::KubeletReport), 500);
        assert_eq!(count(Write::AgentResync), 490);
        assert!((0..50).all(|s| write_for(Mix::Kubelet, s) == Write::KubeletReport));
    }

    #[test]
    fn heartbeats_change_only_the_heartbeat_and_a_real_change_the_message() {
        let now = Timestamp::from_second(1_000).unwrap();
        let conditions = |w: Write| patch_of(w, 7, now)["status"]["conditions"][0].clone();
        let kubelet = conditions(Write::KubeletReport);
        assert_eq!(kubelet["type"], "Ready");
        assert_eq!(
            kubelet.as_object().unwrap().len(),
            3,
            "type, status and heartbeat: {kubelet}"
        );
        let resync = conditions(Write::AgentResync);
        assert_eq!(resync["type"], node_conditions::GPU_HEALTHY);
        assert_eq!(resync["status"], "True");
        assert!(resync.get("message").is_none() && resync.get("lastTransitionTime").is_none());
        let detail = conditions(Write::AgentDetail);
        assert_eq!(detail["message"], format!("{HEALTHY_MESSAGE} (reading 7)"));
        assert!(detail.get("lastTransitionTime").is_none() && detail.get("reason").is_none());
    }
}
