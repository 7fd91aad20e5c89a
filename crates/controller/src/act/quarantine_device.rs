//! Carries out device-level quarantine (see [`super::device`]): asks the server which version of
//! `DeviceTaintRule` it serves (discovery, asked again after a minute or after a 404), reads a quarantined node's `ResourceSlice`s to find its failed GPUs'
//! devices, records them on the node and creates one rule per device, and each pass makes the
//! rules follow the nodes' annotations. Every write goes through the one writer (`crate::write`).

use std::sync::atomic::Ordering;

use gpu_remediation_api::{GpuRemediationPolicy, constants::DEVICE_QUARANTINE_LABEL};
use kube::{
    ResourceExt as _,
    api::{DeleteParams, ListParams},
};

use crate::quarantine::device::{self, QuarantinedDevice, Target};
use crate::{
    context::Context,
    cordon::NodeRef,
    dra::wire::{self, DeviceTaintRule, ResourceSlice, TaintRuleVersion},
    observe::{CachedNode, NodeView},
    read::{Reader, Scope},
    write::{DeleteStampedError, EditNodeError, NodeEdit, WriteError, Writer},
};

/// The most stable version of `resource.k8s.io` serving `devicetaintrules` (see
/// [`Reader::serves`], whose answers are kept a minute; [`TaintRuleVersion::choose`]): `None`
/// where the server serves none, and a node taint is the safe side.
pub async fn served(reader: &Reader) -> Option<TaintRuleVersion> {
    let mut served = Vec::new();
    for version in TaintRuleVersion::PREFERRED {
        if reader.serves(&version.group_version(), wire::TAINT_RULES).await {
            served.push(version);
        }
    }
    TaintRuleVersion::choose(&served)
}

/// Where `error` (of a list or create in `version`) says the server no longer serves `version`
/// (404: the API was turned off, or the server downgraded), forgets the answer so that the next
/// pass asks discovery again.
fn forget_if_not_served(reader: &Reader, version: TaintRuleVersion, error: &WriteError) {
    if let WriteError::Api(kube::Error::Api(status)) = error
        && status.is_not_found()
    {
        tracing::info!(%version, "DeviceTaintRule not found in this version: asking discovery again");
        reader.forget_served(&version.group_version());
    }
}

/// How `node`'s quarantine is carried out: its failed GPUs' devices, or the node taint and why.
pub async fn choose(ctx: &Context, node: &CachedNode) -> Target {
    let failed = device::failed_gpus(node);
    if failed.is_empty() {
        return device::target(node.node_name(), &failed, None);
    }
    let Some(version) = served(&ctx.reader).await else {
        return device::target(node.node_name(), &failed, None);
    };
    let params = ListParams::default().fields(&format!("spec.nodeName={}", node.node_name().to_owned()));
    match ctx
        .reader
        .list::<ResourceSlice>(Scope::Cluster, &wire::resource_slices(), &params)
        .await
    {
        Ok(listed) => device::target(node.node_name(), &failed, Some((version, &listed.items))),
        Err(error) => Target::Node(format!("reading the node's ResourceSlices failed: {error}")),
    }
}

/// Records a device-level quarantine of `devices` by `policy` on `node`, then creates their rules
/// in `version` (those that exist are kept). With whether the node changed.
pub async fn quarantine_devices(
    ctx: &Context,
    node: &NodeRef,
    policy: &str,
    version: TaintRuleVersion,
    devices: &[QuarantinedDevice],
) -> Result<(NodeEdit, bool), EditNodeError> {
    let (edit, changed) = ctx
        .writer
        .edit_node_changing(node, ctx.caches.node(&node.name).as_deref(), |n| {
            device::mark(n, policy, devices)
        })
        .await?;
    if let NodeEdit::Written(_) = &edit {
        ctx.device_rules_may_exist.store(true, Ordering::Relaxed);
        for device in devices {
            create(ctx, version, &device::rule(version, policy, &node.name, device))
                .await
                .map_err(|source| EditNodeError::Write {
                    node: node.name.clone(),
                    source,
                })?;
        }
    }
    Ok((edit, changed))
}

/// Makes the rules follow the nodes' annotations (see [`device::reconcile`]): creates the missing
/// rules of this controller's policies, deletes those no node names. `looked_at` names the nodes
/// the pass looked at: every node carrying a device-level quarantine is among them (read afresh,
/// with the quarantines this pass wrote).
pub async fn reconcile(ctx: &Context, looked_at: &[String]) -> Result<(), ReconcileRulesError> {
    let nodes = ctx.caches.nodes_named(looked_at);
    let any_marked = nodes.iter().any(device::is_device_level);
    if !any_marked && !ctx.device_rules_may_exist.load(Ordering::Relaxed) {
        return Ok(());
    }
    let Some(version) = served(&ctx.reader).await else {
        return Ok(());
    };
    let params = ListParams::default().labels(&format!("{DEVICE_QUARANTINE_LABEL}=true"));
    let existing = ctx
        .reader
        .list::<DeviceTaintRule>(Scope::Cluster, &wire::device_taint_rules(version), &params)
        .await
        .map_err(WriteError::from)
        .inspect_err(|error| forget_if_not_served(&ctx.reader, version, error))?
        .items;
    let policies = ctx.caches.policies.state();
    let known = |name: &str| policies.iter().any(|p| p.name_any() == name);
    let plan = device::reconcile(version, &nodes, known, &existing);
    for rule in &plan.create {
        create(ctx, version, rule).await?;
    }
    let mut deleted = 0;
    for rule in plan.delete.iter().chain(&plan.delete_if_owner_gone) {
        let owner = rule
            .annotations()
            .get(gpu_remediation_api::constants::QUARANTINED_BY_ANNOTATION);
        if plan
            .delete_if_owner_gone
            .iter()
            .any(|r| r.name_any() == rule.name_any())
            && owner_exists(&ctx.reader, owner.map_or("", String::as_str)).await
        {
            continue;
        }
        let name = rule.name_any();
        delete_rule(&ctx.writer, version, rule).await?;
        tracing::info!(rule = %name, "device quarantine rule deleted: no node names its device any more");
        deleted += 1;
    }
    let kept = existing.len() + plan.create.len() - deleted;
    ctx.device_rules_may_exist
        .store(any_marked || kept > 0, Ordering::Relaxed);
    Ok(())
}

/// Why the rules could not be made to follow the nodes.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileRulesError {
    /// Listing or creating rules failed.
    #[error("device quarantine rules: {0}")]
    Write(#[from] WriteError),
    /// Deleting a rule failed.
    #[error("deleting device quarantine rule {rule}: {source}")]
    Delete {
        /// The rule.
        rule: String,
        /// What went wrong.
        source: DeleteStampedError,
    },
}

/// Creates `rule` in `version` through the writer (an existing one is kept).
pub async fn create_rule(
    writer: &Writer,
    version: TaintRuleVersion,
    rule: &DeviceTaintRule,
) -> Result<(), WriteError> {
    match writer.create(&wire::device_taint_rules(version), rule).await {
        Ok(_) => {
            tracing::info!(rule = %rule.name_any(), %version, "device quarantine rule created");
            Ok(())
        }
        Err(WriteError::Api(kube::Error::Api(status))) if status.is_already_exists() => Ok(()),
        Err(error) => Err(error),
    }
}

/// [`create_rule`], forgetting what discovery said of `version` where the server answers 404.
async fn create(ctx: &Context, version: TaintRuleVersion, rule: &DeviceTaintRule) -> Result<(), WriteError> {
    create_rule(&ctx.writer, version, rule)
        .await
        .inspect_err(|error| forget_if_not_served(&ctx.reader, version, error))
}

/// Deletes `rule` (that UID only) through the writer: the claim stamped onto it, then a delete
/// preconditioned on that write (see `crate::write::claim`).
pub async fn delete_rule(
    writer: &Writer,
    version: TaintRuleVersion,
    rule: &DeviceTaintRule,
) -> Result<(), ReconcileRulesError> {
    let name = rule.name_any();
    writer
        .delete_stamped::<DeviceTaintRule>(
            &wire::device_taint_rules(version),
            Scope::Cluster,
            &name,
            rule.uid().as_deref(),
            &DeleteParams::default(),
        )
        .await
        .map(|_| ())
        .map_err(|source| ReconcileRulesError::Delete { rule: name, source })
}

/// Whether policy `name` exists on the server; a failed read counts as existing (a rule is
/// deleted only on a certain answer).
async fn owner_exists(reader: &Reader, name: &str) -> bool {
    if name.is_empty() {
        return false;
    }
    match reader
        .get_opt::<GpuRemediationPolicy>(Scope::Cluster, &(), name)
        .await
    {
        Ok(found) => found.is_some_and(|p| p.metadata.deletion_timestamp.is_none()),
        Err(_) => true,
    }
}

#[cfg(test)]
#[path = "quarantine_device_tests.rs"]
mod tests;
