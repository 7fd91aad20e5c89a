//! e2e: the agent's rights. Its role (`manifests/agent/rbac.yaml`) lets it read its node and write
//! node status (its condition and hardware annotations ride on it) and nothing else, and the
//! agent's manifests are accepted by the API server.

#[macro_use]
mod agent_support;
mod common;

use std::path::Path;

use agent_support::{AGENT_NAMESPACE, agent_kubeconfig, fleet, scratch};
use gpu_remediation_api::constants::{FAILED_GPUS_ANNOTATION, GPU_INVENTORY_ANNOTATION};
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client,
    api::{ListParams, Patch, PatchParams},
};
use serde_json::{Value, json};

/// A client authenticated as the agent, from the kubeconfig the agents use.
async fn client_from(kubeconfig: &Path) -> Client {
    let file = kube::config::Kubeconfig::read_from(kubeconfig).expect("agent kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
        .await
        .expect("agent client config");
    Client::try_from(config).expect("agent client")
}

fn is_forbidden<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> bool {
    matches!(result, Err(kube::Error::Api(status)) if status.code == 403)
}

#[tokio::test]
async fn the_agents_role_writes_node_status_and_nothing_else() {
    let cluster = common::cluster().await;
    let admin = cluster.client();
    let dir = scratch("rbac");
    let agent = client_from(&agent_kubeconfig(&admin, &dir).await).await;
    let fleet = fleet(&admin, 1).await;
    let node = fleet.node_names().remove(0);
    let nodes: Api<Node> = Api::all(agent.clone());

    nodes.get(&node).await.expect("the agent reads its node");
    // What the agent writes: its condition and its two hardware annotations, through nodes/status.
    let condition = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": node, "annotations": {GPU_INVENTORY_ANNOTATION: "[]", FAILED_GPUS_ANNOTATION: "[]"}},
        "status": {"conditions": [{"type": "GpuHealthy", "status": "True", "reason": "GpusHealthy", "message": "ok"}]},
    });
    let written = nodes
        .patch_status(
            &node,
            &PatchParams::apply("gpu-health-agent").force(),
            &Patch::Apply(&condition),
        )
        .await
        .expect("the agent applies its condition and annotations");
    let annotations = written.metadata.annotations.unwrap_or_default();
    assert_eq!(
        annotations.get(GPU_INVENTORY_ANNOTATION).map(String::as_str),
        Some("[]")
    );
    assert_eq!(
        annotations.get(FAILED_GPUS_ANNOTATION).map(String::as_str),
        Some("[]")
    );

    let cordon = Patch::Merge(json!({"spec": {"unschedulable": true}}));
    assert!(
        is_forbidden(nodes.patch(&node, &PatchParams::default(), &cordon).await),
        "cordon"
    );
    let relabel = Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}}));
    assert!(
        is_forbidden(nodes.patch(&node, &PatchParams::default(), &relabel).await),
        "node metadata"
    );
    let annotate = Patch::Merge(json!({"metadata": {"annotations": {GPU_INVENTORY_ANNOTATION: "[]"}}}));
    assert!(
        is_forbidden(nodes.patch(&node, &PatchParams::default(), &annotate).await),
        "annotations through nodes itself"
    );
    assert!(
        is_forbidden(nodes.delete(&node, &kube::api::DeleteParams::default()).await),
        "delete node"
    );
    assert!(
        is_forbidden(nodes.list(&ListParams::default()).await),
        "list nodes"
    );
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::all(agent.clone());
    assert!(is_forbidden(pods.list(&ListParams::default()).await), "list pods");
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(agent, AGENT_NAMESPACE);
    assert!(
        is_forbidden(secrets.list(&ListParams::default()).await),
        "read secrets"
    );
    fleet.stop().await.expect("stopping the fleet");
}

#[tokio::test]
async fn the_agent_manifests_are_accepted_by_the_api_server() {
    let admin = common::cluster().await.client();
    agent_kubeconfig(&admin, &scratch("manifests")).await;
    let strict = PatchParams::apply("e2e")
        .dry_run()
        .validation(kube::api::ValidationDirective::Strict);
    for (file, yaml) in [
        (
            "daemonset.yaml",
            include_str!("../../manifests/agent/daemonset.yaml"),
        ),
        (
            "xid-catalog-override.yaml",
            include_str!("../../manifests/agent/xid-catalog-override.yaml"),
        ),
    ] {
        let object: Value = serde_yaml::from_str(yaml).unwrap_or_else(|e| panic!("{file}: {e}"));
        let name = object["metadata"]["name"].as_str().unwrap().to_owned();
        let result = match object["kind"].as_str() {
            Some("DaemonSet") => {
                let tolerations = &object["spec"]["template"]["spec"]["tolerations"];
                assert_eq!(
                    tolerations,
                    &json!([{"operator": "Exists"}]),
                    "tolerates every taint"
                );
                Api::<k8s_openapi::api::apps::v1::DaemonSet>::namespaced(admin.clone(), AGENT_NAMESPACE)
                    .patch(&name, &strict, &Patch::Apply(&object))
                    .await
                    .map(drop)
            }
            Some("ConfigMap") => {
                Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(admin.clone(), AGENT_NAMESPACE)
                    .patch(&name, &strict, &Patch::Apply(&object))
                    .await
                    .map(drop)
            }
            other => panic!("unexpected kind {other:?} in {file}"),
        };
        result.unwrap_or_else(|e| panic!("the API server refused {file}: {e}"));
    }
}
