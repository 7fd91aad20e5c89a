//! The demo's quarantine moment: while the trigger's `for` runs, the broken node already carries
//! the controller's quarantine taint, and a new GPU pod aimed at exactly that node is held off it
//! (the scheduler leaves it Pending and names the taint). The pod is deleted afterwards.

use std::time::{Duration, Instant};

use gpu_remediation_api::constants::QUARANTINE_TAINT_KEY;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api, Client,
    api::{DeleteParams, ObjectMeta, PostParams},
};

use crate::workload::Workload;

/// What the demo shows.
#[derive(Clone, Debug)]
pub struct HeldOff {
    /// From the fault to the taint seen on the node.
    pub quarantined_after: Duration,
    /// The pod aimed at the node.
    pub pod: String,
    /// The scheduler's message on the Pending pod.
    pub scheduler_says: String,
}

/// Waits (up to `within`) for `node`'s quarantine, then creates a one-GPU pod in `namespace`
/// that may run only on `node`, waits for the scheduler to leave it Pending, and deletes it.
pub async fn show(
    admin: &Client,
    namespace: &str,
    node: &str,
    fault_at: Instant,
    within: Duration,
) -> Result<HeldOff, String> {
    let deadline = Instant::now() + within;
    let nodes = Api::<Node>::all(admin.clone());
    loop {
        let seen = nodes
            .get(node)
            .await
            .map_err(|e| format!("reading node {node}: {e}"))?;
        let quarantined = seen
            .spec
            .and_then(|s| s.taints)
            .is_some_and(|ts| ts.iter().any(|t| t.key == QUARANTINE_TAINT_KEY));
        if quarantined {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{node} carries no {QUARANTINE_TAINT_KEY} taint {within:?} after the fault"
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let quarantined_after = fault_at.elapsed();
    let pods = Api::<Pod>::namespaced(admin.clone(), namespace);
    let name = format!("new-job-on-{node}");
    let template = Workload::new(namespace, "new-job")
        .gpus(1)
        .on_nodes(&[node])
        .pod_template();
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..template.metadata.unwrap_or_default()
        },
        spec: template.spec,
        status: None,
    };
    pods.create(&PostParams::default(), &pod)
        .await
        .map_err(|e| format!("creating pod {name}: {e}"))?;
    let verdict = async {
        loop {
            let current = pods
                .get(&name)
                .await
                .map_err(|e| format!("reading pod {name}: {e}"))?;
            if let Some(bound) = current.spec.as_ref().and_then(|s| s.node_name.clone()) {
                return Err(format!("pod {name} was bound to {bound} despite the quarantine"));
            }
            let unschedulable = current
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .into_iter()
                .find(|c| c.type_ == "PodScheduled" && c.status == "False");
            if let Some(message) = unschedulable.and_then(|c| c.message) {
                return Ok(message);
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "the scheduler said nothing about pod {name} within {within:?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    .await;
    let deleted = pods
        .delete(&name, &DeleteParams::default().grace_period(0))
        .await
        .map(|_| ())
        .map_err(|e| format!("deleting pod {name}: {e}"));
    let scheduler_says = verdict?;
    deleted?;
    Ok(HeldOff {
        quarantined_after,
        pod: name,
        scheduler_says,
    })
}
