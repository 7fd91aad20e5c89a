//! The loop: observe → plan → act → report. A pass plans the fleet, carries out each policy's
//! plan, and starts an advance for every remediation that is due; it is woken by a relevant watch
//! event, by an advance ending, by the earliest time a decision asked to be made again (a
//! trigger's `for` elapsing, a rate slot freeing, a drain timeout, a pod poll), or by the resync
//! period.
//!
//! Advances run as tasks of their own, at most one per remediation, so that one slow drain round
//! (a PDB refusing, an API server answering slowly) never holds up another node's cordon. They
//! run in two lanes with a concurrency limit each (`lanes`): remediations that are still starting
//! (their next step is the cordon) never wait behind remediations that are draining or being
//! replaced, and those hold back while a cordon is under way.
//!
//! A pass runs only while this replica's leader claim is current; a follower keeps its caches
//! warm and waits. Passes are level-triggered from the API server's state, so an advance that fails
//! halfway is simply made again.

use std::{
    collections::{HashMap, HashSet},
    future::Future,
    sync::Arc,
    time::Duration,
};

use gpu_remediation_api::{GpuRemediation, GpuRemediationPolicy, GpuRemediationStatus, Phase, policy::Mode};
use jiff::Timestamp;
use kube::{ResourceExt as _, runtime::events::Reporter};
use tokio::{
    sync::Notify,
    task::{JoinError, JoinSet},
};

use crate::{
    act::{
        self, admit,
        remediation::{self, AdvanceRemediationError, Next},
    },
    context::{Context, Settings},
    first_seen::FirstSeen,
    fleet, hardware,
    lanes::{Lane, Lanes},
    leader::Fence,
    observe::{Caches, Changed, StartCachesError, Undecodable, overlay::Overlays},
    telemetry::{Health, Metrics},
    write::{self, Writer},
};

/// How long a stopping controller waits for the advances under way to end. An advance cut short
/// can leave an eviction half done on the API server (its PDB charged, the pod not deleted, until
/// the disruption controller gives the charge back two minutes later), so they are let finish.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Why the controller stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunControllerError {
    /// The Kubernetes clients could not be built from the configuration.
    #[error("building the Kubernetes clients failed: {0}")]
    Client(#[source] kube::Error),
    /// The watches could not start.
    #[error(transparent)]
    Caches(#[from] StartCachesError),
}

/// Where the controller reports besides the API: metrics, and the health the HTTP server serves.
#[derive(Clone, Debug, Default)]
pub struct Telemetry {
    /// The metrics registry the passes update.
    pub metrics: Metrics,
    /// Readiness: marked once every watch has listed.
    pub health: Option<Health>,
}

/// Runs the controller until `shutdown` completes. Every write is checked against `fence`
/// (use `Fence::standalone()` for a single replica).
pub async fn run(
    config: kube::Config,
    settings: Settings,
    fence: Fence,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunControllerError> {
    run_with_telemetry(config, settings, fence, Telemetry::default(), shutdown).await
}

/// [`run`], reporting to `telemetry`.
pub async fn run_with_telemetry(
    config: kube::Config,
    settings: Settings,
    fence: Fence,
    telemetry: Telemetry,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunControllerError> {
    let reporter = Reporter {
        controller: "gpu-remediator".to_owned(),
        instance: settings.instance.clone(),
    };
    let writer = Writer::new(
        &config,
        fence.clone(),
        reporter,
        Overlays::new(crate::observe::prune_node),
        telemetry.metrics.clone(),
    )
    .map_err(RunControllerError::Client)?;
    // The watches' own client: a watch holds its connection, and reads nothing else.
    let watch_client = kube::Client::try_from(config.clone()).map_err(RunControllerError::Client)?;
    let wake = Arc::new(Notify::new());
    let (undecodable, findings) = Undecodable::new();
    // Reports for as long as the runtime runs (Events and conditions, while the fence holds).
    tokio::spawn(act::undecodable::report(writer.clone(), findings));
    let caches = Caches::start(
        &watch_client,
        settings.policy_selector.as_deref(),
        writer.overlays(),
        undecodable,
        wake.clone(),
    )
    .await?;
    if let Some(health) = &telemetry.health {
        health.mark_caches_synced();
    }
    // A JoinSet aborts its tasks when dropped: the connections are kept until the controller ends.
    let mut warm = JoinSet::new();
    warm.spawn(write::keep_warm(
        writer.reader(),
        fence.clone(),
        settings.warm_connections,
    ));
    let ctx = Arc::new(Context::new(settings, writer, caches, telemetry.metrics));
    tracing::info!(policy_selector = ?ctx.settings.policy_selector, "caches ready; controller running");
    let mut advances = Advances::new(&ctx.settings);
    let mut index = fleet::index::NodeIndex::default();
    // When each condition whose own clock cannot be trusted was first seen (see `first_seen`).
    let mut first_seen = FirstSeen::default();
    let mut ledger = act::hardware::Ledger::default();
    let mut claimants = hardware::claimants::Claimants::default();
    // The first pass, and every pass the resync starts, looks at every remediation; a pass a watch
    // event starts looks at those the change concerns and those due; a pass started by an
    // advance ending or by a timer looks at those due.
    let mut changed = Changed::everything();
    let mut last_full_pass = tokio::time::Instant::now();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            () = fence.acquired() => {}
            () = &mut shutdown => break,
        }
        if last_full_pass.elapsed() >= ctx.settings.resync {
            changed.anything = true;
            changed.resync = true;
        }
        if changed.anything {
            last_full_pass = tokio::time::Instant::now();
        }
        let since_last = std::mem::take(&mut changed);
        let Passed { next, planned } = pass(
            &ctx,
            &mut advances,
            &mut index,
            &mut first_seen,
            &mut ledger,
            &mut claimants,
            &since_last,
        )
        .await;
        if !planned {
            // What changed is still to be planned, by the pass after the node list completes.
            changed.merge(since_last);
        }
        let sleep = until(next, ctx.settings.resync);
        tokio::select! {
            () = wake.notified() => {
                let news = ctx.caches.changes.take();
                advances.touch_running(&ctx, &news);
                changed.merge(news);
            }
            Some(joined) = advances.running.join_next_with_id() => {
                advances.ended(&ctx, joined);
                // Collect every other advance that has ended too, so they share one pass.
                while let Some(joined) = advances.running.try_join_next_with_id() {
                    advances.ended(&ctx, joined);
                }
            }
            () = tokio::time::sleep(sleep) => {}
            () = ledger.owed_pass() => {}
            () = fence.lost() => tracing::warn!("leader claim lost: acting stops until it is current again"),
            () = &mut shutdown => break,
        }
    }
    advances.wind_down(&ctx).await;
    Ok(())
}

/// What a pass did.
struct Passed {
    /// When the next pass is due at the latest.
    next: Timestamp,
    /// Whether it planned the fleet: not while the node cache does not keep a label a policy reads
    /// (`act::node_labels`).
    planned: bool,
}

/// One pass over the fleet: plans it, carries out each policy's plan, and starts an advance for
/// every remediation that needs one and is due or concerned by what `changed`.
///
/// The plan looks only at the nodes `index` names (kept from `changed`): those not healthy by their
/// policy's triggers, carrying anything of ours, or named by a remediation. The rest of the fleet
/// only counts, and the index's census holds the counts. While the node cache does not keep every
/// label the policies read, nothing is planned: remediations under way go on.
async fn pass(
    ctx: &Arc<Context>,
    advances: &mut Advances,
    index: &mut fleet::index::NodeIndex,
    first_seen: &mut FirstSeen,
    ledger: &mut act::hardware::Ledger,
    claimants: &mut hardware::claimants::Claimants,
    changed: &Changed,
) -> Passed {
    let now = Timestamp::now();
    let mut next = crate::time::plus(now, crate::time::signed(ctx.settings.resync));

    let policies: Vec<_> = ctx
        .caches
        .policies
        .state()
        .iter()
        .map(|policy| ctx.writer.policy_as_written(policy))
        .collect();
    if !act::node_labels::covered(ctx, &policies).await {
        start_advances(ctx, advances, changed, now, &mut next);
        return Passed { next, planned: false };
    }
    let (announcements, candidates) = plan_and_admit(
        ctx, advances, index, first_seen, claimants, changed, &policies, &mut next,
    )
    .await;
    start_advances(ctx, advances, changed, now, &mut next);
    // Behind the pass: neither a fault's cordon nor the next faults' quarantines wait for the
    // ledger's writes.
    ledger.start(changed, |unstamped| {
        act::hardware::sync(ctx.clone(), policies, candidates, unstamped, now)
    });
    announcements.publish(ctx).await;
    Passed { next, planned: true }
}

/// Plans the fleet and carries out each policy's plan: quarantines, device rules, out-of-service
/// taints, records created and readmitted; lowers `next_due` to when a pass is due for them. With
/// the announcements to publish and the nodes looked at.
#[allow(clippy::too_many_arguments, reason = "the pass's state, lent to its planning")]
async fn plan_and_admit(
    ctx: &Arc<Context>,
    advances: &mut Advances,
    index: &mut fleet::index::NodeIndex,
    first_seen: &mut FirstSeen,
    claimants: &mut hardware::claimants::Claimants,
    changed: &Changed,
    policies: &[Arc<GpuRemediationPolicy>],
    next_due: &mut Timestamp,
) -> (admit::Announcements, Vec<String>) {
    let now = Timestamp::now();
    let error_retry = crate::time::plus(now, crate::time::signed(ctx.settings.error_backoff));
    let mut next = *next_due;
    let remediations = ctx.caches.remediations();
    let candidates = candidates(ctx, index, claimants, policies, &remediations, changed, now);
    let nodes = ctx.caches.nodes_named(&candidates);
    first_seen.observe(nodes.iter().map(AsRef::as_ref), now);
    let mut plan = fleet::plan_with(policies, &index.census(), &nodes, &remediations, first_seen, now);
    // The hardware ledger: each new record names its node's GPUs; repeat offenders skip rungs.
    let failures = hardware::failures(&ctx.caches.hardware_records(), &remediations);
    hardware::amend(
        &mut plan,
        &nodes,
        claimants,
        || ctx.caches.all_nodes(),
        &failures,
        now,
    );
    if let Some(at) = plan.wake_at {
        next = next.min(at);
    }
    // New nodes' validation Jobs are not watched: look again soon while one runs or waits.
    if act::join_validation::polls(policies, || ctx.caches.all_nodes()) {
        next = next.min(crate::time::plus(
            now,
            crate::time::signed(act::join_validation::POLL),
        ));
    }
    // Quarantines first: stopping new placements is what a fresh signal waits for.
    for policy_plan in &mut plan.policies {
        if let Err(error) = act::quarantine::apply(ctx, policy_plan, &candidates).await {
            tracing::warn!(policy = ?policy_plan.policy.metadata.name, %error, "writing a quarantine failed; retrying");
            ctx.metrics.reconcile_error("policy", write::metric_label(&error));
            next = next.min(error_retry);
        }
    }
    if let Err(error) = act::quarantine::lift_orphans(ctx, &plan.orphan_quarantines).await {
        tracing::warn!(%error, "lifting an orphaned quarantine failed; retrying");
        ctx.metrics.reconcile_error("policy", write::metric_label(&error));
        next = next.min(error_retry);
    }
    // Device-level quarantines' rules follow the nodes' annotations written just above.
    if let Err(error) = act::quarantine_device::reconcile(ctx, &candidates).await {
        tracing::warn!(%error, "making the device quarantine rules follow the nodes failed; retrying");
        ctx.metrics.reconcile_error("policy", write::metric_label(&error));
        next = next.min(error_retry);
    }
    // Dead nodes their remediation shut down get the out-of-service taint; returning ones lose it.
    match act::out_of_service::apply(ctx, &remediations, &candidates).await {
        Ok(Some(confirmed_at)) => next = next.min(confirmed_at),
        Ok(None) => {}
        Err(error) => {
            tracing::warn!(%error, "writing an out-of-service taint failed; retrying");
            ctx.metrics.reconcile_error("policy", write::metric_label(&error));
            next = next.min(error_retry);
        }
    }
    let mut announcements = admit::Announcements::default();
    for policy_plan in plan.policies {
        let policy = policy_plan.policy.metadata.name.clone().unwrap_or_default();
        // Each record's cordon starts as soon as the record exists.
        let mut created = |record: Arc<GpuRemediation>| advances.start(ctx, record.name_any(), record);
        match admit::apply(ctx, policy_plan, first_seen, &mut announcements, &mut created).await {
            Ok(Some(counts_held_until)) => next = next.min(counts_held_until),
            Ok(None) => {}
            Err(error) => {
                tracing::warn!(%policy, error = %error, "carrying out the policy's plan failed; retrying");
                ctx.metrics.reconcile_error("policy", write::metric_label(&error));
                next = next.min(error_retry);
            }
        }
    }
    *next_due = next;
    (announcements, candidates)
}

/// Starts an advance for every remediation that needs one and is due or concerned by `changed`;
/// lowers `next` to when the next one is due.
fn start_advances(
    ctx: &Arc<Context>,
    advances: &mut Advances,
    changed: &Changed,
    now: Timestamp,
    next: &mut Timestamp,
) {
    let mut pending: Vec<Arc<GpuRemediation>> = ctx
        .caches
        .remediations()
        .into_iter()
        .filter(|r| remediation::needs_attention(r))
        .collect();
    advances.forget_all_but(&pending);
    // Starting remediations first: their cordon is what a fault waits for.
    pending.sort_by_cached_key(|r| !is_starting(ctx.progress.phase(r)));
    for remediation in pending {
        let name = remediation.name_any();
        if advances.is_running(&name) {
            continue;
        }
        // Blockers held with the drain's progress (see `progress`) count as written.
        let concerned = ctx
            .progress
            .with_status(&remediation, |status| concerns(changed, &remediation, status));
        match advances.due(&name) {
            Due::Now => advances.start(ctx, name, remediation),
            Due::At(at) if concerned || at <= now => advances.start(ctx, name, remediation),
            Due::At(at) => *next = (*next).min(at),
            Due::OnChange if concerned => advances.start(ctx, name, remediation),
            Due::OnChange => {}
        }
    }
}

/// Whether what `changed` may give `remediation` something to do. A node's change matters to the
/// remediation of that node only. A budget's change (its room, its healthy count) matters to the
/// remediations whose evictions it refuses or holds, and to dry runs, which report the budgets
/// that would refuse; anything else may matter to all. Waking every draining remediation on every
/// node or budget change would list each draining node's pods after every status report or
/// eviction anywhere in the cluster.
fn concerns(changed: &Changed, remediation: &GpuRemediation, status: Option<&GpuRemediationStatus>) -> bool {
    if changed.anything || changed.nodes.contains(&remediation.spec.node_name) {
        return true;
    }
    if changed.budgets.is_empty() {
        return false;
    }
    if remediation.spec.mode == Mode::DryRun {
        return true;
    }
    status.and_then(|s| s.drain.as_ref()).is_some_and(|drain| {
        drain
            .blockers
            .iter()
            .filter_map(|b| b.pdb.as_deref())
            .flat_map(|named| named.split(','))
            .any(|budget| changed.budgets.contains(budget))
    })
}

/// Whether the remediation's next step is the cordon (or before it): it advances in the
/// starting lane.
fn is_starting(phase: Phase) -> bool {
    matches!(phase, Phase::Pending | Phase::AwaitingApproval)
}

/// When a remediation wants its next advance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Due {
    /// Never advanced by this replica, or something it watches changed while it ran.
    Now,
    /// At this time, or on the next look at all.
    At(Timestamp),
    /// On the next look at all.
    OnChange,
}

/// The advances under way (at most one per remediation), the lanes they run in, and when each
/// remediation wants its next one.
struct Advances {
    /// The running advances.
    running: JoinSet<Result<Next, AdvanceRemediationError>>,
    /// Which remediation each running task advances.
    names: HashMap<tokio::task::Id, String>,
    /// Remediations with an advance running.
    in_flight: HashSet<String>,
    /// Running ones a watch event came for: they are due again as soon as they end.
    touched: HashSet<String>,
    /// When each remediation that has been advanced wants the next advance.
    due: HashMap<String, Due>,
    /// How many advances of each remediation failed in a row: the next is backed off
    /// exponentially with jitter from `error_backoff` (see `retry::backoff`).
    failures: HashMap<String, u32>,
    /// The lanes they run in: starting (up to the cordon) first, then carrying (see `lanes`).
    lanes: Lanes,
}

impl Advances {
    fn new(settings: &Settings) -> Self {
        Self {
            running: JoinSet::new(),
            names: HashMap::new(),
            in_flight: HashSet::new(),
            touched: HashSet::new(),
            due: HashMap::new(),
            failures: HashMap::new(),
            lanes: Lanes::new(settings.starting_concurrency, settings.remediation_concurrency),
        }
    }

    fn is_running(&self, name: &str) -> bool {
        self.in_flight.contains(name)
    }

    fn due(&self, name: &str) -> Due {
        self.due.get(name).copied().unwrap_or(Due::Now)
    }

    /// Forgets the due times of remediations no longer needing attention (finished or gone).
    fn forget_all_but(&mut self, pending: &[Arc<GpuRemediation>]) {
        let names: HashSet<String> = pending.iter().map(|r| r.name_any()).collect();
        self.due.retain(|name, _| names.contains(name));
        self.failures.retain(|name, _| names.contains(name));
    }

    /// Starts an advance of `remediation` in its lane.
    fn start(&mut self, ctx: &Arc<Context>, name: String, remediation: Arc<GpuRemediation>) {
        // A cordon held for the drain's first write (see `progress`) has done its step.
        let lane = if is_starting(ctx.progress.phase(&remediation)) {
            Lane::Starting
        } else {
            Lane::Carrying
        };
        // Entered now, before the task runs: a carrying advance spawned next already yields to it.
        let ticket = self.lanes.enter(lane);
        let ctx = ctx.clone();
        let task = self.running.spawn(async move {
            let _turn = ticket.turn().await;
            remediation::advance_in_span(&ctx, remediation).await
        });
        self.names.insert(task.id(), name.clone());
        self.due.remove(&name);
        self.in_flight.insert(name);
    }

    /// A watch event came: whatever is running and concerned by the change may have acted on a
    /// view that is now stale.
    fn touch_running(&mut self, ctx: &Context, changed: &Changed) {
        if self.in_flight.is_empty() {
            return;
        }
        if changed.anything {
            self.touched.extend(self.in_flight.iter().cloned());
            return;
        }
        for remediation in ctx.caches.remediations() {
            let name = remediation.name_any();
            if self.in_flight.contains(&name)
                && ctx
                    .progress
                    .with_status(&remediation, |status| concerns(changed, &remediation, status))
            {
                self.touched.insert(name);
            }
        }
    }

    /// Records how an advance ended.
    fn ended(
        &mut self,
        ctx: &Context,
        joined: Result<(tokio::task::Id, Result<Next, AdvanceRemediationError>), JoinError>,
    ) {
        let (id, result) = match joined {
            Ok((id, result)) => (id, Ok(result)),
            Err(error) => (error.id(), Err(error)),
        };
        let Some(name) = self.names.remove(&id) else {
            return;
        };
        self.in_flight.remove(&name);
        let failed = !matches!(result, Ok(Ok(_)));
        let failures = if failed {
            let count = self.failures.entry(name.clone()).or_default();
            *count = count.saturating_add(1);
            *count
        } else {
            self.failures.remove(&name);
            0
        };
        let wait = crate::retry::backoff(ctx.settings.error_backoff, crate::retry::CAP, failures, &name);
        let retry = crate::time::plus(Timestamp::now(), crate::time::signed(wait));
        let due = match result {
            Ok(Ok(Next::Idle)) => Due::OnChange,
            Ok(Ok(Next::At(at))) => Due::At(at),
            Ok(Err(error)) => {
                tracing::warn!(remediation = %name, error = %error, failures, ?wait, "advancing the remediation failed; retrying after a backoff");
                ctx.metrics
                    .reconcile_error("remediation", write::metric_label(&error));
                Due::At(retry)
            }
            Err(error) => {
                tracing::error!(remediation = %name, %error, "advancing the remediation panicked; retrying");
                ctx.metrics.reconcile_error("remediation", "internal");
                Due::At(retry)
            }
        };
        let due = if self.touched.remove(&name) { Due::Now } else { due };
        self.due.insert(name, due);
    }

    /// Lets the running advances end (within [`SHUTDOWN_GRACE`]), then abandons the rest.
    async fn wind_down(&mut self, ctx: &Context) {
        let all_ended = async {
            while let Some(joined) = self.running.join_next_with_id().await {
                self.ended(ctx, joined);
            }
        };
        if tokio::time::timeout(SHUTDOWN_GRACE, all_ended).await.is_err() {
            tracing::warn!(
                still_running = self.in_flight.len(),
                "advances still running at shutdown were cut short"
            );
            self.running.abort_all();
            // Aborted tasks end at their next await; wait for that, so that nothing of ours is
            // still running when the caller releases the Lease.
            while let Some(joined) = self.running.join_next_with_id().await {
                self.ended(ctx, joined);
            }
        }
    }
}

/// Brings the node index and `claimants` up to date with `changed`, and names the nodes the pass
/// plans over (see [`fleet::index`]).
fn candidates(
    ctx: &Context,
    index: &mut fleet::index::NodeIndex,
    claimants: &mut hardware::claimants::Claimants,
    policies: &[Arc<GpuRemediationPolicy>],
    remediations: &[Arc<GpuRemediation>],
    changed: &Changed,
    now: Timestamp,
) -> Vec<String> {
    let node_changes = if changed.every_node() {
        fleet::index::NodeChanges::Everything
    } else {
        fleet::index::NodeChanges::Nodes(&changed.nodes)
    };
    index.refresh(
        policies,
        node_changes,
        now,
        |name| ctx.caches.node(name),
        || ctx.caches.all_nodes(),
    );
    let written = ctx.caches.written_node_names();
    refresh_claimants(ctx, claimants, changed, &written);
    index
        .candidates(remediations, &written)
        .into_iter()
        .map(str::to_owned)
        .collect()
}

/// Brings `claimants` (which node lists each serial, for the ledger's conflict check) up to date
/// with the nodes that changed and those we wrote: built afresh when the node watch listed afresh
/// (a node may have changed unseen) or stale claims have grown it (`Claimants::stale`); not at the
/// resync, which it does not need (a stale claim costs a walk, never hides a claimant) and which
/// would pay the rebuild every minute (190-270 ms at 50,000 nodes, `pass_cost_tests`).
fn refresh_claimants(
    ctx: &Context,
    claimants: &mut hardware::claimants::Claimants,
    changed: &Changed,
    written: &[String],
) {
    if changed.nodes_listed || claimants.stale() {
        *claimants = hardware::claimants::Claimants::of(&ctx.caches.all_nodes());
        return;
    }
    for node in changed
        .nodes
        .iter()
        .chain(written)
        .filter_map(|name| ctx.caches.node(name))
    {
        claimants.note(&node);
    }
}

/// How long to sleep until `next`, at most `resync`.
fn until(next: Timestamp, resync: Duration) -> Duration {
    let wait = next.duration_since(Timestamp::now());
    Duration::try_from(wait).unwrap_or(Duration::ZERO).min(resync)
}

#[cfg(test)]
#[path = "controller_tests.rs"]
mod tests;
