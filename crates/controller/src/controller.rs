//! The loop: observe → plan → act → report, one pass at a time, woken by a relevant watch event,
//! by the earliest time a decision asked to be made again (a trigger's `for` elapsing, a rate
//! slot freeing, a drain timeout, a pod poll), or by the resync period.
//!
//! A pass runs only while this replica's leader claim is current; a follower keeps its caches
//! warm and waits. Passes are level-triggered from the API server's state, so a pass that fails
//! halfway is simply made again.

use std::{future::Future, sync::Arc, time::Duration};

use futures::{StreamExt, stream};
use jiff::Timestamp;
use kube::runtime::events::Reporter;
use tokio::sync::Notify;

use crate::{
    admit,
    context::{Context, Settings},
    fleet,
    kubeops::KubeOps,
    leader::Fence,
    observe::{Caches, StartCachesError},
    remediation::{self, Next},
    telemetry::{Health, Metrics},
};

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
    let ops = KubeOps::new(&config, fence.clone(), reporter).map_err(RunControllerError::Client)?;
    let wake = Arc::new(Notify::new());
    let caches = Caches::start(ops.client(), settings.policy_selector.as_deref(), wake.clone()).await?;
    if let Some(health) = &telemetry.health {
        health.mark_caches_synced();
    }
    let ctx = Context::new(settings, ops, caches, telemetry.metrics);
    tracing::info!(policy_selector = ?ctx.settings.policy_selector, "caches ready; controller running");
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            () = fence.acquired() => {}
            () = &mut shutdown => return Ok(()),
        }
        let next = pass(&ctx).await;
        let sleep = until(next, ctx.settings.resync);
        tokio::select! {
            () = wake.notified() => {}
            () = tokio::time::sleep(sleep) => {}
            () = fence.lost() => tracing::warn!("leader claim lost: acting stops until it is current again"),
            () = &mut shutdown => return Ok(()),
        }
    }
}

/// One pass over the fleet. Returns when the next pass is due at the latest.
pub async fn pass(ctx: &Context) -> Timestamp {
    let now = Timestamp::now();
    let error_retry = crate::time::plus(now, crate::time::signed(ctx.settings.error_backoff));
    let mut next = crate::time::plus(now, crate::time::signed(ctx.settings.resync));

    let policies = ctx.caches.policies.state();
    let plan = fleet::plan(
        &policies,
        &ctx.caches.all_nodes(),
        &ctx.caches.remediations(),
        now,
    );
    if let Some(at) = plan.wake_at {
        next = next.min(at);
    }
    for policy_plan in plan.policies {
        let policy = policy_plan.policy.metadata.name.clone().unwrap_or_default();
        if let Err(error) = admit::apply(ctx, policy_plan).await {
            tracing::warn!(%policy, error = %error, "carrying out the policy's plan failed; retrying");
            ctx.metrics.reconcile_error("policy");
            next = next.min(error_retry);
        }
    }

    let pending: Vec<_> = ctx
        .caches
        .remediations()
        .into_iter()
        .filter(|r| remediation::needs_attention(r))
        .collect();
    // Futures built before they enter the stream (see `remediation::evict_all`).
    let advances: Vec<_> = pending.into_iter().map(|r| advance_named(ctx, r)).collect();
    let results: Vec<_> = stream::iter(advances)
        .buffer_unordered(ctx.settings.remediation_concurrency.max(1))
        .collect()
        .await;
    for (name, result) in results {
        match result {
            Ok(Next::Idle) => {}
            Ok(Next::At(at)) => next = next.min(at),
            Err(error) => {
                tracing::warn!(remediation = %name, error = %error, "advancing the remediation failed; retrying");
                ctx.metrics.reconcile_error("remediation");
                next = next.min(error_retry);
            }
        }
    }
    next
}

async fn advance_named(
    ctx: &Context,
    remediation: Arc<gpu_remediation_api::GpuRemediation>,
) -> (String, Result<Next, remediation::AdvanceRemediationError>) {
    let name = remediation.metadata.name.clone().unwrap_or_default();
    (name, remediation::advance(ctx, remediation).await)
}

/// How long to sleep until `next`, at most `resync`.
fn until(next: Timestamp, resync: Duration) -> Duration {
    let wait = next.duration_since(Timestamp::now());
    Duration::try_from(wait).unwrap_or(Duration::ZERO).min(resync)
}
