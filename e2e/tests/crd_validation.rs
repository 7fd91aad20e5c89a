//! The CRDs in `crds/` on a real API server: every invalid policy fixture
//! (`crates/api/tests/fixtures/invalid/`) is refused with the message its `# expect:` line names,
//! every sample in `config/` is accepted, unknown fields are pruned (or refused under strict field
//! validation), and `kubectl get` prints the promised columns.

mod common;

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use common::{cluster, eventually};
use gpu_remediation_api::{GpuRemediation, GpuRemediationPolicy, schema::messages};
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::json;
use tokio::sync::OnceCell;

static CRDS: OnceCell<()> = OnceCell::const_new();

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs the cluster's kubectl: stdout when it succeeds, stderr when it fails.
async fn try_kubectl(args: &[&str]) -> Result<String, String> {
    let cluster = cluster().await;
    let output = Command::new(cluster.kubectl())
        .arg("--kubeconfig")
        .arg(cluster.kubeconfig_path())
        .args(args)
        .output()
        .expect("kubectl runs");
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

/// Runs the cluster's kubectl; returns stdout, panicking with stderr on failure.
async fn kubectl(args: &[&str]) -> String {
    try_kubectl(args)
        .await
        .unwrap_or_else(|stderr| panic!("kubectl {args:?} failed: {stderr}"))
}

/// Applies the two generated CRD files, exactly as committed, and waits until both are served.
async fn install_crds() -> Client {
    CRDS.get_or_init(|| async {
        let dir = repo().join("crds");
        kubectl(&[
            "apply",
            "-f",
            dir.join("gpuremediationpolicies.yaml").to_str().unwrap(),
            "-f",
            dir.join("gpuremediations.yaml").to_str().unwrap(),
        ])
        .await;
        kubectl(&[
            "wait",
            "--for=condition=Established",
            "--timeout=30s",
            "crd/gpuremediationpolicies.gpuremediation.dev",
            "crd/gpuremediations.gpuremediation.dev",
        ])
        .await;
        // Established comes a moment before the kinds are discoverable to every client.
        let client = cluster().await.client();
        eventually("the policy kind is served", Duration::from_secs(30), || {
            let api = Api::<GpuRemediationPolicy>::all(client.clone());
            async move { api.list(&ListParams::default()).await.ok().map(|_| ()) }
        })
        .await;
    })
    .await;
    cluster().await.client()
}

fn policies(client: &Client) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &ApiResource::erase::<GpuRemediationPolicy>(&()))
}

fn yaml_files(dir: &Path) -> Vec<(PathBuf, String, String)> {
    let mut files: Vec<(PathBuf, String, String)> = fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .map(|path| {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let text = fs::read_to_string(&path).unwrap();
            (path, name, text)
        })
        .collect();
    files.sort();
    files
}

fn document(text: &str) -> DynamicObject {
    serde_yaml::from_str(text).unwrap()
}

#[tokio::test]
async fn every_invalid_policy_fixture_is_refused_with_its_expected_message() {
    install_crds().await;
    let fixtures = yaml_files(&repo().join("crates/api/tests/fixtures/invalid"));
    assert!(fixtures.len() >= 20, "only {} fixtures", fixtures.len());
    let mut failures = Vec::new();
    for (path, file, text) in &fixtures {
        let header = |key: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("# {key}: ")))
                .map(str::to_owned)
        };
        let expect = header("expect").unwrap_or_else(|| panic!("{file} lacks `# expect:`"));
        // `kubectl create` validates fields strictly, as `kubectl apply` does by default.
        match try_kubectl(&["create", "-f", path.to_str().unwrap()]).await {
            Ok(out) => failures.push(format!("{file}: accepted: {out}")),
            Err(refusal) => {
                let names_field = header("field").is_none_or(|field| refusal.contains(&format!("{field}: ")));
                if !refusal.contains(&expect) || !names_field {
                    failures.push(format!(
                        "{file}: expected {expect:?} at {:?}, the server said {refusal:?}",
                        header("field")
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test]
async fn every_sample_policy_in_config_is_accepted_and_kubectl_prints_the_policy_columns() {
    install_crds().await;
    let mut names = Vec::new();
    for (path, file, text) in yaml_files(&repo().join("config")) {
        let doc = document(&text);
        if doc
            .types
            .as_ref()
            .is_none_or(|t| t.kind != "GpuRemediationPolicy")
        {
            continue;
        }
        if let Err(refusal) = try_kubectl(&["apply", "-f", path.to_str().unwrap()]).await {
            panic!("config/{file} refused: {refusal}");
        }
        names.push(doc.metadata.name.unwrap());
    }
    assert!(names.len() >= 3, "only {names:?}");

    let table = kubectl(&["get", "gpupolicy"]).await;
    let header: Vec<_> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME",
            "SELECTED",
            "YIELDED",
            "UNHEALTHY",
            "IN-FLIGHT",
            "MODE",
            "AGE"
        ],
        "{table}"
    );
    for name in &names {
        assert!(
            table.lines().any(|l| l.starts_with(name.as_str())),
            "{name} missing from\n{table}"
        );
    }
    let dry_run = table.lines().find(|l| l.starts_with("all-gpus-dry-run")).unwrap();
    assert!(
        dry_run.split_whitespace().any(|cell| cell == "DryRun"),
        "{dry_run}"
    );
    // The category reaches the kind too.
    assert!(
        kubectl(&["get", "gpu"])
            .await
            .contains("h100-replace-on-gpu-loss")
    );
}

#[tokio::test]
async fn unknown_fields_are_pruned_and_a_null_limit_becomes_its_default() {
    let api = policies(&install_crds().await);
    let doc: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "gpuremediation.dev/v1alpha1",
        "kind": "GpuRemediationPolicy",
        "metadata": {"name": "pruned"},
        "spec": {
            "triggers": [{"conditionType": "GpuHealthy", "status": "False", "severity": "high"}],
            "safety": {"maxConcurent": 5, "maxConcurrent": null, "maxUnhealthy": null},
            "replacement": {"strategy": "Template", "template": {
                "apiVersion": "example.com/v1", "kind": "Repair", "spec": {"anything": {"goes": true}}
            }},
        },
    }))
    .unwrap();
    // Without strict field validation (the API's default is to warn), unknown fields are pruned.
    let stored = api
        .create(&PostParams::default(), &doc)
        .await
        .expect("a policy with unknown fields is accepted");
    let spec = &stored.data["spec"];
    assert_eq!(
        spec["triggers"][0].get("severity"),
        None,
        "unknown trigger field kept: {spec}"
    );
    assert_eq!(
        spec["safety"].get("maxConcurent"),
        None,
        "misspelt field kept: {spec}"
    );
    // A stored null would break every typed reader; the schema makes both limits required with a
    // default instead, so null is pruned and defaulted.
    assert_eq!(spec["safety"]["maxConcurrent"], json!(1), "{spec}");
    assert_eq!(spec["safety"]["maxUnhealthy"], json!("30%"), "{spec}");
    // The template is preserved whole: it is the object the controller will create.
    assert_eq!(
        spec["replacement"]["template"]["spec"],
        json!({"anything": {"goes": true}})
    );
    let typed: GpuRemediationPolicy = serde_json::from_value(serde_json::to_value(&stored).unwrap()).unwrap();
    assert_eq!(typed.spec.safety.rate.limit, 4);
}

#[tokio::test]
async fn kubectl_prints_the_remediation_columns_and_a_remediations_spec_cannot_change() {
    let client = install_crds().await;
    let api = Api::<GpuRemediation>::all(client.clone());
    let remediation: GpuRemediation = serde_json::from_value(json!({
        "apiVersion": "gpuremediation.dev/v1alpha1",
        "kind": "GpuRemediation",
        "metadata": {"name": "gpu-node-7-3f9a2c"},
        "spec": {
            "nodeName": "gpu-node-7",
            "policyName": "h100-replace-on-gpu-loss",
            "trigger": {"conditionType": "GpuHealthy", "status": "False", "reason": "XID79", "message": "GPU 3 fell off the bus"},
            "action": "Replace",
        },
    }))
    .unwrap();
    api.create(&PostParams::default(), &remediation)
        .await
        .expect("a remediation is accepted");
    api.patch_status(
        "gpu-node-7-3f9a2c",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Draining"}})),
    )
    .await
    .expect("the status subresource takes the phase");

    let table = kubectl(&["get", "gpur"]).await;
    let mut lines = table.lines();
    let header: Vec<_> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME", "NODE", "POLICY", "PHASE", "REASON", "ACTION", "STEP", "AGE"
        ],
        "{table}"
    );
    let row: Vec<_> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(
        row[..6],
        [
            "gpu-node-7-3f9a2c",
            "gpu-node-7",
            "h100-replace-on-gpu-loss",
            "Draining",
            "XID79",
            "Replace"
        ],
        "{table}"
    );

    let changed = api
        .patch(
            "gpu-node-7-3f9a2c",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"action": "None"}})),
        )
        .await;
    match changed {
        Err(kube::Error::Api(status)) => {
            assert!(
                status.message.contains(messages::REMEDIATION_SPEC_IMMUTABLE),
                "{}",
                status.message
            );
        }
        other => panic!("changing a remediation's spec was not refused: {other:?}"),
    }
}

#[tokio::test]
async fn kubectl_explain_shows_the_field_docs() {
    install_crds().await;
    let explained = kubectl(&["explain", "gpuremediationpolicies.spec.safety.maxUnhealthy"]).await;
    assert!(explained.contains("Circuit breaker"), "{explained}");
    let explained = kubectl(&["explain", "gpur"]).await;
    assert!(explained.contains("one recycle of one GPU node"), "{explained}");
}
