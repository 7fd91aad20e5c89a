//! The fence's hardening (issue 39), on the real control plane, with the controller's real RBAC:
//!
//! - a missing Lease fails closed: with the shipped fence installed and no Lease, a write of the
//!   controller's account to an object labelled `gpuremediation.dev/fenced` is refused whatever
//!   claim it carries (or none), while another user's unlabelled write is admitted and the account
//!   may still create the Lease (the bootstrap); then the Lease's claim is admitted and another
//!   refused;
//! - without the fence policy the controller binary does not lead: it releases the Lease, `/readyz`
//!   answers 503 saying why, `/metrics` shows `fence_unproven 1`, and it makes no write but its
//!   Lease's and its dry-run probes; once the policy is installed it leads and is ready;
//! - two processes in one pod position (one name, different UIDs) have different identities, so a
//!   take-over between them is a new claim.

mod leader_support;

use std::time::Duration;

use e2e::eventually;
use gpu_remediation_api::GpuRemediation;
use k8s_openapi::api::{coordination::v1::Lease, core::v1::ConfigMap};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};
use leader_support::{
    ReplicaOptions, ReplicaProcess, cluster, controller_account, create_namespace, install_fence,
    kubeconfig_with_token, lease_holder, mutating_requests, requests_of, unfenced_controller_account,
    username,
};
use serde_json::json;

/// A dry-run create, as the controller's account, of a remediation labelled as the controller
/// labels what it writes under the Lease in `namespace`, carrying `claim` (none: no annotation);
/// the refusal's message (403 from the policy, 422 from a binding that found no Lease), or `None`
/// when admitted.
async fn labelled_write(controller: &Client, namespace: &str, claim: Option<&str>) -> Option<String> {
    let annotations = claim.map_or_else(|| json!({}), |claim| json!({"gpuremediation.dev/claim": claim}));
    let object: GpuRemediation = serde_json::from_value(json!({
        "apiVersion": "gpuremediation.dev/v1alpha1",
        "kind": "GpuRemediation",
        "metadata": {
            "name": "fence-hardening",
            "labels": {"gpuremediation.dev/fenced": namespace},
            "annotations": annotations,
        },
        "spec": {
            "nodeName": "gpu-0",
            "policyName": "fence-hardening",
            "trigger": {"conditionType": "GpuHealthy", "status": "False"},
            "action": "None",
        },
    }))
    .expect("a remediation");
    let params = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    match Api::<GpuRemediation>::all(controller.clone())
        .create(&params, &object)
        .await
    {
        Ok(_) => None,
        Err(kube::Error::Api(status)) if matches!(status.code, 403 | 422) => Some(status.message),
        Err(error) => panic!("the write failed otherwise: {error}"),
    }
}

#[tokio::test]
async fn a_missing_lease_refuses_every_claim_yet_lets_the_controller_create_it() {
    let cluster = cluster().await;
    let admin = cluster.control_plane.client();
    let namespace = format!("missing-lease-{}", std::process::id());
    create_namespace(&admin, &namespace).await;
    let token = controller_account(&admin, &namespace, "controller").await;
    let controller = cluster.control_plane.client_with_token(&token);

    // The policy takes a moment to load; then a missing Lease refuses any claim, and none.
    let refused = eventually(
        "a write refused for the missing Lease",
        Duration::from_secs(30),
        || labelled_write(&controller, &namespace, Some("replica-a/0")),
    )
    .await;
    assert!(
        refused.contains("gpu-remediator-fence-missing-lease") && refused.contains("no params found"),
        "{refused}"
    );
    for claim in [Some("replica-b/7"), Some(""), None] {
        let refused = labelled_write(&controller, &namespace, claim)
            .await
            .unwrap_or_else(|| panic!("the claim {claim:?} was admitted without a Lease"));
        assert!(refused.contains("no params found"), "{refused}");
    }

    // Nobody else is locked out: an admin's write of an unlabelled object is admitted.
    let config_map: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "unrelated"}})).unwrap();
    Api::<ConfigMap>::namespaced(admin.clone(), &namespace)
        .create(&PostParams::default(), &config_map)
        .await
        .expect("an admin's unlabelled write is admitted without the Lease");

    // The bootstrap: the controller's account creates the Lease (its writes are not fenced)...
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some("gpu-remediator".to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(
            serde_json::from_value(
                json!({"holderIdentity": "replica-a", "leaseTransitions": 0, "leaseDurationSeconds": 15}),
            )
            .unwrap(),
        ),
    };
    Api::<Lease>::namespaced(controller.clone(), &namespace)
        .create(&PostParams::default(), &lease)
        .await
        .expect("the controller creates its Lease while the fence is closed");
    // ...and then its claim is admitted (once the policy's cache has the Lease), another refused.
    eventually("the Lease's claim admitted", Duration::from_secs(30), || async {
        labelled_write(&controller, &namespace, Some("replica-a/0"))
            .await
            .is_none()
            .then_some(())
    })
    .await;
    let stale = labelled_write(&controller, &namespace, Some("replica-z/0"))
        .await
        .expect("another claim is refused");
    assert!(
        stale.contains("fenced: this write carries the claim replica-z/0")
            && stale.contains("current claim is replica-a/0"),
        "{stale}"
    );
}

#[tokio::test]
async fn without_the_fence_policy_the_controller_refuses_to_lead_and_says_why() {
    let cluster = cluster().await;
    let admin = cluster.control_plane.client();
    let namespace = format!("unfenced-{}", std::process::id());
    create_namespace(&admin, &namespace).await;
    let token = unfenced_controller_account(&admin, &namespace, "controller").await;
    let kubeconfig = kubeconfig_with_token(cluster, &namespace, &token);
    let mut replica = ReplicaProcess::start(
        cluster,
        ReplicaOptions {
            identity: &namespace,
            lease_namespace: &namespace,
            kubeconfig: &kubeconfig,
            policy_selector: &format!("e2e={namespace}"),
            extra_args: Vec::new(),
        },
    )
    .await;

    let body = eventually(
        "503 naming the unproven fence",
        Duration::from_secs(60),
        || async {
            let (status, body) = replica.get("/readyz").await?;
            (status == 503 && body.contains("refusing to lead")).then_some(body)
        },
    )
    .await;
    assert!(
        body.contains("fence is not proven enforced") && body.contains("stale claim was admitted"),
        "{body}\n{}",
        replica.log_tail()
    );
    let (_, metrics) = replica.get("/metrics").await.expect("/metrics");
    assert!(
        metrics.contains("gpu_remediator_fence_unproven 1") && metrics.contains("gpu_remediator_leader 0"),
        "{metrics}"
    );
    assert!(
        replica.log_text().contains("refusing to lead"),
        "{}",
        replica.log_tail()
    );
    assert_eq!(
        lease_holder(&admin, &namespace).await,
        None,
        "it released the Lease"
    );
    let account = username(&namespace, "controller");
    let acting: Vec<_> = mutating_requests(cluster, &account)
        .into_iter()
        .filter(|event| !event.is_lease_write())
        .map(|event| event.describe())
        .collect();
    assert!(acting.is_empty(), "it acted unfenced: {acting:#?}");
    let probes = requests_of(cluster, &account)
        .into_iter()
        .filter(|event| event.is_dry_run() && event.resource == "gpuremediations")
        .count();
    assert!(probes >= 2, "the refusal came from probes: {probes}");

    install_fence(&admin, &namespace).await;
    eventually(
        "ready once the fence is in force",
        Duration::from_secs(90),
        || async {
            let (status, body) = replica.get("/readyz").await?;
            (status == 200 && body.trim() == "ready").then_some(())
        },
    )
    .await;
    assert!(
        lease_holder(&admin, &namespace)
            .await
            .is_some_and(|holder| holder.starts_with(&format!("{namespace}_"))),
        "it leads"
    );
    let (_, metrics) = replica.get("/metrics").await.expect("/metrics");
    assert!(
        metrics.contains("gpu_remediator_fence_unproven 0") && metrics.contains("gpu_remediator_leader 1"),
        "{metrics}"
    );
    replica.terminate().await;
}

#[tokio::test]
async fn two_processes_of_one_pod_name_with_different_uids_have_different_identities() {
    let cluster = cluster().await;
    let admin = cluster.control_plane.client();
    let namespace = format!("same-pod-{}", std::process::id());
    create_namespace(&admin, &namespace).await;
    let token = controller_account(&admin, &namespace, "controller").await;
    let kubeconfig = kubeconfig_with_token(cluster, &namespace, &token);
    let options = || ReplicaOptions {
        identity: "gpu-remediator-0",
        lease_namespace: &namespace,
        kubeconfig: &kubeconfig,
        policy_selector: "e2e=same-pod",
        extra_args: Vec::new(),
    };
    let mut first = ReplicaProcess::start_with_env(cluster, options(), &[("POD_UID", "uid-1")]).await;
    let first_holder = eventually("the first to lead", Duration::from_secs(60), || {
        lease_holder(&admin, &namespace)
    })
    .await;
    assert!(
        first_holder.starts_with("gpu-remediator-0_uid-1_"),
        "{first_holder}"
    );
    let mut second = ReplicaProcess::start_with_env(cluster, options(), &[("POD_UID", "uid-2")]).await;
    eventually("the second to start", Duration::from_secs(30), || async {
        second
            .log_text()
            .contains("gpu-remediator-0_uid-2_")
            .then_some(())
    })
    .await;

    // The leader dies without releasing: the other process of the same pod name takes over under
    // its own identity, so with a new claim (holder and transitions).
    first.kill_9().await;
    let second_holder = eventually("the second to lead", Duration::from_secs(60), || async {
        lease_holder(&admin, &namespace)
            .await
            .filter(|holder| holder != &first_holder)
    })
    .await;
    assert!(
        second_holder.starts_with("gpu-remediator-0_uid-2_"),
        "{second_holder}"
    );
    let transitions = Api::<Lease>::namespaced(admin.clone(), &namespace)
        .get("gpu-remediator")
        .await
        .expect("the Lease")
        .spec
        .and_then(|spec| spec.lease_transitions);
    assert!(transitions.is_some_and(|t| t >= 1), "{transitions:?}");
    second.terminate().await;
}
