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

use std::{future::Future, sync::Arc, time::Duration};

use gpu_remediation_api::{GpuRemediation, GpuRemediationPolicy};
use jiff::Timestamp;
use kube::{ResourceExt as _, runtime::events::Reporter};
use tokio::{sync::Notify, task::JoinSet};

mod advances;

use crate::{
    act::{self, admit},
    context::{Context, Settings},
    first_seen::FirstSeen,
    fleet, hardware,
    leader::Fence,
    observe::{Caches, Changed, StartCachesError, Undecodable, overlay::Overlays},
    telemetry::{Health, Metrics},
    write::{self, Writer},
};
use advances::{Advances, start_advances};

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
        Overlays::default(),
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
