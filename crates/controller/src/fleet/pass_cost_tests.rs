//! What one controller pass costs over a large fleet, by stage: the pure planning over every cached
//! node (`fleet::plan`, the hardware ledger's `amend` and `join::steps`), and the planning a pass
//! does since it keeps a node index (`index::NodeIndex::refresh` with the faulty nodes as the
//! changed ones, then `fleet::plan_with` over the candidates the index names). Not a
//! correctness test: run by hand, in the build whose figures are wanted,
//! `cargo test -p gpu-remediator --lib fleet::pass_cost_tests -- --ignored --nocapture`
//! (`PASS_COST_NODES=10000,50000`, `PASS_COST_FAULTS=1,100`). Beside the faults in flight, the
//! fleet has 100 finished remediations on record (as after the scale bench's earlier rounds).
//! `PASS_COST_INVENTORY=1`: every node also lists its eight GPUs' serials, as the agent reports
//! them, and each faulty node names its failed GPU, so that admission looks for other claimants
//! of the failed serial (`hardware::amend`).

use crate::test_fixtures::at;
use std::{sync::Arc, time::Instant};

use gpu_remediation_api::{
    GpuRemediation, GpuRemediationPolicy, GpuRemediationPolicySpec, GpuRemediationStatus, Phase,
    policy::Action,
};
use jiff::Timestamp;
use k8s_openapi::{
    api::core::v1::{Node, NodeCondition, NodeSpec, NodeStatus},
    apimachinery::pkg::{api::resource::Quantity, apis::meta::v1::Time},
};
use kube::api::ObjectMeta;

use crate::hardware;

fn policy() -> Arc<GpuRemediationPolicy> {
    let spec: GpuRemediationPolicySpec = serde_json::from_value(serde_json::json!({
        "nodeSelector": {"matchLabels": {"gpu-sandbox/fleet": "scale"}},
        "triggers": [{"conditionType": "GpuHealthy", "status": "False", "for": "5s"}],
        "action": "None",
        "safety": {"maxConcurrent": "100%", "maxUnhealthy": "100%", "rate": {"limit": 10000, "per": "1h"},
                   "maxAttemptsPerNode": {"count": 100, "per": "1h"}},
        "drain": {"timeout": "10m"},
        "release": {"healthyFor": "1s"},
    }))
    .unwrap();
    let mut p = GpuRemediationPolicy::new("scale", spec);
    p.metadata.generation = Some(1);
    Arc::new(p)
}

/// A node as the scale bench registers it (labels, capacity, `Ready` and `GpuHealthy` conditions),
/// with the agent's inventory of eight GPUs when `inventory` (and its failed GPU when `broken`).
fn node(index: usize, broken: bool, inventory: bool) -> Arc<Node> {
    let name = format!("gpu-{index:05}");
    let condition = |type_: &str, status: &str, reason: &str| NodeCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        last_transition_time: Some(Time(at(0))),
        ..NodeCondition::default()
    };
    let gpu = if broken {
        condition("GpuHealthy", "False", "XID79")
    } else {
        condition("GpuHealthy", "True", "GpusHealthy")
    };
    let resources = [
        ("cpu", "96"),
        ("memory", "1Ti"),
        ("pods", "110"),
        ("nvidia.com/gpu", "8"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), Quantity(v.to_owned())))
    .collect();
    Arc::new(Node {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            uid: Some(format!("uid-{index}")),
            labels: Some(
                [
                    ("kubernetes.io/hostname", name.as_str()),
                    ("kubernetes.io/os", "linux"),
                    ("kubernetes.io/arch", "amd64"),
                    ("nvidia.com/gpu.present", "true"),
                    ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),
                    ("nvidia.com/gpu.count", "8"),
                    ("gpu-sandbox/fleet", "scale"),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            ),
            annotations: inventory.then(|| inventory_of(index, broken)),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec {
            provider_id: Some(format!("gpu-sandbox://{name}")),
            ..NodeSpec::default()
        }),
        status: Some(NodeStatus {
            capacity: Some(resources),
            conditions: Some(vec![condition("Ready", "True", "KubeletReady"), gpu]),
            ..NodeStatus::default()
        }),
    })
}

/// The agent's annotations of node `index`: eight GPUs with serials, GPU 1 failed when `broken`.
fn inventory_of(index: usize, broken: bool) -> std::collections::BTreeMap<String, String> {
    use gpu_remediation_api::constants::{FAILED_GPUS_ANNOTATION, GPU_INVENTORY_ANNOTATION};
    let gpus: Vec<serde_json::Value> = (0..8)
        .map(|gpu| {
            serde_json::json!({
                "index": gpu,
                "uuid": format!("GPU-{index:08x}-{gpu:04x}-4e1f-9c3a-1b2d3e4f5a6b"),
                "serial": format!("165{index:07}{gpu}"),
                "pciBusId": format!("00000000:{:02X}:00.0", 0x18 + gpu * 0x10),
            })
        })
        .collect();
    let mut annotations = std::collections::BTreeMap::from([(
        GPU_INVENTORY_ANNOTATION.to_owned(),
        serde_json::to_string(&gpus).unwrap(),
    )]);
    if broken {
        annotations.insert(
            FAILED_GPUS_ANNOTATION.to_owned(),
            serde_json::json!([{"uuid": gpus[1]["uuid"], "reason": "XID79"}]).to_string(),
        );
    }
    annotations
}

fn record(index: usize, phase: Phase) -> Arc<GpuRemediation> {
    let node = format!("gpu-{index:05}");
    let mut r =
        crate::test_fixtures::remediation(&format!("{node}-abc"), &node, "scale", Some(at(0)), Action::None);
    r.metadata.creation_timestamp = Some(Time(at(6)));
    r.status = Some(GpuRemediationStatus {
        phase,
        ..GpuRemediationStatus::default()
    });
    Arc::new(r)
}

fn numbers(var: &str, default: &[usize]) -> Vec<usize> {
    std::env::var(var).map_or_else(
        |_| default.to_vec(),
        |v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect(),
    )
}

/// The median of `runs` timings of `f`, in milliseconds.
fn median_ms(runs: usize, mut f: impl FnMut()) -> f64 {
    let mut times: Vec<f64> = (0..runs)
        .map(|_| {
            let started = Instant::now();
            f();
            started.elapsed().as_secs_f64() * 1000.0
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

#[test]
#[ignore = "a measurement, run by hand (see the module's header)"]
fn one_pass_over_a_large_fleet_by_stage() {
    let policies = vec![policy()];
    let now = at(60);
    let inventory = std::env::var("PASS_COST_INVENTORY").is_ok_and(|v| v == "1");
    println!(
        "| nodes | faults | admitted in the pass | fleet::plan ms | hardware::amend ms | the claims walk ms | claimants rebuilt ms | join::steps ms | total ms | indexed plan ms |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for size in numbers("PASS_COST_NODES", &[10_000, 50_000]) {
        for faults in numbers("PASS_COST_FAULTS", &[1, 100]) {
            // The faulty nodes spread over the fleet, as faults are (not all at its start).
            let step = size / (2 * faults);
            let fault = |k: usize| k * step;
            let nodes: Vec<Arc<Node>> = (0..size)
                .map(|i| node(i, i % step == 0 && i / step < faults, inventory))
                .collect();
            // One arriving while the others are in flight, or all arriving together.
            let mut admitted_counts = vec![1];
            if faults > 1 {
                admitted_counts.push(faults);
            }
            for admitted in admitted_counts {
                let remediations: Vec<Arc<GpuRemediation>> = (0..faults - admitted)
                    .map(|k| record(fault(k), Phase::Draining))
                    .chain((0..100).map(|k| record(size - 1 - 3 * k, Phase::Succeeded)))
                    .collect();
                let failures = hardware::failures(&[], &remediations);
                let plan_ms = median_ms(5, || {
                    std::hint::black_box(super::plan(&policies, &nodes, &remediations, now));
                });
                let planned = super::plan(&policies, &nodes, &remediations, now);
                assert_eq!(
                    planned.policies[0].create.len(),
                    admitted,
                    "{:?}",
                    planned.policies[0].status.waiting.first()
                );
                let claimants = hardware::claimants::Claimants::of(&nodes);
                let amend_ms = median_ms(5, || {
                    let mut plan = planned.clone();
                    hardware::amend(&mut plan, &nodes, &claimants, || nodes.clone(), &failures, now);
                    std::hint::black_box(plan);
                });
                // The claimants index built afresh, as when the node watch lists afresh.
                let rebuild_ms = median_ms(3, || {
                    std::hint::black_box(hardware::claimants::Claimants::of(&nodes));
                });
                // Who else lists one failed serial: a walk of every node's inventory text.
                let serial = std::collections::BTreeSet::from([format!("165{:07}1", fault(0))]);
                let claims_ms = median_ms(9, || {
                    std::hint::black_box(hardware::trust::Claims::of(
                        nodes.iter().map(AsRef::as_ref),
                        &serial,
                    ));
                });
                let join_ms = median_ms(5, || {
                    std::hint::black_box(hardware::join::steps(
                        &policies,
                        &nodes,
                        &remediations,
                        &failures,
                        now,
                    ));
                });
                let indexed_ms = indexed_plan_ms(&policies, &nodes, &remediations, faults, fault, now);
                println!(
                    "| {size} | {faults} | {admitted} | {plan_ms:.1} | {amend_ms:.2} | {claims_ms:.1} | {rebuild_ms:.1} | {join_ms:.1} | {:.1} | {indexed_ms:.2} |",
                    plan_ms + amend_ms + join_ms
                );
            }
        }
    }
}

/// A pass's planning with the node index: the faulty nodes are the ones the watch saw change; the
/// index looks them up, names the candidates, and the plan looks at those. The plan is checked to
/// be the whole fleet's.
fn indexed_plan_ms(
    policies: &[Arc<GpuRemediationPolicy>],
    nodes: &[Arc<Node>],
    remediations: &[Arc<GpuRemediation>],
    faults: usize,
    fault: impl Fn(usize) -> usize,
    now: Timestamp,
) -> f64 {
    use std::collections::{BTreeSet, HashMap};

    use super::index::{NodeChanges, NodeIndex};

    let by_name: HashMap<String, Arc<Node>> = nodes
        .iter()
        .map(|n| (n.metadata.name.clone().unwrap_or_default(), n.clone()))
        .collect();
    let changed: BTreeSet<String> = (0..faults).map(|k| format!("gpu-{:05}", fault(k))).collect();
    let mut index = NodeIndex::default();
    index.refresh(
        policies,
        NodeChanges::Everything,
        now,
        |_| None,
        || nodes.to_vec(),
    );
    let mut planned = None;
    let ms = median_ms(5, || {
        index.refresh(
            policies,
            NodeChanges::Nodes(&changed),
            now,
            |name| by_name.get(name).cloned(),
            || unreachable!("no node joined, left or was relabelled"),
        );
        let looked_at: Vec<Arc<Node>> = index
            .candidates(remediations, &[])
            .into_iter()
            .filter_map(|name| by_name.get(name).cloned())
            .collect();
        planned = Some(super::plan_with(
            policies,
            &index.census(),
            &looked_at,
            remediations,
            &crate::first_seen::FirstSeen::default(),
            now,
        ));
    });
    let whole = super::plan(policies, nodes, remediations, now);
    assert_eq!(format!("{planned:?}"), format!("{:?}", Some(whole)));
    ms
}
