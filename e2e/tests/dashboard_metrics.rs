//! The Grafana dashboard (manifests/optional/dashboard/gpu-remediator.json) and the alerts
//! (manifests/optional/alerts/prometheusrule.yaml) query only series the controller really
//! serves: every metric name in their `PromQL`, parsed by Prometheus' own parser
//! (tools/promql-names), is a series of a running controller's `/metrics` after a real
//! remediation (the controller prints a family only once it has a sample).

mod go_tools;
mod leader_support;

use std::{collections::BTreeSet, time::Duration};

use e2e::{eventually, sample};
use leader_support::{
    ReplicaOptions, ReplicaProcess, cluster, controller_account, create_namespace,
    fleet::{break_and_wait_succeeded, create_replace_policy, fleet_with_provider, inference_on},
};
use serde_json::json;

const DASHBOARD: &str = "manifests/optional/dashboard/gpu-remediator.json";
const ALERTS: &str = "manifests/optional/alerts/prometheusrule.yaml";

/// The sample names of every family in `OpenMetrics` text, from its `# TYPE` lines (a counter
/// `x` serves `x_total`, a histogram `x_bucket`, `x_sum` and `x_count`).
fn served_series(metrics: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let (family, kind) = rest.split_once(' ').expect("# TYPE NAME KIND");
        let suffixes: &[&str] = match kind {
            "counter" => &["_total", "_created"],
            "histogram" => &["_bucket", "_sum", "_count", "_created"],
            "summary" => &["", "_sum", "_count", "_created"],
            _ => &[""],
        };
        names.extend(suffixes.iter().map(|suffix| format!("{family}{suffix}")));
    }
    names
}

/// `NAME<TAB>WHERE` lines of promql-names: each name with where it is used.
fn queried_series(files: &[&str]) -> Vec<(String, String)> {
    let output = go_tools::run(&go_tools::tool("promql-names"), files);
    output
        .lines()
        .map(|line| {
            let (name, place) = line.split_once('\t').expect("NAME<TAB>WHERE");
            (name.to_owned(), place.to_owned())
        })
        .collect()
}

/// A controller that has just recycled one node (so every series it serves has a sample: families
/// without one are not printed at all), scraped.
async fn metrics_after_a_remediation() -> (String, ReplicaProcess) {
    let cluster = cluster().await;
    let admin = cluster.control_plane.client();
    let test = format!("dashboard-{}", std::process::id());
    create_namespace(&admin, &test).await;
    let (fleet, _provider) = fleet_with_provider(&admin, &test, 2).await;
    let broken = fleet.node_names()[0].clone();
    inference_on(&admin, &test, &broken, 1).await;
    create_replace_policy(
        &admin,
        &test,
        json!({"maxConcurrent": 1, "maxUnhealthy": "100%"}),
        None,
    )
    .await;
    let token = controller_account(&admin, &test, "scraped").await;
    let kubeconfig = leader_support::kubeconfig_with_token(cluster, "scraped", &token);
    let selector = format!("e2e={test}");
    let replica = ReplicaProcess::start(
        cluster,
        ReplicaOptions {
            identity: "scraped",
            lease_namespace: &test,
            kubeconfig: &kubeconfig,
            policy_selector: &selector,
            extra_args: Vec::new(),
        },
    )
    .await;
    break_and_wait_succeeded(&admin, &broken, &replica).await;
    let finished = format!(
        r#"gpu_remediator_remediations_finished_total{{policy="{test}",action="Replace",outcome="Succeeded"}}"#
    );
    let metrics = eventually(
        "the finished remediation on /metrics",
        Duration::from_secs(30),
        || async {
            let (status, body) = replica.get("/metrics").await?;
            (status == 200 && sample(&body, &finished) == Some(1.0)).then_some(body)
        },
    )
    .await;
    (metrics, replica)
}

#[tokio::test]
async fn every_dashboard_and_alert_query_names_a_series_the_controller_serves() {
    let (metrics, replica) = metrics_after_a_remediation().await;
    let served = served_series(&metrics);
    assert!(
        served.contains("gpu_remediator_leader") && served.contains("gpu_remediator_evictions_total"),
        "the scrape is the controller's: {served:?}"
    );

    let queried = queried_series(&[DASHBOARD, ALERTS]);
    let unknown: Vec<String> = queried
        .iter()
        .filter(|(name, _)| !served.contains(name))
        .map(|(name, place)| format!("{name} ({place})"))
        .collect();
    assert!(
        unknown.is_empty(),
        "queries name series the controller does not serve:\n{}\nserved: {served:?}\n--- log ---\n{}",
        unknown.join("\n"),
        replica.log_tail()
    );

    // The dashboard shows what the issue asks for.
    let dashboard: BTreeSet<&str> = queried
        .iter()
        .filter(|(_, place)| place.starts_with(DASHBOARD))
        .map(|(name, _)| name.as_str())
        .collect();
    for wanted in [
        "gpu_remediator_remediations_in_flight",
        "gpu_remediator_phase_duration_seconds_count",
        "gpu_remediator_time_to_recovery_seconds_bucket",
        "gpu_remediator_detection_to_cordon_seconds_bucket",
        "gpu_remediator_circuit_open",
        "gpu_remediator_budget_remaining",
        "gpu_remediator_evictions_total",
        "gpu_remediator_leader",
    ] {
        assert!(
            dashboard.contains(wanted),
            "the dashboard has no panel on {wanted}: {dashboard:?}"
        );
    }
}

#[test]
fn a_query_on_a_series_nobody_serves_is_caught() {
    let metrics = "# TYPE gpu_remediator_evictions counter\n# TYPE gpu_remediator_leader gauge\n\
                   # TYPE gpu_remediator_time_to_recovery_seconds histogram\n# EOF\n";
    let served = served_series(metrics);
    for name in [
        "gpu_remediator_evictions_total",
        "gpu_remediator_leader",
        "gpu_remediator_time_to_recovery_seconds_bucket",
    ] {
        assert!(served.contains(name), "{name}: {served:?}");
    }
    for name in [
        "gpu_remediator_evictions",
        "gpu_remediator_leader_total",
        "gpu_remediator_time_to_recovery_seconds",
    ] {
        assert!(!served.contains(name), "{name}: {served:?}");
    }
}
