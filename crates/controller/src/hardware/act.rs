//! Carries out the ledger's writes, each behind the leader fence: the `GpuHardwareRecord`s that
//! gain a failure (created, or replaced with the read's resourceVersion), the records past their
//! retention (deleted), one `RepeatOffender` Event per remediation sent to the last rung, and the
//! node steps of `join` (label, cordon and lifting the unchecked taint over one version of the node (`KubeOps::edit_node`), the
//! `GpuRepeatOffender` condition by server-side apply of the node's status, an Event).
//!
//! A write that fails (a conflict, the record's watch behind) is made again on the next pass: the
//! decisions are recomputed from the caches each time, so nothing is lost and nothing doubles.

use std::{collections::BTreeSet, sync::Arc};

use gpu_remediation_api::{
    GpuHardwareRecord, GpuRemediation, GpuRemediationPolicy,
    constants::{CLAIM_ANNOTATION, field_managers, node_conditions, reasons},
    hardware::RepeatOffence,
};
use jiff::Timestamp;
use k8s_openapi::{
    api::core::v1::{Node, ObjectReference},
    apimachinery::pkg::apis::meta::v1::Time,
};
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams, PostParams},
    runtime::events::EventType,
};
use serde_json::json;

use super::{
    history::{self, describe},
    join::{self, JoinStep},
};
use crate::{
    context::Context,
    kubeops::WriteError,
    lifecycle::{NodeRef, Note},
};

/// Brings the records up to date with every remediation on record, forgets expired records, and
/// carries out the join steps. Failures are logged and retried on the next pass. `looked_at` names
/// the nodes the pass looked at: every node flagged or tainted by the ledger is among them, and the
/// whole fleet is read only when a node may have to be flagged (`join::needs_every_node`).
pub async fn sync(
    ctx: &Context,
    policies: &[Arc<GpuRemediationPolicy>],
    looked_at: &[String],
    now: Timestamp,
) {
    let records = ctx.caches.hardware_records.state();
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
        if let Err(error) = delete_record(ctx, &name).await {
            tracing::warn!(record = %name, %error, "deleting an expired hardware record failed");
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
        ctx.ops.publish(remediation.as_ref(), event).await;
    }
}

/// Creates or replaces a record (the replace carries the cached resourceVersion: a conflict waits
/// for the next pass).
async fn write_record(
    ctx: &Context,
    record: &GpuHardwareRecord,
    exists: bool,
) -> Result<GpuHardwareRecord, WriteError> {
    let api = Api::<GpuHardwareRecord>::all(ctx.ops.client().clone());
    let mut record = record.clone();
    record.managed_fields_mut().clear();
    ctx.ops.fence().check()?;
    if let Some(claim) = ctx.ops.fence().claim() {
        record
            .annotations_mut()
            .insert(CLAIM_ANNOTATION.to_owned(), claim.to_string());
    }
    let params = PostParams {
        dry_run: false,
        field_manager: Some(field_managers::CONTROLLER.into()),
    };
    let written = if exists {
        api.replace(&record.name_any(), &params, &record).await?
    } else {
        api.create(&params, &record).await?
    };
    Ok(written)
}

async fn delete_record(ctx: &Context, name: &str) -> Result<(), WriteError> {
    let api = Api::<GpuHardwareRecord>::all(ctx.ops.client().clone());
    // The claim stamped first, the delete preconditioned on it (the fence policy's delete rule).
    match crate::claim::delete_stamped(
        &api,
        name,
        None,
        ctx.ops.fence(),
        &kube::api::DeleteParams::default(),
    )
    .await
    {
        // Kept conflicting: the next pass tries again (the record is still past its retention).
        Ok(_) | Err(crate::claim::DeleteStampedError::KeptConflicting) => Ok(()),
        Err(crate::claim::DeleteStampedError::Write(error)) => Err(error),
    }
}

/// Why a node step failed.
#[derive(Debug, thiserror::Error)]
enum StepError {
    #[error(transparent)]
    Edit(#[from] crate::kubeops::EditNodeError),
    #[error(transparent)]
    Write(#[from] WriteError),
}

async fn carry_out(ctx: &Context, step: &JoinStep, now: Timestamp) -> Result<(), StepError> {
    match step {
        JoinStep::Lift { node, uid } => {
            ctx.ops
                .edit_node(
                    &node_ref(node, uid.as_ref()),
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
        } => {
            let cordon = *cordon;
            ctx.ops
                .edit_node(
                    &node_ref(node, uid.as_ref()),
                    ctx.caches.node(node).as_deref(),
                    |n| join::flag(n, cordon),
                )
                .await?;
            let message = format!(
                "{}{}",
                describe(offence),
                if cordon {
                    "; cordoned (safety.repeatOffender.cordonOnJoin)"
                } else {
                    ""
                }
            );
            write_condition(ctx, node, true, &message, now).await?;
            announce_node(ctx, node, uid.as_ref(), offence, &message).await;
        }
        JoinStep::Unflag { node, uid } => {
            ctx.ops
                .edit_node(
                    &node_ref(node, uid.as_ref()),
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

fn node_ref(node: &str, uid: Option<&String>) -> NodeRef {
    NodeRef {
        name: node.to_owned(),
        uid: uid.cloned(),
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
    let api = Api::<Node>::all(ctx.ops.client().clone());
    let mut chars = message.chars();
    let message: String = chars.by_ref().take(32_000).collect();
    let patch = json!({
        "apiVersion": "v1",
        "kind": "Node",
        "status": {"conditions": [{
            "type": node_conditions::GPU_REPEAT_OFFENDER,
            "status": if offender { "True" } else { "False" },
            "reason": reasons::REPEAT_OFFENDER,
            "message": message,
            "lastTransitionTime": Time(now),
            "lastHeartbeatTime": Time(now),
        }]},
    });
    ctx.ops.fence().check()?;
    api.patch_status(
        node,
        &PatchParams::apply(field_managers::CONTROLLER).force(),
        &Patch::Apply(&patch),
    )
    .await?;
    Ok(())
}

async fn announce_node(
    ctx: &Context,
    node: &str,
    uid: Option<&String>,
    offence: &RepeatOffence,
    message: &str,
) {
    let reference = ObjectReference {
        api_version: Some("v1".to_owned()),
        kind: Some("Node".to_owned()),
        name: Some(node.to_owned()),
        uid: uid.cloned(),
        ..ObjectReference::default()
    };
    tracing::warn!(%node, kind = ?offence.kind, id = %offence.id, "{message}");
    let event = Note::new(reasons::REPEAT_OFFENDER, EventType::Warning, message).event("CheckHardware");
    ctx.ops.publish_to(&reference, event).await;
}
