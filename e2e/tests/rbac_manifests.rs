//! The kustomize base as a cluster receives it: `manifests/` rendered by the pinned
//! `kubectl kustomize` is accepted whole (workloads included) by the real API server under strict
//! field validation, the controller's pod is hardened as the issue asks, and the Deployment's
//! arguments are flags the real `gpu-remediator` binary accepts.

mod common;

use std::path::PathBuf;

use gpu_sandbox::demo::install;
use serde_json::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

async fn rendered() -> Vec<Value> {
    let cluster = common::cluster().await;
    install::render(&cluster.kubectl(), &repo().join("manifests"))
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("{kind} {name} is not in the rendered manifests"))
}

#[tokio::test]
async fn the_whole_base_is_accepted_by_the_api_server_under_strict_validation() {
    let objects = rendered().await;
    let client = common::cluster().await.client();
    // Namespaces and CRDs for real (later objects need them), then everything as a strict dry run.
    let foundations: Vec<Value> = objects
        .iter()
        .filter(|o| o["kind"] == "Namespace" || o["kind"] == "CustomResourceDefinition")
        .cloned()
        .collect();
    install::apply(&client, &foundations)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    install::check_strictly(&client, &objects)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let kinds: Vec<&str> = objects.iter().filter_map(|o| o["kind"].as_str()).collect();
    for kind in [
        "Namespace",
        "CustomResourceDefinition",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Deployment",
        "PodDisruptionBudget",
        "Service",
        "DaemonSet",
    ] {
        assert!(kinds.contains(&kind), "no {kind} in {kinds:?}");
    }
}

#[tokio::test]
async fn the_controller_runs_twice_hardened_probed_and_behind_a_budget() {
    let objects = rendered().await;
    let deployment = find(&objects, "Deployment", "gpu-remediator");
    assert_eq!(deployment["spec"]["replicas"], 2);
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "gpu-remediator");
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    let container = &pod["containers"][0];
    let security = &container["securityContext"];
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["capabilities"]["drop"][0], "ALL");
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    for kind in ["requests", "limits"] {
        assert!(
            container["resources"][kind]["memory"].is_string(),
            "{kind}: {}",
            container["resources"]
        );
    }
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(args.contains(&"--leader-elect"), "{args:?}");
    let pdb = find(&objects, "PodDisruptionBudget", "gpu-remediator");
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"],
        deployment["spec"]["selector"]["matchLabels"]
    );
    assert_eq!(pdb["spec"]["minAvailable"], 1);
    let role = find(&objects, "ClusterRole", "gpu-remediator");
    let pods_rule = role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["resources"].as_array().unwrap().contains(&Value::from("pods")))
        .unwrap();
    assert!(
        !pods_rule["verbs"]
            .as_array()
            .unwrap()
            .contains(&Value::from("delete")),
        "the base role must not delete pods: {pods_rule}"
    );
}

#[tokio::test]
async fn the_deployment_args_are_flags_the_controller_binary_accepts() {
    let objects = rendered().await;
    let deployment = find(&objects, "Deployment", "gpu-remediator");
    let args: Vec<String> = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        // The kubelet expands $(POD_NAME) and friends; any value will do for the parser.
        .map(|a| {
            a.as_str()
                .unwrap()
                .replace("$(POD_NAMESPACE)", "ns")
                .replace("$(POD_NAME)", "pod")
        })
        .collect();
    // clap parses left to right and stops at --help: it exits 0 only if every earlier argument
    // is one the binary knows.
    let output = std::process::Command::new(e2e::controller_binary())
        .args(&args)
        .arg("--help")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "gpu-remediator {args:?} is refused: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let refused = std::process::Command::new(e2e::controller_binary())
        .args(["run", "--no-such-flag", "--help"])
        .output()
        .unwrap();
    assert!(!refused.status.success(), "the check must be able to fail");
}
