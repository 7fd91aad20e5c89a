//! What a cached node costs in memory, by what it carries: nodes as the scale bench registers them
//! (`gpu-sandbox`'s `bench::scale::register`: kubelet conditions and the agent's `GpuHealthy`, and
//! on an installed fleet the agent's inventory of eight GPUs and the controller's first-seen
//! stamps), with the managed fields the server adds, decoded one by one from watch events as the
//! watch decodes them and pruned as it prunes them (`prune_node`), then kept. Not a correctness test: run by hand, one shape per
//! process (the resident size is the process's),
//! `CACHE_COST_SHAPE=installed cargo test --release -p gpu-remediator --lib observe::cache_cost_tests -- --ignored --nocapture`
//! (`CACHE_COST_SHAPE`: `bare`, `installed`, `stamps` for the first-seen stamps without the
//! inventory, or `labelled`: installed, with the hundred-odd labels of a GPU-operator node, see
//! [`operator_labels`]; `CACHE_COST_NODES`, default 50,000; `CACHE_COST_LABELS=all` keeps every
//! label, else the labels kept are those [`a_policys_keys`] reads, as `observe::labels` keeps
//! them). It prints the growth of the resident set per node
//! and the bytes of our annotations' text per node, so the two can be set side by side, and the
//! size of the `Node` struct itself (each cached node's one allocation before any of its strings).
//! `what_a_cached_node_costs_in_the_caches_own_shape` keeps the same nodes as the cache keeps them,
//! as [`CachedNode`]s.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;

use super::{
    CachedNode,
    labels::{Kept, keys_read_by},
    prune_node,
    shared_text::SharedText,
};

/// The label keys a typical policy reads: GPU nodes by `nvidia.com/gpu.present`, zones and `NVLink`
/// cliques as failure domains, the suspect rule's default attributes.
fn a_policys_keys() -> Kept {
    let spec: gpu_remediation_api::GpuRemediationPolicySpec = serde_json::from_value(serde_json::json!({
        "nodeSelector": {"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "Exists"}]},
        "triggers": [{"conditionType": "GpuHealthy", "status": "False", "for": "30s"}],
        "safety": {
            "failureDomains": [
                {"topologyKey": "topology.kubernetes.io/zone", "maxUnhealthyShare": "20%"},
                {"topologyKey": "nvidia.com/gpu.clique", "maxUnhealthyCount": 2},
            ],
            "suspect": {},
        },
    }))
    .expect("a policy");
    Kept::Keys(Arc::new(keys_read_by(&spec)))
}

/// The process's resident set, bytes (Linux).
fn resident() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("resident pages");
    pages * 4096
}

/// Node `i` as the server sends it, carrying `shape`'s annotations.
fn node_json(i: usize, shape: &str) -> String {
    let name = format!("scale-{i:06}");
    let inventory: Vec<serde_json::Value> = (0..8)
        .map(|g| {
            serde_json::json!({"index": g, "uuid": format!("GPU-{:08x}-0000-4000-8000-{:012x}", i, g),
                "serial": format!("165{i:07}{g}"), "pciBusId": format!("00000000:{:02X}:00.0", g + 1),
                "name": "NVIDIA H100 80GB HBM3"})
        })
        .collect();
    let stamps: serde_json::Map<String, serde_json::Value> = (0..8)
        .map(|g| (format!("165{i:07}{g}"), serde_json::json!("2026-12-06T07:27:00Z")))
        .collect();
    let mut annotations = serde_json::json!({"node.alpha.kubernetes.io/ttl": "0"});
    if shape == "installed" || shape == "labelled" {
        annotations["gpuremediation.dev/gpu-inventory"] =
            serde_json::Value::String(serde_json::Value::Array(inventory).to_string());
    }
    if shape == "installed" || shape == "labelled" || shape == "stamps" {
        annotations["gpuremediation.dev/gpu-first-seen"] =
            serde_json::Value::String(serde_json::Value::Object(stamps).to_string());
    }
    // The messages the bench's fleet carries: its simulated kubelet's, the agent's healthy one.
    let condition = |type_: &str, status: &str, reason: &str| {
        let message = if type_ == "GpuHealthy" {
            "all 8 GPUs healthy".to_owned()
        } else {
            format!("simulated kubelet: {reason}")
        };
        serde_json::json!({"type": type_, "status": status, "reason": reason, "message": message,
            "lastHeartbeatTime": "2026-12-06T07:27:00Z", "lastTransitionTime": "2026-12-06T07:27:00Z"})
    };
    let mut labels = serde_json::json!({"gpu-sandbox/fleet": "scale", "kubernetes.io/hostname": name,
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8",
        "topology.kubernetes.io/zone": "zone-a", "kubernetes.io/os": "linux"});
    if shape == "labelled" {
        for (key, value) in operator_labels() {
            labels[key] = serde_json::Value::String(value);
        }
    }
    serde_json::json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name, "uid": format!("00000000-0000-4000-8000-{i:012x}"), "resourceVersion": "123456789",
            "creationTimestamp": "2026-12-06T07:27:00Z",
            "labels": labels,
            "annotations": annotations,
            "managedFields": [{"manager": "gpu-bench", "operation": "Update", "apiVersion": "v1",
                "time": "2026-12-06T07:27:00Z", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:metadata": {"f:annotations": {".": {}, "f:gpuremediation.dev/gpu-inventory": {}},
                    "f:labels": {".": {}, "f:gpu-sandbox/fleet": {}, "f:kubernetes.io/hostname": {}}},
                    "f:status": {"f:conditions": {"k:{\"type\":\"GpuHealthy\"}": {".": {}, "f:message": {}}}}}}]
        },
        "spec": {"providerID": format!("sandbox://{name}")},
        "status": {
            "conditions": [condition("Ready", "True", "KubeletReady"), condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure"), condition("PIDPressure", "False", "KubeletHasSufficientPID"),
                condition("GpuHealthy", "True", "AllGpusHealthy")],
            "nodeInfo": {"systemUUID": format!("{i:032x}"), "bootID": format!("boot-{i}"), "machineID": format!("{i:032x}"),
                "kernelVersion": "6.1.0", "osImage": "Debian", "containerRuntimeVersion": "containerd://2.0",
                "kubeletVersion": "v1.37.2", "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"},
            "capacity": {"cpu": "96", "memory": "2Ti", "nvidia.com/gpu": "8", "pods": "110"},
            "allocatable": {"cpu": "95", "memory": "2Ti", "nvidia.com/gpu": "8", "pods": "110"},
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}, {"type": "Hostname", "address": name}]
        }
    })
    .to_string()
}

/// Labels a GPU node carries on a fleet run by NVIDIA's GPU operator with Node Feature Discovery, on
/// a cloud with Karpenter: the scale bench's `--scale-labels operator` fixture (`gpu-sandbox`'s
/// `fleet::operator_labels`), 123 of them.
fn operator_labels() -> Vec<(String, String)> {
    let labels: std::collections::BTreeMap<String, String> =
        serde_json::from_str(include_str!("../../../sandbox/fixtures/operator-labels.json"))
            .expect("the fixture is a map of label keys to values");
    labels.into_iter().collect()
}

/// Node `i` of `shape` as the watch keeps it: one line of the watch, an event whose object serde
/// buffers before decoding it (each list then takes its exact length), pruned as the watch prunes.
fn as_watched(i: usize, shape: &str, labels: &Kept) -> Node {
    let line = format!(r#"{{"type":"ADDED","object":{}}}"#, node_json(i, shape));
    let kube::api::WatchEvent::Added(mut node) =
        serde_json::from_str::<kube::api::WatchEvent<Node>>(&line).expect("a watch event")
    else {
        panic!("an ADDED event")
    };
    labels.prune(&mut node);
    prune_node(&mut node);
    node
}

#[test]
#[ignore = "a measurement, run by hand (see the module's header)"]
fn what_a_cached_node_costs_by_what_it_carries() {
    let shape = std::env::var("CACHE_COST_SHAPE").unwrap_or_else(|_| "installed".to_owned());
    let count: usize = std::env::var("CACHE_COST_NODES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(50_000);
    let labels = match std::env::var("CACHE_COST_LABELS").as_deref() {
        Ok("all") => Kept::All,
        _ => a_policys_keys(),
    };
    let before = resident();
    let mut kept: Vec<Arc<Node>> = Vec::with_capacity(count);
    let mut text = 0usize;
    for i in 0..count {
        let node = as_watched(i, &shape, &labels);
        text += node
            .metadata
            .annotations
            .iter()
            .flatten()
            .map(|(k, v)| k.len() + v.len())
            .sum::<usize>();
        kept.push(Arc::new(node));
    }
    let grown = usize::try_from(resident().saturating_sub(before)).unwrap_or(usize::MAX);
    #[allow(clippy::cast_precision_loss, reason = "a printed measurement")]
    let per_node = |bytes: usize| bytes as f64 / count as f64;
    #[allow(clippy::cast_precision_loss, reason = "a printed measurement")]
    let mib = grown as f64 / (1024.0 * 1024.0);
    println!(
        "| {shape} | {count} | {mib:.1} MiB | {:.0} B | {:.0} B | {} B |",
        per_node(grown),
        per_node(text),
        size_of::<Node>(),
    );
    std::hint::black_box(kept);
}

/// The same nodes kept as the cache keeps them now, as [`CachedNode`]s: what the type saves
/// over Kubernetes' `Node` (the figure beside [`what_a_cached_node_costs_by_what_it_carries`]'s).
#[test]
#[ignore = "a measurement, run by hand (see the module's header)"]
fn what_a_cached_node_costs_in_the_caches_own_shape() {
    let shape = std::env::var("CACHE_COST_SHAPE").unwrap_or_else(|_| "installed".to_owned());
    let count: usize = std::env::var("CACHE_COST_NODES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(50_000);
    let labels = a_policys_keys();
    let before = resident();
    let mut kept: Vec<Arc<CachedNode>> = Vec::with_capacity(count);
    let mut texts = SharedText::default();
    for i in 0..count {
        kept.push(Arc::new(CachedNode::sharing(
            as_watched(i, &shape, &labels),
            &mut texts,
        )));
    }
    let grown = usize::try_from(resident().saturating_sub(before)).unwrap_or(usize::MAX);
    #[allow(clippy::cast_precision_loss, reason = "a printed measurement")]
    let mib = grown as f64 / (1024.0 * 1024.0);
    #[allow(clippy::cast_precision_loss, reason = "a printed measurement")]
    let per_node = grown as f64 / count as f64;
    println!(
        "| cached {shape} | {count} | {mib:.1} MiB | {per_node:.0} B | {} B |",
        size_of::<CachedNode>()
    );
    std::hint::black_box(kept);
}
