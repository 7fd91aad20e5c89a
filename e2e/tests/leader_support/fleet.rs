//! What the replicas act on: a fleet whose deleted nodes the sandbox's node-group provider
//! replaces, pods pinned to the node that breaks, a `DeleteNode` policy over the fleet, replicas
//! started one leading and one following, and the wait for a remediation to succeed.

use std::{sync::Arc, time::Duration};

use e2e::eventually;
use gpu_remediation_api::{GpuRemediation, GpuRemediationPolicy, Phase, constants::NODE_LABEL};
use gpu_sandbox::{
    Fleet, FleetOptions,
    fleet::FLEET_LABEL,
    provider::{Provider, ProviderKind},
    workload::{self, Workload},
};
use kube::{
    Api, Client,
    api::{ListParams, PostParams},
};
use serde_json::json;

use super::{
    AuditedCluster, ReplicaOptions, ReplicaProcess, controller_account, kubeconfig_with_token, lease_holder,
};

/// A fleet of `nodes` named after (and labelled) `name`, and the node-group provider that replaces
/// its deleted nodes.
pub async fn fleet_with_provider(admin: &Client, name: &str, nodes: usize) -> (Arc<Fleet>, Provider) {
    let options = FleetOptions {
        nodes,
        name_prefix: name.to_owned(),
        ..FleetOptions::default()
    };
    let fleet = Arc::new(Fleet::start(admin.clone(), options).await.expect("fleet"));
    let provider = Provider::start(admin.clone(), Arc::clone(&fleet), ProviderKind::NodeGroup)
        .await
        .expect("provider");
    (fleet, provider)
}

/// The `inference` Deployment of `replicas` pods pinned to `node`, in `namespace`, running.
pub async fn inference_on(admin: &Client, namespace: &str, node: &str, replicas: i32) {
    let app = Workload::new(namespace, "inference")
        .replicas(replicas)
        .on_nodes(&[node]);
    workload::create(admin, &app.deployment())
        .await
        .expect("deployment");
    workload::wait_ready_pods(
        admin,
        namespace,
        &app.selector(),
        usize::try_from(replicas).expect("a count"),
        Duration::from_secs(60),
    )
    .await
    .expect("pods");
}

/// Creates policy `name` (labelled `e2e=<name>`): the fleet `name`'s nodes replaced
/// (`DeleteNode`, no node group: the record ends "replacement not seen" 15 s after the delete)
/// after `GpuHealthy=False` for 1 s, under `safety`, and `drain` where given.
pub async fn create_replace_policy(
    admin: &Client,
    name: &str,
    safety: serde_json::Value,
    drain: Option<serde_json::Value>,
) {
    let mut spec = json!({
        "nodeSelector": {"matchLabels": {FLEET_LABEL: name}},
        "triggers": [{"conditionType": "GpuHealthy", "status": "False", "for": "1s"}],
        "action": "Replace",
        "replacement": {"strategy": "DeleteNode", "timeout": "15s"},
        "safety": safety,
    });
    if let Some(drain) = drain {
        spec["drain"] = drain;
    }
    let policy: GpuRemediationPolicy = serde_json::from_value(json!({
        "apiVersion": "gpuremediation.dev/v1alpha1",
        "kind": "GpuRemediationPolicy",
        "metadata": {"name": name, "labels": {"e2e": name}},
        "spec": spec,
    }))
    .expect("a policy");
    Api::<GpuRemediationPolicy>::all(admin.clone())
        .create(&PostParams::default(), &policy)
        .await
        .expect("policy");
}

/// Starts the replicas `leader` and `follower`, each under an account of its own in `namespace`
/// (its Lease's too) and enforcing the policies labelled `e2e=<scope>`; `leader` first, waited for
/// until it leads (within `lead_within`).
pub async fn start_leader_then_follower(
    cluster: &AuditedCluster,
    namespace: &str,
    scope: &str,
    [leader, follower]: [&str; 2],
    lead_within: Duration,
) -> (ReplicaProcess, ReplicaProcess) {
    let admin = cluster.control_plane.client();
    let selector = format!("e2e={scope}");
    let mut replicas = Vec::new();
    for identity in [leader, follower] {
        let token = controller_account(&admin, namespace, identity).await;
        let kubeconfig = kubeconfig_with_token(cluster, identity, &token);
        let options = ReplicaOptions {
            identity,
            lease_namespace: namespace,
            kubeconfig: &kubeconfig,
            policy_selector: &selector,
            extra_args: Vec::new(),
        };
        replicas.push(ReplicaProcess::start(cluster, options).await);
        if identity == leader {
            let prefix = format!("{leader}_");
            eventually(&format!("{leader} to lead"), lead_within, || async {
                lease_holder(&admin, namespace)
                    .await
                    .is_some_and(|h| h.starts_with(&prefix))
                    .then_some(())
            })
            .await;
        }
    }
    let follower = replicas.pop().expect("follower");
    let leader = replicas.pop().expect("leader");
    (leader, follower)
}

/// The remediations of `node`.
pub async fn remediations_of(client: &Client, node: &str) -> Vec<GpuRemediation> {
    Api::<GpuRemediation>::all(client.clone())
        .list(&ListParams::default().labels(&format!("{NODE_LABEL}={node}")))
        .await
        .expect("listing remediations")
        .items
}

/// Breaks the GPU of `node` and waits (up to 120 s) until `replica` has carried its remediation to
/// `Succeeded`; a `Failed` one panics with the replica's log.
pub async fn break_and_wait_succeeded(admin: &Client, node: &str, replica: &ReplicaProcess) {
    gpu_sandbox::fault::set_gpu_condition(admin, node, "False", "XID79", "GPU fell off the bus")
        .await
        .expect("fault");
    let remediations: Api<GpuRemediation> = Api::all(admin.clone());
    eventually("the remediation to succeed", Duration::from_secs(120), || async {
        let list = remediations
            .list(&ListParams::default().labels(&format!("{NODE_LABEL}={node}")))
            .await
            .ok()?;
        let phase = list.items.first()?.status.as_ref()?.phase;
        assert_ne!(
            phase,
            Phase::Failed,
            "--- {} log ---\n{}",
            replica.identity,
            replica.log_tail()
        );
        (phase == Phase::Succeeded).then_some(())
    })
    .await;
}
