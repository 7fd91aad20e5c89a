//! The scenario on real nodes (issue 43, `docs/plans/real-node.md` S7): a GPU node and a
//! CPU node, the chart installed as shipped (the controller on the CPU node, the agent on the GPU
//! node, with the catalog override a user sets to reset a GPU after an XID 79), NVIDIA's device
//! plugin on the GPU node, and a policy whose ladder tries a GPU reset before it replaces the node
//! (`DeleteNode`).
//!
//! Shown, in order:
//! 1. An XID 79 on GPU 1, written into the NVML stand-in's scenario: the device plugin withdraws
//!    the GPU (allocatable 2 → 1), the agent sets `GpuHealthy=False`, the node is quarantined, and
//!    the `ResetGpu` step's GPU-scoped drain evicts through the Eviction API only the pod the
//!    kubelet handed GPU 1 (read by the agent from the real kubelet's pod-resources API): its
//!    container ends on SIGTERM (exit code 0, within its grace period); the pod on GPU 0 keeps
//!    running, never restarted.
//! 2. The reset's Job reports done, but no evidence follows (the fault stays latched): the step
//!    times out and the ladder climbs to `Replace`, whose drain evicts the node's other pods
//!    through the Eviction API, within a `PodDisruptionBudget` that never drops below its minimum;
//!    the controller deletes the Node only once they are gone.
//! 3. The node group (played by this test: the deleted node's machine is powered off and a new one
//!    started under a new name, with its own certificate, as a cloud's node group brings a new
//!    machine) brings a replacement GPU node; the agent and the plugin start on it from their
//!    `DaemonSet`s, the remediation succeeds on the replacement's evidence, and the evicted pods run
//!    there.
//!
//! `#[ignore]`d: it needs root and the built binaries (`make real-node-test` builds them and names
//! them in the environment).

use std::{
    sync::{
        Arc,
        atomic::{AtomicI32, Ordering},
    },
    time::Duration,
};

use gpu_remediation_api::{
    GpuRemediation, GpuRemediationPolicy, Phase,
    constants::{GPU_PODS_ANNOTATION, GPU_PRESENT_LABEL, QUARANTINE_TAINT_KEY},
    gpu_pods::{GPU_PODS_CLOCK_SLACK_SECONDS, GpuPods},
    ladder::{Rung, StepOutcome},
};
use gpu_sandbox::{
    real_node::{
        chart::{self, Images, NAMESPACE, condition_status, node_of, pods_labelled},
        cluster::{Cluster, Wanted, eventually, exit_code_at_deletion},
        config::PAUSE_IMAGE,
        nvidia::Scenario,
        shipped,
    },
    workload,
};
use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::{Node, Pod},
    policy::v1::PodDisruptionBudget,
};
use kube::{
    Api, ResourceExt,
    api::{ListParams, PostParams},
};
use serde_json::json;

const GPU_NODE: &str = "recycled-gpu";
const CPU_NODE: &str = "recycle-cpu";
const REPLACEMENT: &str = "replacement-gpu";
const WORKLOADS: &str = "default";
const GRACE_SECONDS: i64 = 30;

/// The policy: a trigger on the agent's condition, a GPU reset first (a Job on the node, which
/// here reports done without resetting anything: the stand-in's fault stays), then a replacement
/// by deleting the Node.
fn policy() -> GpuRemediationPolicy {
    let reset_job = json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "{{remediationName}}-reset", "namespace": NAMESPACE},
        "spec": {"backoffLimit": 0, "template": {"spec": {
            "nodeName": "{{nodeName}}", "restartPolicy": "Never",
            "tolerations": [{"operator": "Exists"}],
            // `pause -v` prints its version and exits 0: a reset Job that reports done.
            "containers": [{"name": "reset", "image": PAUSE_IMAGE, "imagePullPolicy": "Never",
                            "args": ["-v"]}],
        }}},
    });
    serde_json::from_value(json!({
        "apiVersion": "gpuremediation.dev/v1alpha1", "kind": "GpuRemediationPolicy",
        "metadata": {"name": "real-nodes"},
        "spec": {
            "nodeSelector": {"matchLabels": {GPU_PRESENT_LABEL: "true"}},
            "triggers": [{"conditionType": "GpuHealthy", "status": "False", "for": "5s"}],
            "ladder": [
                {"step": "ResetGpu", "timeout": "20s", "template": reset_job},
                {"step": "Replace", "timeout": "4m"},
            ],
            "replacement": {"strategy": "DeleteNode", "timeout": "4m"},
            "safety": {"maxConcurrent": 1, "maxUnhealthy": "100%"},
            "drain": {"timeout": "2m"},
            "release": {"healthyFor": "5s"},
        },
    }))
    .expect("a valid policy")
}

/// Two pods of one GPU each (`trainer`), and two CPU pods one per node (`web`) under a budget
/// keeping one available; all run the pause image, which exits on SIGTERM.
async fn run_workloads(cluster: &Cluster) {
    let client = cluster.control_plane.client();
    let deployment = |name: &str, gpus: bool| -> Deployment {
        let mut container = json!({"name": name, "image": PAUSE_IMAGE, "imagePullPolicy": "Never"});
        let mut pod = json!({"terminationGracePeriodSeconds": GRACE_SECONDS});
        if gpus {
            container["resources"] = json!({"limits": {"nvidia.com/gpu": "1"}});
        } else {
            // One per node: the scheduler spreads them, and a second cannot share a node.
            pod["affinity"] = json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": name}}, "topologyKey": "kubernetes.io/hostname"}]}});
        }
        pod["containers"] = json!([container]);
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}}, "spec": pod}},
        }))
        .unwrap()
    };
    let deployments = Api::<Deployment>::namespaced(client.clone(), WORKLOADS);
    for (name, gpus) in [("trainer", true), ("web", false)] {
        deployments
            .create(&PostParams::default(), &deployment(name, gpus))
            .await
            .unwrap();
    }
    let budget: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}},
    }))
    .unwrap();
    Api::<PodDisruptionBudget>::namespaced(client, WORKLOADS)
        .create(&PostParams::default(), &budget)
        .await
        .unwrap();
}

/// The pods labelled `app=app`, Running and not being deleted.
async fn running(pods: &Api<Pod>, app: &str) -> Vec<Pod> {
    pods.list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .map(|list| list.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|pod| {
            pod.metadata.deletion_timestamp.is_none()
                && pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        })
        .collect()
}

/// The node's `nvidia.com/gpu` allocatable count.
async fn allocatable_gpus(nodes: &Api<Node>, name: &str) -> Option<String> {
    chart::gpu_counts(nodes, name)
        .await
        .map(|(_, allocatable)| allocatable)
}

/// The agent's published assignment on `node`, once it covers every pod of `pods` (each read at
/// least the clock slack after its creation, as the controller requires before it trusts it).
async fn assignment_covering(nodes: &Api<Node>, node: &str, pods: &[Pod]) -> GpuPods {
    eventually(
        "the agent's assignment covering both trainers",
        Duration::from_secs(90),
        || async {
            let node = nodes.get(node).await.ok()?;
            let assignment: GpuPods =
                serde_json::from_str(node.annotations().get(GPU_PODS_ANNOTATION)?).ok()?;
            let covers = pods.iter().all(|pod| {
                let created = pod.metadata.creation_timestamp.as_ref().map(|t| t.0);
                let read_late_enough = created.is_some_and(|created| {
                    assignment.read_at.0.as_second() >= created.as_second() + GPU_PODS_CLOCK_SLACK_SECONDS
                });
                read_late_enough
                    && assignment
                        .pods
                        .iter()
                        .any(|entry| entry.namespace == WORKLOADS && entry.name == pod.name_any())
            });
            covers.then_some(assignment)
        },
    )
    .await
}

/// Follows the `web` budget until aborted: the least `currentHealthy - desiredHealthy` it showed.
fn budget_floor(budgets: Api<PodDisruptionBudget>) -> (Arc<AtomicI32>, tokio::task::JoinHandle<()>) {
    let floor = Arc::new(AtomicI32::new(i32::MAX));
    let seen = floor.clone();
    let task = tokio::spawn(async move {
        loop {
            if let Ok(budget) = budgets.get("web").await
                && let Some(status) = budget.status
                && status.observed_generation.is_some()
                && status.expected_pods > 0
            {
                seen.fetch_min(status.current_healthy - status.desired_healthy, Ordering::Relaxed);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    (floor, task)
}

async fn remediation_of(client: &kube::Client, node: &str) -> Option<GpuRemediation> {
    Api::<GpuRemediation>::all(client.clone())
        .list(&ListParams::default())
        .await
        .ok()?
        .items
        .into_iter()
        .find(|r| r.spec.node_name == node)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root, the real node's built binaries, helm, the device plugin, our binaries and the stand-in: make real-node-test"]
#[allow(
    clippy::too_many_lines,
    reason = "one scenario, told in the order it happens, each step asserted where it happens"
)]
async fn an_xid_79_drains_only_its_gpus_pod_then_the_ladder_replaces_the_node_with_a_new_real_one() {
    let wanted = |name, index, gpus| Wanted { name, index, gpus };
    let mut cluster =
        Cluster::with_ready_nodes(&[wanted(GPU_NODE, 6, true), wanted(CPU_NODE, 7, false)]).await;
    let client = cluster.control_plane.client();
    let images = Images::build(cluster.control_plane.data_dir(), true);
    let scenario = Scenario::new("66666666", 2);
    chart::prepare_gpu_node(cluster.named(GPU_NODE), &images, &scenario).await;
    cluster.named(CPU_NODE).import(&images.controller).await.unwrap();
    chart::install_device_plugin(&client).await;
    let mut values = shipped::chart_values();
    values["agent"]["xidCatalogOverride"] = json!({"xids": [{"xid": 79, "severity": "fatal",
        "action": "RESET_GPU", "description": "GPU has fallen off the bus: reset it before replacing the node"}]});
    chart::helm_install(&cluster, &values).await;
    Api::<GpuRemediationPolicy>::all(client.clone())
        .create(&PostParams::default(), &policy())
        .await
        .unwrap();

    let nodes = Api::<Node>::all(client.clone());
    let system = Api::<Pod>::namespaced(client.clone(), NAMESPACE);
    eventually(
        "the agent Ready, GpuHealthy=True, two GPUs advertised, a controller replica Ready",
        Duration::from_secs(180),
        || async {
            let agent_ready = pods_labelled(&system, "gpu-health-agent")
                .await
                .iter()
                .any(|p| node_of(p) == GPU_NODE && workload::is_ready(p));
            let healthy = condition_status(&nodes, GPU_NODE, "GpuHealthy").await.as_deref() == Some("True");
            let gpus = allocatable_gpus(&nodes, GPU_NODE).await.as_deref() == Some("2");
            let leader = pods_labelled(&system, "gpu-remediator")
                .await
                .iter()
                .any(|p| node_of(p) == CPU_NODE && workload::is_ready(p));
            (agent_ready && healthy && gpus && leader).then_some(())
        },
    )
    .await;
    cluster.say("the chart, the plugin and the policy in place: 2 GPUs advertised, GpuHealthy=True");

    run_workloads(&cluster).await;
    let pods = Api::<Pod>::namespaced(client.clone(), WORKLOADS);
    let trainers = eventually(
        "two trainers and two web pods Running",
        Duration::from_secs(90),
        || async {
            let trainers = running(&pods, "trainer").await;
            let web = running(&pods, "web").await;
            (trainers.len() == 2 && trainers.iter().all(|p| node_of(p) == GPU_NODE) && web.len() == 2)
                .then_some(trainers)
        },
    )
    .await;
    let assignment = assignment_covering(&nodes, GPU_NODE, &trainers).await;
    let holds = |uuid: &str| {
        assignment
            .pods
            .iter()
            .find(|entry| entry.gpus.iter().any(|gpu| gpu == uuid))
            .map_or_else(
                || panic!("no pod holds {uuid}: {assignment:?}"),
                |entry| entry.name.clone(),
            )
    };
    let (on_gpu_1, on_gpu_0) = (holds(&scenario.uuid(1)), holds(&scenario.uuid(0)));
    assert_ne!(on_gpu_1, on_gpu_0);
    let kept = trainers
        .iter()
        .find(|p| p.name_any() == on_gpu_0)
        .unwrap()
        .clone();
    let web_on_gpu_node = running(&pods, "web")
        .await
        .into_iter()
        .find(|p| node_of(p) == GPU_NODE)
        .expect("a web pod on the GPU node")
        .name_any();
    cluster.say(&format!(
        "the kubelet handed GPU 1 to {on_gpu_1} and GPU 0 to {on_gpu_0} (the agent's pod-resources read)"
    ));
    let (floor, budget_task) = budget_floor(Api::namespaced(client.clone(), WORKLOADS));
    let evicted_exit = exit_code_at_deletion(&pods, &on_gpu_1);

    // 1. The XID, and the GPU-scoped drain.
    scenario
        .clone()
        .with_xid(79, 1)
        .write(&cluster.named(GPU_NODE).driver_root())
        .unwrap();
    eventually(
        "GPU 1 withdrawn by the plugin, GpuHealthy=False, the node quarantined",
        Duration::from_secs(60),
        || async {
            let withdrawn = allocatable_gpus(&nodes, GPU_NODE).await.as_deref() == Some("1");
            let unhealthy =
                condition_status(&nodes, GPU_NODE, "GpuHealthy").await.as_deref() == Some("False");
            let node = nodes.get(GPU_NODE).await.ok()?;
            let quarantined = node
                .spec?
                .taints?
                .iter()
                .any(|taint| taint.key == QUARANTINE_TAINT_KEY);
            (withdrawn && unhealthy && quarantined).then_some(())
        },
    )
    .await;
    cluster
        .say("XID 79 on GPU 1: the plugin withdrew it, the agent set GpuHealthy=False, the node quarantined");
    let exit = tokio::time::timeout(Duration::from_secs(90), evicted_exit)
        .await
        .expect("GPU 1's pod evicted")
        .unwrap();
    assert_eq!(
        exit,
        Some(0),
        "{on_gpu_1} ended on SIGTERM within its grace period (137: killed at its end)"
    );
    let reset = eventually(
        "the ResetGpu step's drain recorded",
        Duration::from_secs(30),
        || async {
            let remediation = remediation_of(&client, GPU_NODE).await?;
            let status = remediation.status?;
            let step = status.steps.first().filter(|s| s.step == Rung::ResetGpu)?.clone();
            (!step.evicted_pods.is_empty()).then_some((step, status.drain))
        },
    )
    .await;
    assert_eq!(reset.0.evicted_pods, [format!("{WORKLOADS}/{on_gpu_1}")]);
    let scope = reset.1.and_then(|d| d.scope).unwrap_or_default();
    assert!(scope.starts_with("GPU-scoped drain"), "{scope}");
    let still = pods.get(&on_gpu_0).await.unwrap();
    assert_eq!(still.uid(), kept.uid(), "GPU 0's pod is the same pod");
    assert!(
        running(&pods, "trainer")
            .await
            .iter()
            .any(|p| p.uid() == kept.uid())
    );
    let restarts: i32 = still
        .status
        .iter()
        .flat_map(|s| s.container_statuses.iter().flatten())
        .map(|c| c.restart_count)
        .sum();
    assert_eq!(restarts, 0, "GPU 0's pod never restarted");
    cluster.say(&format!(
        "the GPU-scoped drain evicted only {on_gpu_1} (exit 0 on SIGTERM); {on_gpu_0} on GPU 0 runs on"
    ));

    // 2. The reset proves nothing; the ladder climbs to Replace, which drains and deletes the Node.
    eventually(
        "the Node deleted by the Replace step",
        Duration::from_secs(180),
        || async { nodes.get_opt(GPU_NODE).await.ok()?.is_none().then_some(()) },
    )
    .await;
    cluster.say("the ladder climbed to Replace: the node drained and its Node deleted");

    // 3. The node group: the machine powered off, a new one started under a new name.
    cluster.stop_node(GPU_NODE).await;
    let replacement = cluster.start_node(&wanted(REPLACEMENT, 8, true)).await;
    chart::prepare_gpu_node(replacement, &images, &Scenario::new("88888888", 2)).await;
    cluster.until_ready(REPLACEMENT).await;
    cluster.say("the node group's replacement joined, Ready");

    let done = eventually("the remediation Succeeded", Duration::from_secs(180), || async {
        let remediation = remediation_of(&client, GPU_NODE).await?;
        let phase = remediation.status.as_ref()?.phase;
        assert_ne!(phase, Phase::Failed, "{:?}", remediation.status);
        (phase == Phase::Succeeded).then_some(remediation)
    })
    .await;
    let status = done.status.unwrap();
    let steps: Vec<(Rung, Option<StepOutcome>)> = status.steps.iter().map(|s| (s.step, s.outcome)).collect();
    assert_eq!(
        steps,
        [
            (Rung::ResetGpu, Some(StepOutcome::TimedOut)),
            (Rung::Replace, Some(StepOutcome::Succeeded)),
        ],
        "{:?}",
        status.steps
    );
    let mut evicted = status.steps[1].evicted_pods.clone();
    evicted.sort();
    let mut expected = vec![
        format!("{WORKLOADS}/{on_gpu_0}"),
        format!("{WORKLOADS}/{web_on_gpu_node}"),
    ];
    expected.sort();
    assert_eq!(
        evicted, expected,
        "the Replace step's drain: the node's other pods, by eviction"
    );
    cluster.say("the remediation Succeeded: ResetGpu timed out on no evidence, Replace succeeded");

    eventually(
        "both trainers and a web pod Running on the replacement",
        Duration::from_secs(120),
        || async {
            let trainers = running(&pods, "trainer").await;
            let web = running(&pods, "web").await;
            let on_replacement = |pods: &[Pod]| pods.iter().filter(|p| node_of(p) == REPLACEMENT).count();
            (on_replacement(&trainers) == 2 && on_replacement(&web) == 1).then_some(())
        },
    )
    .await;
    budget_task.abort();
    let floor = floor.load(Ordering::Relaxed);
    assert_ne!(floor, i32::MAX, "the web budget's status was never read");
    assert!(floor >= 0, "the web budget went {floor} below its minimum");
    cluster
        .say("the replacement took the trainers and a web pod; the web budget never fell below its minimum");
    cluster.stop().await;
}
