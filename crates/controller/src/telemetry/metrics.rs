//! The controller's Prometheus series and the typed handles that update them. Every series is
//! prefixed `gpu_remediator_` and served as `OpenMetrics` text.
//!
//! | series | type | labels |
//! |---|---|---|
//! | `remediations_started_total` | counter | `policy`, `action` |
//! | `remediations_finished_total` | counter | `policy`, `action`, `outcome` (the terminal phase) |
//! | `remediations_in_flight` | gauge | `policy` |
//! | `phase_duration_seconds` | histogram | `policy`, `phase` (time spent in the phase) |
//! | `detection_to_cordon_seconds` | histogram | `policy` (trigger condition's transition to cordon) |
//! | `time_to_recovery_seconds` | histogram | `policy`, `outcome` (trigger's start to the node, or its replacement, back in service) |
//! | `time_between_incidents_seconds` | histogram | `policy` (a node's previous incident's start to this one's, observed at admission) |
//! | `evictions_total` | counter | `result` |
//! | `budget_remaining` | gauge | `policy` (remediations that may start now: the smallest of the limits, as `status.budget.remaining`) |
//! | `circuit_open` | gauge | `policy` (1 while `maxUnhealthy` is exceeded) |
//! | `quarantined_nodes` | gauge | `policy` (nodes carrying its quarantine taint, as `status.quarantinedNodes`) |
//! | `signal_to_quarantine_seconds` | histogram | `policy` (trigger condition's first match to the quarantine taint written) |
//! | `leaked_pods_total` | counter | `policy` (pods found on a node, at its cordon, that were scheduled after its fault began) |
//! | `drain_gpu_seconds_total` | counter | `policy` (GPU-seconds its drains cost: each evicted pod's GPUs times the seconds from its record's admission to its eviction, as `status.drain.gpuSeconds`) |
//! | `records_held_total` | counter | `policy` (records held because their status has no evidence behind it: written by someone other than the controller; `lifecycle::provenance`) |
//! | `leader` | gauge | (1 while this replica's fence is current) |
//! | `fence_unproven` | gauge | (1 while this replica's last probe could not prove that the API server enforces the fence) |
//! | `node_labels_listing` | gauge | (1 while passes plan nothing: a policy reads a node label the node cache has not listed yet; `act::node_labels`) |
//! | `reconcile_errors_total` | counter | `reconciler` |
//! | `reconcile_errors_by_kind_total` | counter | `reconciler`, `kind` (`fenced`, `conflict`, `forbidden`, `invalid`, `timeout`, `unreachable`, `internal`, ...) |
//! | `writes_total` | counter | `verb`, `resource`, `outcome` (`ok` or the kind of failure; every write the one writer sends) |
//! | `undecodable_objects` | gauge | `kind`, `name` (1 while a stored policy or remediation cannot be decoded; `observe::undecodable`) |
//!
//! Gauges about policies are *set* from what the reconcilers computed from API objects (never
//! counted up and down in memory), so a new leader reports the same values as the old one.

use std::{
    fmt,
    sync::{Arc, Mutex},
    time::Duration,
};

use gpu_remediation_api::{Phase, policy::Action};
use prometheus_client::{
    encoding::{EncodeLabelSet, EncodeLabelValue},
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

/// The content type of [`Metrics::encode`]'s output.
pub const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What became of one eviction attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EncodeLabelValue)]
pub enum EvictionResult {
    /// The server accepted the eviction.
    Evicted,
    /// A `PodDisruptionBudget` refused it (429).
    Blocked,
    /// The pod was already gone (404).
    Gone,
    /// Any other error (a pod matched by two budgets answers 500, for one).
    Failed,
    /// The pod was deleted directly because the policy says `ForceDelete`.
    ForceDeleted,
    /// A server-side dry-run eviction (mode `DryRun`).
    DryRun,
}

impl EvictionResult {
    /// Every result, for initialising the series.
    pub const ALL: [Self; 6] = [
        Self::Evicted,
        Self::Blocked,
        Self::Gone,
        Self::Failed,
        Self::ForceDeleted,
        Self::DryRun,
    ];
}

/// The reconcilers whose errors are counted, initialised to 0: `policy` (a policy's plan) and
/// `remediation` (advancing one remediation).
pub const RECONCILERS: [&str; 2] = ["policy", "remediation"];

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct PolicyLabels {
    policy: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct StartedLabels {
    policy: String,
    action: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct FinishedLabels {
    policy: String,
    action: &'static str,
    outcome: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct OutcomeLabels {
    policy: String,
    outcome: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct PhaseLabels {
    policy: String,
    phase: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct EvictionLabels {
    result: EvictionResult,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReconcilerLabels {
    reconciler: String,
}

fn phase_histogram() -> Histogram {
    // 1 s to about 4.5 h: a cordon takes a second, a blocked drain or a replacement hours.
    Histogram::new(exponential_buckets(1.0, 2.0, 15))
}

fn recovery_histogram() -> Histogram {
    // 30 s to about 68 h: a reboot is minutes, a replacement hours, a blocked drain days.
    Histogram::new(exponential_buckets(30.0, 2.0, 14))
}

fn incidents_histogram() -> Histogram {
    // 1 min to about 1 year: a node failing again within the hour is a repeat offender.
    Histogram::new(exponential_buckets(60.0, 4.0, 10))
}

fn quarantine_histogram() -> Histogram {
    // 10 ms to about 80 s: a quarantine follows its signal by one watch event and one write.
    Histogram::new(exponential_buckets(0.01, 2.0, 14))
}

fn detection_histogram() -> Histogram {
    // 0.25 s to about 17 min: detection-to-cordon is seconds once the trigger's `for` has held.
    Histogram::new(exponential_buckets(0.25, 2.0, 13))
}

struct Series {
    started: Family<StartedLabels, Counter>,
    finished: Family<FinishedLabels, Counter>,
    in_flight: Family<PolicyLabels, Gauge>,
    phase_duration: Family<PhaseLabels, Histogram>,
    detection_to_cordon: Family<PolicyLabels, Histogram>,
    time_to_recovery: Family<OutcomeLabels, Histogram>,
    time_between_incidents: Family<PolicyLabels, Histogram>,
    evictions: Family<EvictionLabels, Counter>,
    budget_remaining: Family<PolicyLabels, Gauge>,
    circuit_open: Family<PolicyLabels, Gauge>,
    quarantined: Family<PolicyLabels, Gauge>,
    signal_to_quarantine: Family<PolicyLabels, Histogram>,
    leaked_pods: Family<PolicyLabels, Counter>,
    drain_gpu_seconds: Family<PolicyLabels, Counter>,
    records_held: Family<PolicyLabels, Counter>,
    leadership: super::leadership_metrics::LeadershipSeries,
    reconcile_errors: Family<ReconcilerLabels, Counter>,
    ladder: super::ladder_metrics::LadderSeries,
    writes: super::write_metrics::WriteSeries,
}

/// The metrics registry plus typed handles. Cheap to clone (one `Arc`); every clone updates the
/// same series.
#[derive(Clone)]
pub struct Metrics {
    series: Arc<Series>,
    registry: Arc<Mutex<Registry>>,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// The label value of an action.
fn action_label(action: Action) -> &'static str {
    match action {
        Action::Replace => "Replace",
        Action::Reboot => "Reboot",
        Action::None => "None",
    }
}

/// The series of stored objects the controller leaves alone: undecodable ones, and records held
/// because their status has no evidence behind it.
fn register_records_left_alone(registry: &mut Registry, series: &Series) {
    registry.register(
        "undecodable_objects",
        "1 while a stored policy or remediation cannot be decoded and is left out, by kind and name",
        crate::observe::undecodable::GAUGE.clone(),
    );
    registry.register(
        "records_held",
        "Records held because their status has no evidence behind it (not written by the controller)",
        series.records_held.clone(),
    );
}

/// Counters that exist from the start read 0 rather than absent, so `rate()` and alerts on them
/// work before the first event.
fn start_at_zero(series: &Series) {
    for reconciler in RECONCILERS {
        series
            .reconcile_errors
            .get_or_create(&ReconcilerLabels {
                reconciler: reconciler.to_owned(),
            })
            .inc_by(0);
    }
    for result in EvictionResult::ALL {
        series
            .evictions
            .get_or_create(&EvictionLabels { result })
            .inc_by(0);
    }
}

impl Metrics {
    /// A fresh registry with every series registered.
    #[must_use]
    pub fn new() -> Self {
        let series = Series {
            started: Family::default(),
            finished: Family::default(),
            in_flight: Family::default(),
            phase_duration: Family::new_with_constructor(phase_histogram),
            detection_to_cordon: Family::new_with_constructor(detection_histogram),
            time_to_recovery: Family::new_with_constructor(recovery_histogram),
            time_between_incidents: Family::new_with_constructor(incidents_histogram),
            evictions: Family::default(),
            budget_remaining: Family::default(),
            circuit_open: Family::default(),
            quarantined: Family::default(),
            signal_to_quarantine: Family::new_with_constructor(quarantine_histogram),
            leaked_pods: Family::default(),
            drain_gpu_seconds: Family::default(),
            records_held: Family::default(),
            leadership: super::leadership_metrics::LeadershipSeries::default(),
            reconcile_errors: Family::default(),
            ladder: super::ladder_metrics::LadderSeries::new(),
            writes: super::write_metrics::WriteSeries::default(),
        };
        let mut registry = Registry::with_prefix("gpu_remediator");
        registry.register(
            "remediations_started",
            "Remediations created, by policy and action",
            series.started.clone(),
        );
        registry.register(
            "remediations_finished",
            "Remediations that reached a terminal phase, by policy, action and outcome",
            series.finished.clone(),
        );
        registry.register(
            "remediations_in_flight",
            "Remediations not yet finished, by policy",
            series.in_flight.clone(),
        );
        registry.register(
            "phase_duration_seconds",
            "Time a remediation spent in a phase, observed when it leaves the phase",
            series.phase_duration.clone(),
        );
        registry.register(
            "detection_to_cordon_seconds",
            "From the trigger condition's last transition to the node being cordoned",
            series.detection_to_cordon.clone(),
        );
        registry.register(
            "time_to_recovery_seconds",
            "From the start of the trigger to the node (or its replacement) back in service, by outcome",
            series.time_to_recovery.clone(),
        );
        registry.register(
            "time_between_incidents_seconds",
            "From the start of a node's previous incident on record to the start of its next one",
            series.time_between_incidents.clone(),
        );
        registry.register(
            "evictions",
            "Eviction attempts, by result",
            series.evictions.clone(),
        );
        registry.register(
            "budget_remaining",
            "Remediations the policy's budget lets start now (the smallest of its limits)",
            series.budget_remaining.clone(),
        );
        registry.register(
            "circuit_open",
            "1 while the policy's unhealthy share exceeds maxUnhealthy and nothing new starts",
            series.circuit_open.clone(),
        );
        registry.register(
            "quarantined_nodes",
            "Nodes carrying the policy's quarantine taint (taken at a trigger's first signal)",
            series.quarantined.clone(),
        );
        registry.register(
            "signal_to_quarantine_seconds",
            "From a quarantining trigger's condition matching to the node's quarantine taint written",
            series.signal_to_quarantine.clone(),
        );
        registry.register(
            "leaked_pods",
            "Pods found on a node at its cordon that were scheduled after its fault began",
            series.leaked_pods.clone(),
        );
        registry.register(
            "drain_gpu_seconds",
            "GPU-seconds drains cost: each evicted pod's GPUs times the seconds from its record's admission to its eviction",
            series.drain_gpu_seconds.clone(),
        );
        series.leadership.register(&mut registry);
        registry.register(
            "reconcile_errors",
            "Reconcile attempts that failed, by reconciler",
            series.reconcile_errors.clone(),
        );
        register_records_left_alone(&mut registry, &series);
        series.ladder.register(&mut registry);
        series.writes.register(&mut registry);
        start_at_zero(&series);
        Self {
            series: Arc::new(series),
            registry: Arc::new(Mutex::new(registry)),
        }
    }

    /// A remediation was created for a node.
    pub fn remediation_started(&self, policy: &str, action: Action) {
        self.series
            .started
            .get_or_create(&StartedLabels {
                policy: policy.to_owned(),
                action: action_label(action),
            })
            .inc();
    }

    /// A remediation reached a terminal phase (`outcome`). Call once per remediation, when the
    /// status write that made it terminal succeeded.
    pub fn remediation_finished(&self, policy: &str, action: Action, outcome: Phase) {
        self.series
            .finished
            .get_or_create(&FinishedLabels {
                policy: policy.to_owned(),
                action: action_label(action),
                outcome: outcome.as_str(),
            })
            .inc();
    }

    /// Sets how many of the policy's remediations are not finished, as counted from the objects.
    pub fn set_in_flight(&self, policy: &str, count: u32) {
        self.series
            .in_flight
            .get_or_create(&PolicyLabels {
                policy: policy.to_owned(),
            })
            .set(i64::from(count));
    }

    /// A remediation left `phase` after spending `spent` in it.
    pub fn phase_finished(&self, policy: &str, phase: Phase, spent: Duration) {
        self.series
            .phase_duration
            .get_or_create(&PhaseLabels {
                policy: policy.to_owned(),
                phase: phase.as_str(),
            })
            .observe(spent.as_secs_f64());
    }

    /// A node's new incident started `between` after its previous one on record.
    pub fn time_between_incidents(&self, policy: &str, between: Duration) {
        self.series
            .time_between_incidents
            .get_or_create(&PolicyLabels {
                policy: policy.to_owned(),
            })
            .observe(between.as_secs_f64());
    }

    /// A node was cordoned `elapsed` after its trigger condition last changed.
    pub fn detected_to_cordoned(&self, policy: &str, elapsed: Duration) {
        self.series
            .detection_to_cordon
            .get_or_create(&PolicyLabels {
                policy: policy.to_owned(),
            })
            .observe(elapsed.as_secs_f64());
    }

    /// A remediation ended with `outcome` (its terminal phase) `elapsed` after its trigger started:
    /// the node, or its replacement, is back in service (or, for another outcome, given up on).
    pub fn time_to_recovery(&self, policy: &str, outcome: Phase, elapsed: Duration) {
        self.series
            .time_to_recovery
            .get_or_create(&OutcomeLabels {
                policy: policy.to_owned(),
                outcome: outcome.as_str(),
            })
            .observe(elapsed.as_secs_f64());
    }

    /// One eviction attempt ended with `result`.
    pub fn eviction(&self, result: EvictionResult) {
        self.series
            .evictions
            .get_or_create(&EvictionLabels { result })
            .inc();
    }

    /// Sets how many remediations the policy's budget lets start now (`status.budget.remaining`).
    pub fn set_budget_remaining(&self, policy: &str, remaining: u32) {
        self.series
            .budget_remaining
            .get_or_create(&PolicyLabels {
                policy: policy.to_owned(),
            })
            .set(i64::from(remaining));
    }

    /// Sets whether the policy's circuit breaker is open.
    pub fn set_circuit_open(&self, policy: &str, open: bool) {
        self.series
            .circuit_open
            .get_or_create(&PolicyLabels {
                policy: policy.to_owned(),
            })
            .set(i64::from(open));
    }

    /// Sets how many nodes carry the policy's quarantine taint (`status.quarantinedNodes`).
    pub fn set_quarantined(&self, policy: &str, count: u32) {
        self.series
            .quarantined
            .get_or_create(&PolicyLabels {
                policy: policy.to_owned(),
            })
            .set(i64::from(count));
    }

    /// A node's quarantine taint was written `elapsed` after its signal began.
    pub fn signal_to_quarantine(&self, policy: &str, elapsed: Duration) {
        self.series
            .signal_to_quarantine
            .get_or_create(&PolicyLabels {
                policy: policy.to_owned(),
            })
            .observe(elapsed.as_secs_f64());
    }

    /// `count` pods were found on a node, at its cordon, scheduled after its fault began.
    pub fn leaked_pods(&self, policy: &str, count: u32) {
        self.series
            .leaked_pods
            .get_or_create(&PolicyLabels {
                policy: policy.to_owned(),
            })
            .inc_by(u64::from(count));
    }

    /// A drain of `policy` cost `seconds` more GPU-seconds (`status.drain.gpuSeconds` grew).
    pub fn drain_gpu_seconds(&self, policy: &str, seconds: u64) {
        self.series
            .drain_gpu_seconds
            .get_or_create(&PolicyLabels {
                policy: policy.to_owned(),
            })
            .inc_by(seconds);
    }

    /// A record was held: its status has no evidence behind it (`lifecycle::provenance`).
    pub fn record_held(&self, policy: &str) {
        self.series
            .records_held
            .get_or_create(&PolicyLabels {
                policy: policy.to_owned(),
            })
            .inc();
    }

    /// A write was sent (or stopped by the fence): `verb` on `resource`, with `outcome` (`ok` or
    /// the kind of failure).
    pub fn write(&self, verb: &'static str, resource: &str, outcome: &'static str) {
        self.series.writes.write(verb, resource, outcome);
    }

    /// A reconcile of `reconciler` (e.g. `policy`, `remediation`) failed, with an error of `kind`
    /// (see `write::WriteError::metric_label`).
    pub fn reconcile_error(&self, reconciler: &str, kind: &'static str) {
        self.series.writes.error(reconciler, kind);
        self.series
            .reconcile_errors
            .get_or_create(&ReconcilerLabels {
                reconciler: reconciler.to_owned(),
            })
            .inc();
    }

    /// Drops the per-policy gauges of a deleted policy, so it stops being reported. Counters and
    /// histograms stay: they are cumulative by definition.
    pub fn forget_policy(&self, policy: &str) {
        let labels = PolicyLabels {
            policy: policy.to_owned(),
        };
        self.series.in_flight.remove(&labels);
        self.series.budget_remaining.remove(&labels);
        self.series.circuit_open.remove(&labels);
        self.series.quarantined.remove(&labels);
    }

    /// The ladder's series.
    pub(super) fn ladder(&self) -> &super::ladder_metrics::LadderSeries {
        &self.series.ladder
    }

    /// Sets the leader gauge (the server does it from the fence at every scrape).
    pub fn set_leader(&self, leader: bool) {
        self.series.leadership.set_leader(leader);
    }

    /// Sets the fence-unproven gauge (the server does it from the fence at every scrape).
    pub fn set_fence_unproven(&self, unproven: bool) {
        self.series.leadership.set_fence_unproven(unproven);
    }

    /// Sets whether passes wait for a node list keeping a label a policy reads (every pass does,
    /// from `act::node_labels::covered`).
    pub fn set_node_labels_listing(&self, listing: bool) {
        self.series.leadership.set_node_labels_listing(listing);
    }

    /// The `OpenMetrics` text of every series.
    #[must_use]
    pub fn encode(&self) -> String {
        let mut text = String::new();
        let registry = self
            .registry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Writing to a String cannot fail.
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encoding to a String");
        text
    }
}

impl Metrics {
    /// A ladder step ended with `outcome` after `took`.
    pub fn step_finished(
        &self,
        policy: &str,
        step: gpu_remediation_api::ladder::Rung,
        outcome: gpu_remediation_api::ladder::StepOutcome,
        took: std::time::Duration,
    ) {
        self.ladder().step_finished(policy, step, outcome, took);
    }

    /// A recycle on a ladder finished; `replaced` when its `Replace` step was triggered.
    pub fn recycle_finished(&self, policy: &str, replaced: bool) {
        self.ladder().recycle_finished(policy, replaced);
    }
}

#[cfg(test)]
mod tests;
