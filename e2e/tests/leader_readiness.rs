//! `/readyz` of a replica that cannot take part in the leader election: the controller binary
//! under the shipped RBAC (the Lease Role granted in its own namespace only), started with
//! `--lease-namespace` naming another namespace, which does not exist: it is not ready and says it
//! has no permission on the Lease; granted Lease rights everywhere, it is still not ready and says
//! the Lease cannot be created (no such namespace); once the namespace exists, it leads and is
//! ready. It takes its initial list of nodes streamed, as the real API server serves it.

mod leader_support;

use std::time::Duration;

use e2e::eventually;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role};
use kube::{Api, api::PostParams};
use leader_support::{
    ReplicaOptions, ReplicaProcess, cluster, controller_account, create_namespace, kubeconfig_with_token,
    lease_holder,
};
use serde_json::json;

async fn readyz_until(replica: &ReplicaProcess, what: &str, wanted: impl Fn(u16, &str) -> bool) -> String {
    eventually(what, Duration::from_secs(60), || async {
        let (status, body) = replica.get("/readyz").await?;
        wanted(status, &body).then_some(body)
    })
    .await
}

#[tokio::test]
async fn a_replica_that_cannot_take_part_in_the_election_is_not_ready_and_says_why() {
    let cluster = cluster().await;
    let admin = cluster.control_plane.client();
    let test = format!("readiness-{}", std::process::id());
    let home = format!("{test}-ctrl");
    let elsewhere = format!("{test}-leases");
    create_namespace(&admin, &home).await;
    let token = controller_account(&admin, &home, "controller").await;
    let kubeconfig = kubeconfig_with_token(cluster, &test, &token);
    let mut replica = ReplicaProcess::start(
        cluster,
        ReplicaOptions {
            identity: &test,
            lease_namespace: &elsewhere,
            kubeconfig: &kubeconfig,
            policy_selector: &format!("e2e={test}"),
            // The fence watches the Lease of the account's namespace, not this one: this test is
            // about taking part in the election (`fence_hardening` is about the fence).
            extra_args: vec!["--allow-unfenced".to_owned()],
        },
    )
    .await;

    // The API server checks permission before the namespace: first it says forbidden.
    let body = readyz_until(&replica, "503 naming the missing permission", |status, body| {
        status == 503 && body.contains("no permission on the leader Lease")
    })
    .await;
    assert!(
        body.contains(&format!("{elsewhere}/gpu-remediator")) && body.contains("forbidden"),
        "{body}\n{}",
        replica.log_tail()
    );
    assert!(
        replica.exited().is_none(),
        "it keeps trying: {}",
        replica.log_tail()
    );

    // Lease rights everywhere (the Lease Role's rules, cluster-wide): now the namespace is missing.
    let rules = Api::<Role>::namespaced(admin.clone(), &home)
        .get("controller")
        .await
        .expect("the Lease Role")
        .rules;
    let role: ClusterRole = serde_json::from_value(json!({"metadata": {"name": test}})).unwrap();
    let role = ClusterRole { rules, ..role };
    Api::<ClusterRole>::all(admin.clone())
        .create(&PostParams::default(), &role)
        .await
        .expect("a cluster-wide Lease role");
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": test},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": test},
        "subjects": [{"kind": "ServiceAccount", "name": "controller", "namespace": home}],
    }))
    .unwrap();
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await
        .expect("its binding");
    let body = readyz_until(&replica, "503 naming the missing namespace", |status, body| {
        status == 503 && body.contains("cannot be created")
    })
    .await;
    assert!(
        body.contains("not found") && body.contains("--lease-namespace"),
        "{body}"
    );

    create_namespace(&admin, &elsewhere).await;
    let body = readyz_until(&replica, "200 once it may elect", |status, _| status == 200).await;
    assert_eq!(body.trim(), "ready");
    assert!(
        lease_holder(&admin, &elsewhere)
            .await
            .is_some_and(|holder| holder.starts_with(&test)),
        "it leads"
    );
    // Under the shipped RBAC it took its initial list of nodes streamed, as the real API server
    // serves it (one watch instead of pages; see `observe::initial_list`), without falling back.
    let log = replica.log_text();
    assert!(
        log.contains(r#""message":"an initial list was streamed""#)
            && !log.contains("a streamed initial list failed"),
        "{}",
        replica.log_tail()
    );
    replica.terminate().await;
}
