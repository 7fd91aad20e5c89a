//! Carries out the quarantine decisions: writes each taint added or lifted (through `write`,
//! behind the leader fence, with the node's resourceVersion and UID as preconditions), or, where
//! the fault names GPUs allocated through DRA, the device-level quarantine (`device_apply`), then
//! publishes one Event per node changed (an edit that found the node already as planned, because a
//! pass came before the watch showed the last write, announces nothing) and one on the policy when its quarantine limit is newly
//! reached. The only part of `quarantine` that does IO.

use std::{
    collections::HashMap,
    sync::{LazyLock, Mutex},
    time::Duration,
};

use futures::{StreamExt as _, stream};
use gpu_remediation_api::GpuRemediationPolicy;
use gpu_remediation_api::constants::{policy_conditions, reasons};
use jiff::Timestamp;
use kube::{ResourceExt as _, runtime::events::EventType};

use super::quarantine_device as device_apply;
use crate::{
    context::Context,
    fleet::PolicyPlan,
    lifecycle::{NodeRef, Note},
    observe::NodeView,
    quarantine::{
        Add, Lift,
        device::{self, Target},
        taint,
    },
    read::Scope,
    write::{EditNodeError, NodeEdit},
};

/// Node edits made at once: as many as the connections kept warm (`Settings::warm_connections`),
/// so a burst's patches open no new connection. What bounds a burst is the API server's throughput,
/// not this number: 25 alternated runs at 1,000 and 50,000 nodes wrote a hundred patches in
/// 0.50–1.32 s at 8, 16 or 32 at a time alike, each patch staying in the server about as much
/// longer as more were in flight (p50 21–45 ms at 8, 53–170 ms at 32), and the hundred faults' p99
/// could not be told apart (`docs/benchmarks.md`, first signal to quarantine).
const EDIT_CONCURRENCY: usize = 32;

/// Whether each policy's quarantine limit was reached at this process's last pass.
static LIMITED: LazyLock<Mutex<HashMap<String, bool>>> = LazyLock::new(Mutex::default);

/// Writes one policy's quarantines and lifts, then their Events. Every edit is tried; the first
/// failure is returned (the next pass tries again).
/// `looked_at` names the nodes the plan looked at: every node carrying a quarantine is among them.
pub async fn apply(ctx: &Context, plan: &mut PolicyPlan, looked_at: &[String]) -> Result<(), EditNodeError> {
    report_device_level(ctx, plan).await;
    let plan = &*plan;
    let policy = plan.policy.name_any();
    let quarantine = &plan.quarantine;
    // Lifts first: the plan's adds fill the room its lifts make, so the limit holds between the
    // writes, and an add whose room a failed lift did not free waits for the next pass.
    let lifted = lift_all(ctx, &quarantine.lift).await;
    let within = quarantine.adds_within_limit(lifted.iter().filter(|l| l.is_err()).count());
    let adds: Vec<_> = quarantine.add[..within]
        .iter()
        .map(|a| add(ctx, &policy, a))
        .collect();
    let mut added: Vec<_> = stream::iter(adds)
        .buffer_unordered(EDIT_CONCURRENCY)
        .collect()
        .await;
    added.extend(extend_all(ctx, &policy, looked_at).await);
    ctx.metrics
        .set_quarantined(&policy, plan.status.quarantined_nodes);

    let was_limited = plan.policy.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == policy_conditions::QUARANTINE_LIMITED && c.status == "True")
    });
    let limited = plan
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == policy_conditions::QUARANTINE_LIMITED && c.status == "True");
    // The cached status may not show this controller's last write yet (the next pass can come
    // before the watch does): what this process last announced counts too.
    let announced = LIMITED
        .lock()
        .is_ok_and(|mut known| known.insert(policy.clone(), limited.is_some()).unwrap_or(false));
    if let (false, false, Some(limited)) = (was_limited, announced, limited) {
        tracing::warn!(%policy, message = %limited.message, "quarantine limit reached");
        let note = Note::new(
            reasons::QUARANTINE_LIMIT_REACHED,
            EventType::Warning,
            &limited.message,
        );
        ctx.writer
            .publish(plan.policy.as_ref(), note.event("Quarantine"))
            .await;
    }
    announce(ctx, added.into_iter().chain(lifted)).await
}

/// Adds the policy's `DeviceQuarantine` condition (whether its quarantines can be device-level)
/// and `deviceTaints` (the `DeviceTaintRule` version spoken, or the node taint) to the status the
/// plan writes, when any of its triggers quarantines.
async fn report_device_level(ctx: &Context, plan: &mut PolicyPlan) {
    let spec = &plan.policy.spec;
    let quarantines = spec
        .triggers
        .iter()
        .any(|t| t.quarantine.unwrap_or(spec.quarantine.enabled));
    if !quarantines {
        return;
    }
    let served = device_apply::served(&ctx.reader).await;
    let previous = plan
        .policy
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let condition = device::condition(
        served,
        previous,
        plan.policy.metadata.generation,
        Timestamp::now(),
    );
    plan.status.conditions.push(condition);
    plan.status.device_taints = Some(device::spoken(served));
}

/// Lifts quarantines no policy's plan covers (their node left the policy, or the policy is gone).
pub async fn lift_orphans(ctx: &Context, orphans: &[Lift]) -> Result<(), EditNodeError> {
    announce(ctx, lift_all(ctx, orphans).await).await
}

/// Publishes the Event of each edit written, several at once (see `Writer::publish_all`); returns
/// the last failure, if any.
async fn announce(ctx: &Context, results: impl IntoIterator<Item = Written>) -> Result<(), EditNodeError> {
    let mut failed = None;
    let mut events = Vec::new();
    for result in results {
        match result {
            Ok(Some((target, note))) => {
                events.push((NodeRef::object_reference(&target), note.event("Quarantine")));
            }
            Ok(None) => {}
            Err(error) => failed = Some(error),
        }
    }
    ctx.writer.publish_all(events).await;
    failed.map_or(Ok(()), Err)
}

type Written = Result<Option<(NodeRef, Note)>, EditNodeError>;

async fn lift_all(ctx: &Context, lifts: &[Lift]) -> Vec<Written> {
    let lifts: Vec<_> = lifts.iter().map(|l| lift(ctx, l)).collect();
    stream::iter(lifts)
        .buffer_unordered(EDIT_CONCURRENCY)
        .collect()
        .await
}

async fn add(ctx: &Context, policy: &str, add: &Add) -> Written {
    let Some(how) = quarantine(ctx, policy, &add.node).await? else {
        return Ok(None);
    };
    let elapsed = Duration::try_from(Timestamp::now().duration_since(add.since)).unwrap_or_default();
    ctx.metrics.signal_to_quarantine(policy, elapsed);
    tracing::info!(node = %add.node.name, %policy, signal = %add.signal, ?elapsed, %how, "node quarantined");
    let text = format!(
        "node {} quarantined by policy {policy} at the first signal {} (since {}): {how}; its remediation \
         waits for the trigger's `for`",
        add.node.name, add.signal, add.since
    );
    Ok(Some((
        add.node.clone(),
        Note::new(reasons::QUARANTINED, EventType::Normal, &text),
    )))
}

/// Quarantines `node` for `policy`: its failed GPUs' devices where the fault names GPUs allocated
/// through DRA and the server serves `DeviceTaintRule`, else the node taint. Returns what was
/// done, in words, and the node as written (`None`: the node is gone or replaced).
async fn quarantine(ctx: &Context, policy: &str, node: &NodeRef) -> Result<Option<String>, EditNodeError> {
    let target = match ctx.caches.node(&node.name) {
        Some(cached) => device_apply::choose(ctx, &cached).await,
        None => Target::Node("the node is not in the cache".to_owned()),
    };
    let (edit, how) = match target {
        Target::Devices(version, devices) => {
            let named: Vec<String> = devices
                .iter()
                .map(|d| format!("GPU {} (device {}/{}/{})", d.uuid, d.driver, d.pool, d.device))
                .collect();
            let how = format!(
                "only {} taken out of allocation by {version} DeviceTaintRule (NoSchedule); the node's other GPUs \
                 keep taking work",
                named.join(", ")
            );
            match device_apply::quarantine_devices(ctx, node, policy, version, &devices).await? {
                // Already recorded (a pass before the watch showed the last write): announced then.
                (NodeEdit::Written(_), false) => return Ok(None),
                (edit, _) => (edit, how),
            }
        }
        Target::Node(why) => match ctx
            .writer
            .quarantine_node(node, ctx.caches.node(&node.name).as_deref(), policy)
            .await?
        {
            // Already quarantined (a pass that came before the watch showed the last write): it was
            // announced then.
            (NodeEdit::Written(_), false) => return Ok(None),
            (edit, _) => (
                edit,
                format!("no new pod is scheduled onto it (node taint: {why})"),
            ),
        },
    };
    Ok(match edit {
        NodeEdit::Written(_) => Some(how),
        NodeEdit::Gone | NodeEdit::Replaced => None,
    })
}

/// Decides again the device-level quarantines of `policy` whose fault now names a GPU they do
/// not hold (a second GPU failed during the episode).
/// The nodes are read afresh: the quarantines just written are among them.
async fn extend_all(ctx: &Context, policy: &str, looked_at: &[String]) -> Vec<Written> {
    let mut results = Vec::new();
    for node in ctx.caches.nodes_named(looked_at) {
        if taint::owner(&node) != Some(policy) || !device::misses_a_failed_gpu(&node) {
            continue;
        }
        let target = NodeRef {
            name: node.node_name().to_owned(),
            uid: node.node_uid().map(str::to_owned),
        };
        results.push(match quarantine(ctx, policy, &target).await {
            Ok(Some(how)) => {
                tracing::info!(node = %target.name, %policy, %how, "quarantine extended to another failed GPU");
                let text = format!(
                    "quarantine of node {} by policy {policy} extended: another GPU failed; {how}",
                    target.name
                );
                Ok(Some((target, Note::new(reasons::QUARANTINED, EventType::Normal, &text))))
            }
            Ok(None) => Ok(None),
            Err(error) => Err(error),
        });
    }
    results
}

async fn lift(ctx: &Context, lift: &Lift) -> Written {
    if lift.unless_owner_exists && owner_exists(ctx, &lift.policy).await {
        return Ok(None);
    }
    // A lift that found nothing of ours (already lifted by a pass the watch had not shown yet)
    // announces nothing.
    let seen = ctx.caches.node(&lift.node.name);
    let (NodeEdit::Written(_), true) = ctx
        .writer
        .lift_quarantine(&lift.node, seen.as_deref(), &lift.policy)
        .await?
    else {
        return Ok(None);
    };
    tracing::info!(node = %lift.node.name, policy = %lift.policy, why = %lift.why, "quarantine lifted");
    let text = format!(
        "quarantine of node {} by policy {} lifted: {}",
        lift.node.name, lift.policy, lift.why
    );
    Ok(Some((
        lift.node.clone(),
        Note::new(reasons::QUARANTINE_LIFTED, EventType::Normal, &text),
    )))
}

/// Whether the API server holds policy `name` (one this controller's selector leaves out). A
/// failed read counts as existing: a quarantine is lifted only on a certain answer.
async fn owner_exists(ctx: &Context, name: &str) -> bool {
    match ctx
        .reader
        .get_opt::<GpuRemediationPolicy>(Scope::Cluster, &(), name)
        .await
    {
        Ok(found) => found.is_some_and(|p| p.metadata.deletion_timestamp.is_none()),
        Err(error) => {
            tracing::debug!(policy = %name, %error, "reading a quarantine's policy failed; keeping it");
            true
        }
    }
}

#[cfg(test)]
#[path = "quarantine_tests.rs"]
mod tests;
