//! The Helm chart as a cluster receives it: `helm template` of charts/gpu-remediator (default
//! values, every optional object on, and policies from values without the agent) and the
//! kustomize base are accepted whole by the real API server as a server-side dry run under strict
//! field validation. `make chart-test` shows the chart and the base are the same objects; this
//! shows those objects are valid.

mod common;
mod go_tools;

use std::time::Duration;

use gpu_sandbox::demo::install;
use serde_json::Value;

const NAMESPACE: &str = "gpu-remediation";

/// Kinds whose CRDs (the Prometheus Operator's) the sandbox does not have: checked by
/// `make chart-test` (against kustomize) and `make alerts-test` (promtool) instead.
const OPERATOR_KINDS: &[&str] = &["ServiceMonitor", "PrometheusRule"];

fn helm_template(values: Option<&str>) -> Vec<Value> {
    let helm = go_tools::tool("helm");
    let mut args = vec![
        "template",
        "gpu-remediator",
        "charts/gpu-remediator",
        "--namespace",
        NAMESPACE,
        "--include-crds",
    ];
    if let Some(values) = values {
        args.extend(["--values", values]);
    }
    install::parse_documents(&go_tools::run(&helm, &args)).expect("helm's output is YAML")
}

fn kinds(objects: &[Value]) -> Vec<&str> {
    objects.iter().filter_map(|o| o["kind"].as_str()).collect()
}

/// Creates the namespace (as `kubectl apply -f manifests/namespace.yaml` does before `helm
/// install`) and the CRDs for real, then dry-runs every other object strictly. Custom resources
/// are retried until their CRD is served.
async fn accepted(objects: &[Value]) {
    let client = common::cluster().await.client();
    let namespace = install::parse_documents(
        &std::fs::read_to_string(go_tools::repo().join("manifests/namespace.yaml")).expect("namespace.yaml"),
    )
    .expect("namespace.yaml is YAML");
    let crds: Vec<Value> = objects
        .iter()
        .filter(|o| o["kind"] == "CustomResourceDefinition")
        .cloned()
        .collect();
    assert_eq!(crds.len(), 3, "the chart's CRDs: {:?}", kinds(objects));
    install::apply(&client, &namespace)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    install::apply(&client, &crds)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let rest: Vec<Value> = objects
        .iter()
        .filter(|o| {
            o["kind"] != "CustomResourceDefinition"
                && !OPERATOR_KINDS.contains(&o["kind"].as_str().unwrap_or(""))
        })
        .cloned()
        .collect();
    common::eventually(
        "the server to accept every object (dry run, strict)",
        Duration::from_secs(30),
        || {
            let (client, rest) = (client.clone(), rest.clone());
            async move {
                match install::check_strictly(&client, &rest).await {
                    Ok(()) => Some(()),
                    // A CRD just created is discovered within a few seconds; anything else is a refusal.
                    Err(install::ApplyManifestsError::Discover { .. }) => None,
                    Err(e) => panic!("{e}"),
                }
            }
        },
    )
    .await;
}

#[tokio::test]
async fn the_chart_with_default_values_is_accepted_by_the_api_server() {
    let objects = helm_template(None);
    let kinds = kinds(&objects);
    for kind in [
        "Deployment",
        "DaemonSet",
        "ClusterRole",
        "Role",
        "ConfigMap",
        "PodDisruptionBudget",
        "FlowSchema",
    ] {
        assert!(kinds.contains(&kind), "no {kind} in {kinds:?}");
    }
    accepted(&objects).await;
}

#[tokio::test]
async fn the_chart_with_every_optional_object_is_accepted_by_the_api_server() {
    let objects = helm_template(Some("charts/gpu-remediator/ci/all-optional-values.yaml"));
    let kinds = kinds(&objects);
    for kind in OPERATOR_KINDS {
        assert!(kinds.contains(kind), "no {kind} in {kinds:?}");
    }
    let dashboard = objects
        .iter()
        .find(|o| o["kind"] == "ConfigMap" && o["metadata"]["name"] == "gpu-remediator-dashboard")
        .expect("the dashboard ConfigMap");
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    let json = dashboard["data"]["gpu-remediator.json"]
        .as_str()
        .expect("the dashboard JSON");
    let parsed: Value = serde_json::from_str(json).expect("the dashboard is JSON");
    assert!(parsed["panels"].as_array().is_some_and(|p| !p.is_empty()));
    accepted(&objects).await;
}

#[tokio::test]
async fn the_chart_with_policies_and_without_the_agent_is_accepted_by_the_api_server() {
    let objects = helm_template(Some("charts/gpu-remediator/ci/policies-values.yaml"));
    let kinds = kinds(&objects);
    assert!(kinds.contains(&"GpuRemediationPolicy"), "{kinds:?}");
    assert!(!kinds.contains(&"DaemonSet"), "agent.enabled=false: {kinds:?}");
    assert!(
        !objects
            .iter()
            .any(|o| o["kind"] == "Role" && o["metadata"]["name"] == "gpu-remediator-leader-election"),
        "no leader election, no Lease role: {kinds:?}"
    );
    let deployment = objects
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .expect("the controller");
    let args = deployment["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(args.contains("--policy-selector=team=ml-infra"), "{args}");
    assert!(!args.contains("--leader-elect"), "{args}");
    accepted(&objects).await;
}

#[tokio::test]
async fn the_kustomize_base_is_accepted_by_the_api_server() {
    let cluster = common::cluster().await;
    let objects = install::render(&cluster.kubectl(), &go_tools::repo().join("manifests"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    accepted(&objects).await;
}
