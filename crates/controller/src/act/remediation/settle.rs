//! Carries out a remediation's settlement: the node's release, the status write (or its hold, see
//! `progress`), the Events, the finalizer, and the metrics of a phase change. The decision was made
//! in `lifecycle`; what to ask the server before it is in the parent module.

use std::{sync::Arc, time::Duration};

use gpu_remediation_api::{
    GpuRemediation, GpuRemediationStatus, Phase,
    constants::{REMEDIATION_FINALIZER, reasons},
};
use jiff::Timestamp;
use kube::{ResourceExt, runtime::events::EventType};

use super::AdvanceRemediationError;
use crate::{
    context::Context,
    lifecycle::{self, Note, Release, Settlement},
    progress::{self, Verdict},
};

/// A settlement carried out: the record as it now stands (with a held status laid over it), and
/// until when its status is held back.
pub(super) struct Settled {
    pub(super) remediation: Arc<GpuRemediation>,
    pub(super) hold_until: Option<Timestamp>,
}

/// Carries out a settlement: release, status, Events, finalizer, metrics. `written` is the status
/// the server has.
pub(super) async fn settle(
    ctx: &Context,
    remediation: &Arc<GpuRemediation>,
    written: Option<&GpuRemediationStatus>,
    settlement: Settlement,
    passing: bool,
) -> Result<Settled, AdvanceRemediationError> {
    let name = remediation.name_any();
    let mut cordon_kept = None;
    if let Some(Release {
        node,
        remember_cancel,
    }) = &settlement.release
    {
        let (_, kept_for) = ctx
            .writer
            .release_node(
                node,
                ctx.caches.node(&node.name).as_deref(),
                &name,
                &remediation.spec.policy_name,
                *remember_cancel,
            )
            .await?;
        cordon_kept = kept_for.map(|manager| {
            Note::new(
                reasons::CORDON_KEPT,
                EventType::Normal,
                &format!(
                    "node {}: its cordon was laid again by {manager} after ours and stays theirs; \
                     our note and taint are gone",
                    node.name
                ),
            )
        });
    }
    let before = remediation.status.as_ref().map(|s| s.phase).unwrap_or_default();
    let after = settlement.status.phase;
    let measured = remediation.status.as_ref().and_then(|s| s.leaked_pods).is_none();
    let cost_before = drain_cost(remediation.status.as_ref());
    let (updated, hold_until, notes) = write_if_changed(
        ctx,
        remediation,
        written,
        settlement.status,
        settlement.notes,
        passing,
    )
    .await?;
    if let Some(leaked) = updated.status.as_ref().and_then(|s| s.leaked_pods)
        && measured
    {
        ctx.metrics.leaked_pods(&remediation.spec.policy_name, leaked);
    }
    let cost = drain_cost(updated.status.as_ref()).saturating_sub(cost_before);
    if cost > 0 {
        ctx.metrics.drain_gpu_seconds(&remediation.spec.policy_name, cost);
    }
    if after.is_terminal() {
        ctx.progress.forget(&name);
    }
    report_steps(ctx, remediation, updated.status.as_ref());
    if before != after {
        report_phase_change(ctx, remediation, before, after);
        if let Some(status) = &updated.status {
            report_recovery(ctx, remediation, status);
        }
    }
    // A phase change's Events are told under the phase entered (the kube recorder aggregates
    // Events by action and reason: under one action, a later phase change would only count up the
    // first one's series, and its words would be lost).
    let action = if before == after {
        "Remediate".to_owned()
    } else {
        after.to_string()
    };
    for note in notes.iter().chain(&cordon_kept) {
        ctx.writer.publish(updated.as_ref(), note.event(&action)).await;
    }
    if settlement.drop_finalizer {
        drop_finalizer(ctx, &updated).await?;
    }
    Ok(Settled {
        remediation: updated,
        hold_until,
    })
}

/// Metrics for a phase change: the time spent in the phase left, the cordon's latency from the
/// trigger, and the outcome of a finished remediation.
fn report_phase_change(ctx: &Context, remediation: &GpuRemediation, before: Phase, after: Phase) {
    let policy = &remediation.spec.policy_name;
    let now = Timestamp::now();
    let since = |t: Timestamp| Duration::try_from(now.duration_since(t)).unwrap_or_default();
    let entered_before = remediation
        .status
        .as_ref()
        .and_then(|s| lifecycle::status::phase_entered(s, before))
        .or_else(|| remediation.creation_timestamp().map(|t| t.0));
    if let Some(entered) = entered_before {
        ctx.metrics.phase_finished(policy, before, since(entered));
    }
    if after == Phase::Cordoned
        && let Some(triggered) = &remediation.spec.trigger.since
    {
        ctx.metrics.detected_to_cordoned(policy, since(triggered.0));
    }
    if after.is_terminal() {
        ctx.metrics
            .remediation_finished(policy, remediation.spec.action, after);
    }
}

/// Metrics for the ladder steps the status just written ended, and for a ladder recycle that
/// just finished (whether it needed a replacement).
fn report_steps(ctx: &Context, remediation: &GpuRemediation, written: Option<&GpuRemediationStatus>) {
    let Some(after) = written else { return };
    let before = remediation.status.as_ref();
    let policy = &remediation.spec.policy_name;
    for step in lifecycle::ladder::newly_ended(before, after) {
        if let (Some(end), Some(outcome)) = (&step.end, step.outcome) {
            let took = Duration::try_from(end.0.duration_since(step.start.0)).unwrap_or_default();
            ctx.metrics.step_finished(policy, step.step, outcome, took);
        }
    }
    let finished = |s: Option<&GpuRemediationStatus>| {
        s.is_some_and(|s| matches!(s.phase, Phase::Succeeded | Phase::Failed | Phase::ManualRequired))
    };
    if !after.steps.is_empty() && finished(Some(after)) && !finished(before) {
        ctx.metrics
            .recycle_finished(policy, lifecycle::ladder::replaced(after));
    }
}

/// The time to recovery of a remediation that just succeeded, as its status records it.
fn report_recovery(ctx: &Context, remediation: &GpuRemediation, status: &GpuRemediationStatus) {
    if let Some(seconds) = status.time_to_recovery_seconds {
        ctx.metrics.time_to_recovery(
            &remediation.spec.policy_name,
            status.phase,
            Duration::from_secs(seconds),
        );
    }
}

async fn drop_finalizer(ctx: &Context, remediation: &GpuRemediation) -> Result<(), AdvanceRemediationError> {
    if !remediation
        .finalizers()
        .iter()
        .any(|f| f == REMEDIATION_FINALIZER)
    {
        return Ok(());
    }
    ctx.writer.drop_finalizer(remediation).await?;
    Ok(())
}

/// Writes `status` unless the server has it or it is held (see `progress`); returns the record as
/// it now stands, until when its status is held, and the Events to publish now (`notes`, with those
/// of a held phase change this write carries folded in; none while a phase change is held).
/// `passing`: the next step of this advance follows at once, and its write carries this status
/// and its Events.
async fn write_if_changed(
    ctx: &Context,
    remediation: &Arc<GpuRemediation>,
    written: Option<&GpuRemediationStatus>,
    status: GpuRemediationStatus,
    notes: Vec<lifecycle::Note>,
    passing: bool,
) -> Result<(Arc<GpuRemediation>, Option<Timestamp>, Vec<lifecycle::Note>), AdvanceRemediationError> {
    let name = remediation.name_any();
    let now = Timestamp::now();
    let with_status = |status: GpuRemediationStatus| {
        let mut kept = (**remediation).clone();
        kept.status = Some(status);
        Arc::new(kept)
    };
    let verdict = match progress::verdict(written, ctx.progress.written_at(&name), &status, now) {
        Verdict::Write | Verdict::HoldUntil(_) if passing => {
            // Held with every Event it calls for: the next step's write publishes them, folded.
            ctx.progress.hold(
                &name,
                remediation.resource_version(),
                written.cloned(),
                status.clone(),
                notes,
            );
            return Ok((with_status(status), Some(now), Vec::new()));
        }
        verdict => verdict,
    };
    match verdict {
        Verdict::Unchanged => {
            let earlier = ctx.progress.release(&name);
            Ok((with_status(status), None, progress::fold(earlier, notes)))
        }
        Verdict::HoldUntil(due) => {
            let phase_change = progress::cordon_entered(written, &status).is_some();
            let (held, now_notes) = if phase_change {
                (notes, Vec::new())
            } else {
                (Vec::new(), notes)
            };
            ctx.progress.hold(
                &name,
                remediation.resource_version(),
                written.cloned(),
                status.clone(),
                held,
            );
            Ok((with_status(status), Some(due), now_notes))
        }
        Verdict::Write => {
            let updated = ctx.writer.write_remediation_status(remediation, &status).await?;
            let earlier = ctx.progress.wrote(&name, now);
            Ok((Arc::new(updated), None, progress::fold(earlier, notes)))
        }
    }
}

#[cfg(test)]
#[path = "settle_tests.rs"]
mod tests;

/// The GPU-seconds `status`'s drain has cost so far.
fn drain_cost(status: Option<&GpuRemediationStatus>) -> u64 {
    status.and_then(|s| s.drain.as_ref()).map_or(0, |d| d.gpu_seconds)
}
