//! Carries out the ledger's writes, each behind the leader fence: the first-seen stamps of the
//! serials newly listed in a node's inventory (`trust`), the `GpuHardwareRecord`s that
//! gain a failure (created, or replaced with the read's resourceVersion), the records past their
//! retention (deleted), one `RepeatOffender` Event per remediation sent to the last rung, and the
//! node steps of `join` (label, cordon and lifting the unchecked taint over one version of the node (`Writer::edit_node`), the
//! `GpuRepeatOffender` condition by server-side apply of the node's status, an Event), then new
//! nodes' validation (`act::join_validation`).
//!
//! A write that fails (a conflict, the record's watch behind) is made again on the next pass: the
//! decisions are recomputed from the caches each time, so nothing is lost and nothing doubles.
//!
//! The writes run behind the pass ([`Ledger`]), one sync at a time: a pass that waited for them
//! planned the next faults only after the last record was written (at 1,000 nodes, ten records
//! written one after the other held a hundred faults' first quarantine for 618 ms).

use std::{collections::BTreeSet, future::Future, sync::Arc};

use tokio::task::JoinSet;

use gpu_remediation_api::{
    GpuHardwareRecord, GpuRemediation, GpuRemediationPolicy,
    constants::{node_conditions, reasons},
    hardware::RepeatOffence,
};
use jiff::Timestamp;
use k8s_openapi::{api::core::v1::Node, apimachinery::pkg::apis::meta::v1::Time};
use kube::{ResourceExt, api::DeleteParams, runtime::events::EventType};
use serde_json::json;

use crate::hardware::{
    history::{self, describe},
    join::{self, JoinStep},
    trust,
};
use crate::{
    context::Context,
    lifecycle::{NodeRef, Note},
    observe::{Changed, NodeView},
    read::Scope,
    write::{DeleteStampedError, WriteError},
};

/// The ledger's sync running behind the pass: at most one at a time, so two never write the same
/// record at once, and a pass that finds one under way leaves its own to the pass the sync's end
/// owes it (see [`Ledger::owed_pass`]).
#[derive(Debug, Default)]
pub struct Ledger {
    /// The sync under way, or ended and not yet reaped (aborted if the controller stops: a record
    /// write cut short is recomputed by the next leader).
    running: JoinSet<()>,
    /// Whether a pass found a sync under way and did not start its own.
    owed: bool,
    /// The nodes whose inventory may have changed since the last sync started: their first-seen
    /// stamps are due (kept over a pass whose sync did not start).
    unstamped: Unstamped,
}

/// The nodes whose first-seen stamps a sync checks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Unstamped {
    /// Every node (the node watch listed afresh, or the loop resynced).
    pub all: bool,
    /// These nodes, by name.
    pub nodes: BTreeSet<String>,
}

impl Ledger {
    /// Starts the sync `sync` builds (a [`sync`] over the pass's view, given the nodes whose
    /// stamps are due, `changed`'s among them), unless a sync is under way: then nothing starts,
    /// `changed`'s nodes wait for the next sync, and the pass the one under way owes at its end
    /// starts it.
    pub fn start<F>(&mut self, changed: &Changed, sync: impl FnOnce(Unstamped) -> F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.unstamped.all |= changed.every_node();
        if !self.unstamped.all {
            self.unstamped.nodes.extend(changed.nodes.iter().cloned());
        }
        while let Some(ended) = self.running.try_join_next() {
            report_end(ended);
        }
        if !self.running.is_empty() {
            self.owed = true;
            return;
        }
        self.owed = false;
        self.running.spawn(sync(std::mem::take(&mut self.unstamped)));
    }

    /// Resolves when a pass is owed: a pass left its sync to the one under way, and that one ended.
    /// Never resolves otherwise, so a sync's end wakes no pass nobody asked for.
    pub async fn owed_pass(&mut self) {
        if !self.owed {
            return std::future::pending().await;
        }
        while let Some(ended) = self.running.join_next().await {
            report_end(ended);
        }
    }
}

/// Logs a sync that panicked (its writes are made again by the next sync).
fn report_end(ended: Result<(), tokio::task::JoinError>) {
    if let Err(error) = ended
        && error.is_panic()
    {
        tracing::error!(%error, "the hardware ledger's sync panicked; the next pass syncs again");
    }
}

/// Brings the records up to date with every remediation on record, forgets expired records, and
/// carries out the join steps. Failures are logged and retried on the next pass. `looked_at` names
/// the nodes the pass looked at: every node flagged or tainted by the ledger is among them, and the
/// whole fleet is read only when a node may have to be flagged (`join::needs_every_node`). Takes
/// what it reads, to run behind the pass ([`Ledger::start`]).
pub async fn sync(
    ctx: Arc<Context>,
    policies: Vec<Arc<GpuRemediationPolicy>>,
    looked_at: Vec<String>,
    unstamped: Unstamped,
    now: Timestamp,
) {
    let (ctx, policies, looked_at) = (&*ctx, policies.as_slice(), looked_at.as_slice());
    stamp_first_seen(ctx, &unstamped, now).await;
    // With the last sync's writes the watch has not shown yet: a record is not created twice.
    let records = ctx.caches.hardware_records();
    let remediations = ctx.caches.remediations();
    for record in history::records_to_write(&records, &remediations) {
        let name = record.name_any();
        let before = records.iter().find(|r| r.name_any() == name);
        match write_record(ctx, &record, before.is_some()).await {
            Ok(written) => {
                announce_offences(ctx, before.map(AsRef::as_ref), &written, &remediations).await;
            }
            Err(error) => {
                tracing::info!(record = %name, %error, "writing a hardware record failed; next pass retries");
            }
        }
    }
    for name in history::records_to_forget(&records, now) {
        match delete_record(ctx, &name).await {
            Ok(()) => ctx.writer.overlays().hardware_records.forget(&name),
            Err(error) => {
                tracing::warn!(record = %name, %error, "deleting an expired hardware record failed");
            }
        }
    }
    let failures = history::failures(&records, &remediations);
    let nodes = if join::needs_every_node(policies, &failures) {
        ctx.caches.all_nodes()
    } else {
        ctx.caches.nodes_named(looked_at)
    };
    for step in join::steps(policies, &nodes, &remediations, &failures, now) {
        if let Err(error) = carry_out(ctx, &step, now).await {
            tracing::warn!(?step, %error, "a hardware check of a node failed; next pass retries");
        }
    }
    // New nodes' validation, after the hardware check: a node flagged at join is held either way.
    super::join_validation::sync(ctx, policies, now).await;
}

/// Stamps when each serial newly listed in a node's inventory was first seen (whole seconds, like
/// the trigger's `since` it is compared with), on the nodes of `unstamped`.
async fn stamp_first_seen(ctx: &Context, unstamped: &Unstamped, now: Timestamp) {
    let now = Timestamp::from_second(now.as_second()).unwrap_or(now);
    let nodes = if unstamped.all {
        ctx.caches.all_nodes()
    } else {
        let names: Vec<String> = unstamped.nodes.iter().cloned().collect();
        ctx.caches.nodes_named(&names)
    };
    for node in nodes.iter().filter(|n| n.deleting().is_none()) {
        if trust::first_seen_update(node, now).is_none() {
            continue;
        }
        let name = node.node_name().to_owned();
        let target = node_ref(&name, node.node_uid());
        // Over the node as read, too: a serial listed since is stamped, one stamped kept.
        let stamp = |n: &mut Node| {
            trust::first_seen_update(n, now).is_some_and(|stamps| trust::stamp_first_seen(n, &stamps))
        };
        if let Err(error) = ctx.writer.edit_node(&target, Some(node), stamp).await {
            tracing::info!(node = %name, %error, "stamping the node's GPUs as first seen failed; next pass retries");
        }
    }
}

/// One Event for each remediation sent to the last rung whose failure `written` newly holds.
async fn announce_offences(
    ctx: &Context,
    before: Option<&GpuHardwareRecord>,
    written: &GpuHardwareRecord,
    remediations: &[Arc<GpuRemediation>],
) {
    let known: BTreeSet<&str> = before
        .into_iter()
        .flat_map(|r| r.spec.failures.iter().map(|f| f.remediation.as_str()))
        .collect();
    for failure in written
        .spec
        .failures
        .iter()
        .filter(|f| !known.contains(f.remediation.as_str()))
    {
        let Some(remediation) = remediations.iter().find(|r| r.name_any() == failure.remediation) else {
            continue;
        };
        let Some(offence) = remediation
            .spec
            .hardware
            .as_ref()
            .and_then(|h| h.repeat_offender.as_ref())
        else {
            continue;
        };
        // A remediation names its offence once: on the record of the offending hardware.
        if offence.id != written.spec.id || offence.kind != written.spec.kind {
            continue;
        }
        let note = format!(
            "{}: remediation {} goes straight to {:?}",
            describe(offence),
            failure.remediation,
            offence.action
        );
        tracing::info!(remediation = %failure.remediation, "{note}");
        let event = Note::new(reasons::REPEAT_OFFENDER, EventType::Warning, &note).event("Admit");
        ctx.writer.publish(remediation.as_ref(), event).await;
    }
}

/// Creates or replaces a record (the replace carries the cached resourceVersion: a conflict waits
/// for the next pass).
async fn write_record(
    ctx: &Context,
    record: &GpuHardwareRecord,
    exists: bool,
) -> Result<GpuHardwareRecord, WriteError> {
    let mut record = record.clone();
    record.managed_fields_mut().clear();
    if exists {
        ctx.writer.replace(&(), &record).await
    } else {
        ctx.writer.create(&(), &record).await
    }
}

async fn delete_record(ctx: &Context, name: &str) -> Result<(), WriteError> {
    // The claim stamped first, the delete preconditioned on it (the fence policy's delete rule).
    match ctx
        .writer
        .delete_stamped::<GpuHardwareRecord>(&(), Scope::Cluster, name, None, &DeleteParams::default())
        .await
    {
        // Kept conflicting: the next pass tries again (the record is still past its retention).
        Ok(_) | Err(DeleteStampedError::KeptConflicting) => Ok(()),
        Err(DeleteStampedError::Write(error)) => Err(error),
    }
}

/// Why a node step failed.
#[derive(Debug, thiserror::Error)]
enum StepError {
    #[error(transparent)]
    Edit(#[from] crate::write::EditNodeError),
    #[error(transparent)]
    Write(#[from] WriteError),
}

async fn carry_out(ctx: &Context, step: &JoinStep, now: Timestamp) -> Result<(), StepError> {
    match step {
        JoinStep::Lift { node, uid } => {
            ctx.writer
                .edit_node(
                    &node_ref(node, uid.as_deref()),
                    ctx.caches.node(node).as_deref(),
                    join::lift,
                )
                .await?;
            tracing::info!(%node, "node's GPUs checked against the hardware records: none past its limit");
        }
        JoinStep::Flag {
            node,
            uid,
            offence,
            cordon,
            withheld,
        } => {
            let cordon = *cordon;
            ctx.writer
                .edit_node(
                    &node_ref(node, uid.as_deref()),
                    ctx.caches.node(node).as_deref(),
                    |n| join::flag(n, cordon),
                )
                .await?;
            let message = format!(
                "{}{}",
                describe(offence),
                match (cordon, withheld) {
                    (true, _) => "; cordoned (safety.repeatOffender.cordonOnJoin)".to_owned(),
                    (false, Some(why)) => format!("; {why}"),
                    (false, None) => String::new(),
                }
            );
            write_condition(ctx, node, true, &message, now).await?;
            let reason = if withheld.is_some() {
                reasons::JOIN_CORDON_LIMITED
            } else {
                reasons::REPEAT_OFFENDER
            };
            announce_node(ctx, node, uid.as_deref(), offence, reason, &message).await;
        }
        JoinStep::Unflag { node, uid } => {
            ctx.writer
                .edit_node(
                    &node_ref(node, uid.as_deref()),
                    ctx.caches.node(node).as_deref(),
                    join::unflag,
                )
                .await?;
            let message = "no GPU or host of this node is past its policy's safety.repeatOffender limit";
            write_condition(ctx, node, false, message, now).await?;
        }
    }
    Ok(())
}

fn node_ref(node: &str, uid: Option<&str>) -> NodeRef {
    NodeRef {
        name: node.to_owned(),
        uid: uid.map(str::to_owned),
    }
}

/// Sets the `GpuRepeatOffender` node condition (server-side apply of the node's status, under
/// the controller's field manager: the agent's conditions are not touched).
async fn write_condition(
    ctx: &Context,
    node: &str,
    offender: bool,
    message: &str,
    now: Timestamp,
) -> Result<(), WriteError> {
    let mut chars = message.chars();
    let message: String = chars.by_ref().take(32_000).collect();
    let status = json!({"conditions": [{
        "type": node_conditions::GPU_REPEAT_OFFENDER,
        "status": if offender { "True" } else { "False" },
        "reason": reasons::REPEAT_OFFENDER,
        "message": message,
        "lastTransitionTime": Time(now),
        "lastHeartbeatTime": Time(now),
    }]});
    ctx.writer.apply_status::<Node>(&(), node, None, status).await?;
    Ok(())
}

async fn announce_node(
    ctx: &Context,
    node: &str,
    uid: Option<&str>,
    offence: &RepeatOffence,
    reason: &str,
    message: &str,
) {
    let reference = node_ref(node, uid).object_reference();
    tracing::warn!(%node, kind = ?offence.kind, id = %offence.id, "{message}");
    let event = Note::new(reason, EventType::Warning, message).event("CheckHardware");
    ctx.writer.publish_to(&reference, event).await;
}

#[cfg(test)]
mod tests {
    use std::{
        sync::atomic::{AtomicBool, Ordering},
        time::Duration,
    };

    use tokio::sync::oneshot;

    use super::*;

    /// Starts a sync that runs until the returned sender is used (or dropped).
    fn start_held(ledger: &mut Ledger) -> oneshot::Sender<()> {
        let (end, ended) = oneshot::channel::<()>();
        ledger.start(&Changed::default(), |_| async move {
            let _ = ended.await;
        });
        end
    }

    /// Whether `owed_pass` resolves within 100 ms.
    async fn owes_a_pass(ledger: &mut Ledger) -> bool {
        tokio::time::timeout(Duration::from_millis(100), ledger.owed_pass())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn a_pass_that_finds_a_sync_under_way_starts_none_and_is_owed_a_pass_when_it_ends() {
        let mut ledger = Ledger::default();
        let end = start_held(&mut ledger);
        let second_ran = Arc::new(AtomicBool::new(false));
        let ran = second_ran.clone();
        ledger.start(&Changed::default(), |_| async move {
            ran.store(true, Ordering::SeqCst);
        });
        assert!(
            !owes_a_pass(&mut ledger).await,
            "owed before the first sync ended"
        );
        end.send(()).unwrap();
        assert!(
            owes_a_pass(&mut ledger).await,
            "no pass owed once the first sync ended"
        );
        assert!(!second_ran.load(Ordering::SeqCst), "two syncs ran at once");
    }

    #[tokio::test]
    async fn a_sync_that_ends_with_no_pass_left_undone_wakes_none() {
        let mut ledger = Ledger::default();
        ledger.start(&Changed::default(), |_| async {});
        tokio::task::yield_now().await;
        assert!(!owes_a_pass(&mut ledger).await);
    }

    #[tokio::test]
    async fn the_owed_pass_starts_a_sync_again_and_owes_nothing_more() {
        let mut ledger = Ledger::default();
        let end = start_held(&mut ledger);
        ledger.start(&Changed::default(), |_| async {});
        end.send(()).unwrap();
        assert!(owes_a_pass(&mut ledger).await);
        let (ran, runs) = oneshot::channel();
        ledger.start(&Changed::default(), |_| async move { ran.send(()).unwrap() });
        tokio::time::timeout(Duration::from_secs(1), runs)
            .await
            .expect("the owed pass's sync runs")
            .unwrap();
        assert!(!owes_a_pass(&mut ledger).await);
    }
}
