//! New nodes validated before they take work, on the real control plane. A node that joins (a
//! replacement the provider made, or any node the policy selects on arrival) registers with the
//! `gpuremediation.dev/unvalidated` taint, as a kubelet's `--register-with-taints` or Karpenter's
//! `startupTaints` would make it; the policy's `validation.newNodes` runs its validation Job there
//! (kube-controller-manager's job controller; the sandbox's simulated kubelet finishes the pod from
//! the node's simulated GPU), at most `max` at once. The taint is lifted only when the Job passed:
//! a pod waiting for the node is scheduled after the Job completed, never before; a node whose GPU
//! is broken keeps its taint, says why (`GpuValidated=False`, an Event) and takes no pod. The
//! shipped `config/validation/dcgm-diag.yaml`, as shipped, validates a joining node in the
//! controller's namespace.

mod common;
mod scenario;

use std::time::Duration;

use common::eventually;
use gpu_remediation_api::constants::{
    UNVALIDATED_TAINT_KEY, node_conditions::GPU_VALIDATED, reasons, validated_reasons,
};
use gpu_remediator::quarantine::leak::scheduled_at;
use gpu_sandbox::fleet::validation_pod::SIM_GPU_FAULT_ANNOTATION;
use k8s_openapi::api::{
    batch::v1::Job,
    core::v1::{Node, NodeSpec, Pod, Taint},
};
use kube::{
    Api, ResourceExt,
    api::{ListParams, PostParams},
};
use scenario::{RunningController, Scenario, event_notes};
use serde_json::json;

/// The policy: the sample's `dcgmi diag` as validation Job, new nodes validated one at a time.
fn policy(s: &Scenario) -> serde_json::Value {
    json!({"validation": {
        "job": scenario::dcgm_validation_job(&s.namespace),
        "timeout": "2m",
        "newNodes": {"max": 1},
    }})
}

/// Registers the node with the startup taint (and, when `broken`, a simulated GPU whose hardware
/// is broken while the node reports healthy).
fn unvalidated(node: &mut Node, broken: bool) {
    node.spec
        .get_or_insert_with(NodeSpec::default)
        .taints
        .get_or_insert_with(Vec::new)
        .push(Taint {
            key: UNVALIDATED_TAINT_KEY.to_owned(),
            effect: "NoSchedule".to_owned(),
            ..Taint::default()
        });
    if broken {
        node.annotations_mut().insert(
            SIM_GPU_FAULT_ANNOTATION.to_owned(),
            "XID 79 on GPU-3 (still broken)".to_owned(),
        );
    }
}

/// A pod that can only run on `node`, created before the node exists (a workload waiting for
/// capacity).
async fn waiting_pod(s: &Scenario, node: &str) -> String {
    let name = format!("waits-for-{node}");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": s.namespace},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                 "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]},
    }))
    .unwrap();
    Api::<Pod>::namespaced(s.client.clone(), &s.namespace)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    name
}

fn has_startup_taint(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == UNVALIDATED_TAINT_KEY))
}

fn validated(node: &Node) -> Option<(String, String, String)> {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == GPU_VALIDATED))
        .map(|c| {
            (
                c.status.clone(),
                c.reason.clone().unwrap_or_default(),
                c.message.clone().unwrap_or_default(),
            )
        })
}

/// The validation Job of `node` (by the node's pod label), once it exists.
async fn job_of(s: &Scenario, node: &str) -> Option<Job> {
    Api::<Job>::namespaced(s.client.clone(), &s.namespace)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|job| {
            job.spec
                .as_ref()
                .and_then(|spec| spec.template.spec.as_ref())
                .and_then(|pod| pod.node_name.as_deref())
                == Some(node)
        })
}

#[tokio::test]
async fn joining_nodes_take_their_first_pod_only_after_their_validation_passed_one_at_a_time() {
    let s = Scenario::new(1).await;
    s.policy(policy(&s)).await;
    let controller = RunningController::start(&s.scope).await;
    let (first, second) = (
        gpu_sandbox::fleet::node::node_name(s.fleet.name(), 1),
        gpu_sandbox::fleet::node::node_name(s.fleet.name(), 2),
    );
    let pods = [waiting_pod(&s, &first).await, waiting_pod(&s, &second).await];
    let joined = s
        .fleet
        .add_nodes_prepared(2, &|node| unvalidated(node, false))
        .await
        .unwrap();
    assert_eq!(joined, [first.clone(), second.clone()]);

    let api = Api::<Pod>::namespaced(s.client.clone(), &s.namespace);
    let mut jobs = Vec::new();
    for (node, pod) in [&first, &second].into_iter().zip(&pods) {
        let (job, scheduled) = eventually(
            &format!("{node}'s validation passed and its pod scheduled"),
            Duration::from_secs(90),
            || async {
                let job = job_of(&s, node).await?;
                let pod = api.get(pod).await.unwrap();
                Some((job, scheduled_at(&pod)?))
            },
        )
        .await;
        let Some(completed) = job
            .status
            .as_ref()
            .and_then(|status| status.completion_time.as_ref())
            .map(|t| t.0)
        else {
            panic!(
                "{node}'s pod was scheduled before its Job {} completed",
                job.name_any()
            );
        };
        assert!(
            completed <= scheduled,
            "{node}: pod scheduled at {scheduled}, before its Job completed at {completed}"
        );
        let node_now = s.node(node).await;
        assert!(!has_startup_taint(&node_now), "{node} keeps the startup taint");
        let (status, reason, message) = validated(&node_now).expect("a GpuValidated condition");
        assert_eq!(
            (status.as_str(), reason.as_str()),
            ("True", validated_reasons::PASSED)
        );
        assert!(message.contains(&job.name_any()), "{message}");
        jobs.push((job, completed));
    }
    // One at a time: the second node's Job was created only once the first had completed.
    let (second_job, first_completed) = (&jobs[1].0, jobs[0].1);
    let second_created = second_job.metadata.creation_timestamp.as_ref().unwrap().0;
    assert!(
        second_created >= first_completed,
        "newNodes.max 1, yet the second Job was created at {second_created}, before the first completed at {first_completed}"
    );
    // The Job belongs to the policy: it goes with it.
    let owner = jobs[0].0.owner_references();
    assert!(
        owner
            .iter()
            .any(|o| o.kind == "GpuRemediationPolicy" && o.name == s.scope),
        "{owner:?}"
    );
    assert_eq!(
        event_notes(&s.client, &first, reasons::NEW_NODE_VALIDATED)
            .await
            .len(),
        1,
        "one NewNodeValidated Event"
    );
    controller.stop().await;
}

#[tokio::test]
async fn a_joining_node_whose_gpu_is_broken_fails_validation_keeps_its_taint_says_why_and_takes_no_pod() {
    let s = Scenario::new(1).await;
    s.policy(policy(&s)).await;
    let controller = RunningController::start(&s.scope).await;
    let broken = gpu_sandbox::fleet::node::node_name(s.fleet.name(), 1);
    let pod = waiting_pod(&s, &broken).await;
    s.fleet
        .add_nodes_prepared(1, &|node| unvalidated(node, true))
        .await
        .unwrap();
    let (_, reason, message) = eventually("the node held", Duration::from_secs(90), || async {
        validated(&s.node(&broken).await).filter(|(status, ..)| status == "False")
    })
    .await;
    assert_eq!(reason, validated_reasons::FAILED);
    assert!(
        message.contains("failed") && message.contains("a person decides"),
        "{message}"
    );
    let notes = eventually(
        "a NewNodeValidationFailed Event",
        Duration::from_secs(20),
        || async {
            let notes = event_notes(&s.client, &broken, reasons::NEW_NODE_VALIDATION_FAILED).await;
            (!notes.is_empty()).then_some(notes)
        },
    )
    .await;
    assert!(notes[0].contains(&message[..20]), "{notes:?}");
    // Held, not retried: several passes later the taint stays, one Job ran, the pod waits.
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert!(
        has_startup_taint(&s.node(&broken).await),
        "the startup taint stays"
    );
    let jobs = Api::<Job>::namespaced(s.client.clone(), &s.namespace)
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(jobs.items.len(), 1, "one validation Job, not retried");
    let waiting = Api::<Pod>::namespaced(s.client.clone(), &s.namespace)
        .get(&pod)
        .await
        .unwrap();
    assert_eq!(
        waiting.spec.and_then(|spec| spec.node_name),
        None,
        "no pod lands on the held node"
    );
    assert_eq!(
        event_notes(&s.client, &broken, reasons::NEW_NODE_VALIDATION_FAILED)
            .await
            .len(),
        1,
        "the Warning is given once"
    );
    controller.stop().await;
}

#[tokio::test]
async fn the_shipped_dcgm_sample_as_shipped_validates_a_joining_node_in_the_controllers_namespace() {
    let sample: serde_json::Value =
        serde_yaml::from_str(&common::repo_file("config/validation/dcgm-diag.yaml")).unwrap();
    assert!(sample.get("newNodes").is_some(), "the sample validates new nodes");
    let s = Scenario::new(1).await;
    let namespace =
        gpu_sandbox::demo::install::parse_documents(&common::repo_file("manifests/namespace.yaml")).unwrap();
    gpu_sandbox::demo::install::apply(&s.client, &namespace)
        .await
        .unwrap();
    s.policy(json!({"validation": sample})).await;
    let controller = RunningController::start(&s.scope).await;
    let joining = gpu_sandbox::fleet::node::node_name(s.fleet.name(), 1);
    s.fleet
        .add_nodes_prepared(1, &|node| unvalidated(node, false))
        .await
        .unwrap();
    // The taint is lifted first, then the condition says why: wait for both writes.
    let node = eventually("the joining node validated", Duration::from_secs(90), || async {
        let node = s.node(&joining).await;
        let decided = validated(&node).is_some_and(|(status, _, _)| status != "Unknown");
        (!has_startup_taint(&node) && decided).then_some(node)
    })
    .await;
    let (status, reason, message) = validated(&node).expect("a GpuValidated condition");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", validated_reasons::PASSED)
    );
    assert!(message.contains("gpu-remediation/"), "{message}");
    let job = Api::<Job>::namespaced(s.client.clone(), "gpu-remediation")
        .get(&gpu_remediator::hardware::join_validation::job_name(
            &joining,
            node.metadata.uid.as_deref().unwrap(),
        ))
        .await
        .unwrap();
    let pod = job
        .spec
        .as_ref()
        .and_then(|spec| spec.template.spec.as_ref())
        .unwrap();
    assert!(
        pod.containers[0]
            .args
            .clone()
            .unwrap_or_default()
            .join(" ")
            .contains("dcgmi diag -r 2"),
        "{pod:?}"
    );
    assert_eq!(job.status.and_then(|status| status.succeeded), Some(1));
    controller.stop().await;
}
