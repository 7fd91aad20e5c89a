//! A flooding agent against another node's fault (issue 39), measured once, not run by default
//! (`cargo test -p e2e --test attacker_flood -- --ignored --nocapture`): the agent on node A,
//! with its pod-bound token under the shipped RBAC, admission policy and FlowSchemas, writes its
//! `GpuHealthy` condition 50 times a second (each a real change: a new message) for a minute,
//! while other nodes' agents, each with its own pod-bound token, write their faults one after
//! another. Each fault's time, from its agent starting the write, to the write returning, to the
//! quarantine taint and to the cordon (the trigger's `for` of 1 s included), both seen by one node
//! watch, is compared with the same faults written before the flood. The server's API Priority
//! and Fairness counts for the agents' FlowSchema are printed too.
//!
//! The controller runs in-process as the admin (as every e2e controller here): its requests are
//! exempt from API Priority and Fairness, so the flood reaches it through the server's load and
//! the watch events of A's node; the other agents share A's flow (they are one user).

mod common;

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use common::agent_identity::{apply_status, enforced_agent_on, gpu_healthy};
use gpu_remediation_api::GpuRemediationPolicy;
use gpu_sandbox::{FleetOptions, bench::cordon_watch::CordonWatch, fleet::FLEET_LABEL};
use k8s_openapi::jiff::Timestamp;
use serde_json::json;

/// Faults raised in each arm.
const FAULTS: usize = 5;
/// The flood's writes per second.
const FLOOD_PER_SECOND: u64 = 50;
/// How long the flood lasts.
const FLOOD_FOR: Duration = Duration::from_secs(60);

/// One fault's figures, ms, each from the instant node's agent starts writing its fault.
#[derive(Debug)]
struct Measured {
    /// Until the write returns.
    written: f64,
    /// Until the node watch sees the quarantine taint.
    to_quarantine: f64,
    /// Until the node watch sees the node cordoned (the trigger's `for` of 1 s included).
    to_cordon: f64,
}

/// `node`'s agent (`agent`) writes its fault; waits until the watch sees it quarantined and
/// cordoned.
async fn measure(agent: &kube::Client, watch: &CordonWatch, node: &str) -> Measured {
    let started = Timestamp::now();
    apply_status(agent, node, &json!({}), &gpu_healthy("False", started))
        .await
        .expect("the fault");
    let written = Timestamp::now();
    let (quarantined, held) = common::eventually(
        &format!("{node} quarantined and cordoned"),
        Duration::from_secs(60),
        || async {
            let quarantined = watch.first_quarantined().get(node).copied()?;
            let held = watch.first_held().get(node).copied()?;
            Some((quarantined, held))
        },
    )
    .await;
    let ms = |at: Timestamp| at.duration_since(started).as_secs_f64() * 1000.0;
    Measured {
        written: ms(written),
        to_quarantine: ms(quarantined),
        to_cordon: ms(held),
    }
}

fn summary(arm: &str, measured: &[Measured]) {
    let mean = |f: fn(&Measured) -> f64| {
        measured.iter().map(f).sum::<f64>() / f64::from(u32::try_from(measured.len()).unwrap_or(u32::MAX))
    };
    let max = |f: fn(&Measured) -> f64| measured.iter().map(f).fold(0.0, f64::max);
    println!(
        "{arm}: fault written mean {:.0} ms max {:.0} ms; to quarantine mean {:.0} ms max {:.0} ms; to cordon mean {:.0} ms max {:.0} ms; each {measured:?}",
        mean(|m| m.written),
        max(|m| m.written),
        mean(|m| m.to_quarantine),
        max(|m| m.to_quarantine),
        mean(|m| m.to_cordon),
        max(|m| m.to_cordon),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "a one-minute measurement, run by hand (its figures are in the issue's report)"]
async fn a_flooding_agent_and_another_nodes_fault() {
    let admin = common::cluster().await.client();
    common::install_generated_crds(&admin).await;
    common::kubectl_apply("manifests/namespace.yaml").await;
    common::kubectl_apply("manifests/controller/flow-schemas.yaml").await;
    let fleet = common::fleet_with(1 + 2 * FAULTS, |_: &mut FleetOptions| {}).await;
    let mut nodes = fleet.node_names();
    nodes.sort();
    let flooder = nodes.remove(0);
    let name = fleet.name().to_owned();
    let policy: GpuRemediationPolicy = serde_json::from_value(json!({
        "apiVersion": "gpuremediation.dev/v1alpha1",
        "kind": "GpuRemediationPolicy",
        "metadata": {"name": name, "labels": {"e2e.gpuremediation.dev/scope": name}},
        "spec": {
            "nodeSelector": {"matchLabels": {FLEET_LABEL: name}},
            "triggers": [{"conditionType": "GpuHealthy", "status": "False", "for": "1s"}],
            "action": "None",
            "quarantine": {"enabled": true, "max": "100%", "hysteresis": "1s"},
            "safety": {"maxConcurrent": "100%", "maxUnhealthy": "100%", "rate": {"limit": 10000, "per": "1h"}},
        },
    }))
    .expect("a policy");
    let _stop = common::run_controller_over(&admin, &policy, &name).await;
    let watch = CordonWatch::start(&admin, &fleet.selector())
        .await
        .expect("the node watch");
    let agent = enforced_agent_on(&admin, &flooder).await;
    tokio::time::sleep(Duration::from_secs(3)).await;

    let mut agents = Vec::new();
    for node in &nodes {
        agents.push(enforced_agent_on(&admin, node).await);
    }
    let mut quiet = Vec::new();
    for (node, agent) in nodes[..FAULTS].iter().zip(&agents) {
        quiet.push(measure(agent, &watch, node).await);
    }

    let written = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let flood = {
        let (written, refused, flooder) = (written.clone(), refused.clone(), flooder.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / FLOOD_PER_SECOND));
            let started = Instant::now();
            let mut n = 0_u64;
            while started.elapsed() < FLOOD_FOR {
                tick.tick().await;
                n += 1;
                let (agent, flooder, written, refused) =
                    (agent.clone(), flooder.clone(), written.clone(), refused.clone());
                tokio::spawn(async move {
                    let condition = json!({"conditions": [{
                        "type": "GpuHealthy", "status": "True", "reason": "GpusHealthy", "message": format!("flood {n}"),
                        "lastTransitionTime": "2026-01-01T00:00:00Z", "lastHeartbeatTime": Timestamp::now().to_string(),
                    }]});
                    let counter = if apply_status(&agent, &flooder, &json!({}), &condition)
                        .await
                        .is_ok()
                    {
                        written
                    } else {
                        refused
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                });
            }
            n
        })
    };
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut under_flood = Vec::new();
    for (node, agent) in nodes[FAULTS..].iter().zip(&agents[FAULTS..]) {
        under_flood.push(measure(agent, &watch, node).await);
    }
    assert!(
        !flood.is_finished(),
        "every flooded fault was measured while the flood ran"
    );
    let sent = flood.await.expect("the flood");
    tokio::time::sleep(Duration::from_secs(2)).await;

    let (written, refused) = (written.load(Ordering::Relaxed), refused.load(Ordering::Relaxed));
    println!(
        "flood: {sent} writes sent, {written} accepted, {refused} refused within {}s and 2s after ({:.1}/s accepted)",
        FLOOD_FOR.as_secs(),
        f64::from(u32::try_from(written).unwrap_or(u32::MAX)) / FLOOD_FOR.as_secs_f64()
    );
    // Whether API Priority and Fairness queued or rejected the flood, from the server's own counts.
    let metrics = admin
        .request_text(
            http::Request::get("/metrics")
                .body(Vec::new())
                .expect("a request"),
        )
        .await
        .expect("the server's metrics");
    for line in metrics.lines().filter(|l| {
        l.contains(r#"flow_schema="gpu-remediator-agents""#)
            && (l.starts_with("apiserver_flowcontrol_rejected_requests_total")
                || l.starts_with("apiserver_flowcontrol_dispatched_requests_total")
                || l.starts_with("apiserver_flowcontrol_request_wait_duration_seconds_sum")
                || l.starts_with("apiserver_flowcontrol_request_wait_duration_seconds_count"))
    }) {
        println!("{line}");
    }
    summary("without flood", &quiet);
    summary("with flood", &under_flood);
    fleet.stop().await.expect("stopping the fleet");
}
