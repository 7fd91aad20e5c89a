//! The agent's loop: read the GPUs, decide, publish. Every tick reads once (under the probe's
//! deadline), turns the reading into signals and a verdict, and applies the condition when it
//! changed (or when the periodic resync is due). The node itself is re-read at the resync period
//! for the expected GPU count, and more often while a fault is latched, for a person's clear.

use std::time::{Duration, Instant};

use gpu_remediation_api::gpu_pods::GpuPods;
use jiff::Timestamp;

use crate::{
    assess::{Memory, Signal, assess},
    catalog::XidCatalog,
    condition::{NodeAnnotations, NodeView, PublishedCondition},
    health::{DesiredCondition, HealthState, WarningPolicy, detector_fault},
    inventory::{FailedGpu, InventoryGpu, annotation_text, failed_gpus, inventory_of},
    kernel_log::KernelLog,
    liveness::Liveness,
    pod_resources::{
        assignment::{DeviceNames, annotation_to_publish, assignment_of, restamp_due},
        reader::PodResourcesReader,
    },
    probe::{ReadGpusError, deadline::DeadlineReader},
    publish::NodePublisher,
    readings::Snapshot,
    xid_paths::XidPaths,
};

/// How the loop runs.
#[derive(Debug, Clone)]
pub struct AgentSettings {
    /// Time between reads.
    pub interval: Duration,
    /// Time between reads of the Node while a fault is latched (for the clear annotation).
    pub node_refresh: Duration,
    /// Time after which the condition is applied again even if unchanged (heartbeat, and repair
    /// of a condition someone else overwrote), and the Node re-read when nothing is latched.
    pub resync: Duration,
    /// The expected GPU count from the command line; overrides the node label.
    pub expected_gpus: Option<u32>,
    /// Warning hysteresis.
    pub warning_policy: WarningPolicy,
    /// When the host booted.
    pub booted_at: Option<Timestamp>,
}

/// Everything one read means: the signals and the message a healthy condition would carry.
#[must_use]
pub fn signals_of(
    read: &Result<Snapshot, ReadGpusError>,
    memory: &Memory,
    expected: Option<u32>,
    catalog: &XidCatalog,
) -> (Vec<Signal>, String) {
    match read {
        Ok(snapshot) => {
            let healthy = match expected {
                Some(expected) => format!(
                    "{} of {expected} expected GPUs present and healthy",
                    snapshot.gpus.len()
                ),
                None => format!(
                    "{} GPUs present and healthy (no expected count)",
                    snapshot.gpus.len()
                ),
            };
            (assess(snapshot, memory, expected, catalog), healthy)
        }
        Err(err) => (vec![detector_fault(err.to_string())], String::new()),
    }
}

/// One read through every path the agent reads: the probe's (less the XID events another path
/// already reported), then the kernel log's and the DCGM exporter's where `paths` has them. Returns
/// the read, the signals of all paths (sorted by kind) and the message a healthy condition would
/// carry. The loop's tick and `--print` both read this way, so what `--print` shows cannot drift
/// from what the agent would publish.
pub async fn read_all(
    reader: &DeadlineReader,
    paths: &mut XidPaths,
    memory: &Memory,
    expected: Option<u32>,
    catalog: &XidCatalog,
    now: Timestamp,
) -> (Result<Snapshot, ReadGpusError>, Vec<Signal>, String) {
    let mut read = reader.read().await;
    let dcgm = paths.scrape_dcgm().await;
    let other_paths = paths.collect(&mut read, dcgm, memory, catalog, now);
    let (mut signals, healthy_message) = signals_of(&read, memory, expected, catalog);
    signals.extend(other_paths);
    signals.sort_by_key(|signal| signal.kind);
    (read, signals, healthy_message)
}

/// Whole seconds: the API server stores condition times at that precision, so comparisons with
/// what it returns hold.
fn now() -> Timestamp {
    Timestamp::from_second(Timestamp::now().as_second()).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// The device plugin's assignment as last read.
struct ReadAssignment {
    pods: Vec<gpu_remediation_api::gpu_pods::PodDevices>,
    /// When it was read.
    read_at: Timestamp,
    /// When its pods last changed.
    changed_at: Timestamp,
}

/// The running agent for one node.
pub struct Agent {
    settings: AgentSettings,
    catalog: XidCatalog,
    reader: DeadlineReader,
    publisher: NodePublisher,
    health: HealthState,
    memory: Memory,
    view: NodeView,
    published: Option<PublishedCondition>,
    /// The inventory of the last successful read (kept through failed reads).
    inventory: Option<String>,
    /// Failed GPUs an earlier agent recorded on the node, for a restored latch.
    recorded_failed: Vec<FailedGpu>,
    applied_at: Option<Instant>,
    node_read_at: Instant,
    liveness: Option<Liveness>,
    /// The kubelet's pod-resources API, where the agent reads it.
    pod_resources: Option<PodResourcesReader>,
    /// The device plugin's assignment from the last successful read.
    gpu_pods: Option<ReadAssignment>,
    /// The last failure to read it, logged once until it changes.
    pod_resources_error: Option<String>,
    /// The kubelet's device IDs' GPUs, from the last successful read.
    device_names: DeviceNames,
    /// The XID paths besides NVML's events (the kernel log), deduplicated with them.
    xid_paths: XidPaths,
    /// The whole GPUs the node's DRA `ResourceSlice`s list, where no flag or label names a count.
    slice_gpus: Option<u32>,
    /// The last reason the slices gave no count, logged once until it changes.
    slice_problem: Option<String>,
}

impl Agent {
    /// Reads the node (retrying until the API server answers), restores a latch it carries, and
    /// returns the agent ready to run.
    pub async fn start(
        settings: AgentSettings,
        catalog: XidCatalog,
        reader: DeadlineReader,
        publisher: NodePublisher,
    ) -> Self {
        let node = loop {
            match publisher.fetch().await {
                Ok(node) => break node,
                Err(err) => {
                    tracing::warn!(error = %err, "cannot read my node yet; retrying");
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
            }
        };
        let view = NodeView::of(&node);
        for problem in &view.problems {
            tracing::warn!(%problem, "ignoring a node field");
        }
        let mut health = HealthState::new(settings.warning_policy);
        if let Some(latch) = view.latch_to_restore(settings.booted_at) {
            tracing::info!(reason = %latch.reason, since = %latch.since, "restoring latched fault from the node");
            health.restore(latch);
        }
        let mut agent = Self {
            published: view.condition.clone(),
            // What the node already carries, so a restart that cannot read the GPUs keeps it.
            inventory: view
                .condition
                .as_ref()
                .and_then(|condition| condition.annotations.inventory.clone()),
            recorded_failed: view.recorded_failed.clone(),
            view,
            settings,
            catalog,
            reader,
            publisher,
            health,
            memory: Memory::default(),
            applied_at: None,
            node_read_at: Instant::now(),
            liveness: None,
            pod_resources: None,
            gpu_pods: None,
            pod_resources_error: None,
            device_names: DeviceNames::default(),
            xid_paths: XidPaths::default(),
            slice_gpus: None,
            slice_problem: None,
        };
        agent.refresh_slice_count().await;
        agent
    }

    /// Scrapes a DCGM exporter too.
    #[must_use]
    pub fn with_dcgm(mut self, source: crate::dcgm::DcgmSource) -> Self {
        self.xid_paths.set_dcgm(source);
        self
    }

    /// Reads XIDs from the kernel log too. What the node says was handled (a clear, a `True`
    /// condition) sets the log's horizon; the inventory it carries names GPUs NVML no longer lists.
    #[must_use]
    pub fn with_kernel_log(mut self, mut log: KernelLog) -> Self {
        if let Some(cleared_at) = self.view.cleared_at {
            log.handled_until(cleared_at);
        }
        if let Some(condition) = self.view.condition.as_ref().filter(|c| c.status == "True") {
            log.handled_until(condition.last_transition);
        }
        let recorded: Vec<InventoryGpu> = self
            .inventory
            .as_deref()
            .and_then(|text| serde_json::from_str(text).ok())
            .unwrap_or_default();
        log.learn(
            recorded
                .iter()
                .map(|gpu| (gpu.pci_bus_id.as_str(), gpu.uuid.as_str())),
        );
        self.xid_paths.set_kernel_log(log);
        self
    }

    /// Reads the device plugin's GPU assignment from the kubelet at every tick and publishes it
    /// (`gpuremediation.dev/gpu-pods`) when it changes, and at every resync.
    #[must_use]
    pub fn with_pod_resources(mut self, reader: PodResourcesReader) -> Self {
        self.pod_resources = Some(reader);
        self
    }

    /// Reports each completed tick to `liveness` (the `/healthz` endpoint).
    #[must_use]
    pub fn with_liveness(mut self, liveness: Liveness) -> Self {
        self.liveness = Some(liveness);
        self
    }

    /// The GPU count the node should have: the flag, else the node's label, else the whole GPUs
    /// its DRA driver's `ResourceSlice`s list (a DRA-only node).
    fn expected(&self) -> Option<u32> {
        self.settings
            .expected_gpus
            .or(self.view.expected_gpus)
            .or(self.slice_gpus)
    }

    /// Where neither the flag nor the label names a count: the GPUs the node's DRA slices list,
    /// re-read with the node. A failed list or an untrustworthy count is said once (per cause) and
    /// leaves no count, as on a node without a label.
    async fn refresh_slice_count(&mut self) {
        if self.settings.expected_gpus.is_some() || self.view.expected_gpus.is_some() {
            self.slice_gpus = None;
            return;
        }
        let Some(counted) = self.publisher.count_gpu_slices().await else {
            return;
        };
        match counted {
            Ok(count) => {
                if count != self.slice_gpus {
                    tracing::info!(expected = ?count, "expected GPU count from the node's DRA ResourceSlices");
                }
                self.slice_gpus = count;
                self.slice_problem = None;
            }
            Err(problem) => {
                if self.slice_problem.as_deref() != Some(problem.as_str()) {
                    tracing::warn!(%problem, "no expected GPU count from the node's DRA ResourceSlices");
                }
                self.slice_gpus = None;
                self.slice_problem = Some(problem);
            }
        }
    }

    /// Runs until `shutdown` completes.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) {
        tracing::info!(probe = self.reader.name(), expected = ?self.expected(), "agent running");
        let mut ticks = tokio::time::interval(self.settings.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                _ = ticks.tick() => self.tick().await,
            }
        }
        tracing::info!("agent stopped");
    }

    /// One read, decision and publication.
    pub async fn tick(&mut self) {
        // Only a latch waits on a person (the clear annotation); otherwise the node is re-read at
        // the resync period, for a changed expected count: steady-state cost stays one read and
        // one write per node per resync, whatever the fleet size.
        let refresh = if self.health.latch().is_some() {
            self.settings.node_refresh
        } else {
            self.settings.resync
        };
        if self.node_read_at.elapsed() >= refresh {
            self.refresh_node().await;
        }
        let expected = self.expected();
        let (read, signals, healthy_message) = read_all(
            &self.reader,
            &mut self.xid_paths,
            &self.memory,
            expected,
            &self.catalog,
            now(),
        )
        .await;
        if let Ok(snapshot) = &read {
            self.memory.remember(snapshot);
            self.inventory = Some(annotation_text(&inventory_of(snapshot)));
            self.device_names = DeviceNames::of(&snapshot.gpus);
        }
        self.read_pod_resources().await;
        let now = now();
        let verdict = self.health.observe(&signals, now, &healthy_message);
        self.publish(&verdict.condition, now).await;
        for warning in &verdict.warnings {
            tracing::warn!(reason = %warning.reason, message = %warning.message, "GPU warning");
            if let Err(err) = self.publisher.warn(warning).await {
                tracing::warn!(error = %err, "warning event not published");
            }
        }
        if let Some(liveness) = &self.liveness {
            liveness.beat();
        }
    }

    /// One read of the kubelet's pod resources; a failure keeps the last assignment with its
    /// read time, so it ages until the controller stops trusting it.
    async fn read_pod_resources(&mut self) {
        let Some(reader) = &self.pod_resources else {
            return;
        };
        match reader.list().await {
            Ok(response) => {
                if self.pod_resources_error.take().is_some() {
                    tracing::info!(socket = %reader.socket().display(), "reading the kubelet's pod resources again");
                }
                let (pods, read_at) = (assignment_of(&response, &self.device_names), now());
                let changed_at = match &self.gpu_pods {
                    Some(last) if last.pods == pods => last.changed_at,
                    _ => read_at,
                };
                self.gpu_pods = Some(ReadAssignment {
                    pods,
                    read_at,
                    changed_at,
                });
            }
            Err(err) => {
                let text = err.to_string();
                if self.pod_resources_error.as_deref() != Some(text.as_str()) {
                    tracing::warn!(error = %text, "cannot read the kubelet's pod resources; the GPU assignment ages");
                    self.pod_resources_error = Some(text);
                }
            }
        }
    }

    async fn refresh_node(&mut self) {
        match self.publisher.fetch().await {
            Ok(node) => {
                self.node_read_at = Instant::now();
                let view = NodeView::of(&node);
                for problem in view
                    .problems
                    .iter()
                    .filter(|problem| !self.view.problems.contains(problem))
                {
                    tracing::warn!(%problem, "ignoring a node field");
                }
                if let Some(cleared_at) = view.cleared_at
                    && self.health.clear_if_before(cleared_at)
                {
                    tracing::info!(%cleared_at, "latched fault cleared by annotation");
                    if let Some(log) = self.xid_paths.kernel_log_mut() {
                        log.handled_until(cleared_at);
                    }
                    // The person accepted the node as it is now: GPUs gone before the clear are no
                    // longer looked for (the expected count still is).
                    self.memory = Memory::default();
                }
                // Someone else rewrote our condition: apply ours again now.
                if view.condition != self.published {
                    self.applied_at = None;
                }
                self.view = view;
                self.refresh_slice_count().await;
            }
            Err(err) => tracing::warn!(error = %err, "cannot re-read my node"),
        }
    }

    async fn publish(&mut self, desired: &DesiredCondition, now: Timestamp) {
        let resync_due = self
            .applied_at
            .is_none_or(|at| at.elapsed() >= self.settings.resync);
        let previous_pods = self
            .published
            .as_ref()
            .and_then(|published| published.annotations.gpu_pods.as_deref());
        let annotations = NodeAnnotations {
            inventory: self.inventory.clone(),
            failed_gpus: self
                .health
                .latch()
                .map(|latch| annotation_text(&failed_gpus(latch, &self.memory, &self.recorded_failed))),
            gpu_pods: self.gpu_pods.as_ref().map(|read| {
                let published_at = previous_pods
                    .and_then(|text| GpuPods::parse(text).ok())
                    .map(|published| published.read_at.0);
                let refresh = restamp_due(published_at, read.changed_at, now, resync_due);
                annotation_to_publish(&read.pods, read.read_at, previous_pods, refresh)
            }),
        };
        let next = PublishedCondition::next(
            desired,
            self.published.as_ref(),
            self.health.latch(),
            now,
            annotations,
        );
        if !next.differs_from(self.published.as_ref()) && !resync_due {
            return;
        }
        match self.publisher.apply(&next, now).await {
            Ok(()) => {
                if self.published.as_ref().map(|published| &published.annotations) != Some(&next.annotations)
                {
                    tracing::info!(
                        inventory = next.annotations.inventory.as_deref().unwrap_or("none"),
                        failed_gpus = next.annotations.failed_gpus.as_deref().unwrap_or("none"),
                        gpu_pods = next.annotations.gpu_pods.as_deref().unwrap_or("none"),
                        "node GPU annotations changed"
                    );
                }
                let condition_changed = self.published.as_ref().is_none_or(|published| {
                    (&published.status, &published.reason, &published.message)
                        != (&next.status, &next.reason, &next.message)
                });
                if condition_changed {
                    tracing::info!(
                        status = %next.status, reason = %next.reason, message = %next.message,
                        "GpuHealthy condition changed"
                    );
                }
                // The first publication on a fresh node is no news; a status change is.
                let status_changed = self
                    .published
                    .as_ref()
                    .is_some_and(|previous| previous.status != next.status);
                if status_changed && let Err(err) = self.publisher.status_changed(&next).await {
                    tracing::warn!(error = %err, "condition change event not published");
                }
                self.published = Some(next);
                self.applied_at = Some(Instant::now());
            }
            // Left unpublished: the next tick tries again.
            Err(err) => tracing::warn!(error = %err, "condition not applied"),
        }
    }
}
