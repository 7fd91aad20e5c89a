//! What every step of the controller shares: the settings, the caches, the writer, and the
//! eviction backoff memory.

use std::{
    collections::HashMap,
    sync::{Mutex, PoisonError},
    time::Duration,
};

use jiff::Timestamp;

use crate::{
    lifecycle::eviction_round::Flight, observe::Caches, read::Reader, telemetry::Metrics, write::Writer,
};

/// How the controller runs. `Default` is what production uses.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Only policies matching this label selector are enforced (and only their remediations are
    /// touched). `None`: every policy. Lets several controllers share a cluster, as the e2e tests
    /// do, one per test.
    pub policy_selector: Option<String>,
    /// Evictions in flight at once for one node.
    pub eviction_concurrency: usize,
    /// How long a refused eviction waits before it is asked again, unless its budget's status
    /// shows room first.
    pub eviction_backoff: Duration,
    /// How often a draining node's pods are listed while some are still terminating (pods are not
    /// watched, so that the cost grows with faults and not with the fleet).
    pub pod_poll: Duration,
    /// The longest the controller sleeps without a pass, whatever the watches say.
    pub resync: Duration,
    /// How long a pass waits after an error before trying again (an advance that fails again
    /// waits twice as long each time, with jitter, up to `retry::CAP`).
    pub error_backoff: Duration,
    /// How often a triggered replacement is looked at while it is under way.
    pub replacement_poll: Duration,
    /// Remediations carried forward at once in the loop's carrying lane (drains, replacements,
    /// releases: see `lanes`).
    pub remediation_concurrency: usize,
    /// Remediations started at once: records created in one pass, and advances at once in the
    /// starting lane (a fresh read of the node and its cordon). Each is a few small requests, and
    /// the policies' budgets already bound how many start; at 16 a hundred faults at 50,000 nodes
    /// were cordoned at p99 699 ms against the API server's floor of 248 ms, at 100 in 283 ms
    /// against 267 ms (`docs/benchmarks.md`, the cordon floor).
    pub starting_concurrency: usize,
    /// This replica's name in Events (`reportingInstance`), e.g. the pod name.
    pub instance: Option<String>,
    /// Connections to the API server kept open while leading (see `write::keep_warm`): as many
    /// as the two lanes' advances and admission's creates use at once.
    pub warm_connections: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            policy_selector: None,
            eviction_concurrency: 8,
            eviction_backoff: Duration::from_secs(5),
            pod_poll: Duration::from_secs(1),
            resync: Duration::from_secs(60),
            error_backoff: Duration::from_secs(2),
            replacement_poll: Duration::from_secs(5),
            remediation_concurrency: 16,
            starting_concurrency: 100,
            instance: None,
            warm_connections: 32,
        }
    }
}

/// Shared by every pass.
pub struct Context {
    /// How the controller runs.
    pub settings: Settings,
    /// The one writer: every write, behind the leader fence.
    pub writer: Writer,
    /// Reads not served from the caches.
    pub reader: Reader,
    /// The watch caches and our recent writes.
    pub caches: Caches,
    /// Metrics.
    pub metrics: Metrics,
    /// Whether `DeviceTaintRule`s of ours may exist that no node names (unknown at start, so the
    /// first pass looks; see `act::quarantine_device::reconcile`).
    pub device_rules_may_exist: std::sync::atomic::AtomicBool,
    /// When each pod (by UID) was last asked to leave. Only paces retries: losing it on a restart
    /// costs one early retry, never a wrong decision.
    eviction_attempts: Mutex<HashMap<String, Timestamp>>,
    /// Evictions this replica asked (by pod UID) that their budgets' statuses may not count yet:
    /// every drain plans against them, under this lock, so that two drains sharing a budget never
    /// spend the same room. Lost on a restart: the budgets' statuses have counted them by then.
    pub evictions_in_flight: Mutex<HashMap<String, Flight>>,
    /// Drain progress held back between status writes, and when each status was last written.
    pub progress: crate::progress::HeldProgress,
}

impl Context {
    /// A context over these parts.
    #[must_use]
    pub fn new(settings: Settings, writer: Writer, caches: Caches, metrics: Metrics) -> Self {
        Self {
            settings,
            reader: writer.reader(),
            writer,
            caches,
            metrics,
            device_rules_may_exist: std::sync::atomic::AtomicBool::new(true),
            eviction_attempts: Mutex::default(),
            evictions_in_flight: Mutex::default(),
            progress: crate::progress::HeldProgress::default(),
        }
    }

    /// When the pod with `uid` was last asked to leave by this replica.
    #[must_use]
    pub fn last_eviction_attempt(&self, uid: &str) -> Option<Timestamp> {
        self.eviction_attempts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(uid)
            .copied()
    }

    /// Records an eviction attempt, and forgets attempts old enough not to matter any more.
    pub fn record_eviction_attempt(&self, uid: &str, at: Timestamp) {
        let mut attempts = self
            .eviction_attempts
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let horizon = crate::time::minus(at, jiff::SignedDuration::from_hours(1));
        attempts.retain(|_, t| *t > horizon);
        attempts.insert(uid.to_owned(), at);
    }
}
