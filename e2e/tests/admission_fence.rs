//! The fence the API server enforces (`manifests/controller/fence-policy.yaml`, in the base): with
//! the controller's Lease naming `replica-b` after 4 transitions, every kind of write the
//! controller makes as its service account (an eviction, a remediation create, a cordon, a status
//! write, a finalizer patch, a remediation delete and a node delete, each through the controller's
//! own code) is refused when its fence carries a stale claim (`replica-a/3`, a deposed leader) or
//! none, with the policy's message, and admitted when it carries the current one. A status write
//! decided from an older version conflicts instead of overwriting, and a delete of an object whose
//! last fenced write is stale is refused even without a stamp.

mod common;

use std::time::Duration;

use common::{cluster, eventually};
use gpu_remediation_api::{
    GpuRemediation, GpuRemediationStatus, Phase,
    constants::REMEDIATION_FINALIZER,
    policy::{Replacement, Strategy},
};
use gpu_remediator::{
    act::replace::Replacers,
    drain::Leaving,
    leader::Fence,
    lifecycle::{EvictionAnswer, NodeRef},
    observe::CachedNode,
    write::{NodeEdit, Writer},
};
use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{Node, Pod, ServiceAccount},
    rbac::v1::{ClusterRole, ClusterRoleBinding},
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams},
    runtime::events::Reporter,
};
use serde_json::json;

const NAMESPACE: &str = "gpu-remediation";
const STALE: &str = "fenced: this write carries the claim replica-a/3";
const ACCOUNT: &str = "gpu-remediator";

/// The controller's service account with eviction rights only, and a token of it.
async fn controller_token(admin: &Client) -> String {
    let account = ServiceAccount {
        metadata: ObjectMeta {
            name: Some(ACCOUNT.into()),
            ..ObjectMeta::default()
        },
        ..ServiceAccount::default()
    };
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), NAMESPACE);
    let _ = accounts.create(&PostParams::default(), &account).await;
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": "e2e-fence-evictions"},
        "rules": [{"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
                  {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "update", "patch", "delete"]},
                  {"apiGroups": ["gpuremediation.dev"], "resources": ["gpuremediations"],
                   "verbs": ["get", "create", "update", "patch", "delete"]},
                  {"apiGroups": ["gpuremediation.dev"], "resources": ["gpuremediations/status"],
                   "verbs": ["get", "patch", "update"]}],
    }))
    .unwrap();
    Api::<ClusterRole>::all(admin.clone())
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "e2e-fence-evictions"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "e2e-fence-evictions"},
        "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": NAMESPACE}],
    }))
    .unwrap();
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    let request = serde_json::from_value(json!({"spec": {"expirationSeconds": 3600}})).unwrap();
    accounts
        .create_token_request(ACCOUNT, &PostParams::default(), &request)
        .await
        .expect("a token")
        .status
        .expect("a token status")
        .token
}

async fn pod(admin: &Client, node: &str) -> Leaving {
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": common::unique_name("evictee"), "namespace": "default"},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "e2e:none"}]},
    }))
    .unwrap();
    let pod = Api::<Pod>::namespaced(admin.clone(), "default")
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    Leaving {
        namespace: "default".into(),
        name: pod.name_any(),
        uid: pod.uid().unwrap(),
        terminating: false,
        gone_by: None,
        labels: std::collections::BTreeMap::new(),
        readiness: gpu_remediator::drain::Readiness::Ready,
        notice: gpu_remediator::drain::Notice::default(),
        gpus: 0,
    }
}

fn remediation(node: &str) -> GpuRemediation {
    serde_json::from_value(json!({
        "apiVersion": "gpuremediation.dev/v1alpha1", "kind": "GpuRemediation",
        "metadata": {"name": format!("{node}-fence"), "finalizers": [REMEDIATION_FINALIZER]},
        "spec": {"nodeName": node, "policyName": "p", "action": "None",
                 "trigger": {"conditionType": "GpuHealthy", "status": "False"}},
    }))
    .unwrap()
}

fn ops(client: &Client, fence: Fence) -> Writer {
    let reporter = Reporter {
        controller: "gpu-remediator".into(),
        instance: Some("e2e-fence".into()),
    };
    Writer::from_clients(client.clone(), client.clone(), fence, reporter)
}

#[tokio::test]
async fn an_eviction_with_a_stale_claim_is_refused_by_the_api_server_and_the_current_one_admitted() {
    let admin = cluster().await.client();
    common::kubectl_apply("manifests/namespace.yaml").await;
    for (_, yaml) in gpu_remediation_api::crds::render_all() {
        common::install_crd(&admin, &yaml).await;
    }
    let token = controller_token(&admin).await;
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": "gpu-remediator", "namespace": NAMESPACE},
        "spec": {"holderIdentity": "replica-b", "leaseTransitions": 4, "leaseDurationSeconds": 15},
    }))
    .unwrap();
    Api::<Lease>::namespaced(admin.clone(), NAMESPACE)
        .create(&PostParams::default(), &lease)
        .await
        .unwrap();
    common::kubectl_apply("manifests/controller/fence-policy.yaml").await;
    let fleet = common::fleet(1).await;
    let node = fleet.node_names()[0].clone();
    let controller = cluster().await.client_with_token(&token);

    let (fence, keeper) = Fence::keeper(None);
    keeper.hold_until(tokio::time::Instant::now() + Duration::from_secs(600));
    keeper.claimed_as("replica-a", 3);
    let deposed = ops(&controller, fence.clone());
    // Until the policy is loaded an eviction passes; each try uses a pod of its own.
    let (victim, message) = eventually("the stale claim refused", Duration::from_secs(30), || async {
        let victim = pod(&admin, &node).await;
        match deposed.evict(&victim, None, false).await {
            Err(error) => Some((victim, format!("{error:?}"))),
            Ok(EvictionAnswer::Refused(status)) => Some((victim, status.message)),
            Ok(_) => None,
        }
    })
    .await;
    assert!(
        message.contains("fenced: this write carries the claim replica-a/3")
            && message.contains("current claim is replica-b/4"),
        "{message}"
    );

    let created = deposed.create_remediation(&remediation(&node)).await;
    let message = format!("{created:?}");
    assert!(
        message.contains("fenced: this write carries the claim replica-a/3"),
        "{message}"
    );

    let unfenced = ops(&controller, Fence::standalone());
    let refused = unfenced.evict(&victim, None, false).await;
    let message = format!("{refused:?}");
    assert!(message.contains("carries the claim (none)"), "{message}");

    keeper.claimed_as("replica-b", 4);
    let current = ops(&controller, fence);
    let outcome = current
        .evict(&victim, None, false)
        .await
        .expect("the current claim is admitted");
    assert!(matches!(outcome, EvictionAnswer::Accepted), "{outcome:?}");
    let created = current
        .create_remediation(&remediation(&node))
        .await
        .expect("the current claim creates a remediation");
    assert_eq!(
        created
            .annotations()
            .get("gpuremediation.dev/claim")
            .map(String::as_str),
        Some("replica-b/4")
    );

    // The keeper above now names the current claim: a deposed leader's fence of its own.
    let (stale_fence, stale_keeper) = Fence::keeper(None);
    stale_keeper.hold_until(tokio::time::Instant::now() + Duration::from_secs(600));
    stale_keeper.claimed_as("replica-a", 3);
    let deposed = ops(&controller, stale_fence);
    node_edits_are_fenced_both_ways(&admin, &deposed, &current, &node).await;
    status_writes_are_fenced_and_preconditioned(&deposed, &current, &created).await;
    Box::pin(deletes_are_fenced(
        &admin,
        &controller,
        &deposed,
        &current,
        created,
        &node,
    ))
    .await;
    fleet.stop().await.expect("stopping the fleet");
}

/// Node edits, both ways a node is edited: read and replaced (nothing seen), and patched over the
/// node as seen (`node_patch`), which the policy sees as an update of the whole node.
async fn node_edits_are_fenced_both_ways(admin: &Client, deposed: &Writer, current: &Writer, node: &str) {
    let target = NodeRef {
        name: node.to_owned(),
        uid: None,
    };
    let nodes = Api::<Node>::all(admin.clone());
    let seen = nodes.get(node).await.unwrap();
    // What the controller's cache would hold of it.
    let cached = CachedNode::from(seen.clone());
    for seen in [None, Some(&cached)] {
        let cordon = deposed.cordon_node(&target, seen, "e2e-fence").await;
        let message = format!("{cordon:?}");
        assert!(message.contains(STALE), "seen {}: {message}", seen.is_some());
    }
    // The node as seen is behind (someone labelled and tainted it since): the patch over it
    // conflicts, and the edit is made again over the node as read, keeping their taint (a patch
    // applied over the stale taint list would have dropped it) and their label.
    let mut taints = seen
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    taints.push(k8s_openapi::api::core::v1::Taint {
        key: "e2e/meanwhile".into(),
        effect: "NoSchedule".into(),
        ..Default::default()
    });
    let meanwhile = json!({"metadata": {"labels": {"e2e/meanwhile": "1"}}, "spec": {"taints": taints}});
    nodes
        .patch(node, &PatchParams::default(), &Patch::Merge(&meanwhile))
        .await
        .unwrap();
    let NodeEdit::Written(cordoned) = current
        .cordon_node(&target, Some(&cached), "e2e-fence")
        .await
        .expect("the current claim cordons")
    else {
        panic!("the node exists")
    };
    assert_eq!(
        cordoned
            .annotations()
            .get("gpuremediation.dev/claim")
            .map(String::as_str),
        Some("replica-b/4")
    );
    assert_eq!(
        cordoned.labels().get("e2e/meanwhile").map(String::as_str),
        Some("1")
    );
    let kept = cordoned.spec.as_ref().and_then(|s| s.taints.as_ref());
    assert!(
        kept.is_some_and(|t| t.iter().any(|t| t.key == "e2e/meanwhile")),
        "{kept:?}"
    );
    assert_eq!(cordoned.spec.as_ref().and_then(|s| s.unschedulable), Some(true));
    // The release lifts our cordon, so it replaces a fresh read (which names the cordon's
    // manager), admitted under the current claim.
    let (NodeEdit::Written(released), None) = current
        .release_node(
            &target,
            Some(&CachedNode::from(*cordoned.clone())),
            "e2e-fence",
            "p",
            false,
        )
        .await
        .expect("the current claim releases")
    else {
        panic!("the node exists")
    };
    assert_eq!(released.spec.as_ref().and_then(|s| s.unschedulable), None);
    assert!(
        !released
            .annotations()
            .contains_key("gpuremediation.dev/cordoned-by")
    );
}

/// Status writes: the claim rides in `status.claim` (the status subresource drops metadata), and
/// the read's resourceVersion is a precondition.
async fn status_writes_are_fenced_and_preconditioned(
    deposed: &Writer,
    current: &Writer,
    created: &GpuRemediation,
) {
    let status = GpuRemediationStatus {
        phase: Phase::Cordoned,
        ..GpuRemediationStatus::default()
    };
    let refused = deposed.write_remediation_status(created, &status).await;
    let message = format!("{refused:?}");
    assert!(message.contains(STALE), "{message}");
    let written = current
        .write_remediation_status(created, &status)
        .await
        .expect("the current claim writes the status");
    let stored = written.status.as_ref().expect("a status");
    assert_eq!(stored.claim.as_deref(), Some("replica-b/4"));
    assert_eq!(stored.phase, Phase::Cordoned);
    // A status decided from the version before that write conflicts: it must not overwrite it.
    let older = GpuRemediationStatus {
        phase: Phase::Draining,
        ..GpuRemediationStatus::default()
    };
    let conflict = current.write_remediation_status(created, &older).await;
    assert!(
        matches!(&conflict, Err(e) if e.source.code() == Some(409)),
        "{conflict:?}"
    );
}

/// Deletes: the claim is stamped on the object just before, and the delete carries the stamp's
/// resourceVersion; a stale stamp is refused, and so is a delete of an object last written
/// under a stale claim.
async fn deletes_are_fenced(
    admin: &Client,
    controller: &Client,
    deposed: &Writer,
    current: &Writer,
    created: GpuRemediation,
    node: &str,
) {
    let remediations = Api::<GpuRemediation>::all(admin.clone());
    let name = created.name_any();
    let refused = deposed.delete_remediation(&name).await;
    let message = format!("{refused:?}");
    assert!(message.contains(STALE), "{message}");
    let latest = remediations.get(&name).await.expect("still there");
    let refused = deposed.drop_finalizer(&latest).await;
    let message = format!("{refused:?}");
    assert!(message.contains(STALE), "a finalizer patch: {message}");

    // Last written under the stale claim (as a deposed leader's stamp would leave it): a plain
    // delete by the controller's account is refused by the policy's delete rule.
    let stale = json!({"metadata": {"annotations": {"gpuremediation.dev/claim": "replica-a/3"}}});
    remediations
        .patch(&name, &PatchParams::default(), &Patch::Merge(&stale))
        .await
        .expect("the admin marks the record");
    let refused = Api::<GpuRemediation>::all(controller.clone())
        .delete(&name, &DeleteParams::default())
        .await;
    let message = format!("{refused:?}");
    assert!(
        message
            .contains("fenced: this delete (of an object last written under) carries the claim replica-a/3"),
        "{message}"
    );
    current
        .delete_remediation(&name)
        .await
        .expect("the current claim deletes (the record then waits on its finalizer)");
    let latest = remediations.get(&name).await.expect("held by its finalizer");
    assert!(latest.metadata.deletion_timestamp.is_some());
    current
        .drop_finalizer(&latest)
        .await
        .expect("the current claim drops the finalizer");

    let nodes = Api::<Node>::all(admin.clone());
    let target = remediation(node);
    let replacement = Replacement::default();
    let refused = Replacers::new(gpu_remediator::write::Writer::over(
        controller.clone(),
        deposed.fence().clone(),
    ))
    .for_strategy(Strategy::DeleteNode)
    .trigger(&target, &replacement)
    .await;
    let message = format!("{refused:?}");
    assert!(message.contains(STALE), "a node delete: {message}");
    assert!(nodes.get_opt(node).await.unwrap().is_some(), "the node stays");
    Replacers::new(gpu_remediator::write::Writer::over(
        controller.clone(),
        current.fence().clone(),
    ))
    .for_strategy(Strategy::DeleteNode)
    .trigger(&target, &replacement)
    .await
    .expect("the current claim deletes the node");
    assert!(nodes.get_opt(node).await.unwrap().is_none(), "the node is gone");
}
