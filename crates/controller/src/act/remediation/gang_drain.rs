//! Reads the gangs a drain touches for the lifecycle (`drain::gangs` decides): until the drain has
//! recorded them, the node's leaving pods' gangs and their members everywhere (listed by the
//! gang's label selector in its namespace); once recorded, only the recorded members. Under
//! `drain.gangs: Together` the recorded members on other nodes still there join the drain's plan,
//! so the one drain evicts them (Eviction API, their budgets, the same blockers and deadline) and
//! ends when they are gone too. Reads only; the lifecycle records, the writer evicts.

use gpu_remediation_api::{gangs::GangRecord, policy::GangDrain, remediation::PolicySnapshot};
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;

use super::AdvanceRemediationError;
use crate::{
    context::Context,
    drain::{
        Plan,
        gangs::{self, Gang},
    },
    read::Scope,
};

/// The drain's plan for `node` widened by the gangs' members under `Together`, and the gang
/// records to keep (`recorded`: what the drain recorded already, if anything).
pub(super) async fn widen(
    ctx: &Context,
    node: &str,
    rules: &PolicySnapshot,
    recorded: &[GangRecord],
    mut plan: Plan,
    listed: &[Pod],
) -> Result<(Plan, Vec<GangRecord>), AdvanceRemediationError> {
    let extra = &rules.drain.gang_labels;
    // Members by the policy's own keys want the checkpoint notice too (the well-known keys are
    // marked by `drain::plan`).
    if !extra.is_empty() {
        let members: std::collections::BTreeSet<&str> = listed
            .iter()
            .filter(|pod| gangs::gang_of(pod, extra).is_some())
            .filter_map(|pod| pod.metadata.uid.as_deref())
            .collect();
        for pod in &mut plan.leaving {
            pod.notice.wanted |= members.contains(pod.uid.as_str());
        }
    }
    let (records, mut members) = if recorded.is_empty() {
        let local = gangs::plan(node, &plan.leaving, listed, extra, GangDrain::Members);
        if local.touched.is_empty() {
            return Ok((plan, Vec::new()));
        }
        let mut pods = listed.to_vec();
        for touched in &local.touched {
            pods.extend(
                members_of(
                    ctx,
                    &touched.gang.namespace,
                    gangs::selector(&touched.gang).as_deref(),
                    Some(&touched.gang),
                    extra,
                )
                .await?,
            );
        }
        let records = gangs::records(&gangs::plan(node, &plan.leaving, &pods, extra, rules.drain.gangs));
        (records, Some(pods))
    } else {
        (recorded.to_vec(), None)
    };
    if rules.drain.gangs != GangDrain::Together || records.iter().all(|r| r.evicted.is_empty()) {
        return Ok((plan, records));
    }
    if members.is_none() {
        let mut pods = Vec::new();
        for record in records.iter().filter(|r| !r.evicted.is_empty()) {
            pods.extend(members_of(ctx, &record.namespace, record.selector.as_deref(), None, extra).await?);
        }
        members = Some(pods);
    }
    let on_node: std::collections::BTreeSet<String> = plan.leaving.iter().map(|p| p.uid.clone()).collect();
    plan.leaving.extend(
        gangs::recorded_members(&records, members.as_deref().unwrap_or_default())
            .into_iter()
            .filter(|p| !on_node.contains(&p.uid)),
    );
    plan.leaving
        .sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    Ok((plan, records))
}

/// The pods of `namespace` that `selector` selects (all of them when `None`), kept to `gang`'s
/// members when one is given and no selector narrows the list (a Volcano group).
async fn members_of(
    ctx: &Context,
    namespace: &str,
    selector: Option<&str>,
    gang: Option<&Gang>,
    extra: &[String],
) -> Result<Vec<Pod>, AdvanceRemediationError> {
    let params = selector.map_or_else(ListParams::default, |s| ListParams::default().labels(s));
    let listed = ctx
        .reader
        .list::<Pod>(Scope::Namespace(namespace), &(), &params)
        .await
        .map_err(|source| AdvanceRemediationError::ListGang {
            namespace: namespace.to_owned(),
            selector: selector.unwrap_or_default().to_owned(),
            source,
        })?;
    Ok(listed
        .items
        .into_iter()
        .filter(|pod| {
            selector.is_some() || gang.is_none_or(|g| gangs::gang_of(pod, extra).as_ref() == Some(g))
        })
        .collect())
}
