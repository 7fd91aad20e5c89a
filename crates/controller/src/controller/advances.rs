//! The advances under way: at most one per remediation, each a task of its own in its lane
//! (`lanes`), when each remediation wants its next one, and whether a watch event concerns it.
//! The loop (`controller`) starts them after each pass and records how they end.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use gpu_remediation_api::{GpuRemediation, GpuRemediationStatus, Phase, policy::Mode};
use jiff::Timestamp;
use kube::ResourceExt as _;
use tokio::task::{JoinError, JoinSet};

use crate::{
    act::remediation::{self, AdvanceRemediationError, Next},
    context::{Context, Settings},
    lanes::{Lane, Lanes},
    observe::Changed,
    write,
};

/// How long a stopping controller waits for the advances under way to end. An advance cut short
/// can leave an eviction half done on the API server (its PDB charged, the pod not deleted, until
/// the disruption controller gives the charge back two minutes later), so they are let finish.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Starts an advance for every remediation that needs one and is due or concerned by `changed`;
/// lowers `next` to when the next one is due.
pub(super) fn start_advances(
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
pub(super) struct Advances {
    /// The running advances.
    pub(super) running: JoinSet<Result<Next, AdvanceRemediationError>>,
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
    pub(super) fn new(settings: &Settings) -> Self {
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
    pub(super) fn start(&mut self, ctx: &Arc<Context>, name: String, remediation: Arc<GpuRemediation>) {
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
    pub(super) fn touch_running(&mut self, ctx: &Context, changed: &Changed) {
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
    pub(super) fn ended(
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
    pub(super) async fn wind_down(&mut self, ctx: &Context) {
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

#[cfg(test)]
#[path = "advances_tests.rs"]
mod tests;
