//! `/metrics`, `/healthz` and `/readyz` of the controller binary after a real remediation, on a
//! leader and on a follower, and `/readyz` before the caches can sync.

mod leader_support;

use std::time::Duration;

use e2e::{eventually, sample};
use gpu_remediation_api::GpuRemediationPolicy;
use gpu_sandbox::provider::Provider;
use kube::{Api, Client};
use leader_support::{
    ReplicaOptions, ReplicaProcess, cluster, controller_account, create_namespace,
    fleet::{
        break_and_wait_succeeded, create_replace_policy, fleet_with_provider, inference_on,
        start_leader_then_follower,
    },
    free_port, kubeconfig_with_token,
};
use serde_json::json;

/// Two nodes, two pods on the first, a policy allowing three recycles an hour, and two replicas:
/// `leader` (started first and waited for) and `follower`.
struct Scenario {
    admin: Client,
    test: String,
    broken: String,
    leader: ReplicaProcess,
    follower: ReplicaProcess,
    _provider: Provider,
}

async fn set_up() -> Scenario {
    let cluster = cluster().await;
    let admin = cluster.control_plane.client();
    let test = format!("metrics-{}", std::process::id());
    let controller_namespace = format!("{test}-ctrl");
    let workload_namespace = format!("{test}-work");
    create_namespace(&admin, &controller_namespace).await;
    create_namespace(&admin, &workload_namespace).await;
    let (fleet, provider) = fleet_with_provider(&admin, &test, 2).await;
    let broken = fleet.node_names()[0].clone();
    inference_on(&admin, &workload_namespace, &broken, 2).await;
    create_replace_policy(
        &admin,
        &test,
        json!({"maxConcurrent": 1, "maxUnhealthy": "100%", "rate": {"limit": 3, "per": "1h"}}),
        None,
    )
    .await;
    let (leader, follower) = start_leader_then_follower(
        cluster,
        &controller_namespace,
        &test,
        ["leader", "follower"],
        Duration::from_secs(60),
    )
    .await;
    Scenario {
        admin,
        test,
        broken,
        leader,
        follower,
        _provider: provider,
    }
}

#[tokio::test]
async fn metrics_after_a_remediation_carry_its_counts_and_only_the_leader_says_it_leads() {
    let Scenario {
        admin,
        test,
        broken,
        leader,
        follower,
        ..
    } = &set_up().await;
    let (admin, test, broken) = (admin.clone(), test.clone(), broken.clone());

    break_and_wait_succeeded(&admin, &broken, leader).await;
    // Gauges are set by the pass after the status write: give it a moment.
    let metrics = eventually("the leader's metrics to show the finished remediation", Duration::from_secs(30), || async {
        let (status, body) = leader.get("/metrics").await?;
        assert_eq!(status, 200);
        let finished = format!(r#"gpu_remediator_remediations_finished_total{{policy="{test}",action="Replace",outcome="Succeeded"}}"#);
        let in_flight = format!(r#"gpu_remediator_remediations_in_flight{{policy="{test}"}}"#);
        // And the pass after that: the budget gauge is set from the same plan as the policy's status,
        // which by then gives the slot back (see `budget_remaining` below).
        let remaining = format!(r#"gpu_remediator_budget_remaining{{policy="{test}"}}"#);
        (sample(&body, &finished) == Some(1.0)
            && sample(&body, &in_flight) == Some(0.0)
            && sample(&body, &remaining) == Some(1.0))
        .then_some(body)
    })
    .await;

    let policy_series = |name: &str| format!(r#"gpu_remediator_{name}{{policy="{test}"}}"#);
    assert_eq!(sample(&metrics, "gpu_remediator_leader"), Some(1.0), "{metrics}");
    assert_eq!(
        sample(
            &metrics,
            &format!(r#"gpu_remediator_remediations_started_total{{policy="{test}",action="Replace"}}"#)
        ),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(
        sample(&metrics, r#"gpu_remediator_evictions_total{result="Evicted"}"#),
        Some(2.0),
        "{metrics}"
    );
    assert_eq!(
        sample(&metrics, &policy_series("detection_to_cordon_seconds_count")),
        Some(1.0),
        "{metrics}"
    );
    let detection_seconds =
        sample(&metrics, &policy_series("detection_to_cordon_seconds_sum")).expect("detection sum");
    assert!(
        (1.0..30.0).contains(&detection_seconds),
        "detection to cordon took {detection_seconds}s (trigger `for` is 1s)"
    );
    assert_eq!(
        sample(
            &metrics,
            &format!(r#"gpu_remediator_phase_duration_seconds_count{{policy="{test}",phase="Draining"}}"#)
        ),
        Some(1.0),
        "{metrics}"
    );
    // The budget as the policy's status reports it: min(maxConcurrent 1 - 0 in flight, rate 3 - 1 used).
    // The pass sets the gauge before it writes the status of the same plan (and a write that
    // meets a conflict is made again by the next pass), so the status is waited for.
    let policies = Api::<GpuRemediationPolicy>::all(admin.clone());
    eventually(
        "the policy's status to give the slot back",
        Duration::from_secs(15),
        || async { (policies.get(&test).await.ok()?.status?.budget?.remaining == 1).then_some(()) },
    )
    .await;
    assert_eq!(
        sample(&metrics, &policy_series("budget_remaining")),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(
        sample(&metrics, &policy_series("circuit_open")),
        Some(0.0),
        "{metrics}"
    );
    for reconciler in ["policy", "remediation"] {
        let errors = format!(r#"gpu_remediator_reconcile_errors_total{{reconciler="{reconciler}"}}"#);
        assert_eq!(sample(&metrics, &errors), Some(0.0), "{metrics}");
    }
    assert_eq!(
        sample(&metrics, r#"gpu_remediator_evictions_total{result="Blocked"}"#),
        Some(0.0),
        "{metrics}"
    );
    assert!(metrics.ends_with("# EOF\n"), "OpenMetrics text ends with # EOF");

    let (status, follower_metrics) = follower.get("/metrics").await.expect("follower metrics");
    assert_eq!(status, 200);
    assert_eq!(
        sample(&follower_metrics, "gpu_remediator_leader"),
        Some(0.0),
        "{follower_metrics}"
    );
    assert_eq!(leader.get("/readyz").await.map(|(status, _)| status), Some(200));
    assert_eq!(
        follower.get("/readyz").await.map(|(status, _)| status),
        Some(200),
        "a synced follower is ready to take over"
    );
    assert_eq!(
        follower.get("/healthz").await.map(|(status, _)| status),
        Some(200)
    );
    eprintln!("detection to cordon: {detection_seconds:.2}s");
}

#[tokio::test]
async fn a_replica_that_cannot_sync_its_caches_is_alive_but_not_ready() {
    let cluster = cluster().await;
    let admin = cluster.control_plane.client();
    let namespace = format!("unready-{}", std::process::id());
    create_namespace(&admin, &namespace).await;
    let token = controller_account(&admin, &namespace, "unready").await;
    let kubeconfig = kubeconfig_with_token(cluster, "unready", &token);
    // The same kubeconfig, pointed at a port nothing listens on.
    let text = std::fs::read_to_string(&kubeconfig).expect("kubeconfig");
    let server = url_of(&text);
    std::fs::write(
        &kubeconfig,
        text.replace(&server, &format!("https://127.0.0.1:{}", free_port())),
    )
    .expect("kubeconfig");
    let options = ReplicaOptions {
        identity: "unready",
        lease_namespace: &namespace,
        kubeconfig: &kubeconfig,
        policy_selector: "e2e=nothing",
        extra_args: Vec::new(),
    };
    let mut replica = ReplicaProcess::start(cluster, options).await;

    let (health, _) = eventually("the HTTP server to answer", Duration::from_secs(30), || {
        replica.get("/healthz")
    })
    .await;
    let (ready, body) = replica.get("/readyz").await.expect("readyz answers");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (still, _) = replica.get("/readyz").await.expect("readyz answers");

    assert_eq!(health, 200);
    assert_eq!((ready, body.as_str()), (503, "caches not synced"));
    assert_eq!(still, 503);
    assert!(
        replica.exited().is_none(),
        "it keeps trying:\n{}",
        replica.log_tail()
    );
}

fn url_of(kubeconfig: &str) -> String {
    kubeconfig
        .lines()
        .find_map(|line| line.trim().strip_prefix("server: "))
        .expect("a server line")
        .trim()
        .to_owned()
}
