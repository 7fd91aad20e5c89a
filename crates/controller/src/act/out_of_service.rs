//! Carries out the out-of-service decisions (see [`crate::out_of_service`]): reads the Lease of a
//! node its remediation shut down, adds or lifts the taint through the one writer (a node edit over
//! one resourceVersion: the taints are one list, and every other actor's entry is kept), and says
//! so in an Event on the node and on the remediation.

use std::{collections::BTreeSet, sync::Arc};

use gpu_remediation_api::{GpuRemediation, constants::reasons};
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use kube::{ResourceExt as _, runtime::events::EventType};

use crate::{
    context::Context,
    lifecycle::{NodeRef, Note},
    observe::{CachedNode, NodeView},
    out_of_service::{self, Verdict},
    read::Scope,
    write::{EditNodeError, NodeEdit, WriteError},
};

/// The namespace of the nodes' Leases.
const NODE_LEASES: &str = "kube-node-lease";

/// Why a node's out-of-service taint could not be decided or written.
#[derive(Debug, thiserror::Error)]
pub enum OutOfServiceError {
    /// Reading the node's Lease failed.
    #[error("reading the Lease of node {node}: {source}")]
    Lease {
        /// The node.
        node: String,
        /// What went wrong.
        source: WriteError,
    },
    /// The node edit failed.
    #[error(transparent)]
    Edit(#[from] EditNodeError),
}

/// Decides and writes the out-of-service taint of the nodes the remediations on record name and of
/// the nodes the pass looked at (`looked_at`: a node that reports again is among them). Returns when
/// a node not yet confirmed down will be (the pass to wake by), or the last failure; the other
/// nodes are still done.
pub async fn apply(
    ctx: &Context,
    remediations: &[Arc<GpuRemediation>],
    looked_at: &[String],
) -> Result<Option<Timestamp>, OutOfServiceError> {
    // The remediations in flight that shut their node down: few, found once per pass.
    let shut: Vec<(&GpuRemediation, String)> = remediations
        .iter()
        .filter_map(|r| out_of_service::shut_down_by(r).map(|how| (r.as_ref(), how)))
        .collect();
    // Every recorded node, finished or not, and those looked at: a taint of ours is lifted once its
    // node reports again, whatever became of its remediation.
    let names: BTreeSet<&str> = remediations
        .iter()
        .map(|r| r.spec.node_name.as_str())
        .chain(looked_at.iter().map(String::as_str))
        .collect();
    let mut failed = None;
    let mut wake: Option<Timestamp> = None;
    for name in names {
        let Some(node) = ctx.caches.node(name) else {
            continue;
        };
        match one(ctx, &node, &shut).await {
            Ok(Some(at)) => wake = Some(wake.map_or(at, |w| w.min(at))),
            Ok(None) => {}
            Err(error) => {
                tracing::warn!(node = name, %error, "the out-of-service taint could not be written; retrying");
                failed = Some(error);
            }
        }
    }
    failed.map_or(Ok(wake), Err)
}

/// The remediation of `node` (this UID) that shut it down, with its words.
fn shut_down<'a>(
    node: &CachedNode,
    shut: &'a [(&'a GpuRemediation, String)],
) -> Option<&'a (&'a GpuRemediation, String)> {
    shut.iter().find(|(r, _)| {
        r.spec.node_name == node.node_name()
            && (r.spec.node_uid.is_none() || r.spec.node_uid.as_deref() == node.node_uid())
    })
}

async fn one(
    ctx: &Context,
    node: &CachedNode,
    shut: &[(&GpuRemediation, String)],
) -> Result<Option<Timestamp>, OutOfServiceError> {
    let name = node.node_name().to_owned();
    let shut = shut_down(node, shut);
    if shut.is_none() && !out_of_service::ours(node) {
        return Ok(None);
    }
    let lease_renewed =
        if shut.is_some() && !out_of_service::has_taint(node) && out_of_service::unreachable(node) {
            ctx.reader
                .get_opt::<Lease>(Scope::Namespace(NODE_LEASES), &(), &name)
                .await
                .map_err(|e| OutOfServiceError::Lease {
                    node: name.clone(),
                    source: e.into(),
                })?
                .and_then(|l| l.spec?.renew_time.map(|t| t.0))
        } else {
            None
        };
    let verdict = out_of_service::decide(
        node,
        shut.map(|(r, how)| (r.metadata.name.as_deref().unwrap_or_default(), how.as_str())),
        lease_renewed,
        Timestamp::now(),
    );
    let target = NodeRef {
        name: name.clone(),
        uid: node.node_uid().map(str::to_owned),
    };
    let (edit, said, remediation) = match verdict {
        Verdict::Keep(why) => {
            tracing::debug!(node = %name, why, "out-of-service taint unchanged");
            return Ok(None);
        }
        Verdict::Wait(at) => return Ok(Some(at)),
        Verdict::Add { remediation, why } => {
            let (edit, changed) = ctx
                .writer
                .edit_node_changing(&target, Some(node), |n| out_of_service::add(n, &remediation))
                .await?;
            if !changed {
                return Ok(None);
            }
            let text = format!(
                "node {name} confirmed down ({why}): out-of-service taint added, so the controller manager \
                 force-deletes its pods stuck terminating and detaches their volumes"
            );
            tracing::info!(node = %name, %remediation, "{text}");
            (
                edit,
                Note::new(reasons::OUT_OF_SERVICE, EventType::Warning, &text),
                Some(remediation),
            )
        }
        Verdict::Lift => {
            let (edit, changed) = ctx
                .writer
                .edit_node_changing(&target, Some(node), out_of_service::lift)
                .await?;
            if !changed {
                return Ok(None);
            }
            let text = format!("node {name} reports again (Ready=True): the out-of-service taint is lifted");
            tracing::info!(node = %name, "{text}");
            (
                edit,
                Note::new(reasons::BACK_IN_SERVICE, EventType::Normal, &text),
                None,
            )
        }
    };
    if let NodeEdit::Written(written) = edit {
        ctx.writer
            .publish(written.as_ref(), said.event("OutOfService"))
            .await;
        if let Some((record, _)) = remediation.and_then(|r| shut.filter(|(x, _)| x.name_any() == r)) {
            ctx.writer.publish(*record, said.event("OutOfService")).await;
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use gpu_remediation_api::{
        GpuRemediationStatus,
        constants::{OUT_OF_SERVICE_BY_ANNOTATION, OUT_OF_SERVICE_TAINT_KEY},
        object_reference::ObjectReference,
        policy::Action,
    };
    use jiff::SignedDuration;
    use k8s_openapi::{
        api::core::v1::{NodeCondition, Taint},
        apimachinery::pkg::apis::meta::v1::Time,
    };

    use crate::{
        test_fixtures::{node, remediation},
        write::recording::context,
    };

    const READINESS: &str = "readiness.k8s.io/gpu-driver-ready";

    #[tokio::test]
    async fn a_replaced_node_down_past_the_bound_gets_the_taint_in_one_edit_keeping_the_others() {
        let now = jiff::Timestamp::now();
        let mut dead = node("gpu-1", Some(now - SignedDuration::from_secs(900)));
        dead.status
            .as_mut()
            .unwrap()
            .conditions
            .as_mut()
            .unwrap()
            .push(NodeCondition {
                type_: "Ready".into(),
                status: "Unknown".into(),
                last_transition_time: Some(Time(now - SignedDuration::from_secs(120))),
                ..NodeCondition::default()
            });
        dead.spec.as_mut().unwrap().taints = Some(vec![Taint {
            key: READINESS.into(),
            effect: "NoSchedule".into(),
            ..Taint::default()
        }]);
        let mut record = remediation("r-1", "gpu-1", "p", None, Action::Replace);
        let (ctx, recording) = context(Vec::new(), vec![record.clone()], vec![dead.clone()]);
        let records = vec![std::sync::Arc::new(record.clone())];

        super::apply(&ctx, &records, &[]).await.expect("decided");
        assert!(
            recording.writes().is_empty(),
            "not triggered yet: nothing written"
        );

        record.status = Some(GpuRemediationStatus {
            replacement: Some(ObjectReference {
                api_version: "cluster.x-k8s.io/v1beta1".into(),
                kind: "Machine".into(),
                name: "gpu-1-abcde".into(),
                namespace: Some("capi".into()),
                uid: None,
            }),
            ..GpuRemediationStatus::default()
        });
        let records = vec![std::sync::Arc::new(record)];
        super::apply(&ctx, &records, &[]).await.expect("decided");
        assert_eq!(recording.writes(), ["PATCH /api/v1/nodes/gpu-1"]);
        let written = recording.object("/api/v1/nodes/gpu-1").expect("the node");
        let keys: Vec<&str> = written["spec"]["taints"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|t| t["key"].as_str())
            .collect();
        assert_eq!(keys, [READINESS, OUT_OF_SERVICE_TAINT_KEY]);
        assert_eq!(
            written["metadata"]["annotations"][OUT_OF_SERVICE_BY_ANNOTATION],
            "r-1"
        );
        let patch = recording.first_patch().expect("the patch");
        assert_eq!(
            patch.body["metadata"]["resourceVersion"], "1",
            "over the version read: the taints are one list"
        );
    }
}
