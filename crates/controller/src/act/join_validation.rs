//! Carries out [`crate::hardware::join_validation`] (new nodes validated before they take work),
//! behind the leader fence: for each policy with `validation.newNodes`, it reads the Job of each
//! node whose `GpuValidated` condition says one was started, asks the decision for the steps, and
//! writes them: the Job created (owned by the policy), the startup taint lifted over one version
//! of the node (`Writer::edit_node`), the `GpuValidated` condition applied under its own field
//! manager (so that the controller's other node conditions stay), and an Event on each outcome.
//!
//! It runs in the ledger's sync, behind the pass. A write that fails is made again on the next
//! pass: the steps are decided afresh from the caches and the Jobs each time, and a Job created
//! twice is found (409) rather than doubled. [`polls`] tells the pass to come back while a Job
//! runs or a node waits for room, since Jobs are not watched.

use std::{sync::Arc, time::Duration};

use gpu_remediation_api::{
    GpuRemediationPolicy,
    constants::{
        UNVALIDATED_TAINT_KEY, field_managers, node_conditions::GPU_VALIDATED, reasons, validated_reasons,
    },
    validation::ValidationOutcome,
};
use jiff::Timestamp;
use k8s_openapi::{
    api::{batch::v1::Job, core::v1::Node},
    apimachinery::pkg::apis::meta::v1::Time,
};
use kube::{
    api::{ApiResource, DynamicObject},
    runtime::events::EventType,
};
use serde_json::{Value, json};

use crate::{
    context::Context,
    hardware::join_validation::{self, Candidate, JobSeen, Recorded, Step},
    lifecycle::{NodeRef, Note},
    observe::{CachedNode, NodeView},
    read::Scope,
    write::{WriteError, apply_params_of},
};

/// How often the pass comes back while a new node's Job runs or a node waits for room.
pub const POLL: Duration = Duration::from_secs(5);

/// Whether the pass must come back within [`POLL`]: some policy validates new nodes and one of
/// its new nodes is not held (its Job runs, is due, or waits for room).
#[must_use]
pub fn polls(policies: &[Arc<GpuRemediationPolicy>], nodes: impl FnOnce() -> Vec<Arc<CachedNode>>) -> bool {
    if !join_validation::any_policy(policies) {
        return false;
    }
    let nodes = nodes();
    join_validation::governed(policies, &nodes)
        .iter()
        .flat_map(|g| &g.nodes)
        .any(|node| join_validation::recorded(node) != Recorded::Held)
}

/// Validates the new nodes of every policy that asks for it (see the module header).
pub async fn sync(ctx: &Context, policies: &[Arc<GpuRemediationPolicy>], now: Timestamp) {
    if !join_validation::any_policy(policies) {
        return;
    }
    let nodes = ctx.caches.all_nodes();
    for governed in join_validation::governed(policies, &nodes) {
        let namespace = governed
            .validation
            .job
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let mut candidates = Vec::with_capacity(governed.nodes.len());
        for node in &governed.nodes {
            let name = node.node_name().to_owned();
            let uid = node.node_uid().map(str::to_owned).unwrap_or_default();
            let job = match join_validation::recorded(node) {
                Recorded::Held => JobSeen::Held,
                Recorded::Nothing => JobSeen::None,
                Recorded::Started => {
                    read_job(ctx, &namespace, &join_validation::job_name(&name, &uid), now).await
                }
            };
            candidates.push(Candidate {
                node: name,
                joined: node.created().map_or(now, |t| t.0),
                job,
            });
        }
        let steps = join_validation::steps(
            &candidates,
            governed.max,
            governed.validation.timeout.as_std(),
            now,
        );
        for step in steps {
            let Some(node) = governed.nodes.iter().find(|n| n.node_name() == step_node(&step)) else {
                continue;
            };
            if let Err(error) = carry_out(ctx, &governed, node, &namespace, &step, now).await {
                tracing::warn!(node = %node.node_name(), ?step, %error, "validating a new node failed; next pass retries");
            }
        }
    }
}

/// The node's Job as read: a read that fails counts as running from now (it holds its room and
/// times out only once read).
async fn read_job(ctx: &Context, namespace: &str, name: &str, now: Timestamp) -> JobSeen {
    match ctx
        .reader
        .get_opt::<Job>(Scope::Namespace(namespace), &(), name)
        .await
    {
        Ok(found) => {
            let status = found
                .as_ref()
                .and_then(|job| job.status.as_ref())
                .and_then(|status| serde_json::to_value(status).ok());
            let created = found
                .as_ref()
                .and_then(|job| job.metadata.creation_timestamp.as_ref())
                .map_or(now, |t| t.0);
            join_validation::seen(found.as_ref().map(|_| (status.as_ref(), created)), true)
        }
        Err(error) => {
            tracing::info!(job = %name, %error, "reading a new node's validation Job failed; next pass reads it again");
            JobSeen::Running { since: now }
        }
    }
}

fn step_node(step: &Step) -> &str {
    match step {
        Step::Start { node }
        | Step::Wait { node, .. }
        | Step::Lift { node }
        | Step::Hold { node, .. }
        | Step::Queued { node, .. } => node,
    }
}

/// Why a step's writes failed.
#[derive(Debug, thiserror::Error)]
enum StepError {
    #[error(transparent)]
    Edit(#[from] crate::write::EditNodeError),
    #[error(transparent)]
    Write(#[from] WriteError),
    #[error("the policy has no UID yet: its Job cannot be owned")]
    Unowned,
}

async fn carry_out(
    ctx: &Context,
    governed: &join_validation::Governed<'_, CachedNode>,
    node: &Arc<CachedNode>,
    namespace: &str,
    step: &Step,
    now: Timestamp,
) -> Result<(), StepError> {
    let name = node.node_name().to_owned();
    let uid = node.node_uid().map(str::to_owned).unwrap_or_default();
    let job = format!("{namespace}/{}", join_validation::job_name(&name, &uid));
    match step {
        Step::Start { .. } => {
            let object = join_validation::job_object(governed.validation, governed.policy, &name, &uid)
                .ok_or(StepError::Unowned)?;
            let object: DynamicObject = serde_json::from_value(object)
                .map_err(kube::Error::SerdeError)
                .map_err(WriteError::Api)?;
            match ctx.writer.create(&ApiResource::erase::<Job>(&()), &object).await {
                // Created now, or by a pass whose condition write was lost: started either way.
                Ok(_) => {}
                Err(error) if error.code() == Some(409) => {}
                Err(error) => return Err(error.into()),
            }
            let message = format!("the validation Job {job} runs: the node takes no work until it passes");
            condition(ctx, node, "Unknown", validated_reasons::RUNNING, &message, now).await?;
        }
        Step::Wait { .. } => {}
        Step::Lift { .. } => {
            ctx.writer
                .edit_node(
                    &NodeRef {
                        name: name.clone(),
                        uid: node.node_uid().map(str::to_owned),
                    },
                    Some(node),
                    |n| join_validation::lift(n, UNVALIDATED_TAINT_KEY),
                )
                .await?;
            let message = format!(
                "the validation Job {job} passed: the startup taint {UNVALIDATED_TAINT_KEY} is lifted"
            );
            condition(ctx, node, "True", validated_reasons::PASSED, &message, now).await?;
            announce(
                ctx,
                node,
                reasons::NEW_NODE_VALIDATED,
                EventType::Normal,
                &message,
            )
            .await;
        }
        Step::Hold { outcome, message, .. } => {
            let reason = match outcome {
                ValidationOutcome::TimedOut => validated_reasons::TIMED_OUT,
                ValidationOutcome::Failed | ValidationOutcome::Passed => validated_reasons::FAILED,
            };
            let message = format!(
                "{message} (Job {job}); a person decides: remove the taint to accept the node, or replace it"
            );
            condition(ctx, node, "False", reason, &message, now).await?;
            announce(
                ctx,
                node,
                reasons::NEW_NODE_VALIDATION_FAILED,
                EventType::Warning,
                &message,
            )
            .await;
        }
        Step::Queued { message, .. } => {
            condition(ctx, node, "Unknown", validated_reasons::QUEUED, message, now).await?;
        }
    }
    Ok(())
}

/// Applies the `GpuValidated` condition, unless the node already says exactly that (a queued
/// node is looked at every pass; its condition is written when it changes).
async fn condition(
    ctx: &Context,
    node: &CachedNode,
    status: &str,
    reason: &str,
    message: &str,
    now: Timestamp,
) -> Result<(), WriteError> {
    let current = node.condition(GPU_VALIDATED);
    if current.is_some_and(|c| c.status == status && c.reason == Some(reason) && c.message == Some(message)) {
        return Ok(());
    }
    let since = current
        .filter(|c| c.status == status)
        .and_then(|c| c.last_transition_time)
        .map_or(Time(now), Time);
    let patch = json!({"conditions": [{
        "type": GPU_VALIDATED,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since,
        "lastHeartbeatTime": Time(now),
    }]});
    ctx.writer
        .apply_status_as::<Node>(
            &(),
            node.node_name(),
            None,
            patch,
            &apply_params_of(field_managers::CONTROLLER_VALIDATION),
        )
        .await?;
    Ok(())
}

async fn announce(ctx: &Context, node: &CachedNode, reason: &str, kind: EventType, message: &str) {
    let reference = NodeRef {
        name: node.node_name().to_owned(),
        uid: node.node_uid().map(str::to_owned),
    }
    .object_reference();
    tracing::info!(node = %node.node_name(), %reason, "{message}");
    let event = Note::new(reason, kind, message).event("ValidateNewNode");
    ctx.writer.publish_to(&reference, event).await;
}
