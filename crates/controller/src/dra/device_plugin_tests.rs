use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

use super::*;

const NODE: &str = "gpu-a";

fn at(seconds: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + seconds).unwrap()
}

fn uuid(i: usize) -> String {
    format!("GPU-{i}aaaaaaa-0000-0000-0000-000000000000")
}

/// Worker `i` on `node`, asking for one GPU through the device plugin, created at `at(-3600)`.
fn worker(i: usize, node: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": format!("worker-{i}"), "namespace": "train", "uid": format!("uid-{i}"),
                     "creationTimestamp": at(-3600).to_string()},
        "spec": {"nodeName": node, "containers": [{"name": "main",
                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        "status": {"phase": "Running"},
    }))
    .unwrap()
}

/// Eight workers on the node, one GPU each.
fn eight() -> Vec<Pod> {
    (0..8).map(|i| worker(i, NODE)).collect()
}

/// The agent's assignment of `pods` (worker i on GPU i), read at `read_at`.
fn assignment(pods: &[Pod], read_at: Timestamp) -> String {
    let entries: Vec<_> = pods
        .iter()
        .map(|p| {
            let name = p.metadata.name.clone().unwrap();
            let i: usize = name.trim_start_matches("worker-").parse().unwrap();
            json!({"namespace": "train", "name": name, "gpus": [uuid(i)]})
        })
        .collect();
    json!({"readAt": read_at.to_string(), "pods": entries}).to_string()
}

fn decide(pods: &[Pod], failed: &[String], annotation: Option<&str>) -> Result<Vec<String>, String> {
    let node_pods: Vec<&Pod> = pods
        .iter()
        .filter(|p| p.spec.as_ref().unwrap().node_name.as_deref() == Some(NODE))
        .collect();
    let plugin_pods: Vec<PluginPod<'_>> = node_pods
        .iter()
        .filter(|p| !finished(p))
        .map(|pod| PluginPod {
            pod,
            resource: "nvidia.com/gpu",
        })
        .collect();
    let elsewhere: Vec<Pod> = pods
        .iter()
        .filter(|p| p.spec.as_ref().unwrap().node_name.as_deref() != Some(NODE))
        .cloned()
        .collect();
    plugin_holders(
        NODE,
        failed,
        &node_pods,
        &plugin_pods,
        &elsewhere,
        annotation,
        at(0),
    )
    .map(|set| set.iter().map(ToString::to_string).collect())
}

#[test]
fn on_an_eight_gpu_node_only_the_pod_holding_the_failed_gpu_is_a_holder() {
    let pods = eight();
    let note = assignment(&pods, at(-30));
    assert_eq!(
        decide(&pods, &[uuid(3)], Some(&note)).unwrap(),
        ["train/worker-3"]
    );
}

#[test]
fn the_holder_keeps_its_uid_so_only_the_pod_that_was_seen_is_evicted() {
    let pods = eight();
    let note = assignment(&pods, at(-30));
    let node_pods: Vec<&Pod> = pods.iter().collect();
    let plugin: Vec<PluginPod<'_>> = node_pods
        .iter()
        .map(|pod| PluginPod {
            pod,
            resource: "nvidia.com/gpu",
        })
        .collect();
    let held = plugin_holders(NODE, &[uuid(3)], &node_pods, &plugin, &[], Some(&note), at(0)).unwrap();
    assert_eq!(held.first().unwrap().uid.as_deref(), Some("uid-3"));
}

#[test]
fn uuids_of_the_assignment_match_the_fault_whatever_their_letter_case() {
    let pods = eight();
    let note = assignment(&pods, at(-30));
    assert_eq!(
        decide(&pods, &[uuid(5).to_lowercase()], Some(&note)).unwrap(),
        ["train/worker-5"]
    );
}

#[test]
fn a_gpu_shared_by_two_pods_has_both_as_holders() {
    let pods = eight();
    let mut note: serde_json::Value = serde_json::from_str(&assignment(&pods, at(-30))).unwrap();
    note["pods"][4]["gpus"] = json!([uuid(4), uuid(3)]);
    let note = note.to_string();
    assert_eq!(
        decide(&pods, &[uuid(3)], Some(&note)).unwrap(),
        ["train/worker-3", "train/worker-4"]
    );
}

#[test]
fn a_node_without_device_plugin_pods_needs_no_assignment() {
    assert_eq!(decide(&[], &[uuid(3)], None).unwrap(), Vec::<String>::new());
}

#[test]
fn a_missing_assignment_is_unknown_and_names_the_pod_and_its_resource() {
    let why = decide(&eight(), &[uuid(3)], None).unwrap_err();
    assert!(
        why.contains("pod train/worker-0 asks for nvidia.com/gpu")
            && why.contains("carries no gpuremediation.dev/gpu-pods assignment"),
        "{why}"
    );
}

#[test]
fn an_assignment_that_does_not_parse_is_unknown() {
    let why = decide(&eight(), &[uuid(3)], Some("{not json")).unwrap_err();
    assert!(why.contains("does not parse"), "{why}");
}

#[test]
fn an_assignment_older_than_its_maximum_age_is_stale() {
    let pods = eight();
    let note = assignment(&pods, at(-GPU_PODS_MAX_AGE_SECONDS - 1));
    let why = decide(&pods, &[uuid(3)], Some(&note)).unwrap_err();
    assert!(why.contains("stale"), "{why}");
    let fresh = assignment(&pods, at(-GPU_PODS_MAX_AGE_SECONDS + 60));
    assert!(decide(&pods, &[uuid(3)], Some(&fresh)).is_ok());
}

#[test]
fn a_device_plugin_pod_the_assignment_does_not_name_is_unknown() {
    let mut pods = eight();
    let note = assignment(&pods[..7], at(-30));
    pods.push(worker(9, NODE));
    let why = decide(&pods, &[uuid(3)], Some(&note)).unwrap_err();
    assert!(
        why.contains("pod train/worker-7 asks for nvidia.com/gpu through the device plugin but is not in"),
        "{why}"
    );
}

#[test]
fn pods_left_out_of_a_full_assignment_are_unknown_and_the_reason_says_so() {
    let pods = eight();
    let mut note: serde_json::Value = serde_json::from_str(&assignment(&pods[..7], at(-30))).unwrap();
    note["omitted"] = json!(1);
    let why = decide(&pods, &[uuid(3)], Some(&note.to_string())).unwrap_err();
    assert!(why.contains("(1 pods were left out of it)"), "{why}");
}

#[test]
fn a_pod_created_after_the_assignment_was_read_is_unknown_even_under_a_known_name() {
    let mut pods = eight();
    let note = assignment(&pods, at(-30));
    // worker-3 was deleted and created again (a StatefulSet's pod) after the agent's last read.
    pods[3].metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at(-10)));
    pods[3].metadata.uid = Some("uid-3-again".into());
    let why = decide(&pods, &[uuid(3)], Some(&note)).unwrap_err();
    assert!(
        why.contains("pod train/worker-3 was created at") && why.contains("after node gpu-a's"),
        "{why}"
    );
}

#[test]
fn a_pod_holding_a_device_the_agent_could_not_tie_to_a_gpu_is_unknown() {
    let pods = eight();
    let mut note: serde_json::Value = serde_json::from_str(&assignment(&pods, at(-30))).unwrap();
    note["pods"][6]["unmapped"] = json!(["nvidia.com/mig-1g.10gb=MIG-0f0f0f0f-1111-2222-3333-444444444444"]);
    let why = decide(&pods, &[uuid(3)], Some(&note.to_string())).unwrap_err();
    assert!(
        why.contains("pod train/worker-6 holds device nvidia.com/mig-1g.10gb=MIG-0f0f0f0f"),
        "{why}"
    );
}

#[test]
fn an_assignment_giving_the_failed_gpu_to_a_pod_of_another_node_is_unknown() {
    // A compromised agent on gpu-a names a pod of gpu-b as the holder of GPU 3.
    let mut pods = eight();
    pods[3] = worker(3, "gpu-b");
    pods.push(worker(8, NODE));
    let mut note: serde_json::Value = serde_json::from_str(&assignment(&pods, at(-30))).unwrap();
    note["pods"][8]["gpus"] = json!([uuid(2)]);
    let why = decide(&pods, &[uuid(3)], Some(&note.to_string())).unwrap_err();
    assert!(
        why.contains("gives failed GPU") && why.contains("to pod train/worker-3, which runs on node gpu-b"),
        "{why}"
    );
}

#[test]
fn a_holder_gone_since_the_agents_read_holds_nothing() {
    // worker-3 was evicted and deleted; the agent has not read the kubelet since.
    let mut pods = eight();
    let note = assignment(&pods, at(-30));
    pods.remove(3);
    assert_eq!(
        named_off_node(&[uuid(3)], &pods.iter().collect::<Vec<_>>(), Some(&note)),
        [("train".to_owned(), "worker-3".to_owned())],
        "looked up"
    );
    assert_eq!(
        decide(&pods, &[uuid(3)], Some(&note)).unwrap(),
        Vec::<String>::new()
    );
}

#[test]
fn a_finished_pod_the_assignment_still_names_holds_nothing() {
    let mut pods = eight();
    let note = assignment(&pods, at(-30));
    pods[3].status.as_mut().unwrap().phase = Some("Succeeded".into());
    assert_eq!(
        decide(&pods, &[uuid(3)], Some(&note)).unwrap(),
        Vec::<String>::new()
    );
}
