//! No stored object can wedge the controller. With the CRDs as they were before their bounds
//! (the same schemas without `maximum`/`minimum` and the `self <= N` rules), a policy with
//! `priority: 3000000000` and a remediation whose status counts 5000000000 pods are stored; the
//! bounded CRDs are then installed over them, and a controller started: it becomes ready, names
//! both objects (gauge, Events, the policy's `Invalid` condition), and still cordons a broken node of
//! another policy; `gpu-remediator explain` and `kubectl gpu history --node` work, naming each
//! object they skip. Out-of-range values are then refused by the bounded CRDs, with a message.

mod common;

use std::{process::Command, time::Duration};

use common::{cluster, eventually, unique_name};
use gpu_remediation_api::{GpuRemediation, GpuRemediationPolicy, crds};
use gpu_remediator::{
    Settings,
    controller::{Telemetry, run_with_telemetry},
    leader::Fence,
    telemetry::{Health, Metrics, Readiness},
};
use gpu_sandbox::{fault, fleet::FLEET_LABEL};
use k8s_openapi::{
    api::core::v1::{Event, Node},
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};

const SCOPE_LABEL: &str = "e2e.gpuremediation.dev/scope";

/// Both tests change the shared cluster's CRDs (unbounded, then bounded): they take turns.
static SCHEMA: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The schema as it was before the bounds, stored by a server before 1.37: every
/// `maximum`/`minimum` and every `self <= N` rule removed, and the integers' `format` too (from
/// 1.37 the server refuses an `int32` past its range itself).
fn without_bounds(value: &mut Value) {
    match value {
        Value::Object(object) => {
            object.remove("maximum");
            object.remove("minimum");
            if object.get("type").and_then(Value::as_str) == Some("integer") {
                object.remove("format");
            }
            if let Some(Value::Array(rules)) = object.get_mut("x-kubernetes-validations") {
                rules.retain(|r| !r["rule"].as_str().unwrap_or_default().contains("self <="));
            }
            object.values_mut().for_each(without_bounds);
        }
        Value::Array(items) => items.iter_mut().for_each(without_bounds),
        _ => {}
    }
}

/// Installs (creates or replaces) both CRDs, bounded or not, and waits until both are established.
async fn install(client: &Client, bounded: bool) {
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    for (file, yaml) in crds::render_all() {
        let mut crd: Value = serde_yaml::from_str(&yaml).unwrap_or_else(|e| panic!("{file}: {e}"));
        if !bounded {
            without_bounds(&mut crd);
        }
        let name = crd["metadata"]["name"].as_str().unwrap().to_owned();
        api.patch(
            &name,
            &PatchParams::apply("e2e-undecodable").force(),
            &Patch::Apply(&crd),
        )
        .await
        .unwrap_or_else(|e| panic!("installing {name}: {e}"));
        common::wait_established(client, &name).await;
    }
    eventually("both kinds served", Duration::from_secs(30), || {
        let client = client.clone();
        async move {
            dynamic::<GpuRemediationPolicy>(&client)
                .list(&ListParams::default())
                .await
                .ok()?;
            dynamic::<GpuRemediation>(&client)
                .list(&ListParams::default())
                .await
                .ok()
        }
    })
    .await;
}

fn dynamic<K: kube::Resource<DynamicType = ()>>(client: &Client) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &ApiResource::erase::<K>(&()))
}

fn policy(name: &str, scope: &str, spec: &Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "gpuremediation.dev/v1alpha1",
        "kind": "GpuRemediationPolicy",
        "metadata": {"name": name, "labels": {SCOPE_LABEL: scope}},
        "spec": spec,
    }))
    .unwrap()
}

/// Runs this workspace's `binary` (`gpu-remediator` or `kubectl-gpu`, built on first use) with
/// `args` against the shared cluster: whether it succeeded, its stdout and its stderr.
async fn cli(binary: &str, args: &[&str]) -> (bool, String, String) {
    let dir = e2e::build_binaries(&[
        ("gpu-remediator", "gpu-remediator"),
        ("gpu-remediator", "kubectl-gpu"),
    ]);
    let output = Command::new(dir.join(binary))
        .args(args)
        .arg("--kubeconfig")
        .arg(cluster().await.kubeconfig_path())
        .output()
        .expect("the command runs");
    let (out, err) = (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    );
    eprintln!("$ {binary} {}\n{out}{err}", args.join(" "));
    (output.status.success(), out, err)
}

/// Runs the cluster's kubectl with `stdin` as the manifest: stdout, or stderr on failure.
async fn kubectl(args: &[&str], stdin: &str) -> Result<String, String> {
    use std::io::Write as _;
    let cluster = cluster().await;
    let mut child = Command::new(cluster.kubectl())
        .arg("--kubeconfig")
        .arg(cluster.kubeconfig_path())
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl runs");
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

async fn warning_events_about(client: &Client, name: &str) -> Vec<Event> {
    Api::<Event>::all(client.clone())
        .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("Undecodable"))
        .collect()
}

/// Stores, under the unbounded CRDs, a policy of `scope` with priority 3000000000 (selecting no
/// node) and a remediation whose status counts 5000000000 pods; returns their names.
async fn store_out_of_range(client: &Client, scope: &str) -> (String, String) {
    let huge = unique_name("huge-priority");
    let mut huge_spec = json!({"triggers": [{"conditionType": "GpuHealthy", "status": "False"}]});
    huge_spec["priority"] = json!(3_000_000_000_i64);
    huge_spec["nodeSelector"] = json!({"matchLabels": {"e2e.gpuremediation.dev/nothing": "here"}});
    // The API server takes a moment to serve a changed schema (Established was already True):
    // until then the bound still refuses.
    let policies = dynamic::<GpuRemediationPolicy>(client);
    eventually(
        "the unbounded CRD to store priority 3000000000",
        Duration::from_secs(30),
        || async {
            policies
                .create(&PostParams::default(), &policy(&huge, scope, &huge_spec))
                .await
                .ok()
        },
    )
    .await;
    let stale = unique_name("stale-remediation");
    let remediation: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "gpuremediation.dev/v1alpha1",
        "kind": "GpuRemediation",
        // Records carry their policy's labels (so a controller scoped by a policy selector sees them).
        "metadata": {"name": stale, "labels": {SCOPE_LABEL: scope}},
        "spec": {"nodeName": "gone-node", "policyName": huge, "action": "None",
                 "trigger": {"conditionType": "GpuHealthy", "status": "False"}},
    }))
    .unwrap();
    let remediations = dynamic::<GpuRemediation>(client);
    remediations
        .create(&PostParams::default(), &remediation)
        .await
        .unwrap();
    let huge_count = json!({"status": {"phase": "Draining", "drain": {"podsTotal": 5_000_000_000_i64}}});
    eventually(
        "the unbounded CRD to store a count of 5000000000",
        Duration::from_secs(30),
        || async {
            remediations
                .patch_status(&stale, &PatchParams::default(), &Patch::Merge(&huge_count))
                .await
                .ok()
        },
    )
    .await;

    (huge, stale)
}

/// The controller names both objects: the gauge, a Warning Event on each, the policy's conditions.
async fn assert_both_named(client: &Client, metrics: &Metrics, huge: &str, stale: &str) {
    // It names both objects: the gauge, a Warning Event on each, the policy's conditions.
    eventually("the gauge names both objects", Duration::from_secs(30), || {
        let text = metrics.encode();
        let named = [("GpuRemediationPolicy", huge), ("GpuRemediation", stale)]
            .iter()
            .all(|(kind, name)| {
                text.lines().any(|l| {
                    l.starts_with("gpu_remediator_undecodable_objects{")
                        && l.contains(&format!("kind=\"{kind}\""))
                        && l.contains(&format!("name=\"{name}\""))
                        && l.ends_with(" 1")
                })
            });
        async move { named.then_some(()) }
    })
    .await;
    for name in [huge, stale] {
        let events = eventually(
            &format!("a Warning Event about {name}"),
            Duration::from_secs(30),
            || async { Some(warning_events_about(client, name).await).filter(|e| !e.is_empty()) },
        )
        .await;
        let note = events[0].message.clone().unwrap_or_default();
        assert!(note.contains("cannot read this object"), "{note}");
        assert!(
            note.contains("3000000000") || note.contains("5000000000"),
            "the Event says which value: {note}"
        );
    }
    eventually(
        "the undecodable policy says Invalid",
        Duration::from_secs(30),
        || async {
            let policy = dynamic::<GpuRemediationPolicy>(client).get(huge).await.ok()?;
            let conditions = policy.data["status"]["conditions"].as_array()?.clone();
            conditions
                .iter()
                .any(|c| c["type"] == "Invalid" && c["status"] == "True" && c["reason"] == "Undecodable")
                .then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn objects_stored_out_of_range_before_the_bounds_neither_wedge_the_controller_nor_go_unreported() {
    let _turn = SCHEMA.lock().await;
    let client = cluster().await.client();
    install(&client, false).await;
    let fleet = common::fleet(2).await;
    let scope = fleet.name().to_owned();
    let (huge, stale) = store_out_of_range(&client, &scope).await;
    install(&client, true).await;
    let stored = dynamic::<GpuRemediationPolicy>(&client).get(&huge).await.unwrap();
    assert_eq!(
        stored.data["spec"]["priority"],
        json!(3_000_000_000_i64),
        "still stored"
    );

    // Another policy of the same scope governs the fleet.
    let good = unique_name("good");
    let mut good_spec =
        json!({"triggers": [{"conditionType": "GpuHealthy", "status": "False", "for": "2s"}]});
    good_spec["nodeSelector"] = json!({"matchLabels": {FLEET_LABEL: fleet.name()}});
    good_spec["action"] = json!("None");
    // One of the two nodes broken is half the fleet: above the default 30% circuit breaker.
    good_spec["safety"] = json!({"maxUnhealthy": "50%"});
    dynamic::<GpuRemediationPolicy>(&client)
        .create(&PostParams::default(), &policy(&good, &scope, &good_spec))
        .await
        .unwrap();

    let metrics = Metrics::new();
    let health = Health::new(Fence::standalone());
    let telemetry = Telemetry {
        metrics: metrics.clone(),
        health: Some(health.clone()),
    };
    let settings = Settings {
        policy_selector: Some(format!("{SCOPE_LABEL}={scope}")),
        instance: Some(format!("e2e-{scope}")),
        ..Settings::default()
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let controller = tokio::spawn(run_with_telemetry(
        cluster().await.config(),
        settings,
        Fence::standalone(),
        telemetry,
        async move {
            let _ = stopped.await;
        },
    ));

    eventually("the controller is ready", Duration::from_secs(30), || {
        let health = health.clone();
        async move { (health.readiness() == Readiness::Ready).then_some(()) }
    })
    .await;

    assert_both_named(&client, &metrics, &huge, &stale).await;

    // And it governs everything else: a broken node of the good policy is cordoned.
    let node = fleet.node_names()[0].clone();
    fault::set_gpu_condition(&client, &node, "False", "XID79", "GPU 3 fell off the bus")
        .await
        .unwrap();
    eventually(&format!("{node} cordoned"), Duration::from_secs(60), || async {
        let node = Api::<Node>::all(client.clone()).get(&node).await.ok()?;
        node.spec?.unschedulable.filter(|u| *u)
    })
    .await;
    assert_eq!(health.readiness(), Readiness::Ready);

    // The tools read past them too, naming each: `gpu-remediator explain` and `kubectl gpu
    // history --node` (each object decoded on its own, as the controller's watches do).
    let selector = format!("--policy-selector={SCOPE_LABEL}={scope}");
    let (explained, out, err) = cli("gpu-remediator", &["explain", &node, &selector]).await;
    assert!(
        explained,
        "explain works with an undecodable policy stored: {err}"
    );
    assert!(
        out.contains(&good),
        "explains the node under the good policy: {out}"
    );
    assert!(
        err.contains(&format!(
            "skipped GpuRemediationPolicy {huge}: it does not decode"
        )) && err.contains("3000000000"),
        "names the undecodable policy and why: {err}"
    );
    let (listed, out, err) = cli("kubectl-gpu", &["history", "--node", &node]).await;
    assert!(
        listed,
        "history works with an undecodable remediation stored: {err}"
    );
    assert!(out.contains(&good), "lists the node's remediation: {out}");
    assert!(
        err.contains(&format!("skipped GpuRemediation {stale}: it does not decode"))
            && err.contains("5000000000"),
        "names the undecodable remediation and why: {err}"
    );

    // Deleting the undecodable objects clears the gauge.
    dynamic::<GpuRemediationPolicy>(&client)
        .delete(&huge, &kube::api::DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "the gauge forgets the deleted policy",
        Duration::from_secs(30),
        || {
            let gone = !metrics.encode().contains(&format!("name=\"{huge}\""));
            async move { gone.then_some(()) }
        },
    )
    .await;

    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(10), controller)
        .await
        .expect("the controller stops")
        .expect("no panic")
        .expect("no error");
}

#[tokio::test]
async fn the_bounded_crds_refuse_every_out_of_range_value_with_a_message() {
    let _turn = SCHEMA.lock().await;
    let client = cluster().await.client();
    install(&client, true).await;
    let base = || {
        json!({
            "apiVersion": "gpuremediation.dev/v1alpha1",
            "kind": "GpuRemediationPolicy",
            "metadata": {"name": unique_name("out-of-range")},
            "spec": {"triggers": [{"conditionType": "GpuHealthy", "status": "False"}]},
        })
    };
    let cases = [
        (
            "/spec/priority",
            json!(3_000_000_000_i64),
            "less than or equal to 2147483647",
        ),
        (
            "/spec/safety/rate",
            json!({"limit": 5_000_000_000_i64, "per": "1h"}),
            "rate.limit must be at most 10000",
        ),
        (
            "/spec/safety/maxConcurrent",
            json!(4_294_967_297_i64),
            "a count must be at most 100000",
        ),
        (
            "/spec/safety/maxUnhealthy",
            json!(200_000),
            "a count must be at most 100000",
        ),
        (
            "/spec/safety/maxAttemptsPerNode",
            json!({"count": 5_000_000_000_i64, "per": "24h"}),
            "maxAttemptsPerNode.count must be at most 100",
        ),
        (
            "/spec/drain",
            json!({"gracePeriodSeconds": 1_000_000}),
            "gracePeriodSeconds must be at most 86400",
        ),
    ];
    for (pointer, value, message) in cases {
        let mut document = base();
        let (parent, field) = pointer.rsplit_once('/').unwrap();
        let parent = parent.trim_start_matches("/spec");
        let spec = document.pointer_mut("/spec").unwrap();
        let mut target = spec;
        for key in parent.split('/').filter(|k| !k.is_empty()) {
            target = target
                .as_object_mut()
                .unwrap()
                .entry(key)
                .or_insert_with(|| json!({}));
        }
        target[field] = value.clone();
        let refusal = kubectl(&["apply", "-f", "-"], &document.to_string())
            .await
            .expect_err(&format!("{pointer} = {value} must be refused"));
        assert!(refusal.contains(message), "{pointer} = {value}: {refusal}");
    }

    // A remediation's status counts are bounded too: a person with status rights cannot store one
    // the controller could not read.
    let name = unique_name("bounded-status");
    let remediation = json!({
        "apiVersion": "gpuremediation.dev/v1alpha1",
        "kind": "GpuRemediation",
        "metadata": {"name": name},
        "spec": {"nodeName": "n", "policyName": "p", "action": "None",
                 "trigger": {"conditionType": "GpuHealthy", "status": "False"}},
    });
    kubectl(&["create", "-f", "-"], &remediation.to_string())
        .await
        .expect("a remediation is created");
    let patch = json!({"status": {"drain": {"podsTotal": 5_000_000_000_i64}}}).to_string();
    let refusal = kubectl(
        &[
            "patch",
            "gpuremediation",
            &name,
            "--subresource=status",
            "--type=merge",
            "-p",
            &patch,
        ],
        "",
    )
    .await
    .expect_err("an out-of-range status count must be refused");
    assert!(refusal.contains("less than or equal to 1000000"), "{refusal}");
    let stored = dynamic::<GpuRemediation>(&client).get(&name).await.unwrap();
    assert!(stored.data["status"]["drain"].is_null(), "{:?}", stored.data);
}
