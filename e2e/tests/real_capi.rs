//! `DeleteMachine` against Cluster API itself: upstream Cluster API's core manager (built from the
//! pinned module in `tools/capi-manager`) with the sandbox as its own workload cluster, a
//! `MachineSet` of two machines from the sandbox's infrastructure provider (the only part that is
//! ours: it creates each machine's Node, which the fleet adopts), and a `MachineHealthCheck` over
//! the same machines. The controller (in-process, scoped to this test's policy) drains a broken
//! node and deletes its Machine; Cluster API's Machine controller runs its own drain and deletes
//! the Node, the `MachineSet` creates one replacement, and the controller's verification waits for
//! that Machine's node to be Ready. The health check must not remediate anything on top: one new
//! Machine, not two.
//!
//! The second test gives the health check a rule on the GPU condition itself, shorter than our
//! drain, so both controllers act on the same broken Machine: still one replacement. The third
//! has the health check act before the policy's trigger elapses: the policy then starts nothing.
//!
//! Ignored by plain `cargo test` (it needs the Cluster API binary); `make e2e-real` builds it and
//! runs this with `--ignored`.

mod common;
mod scenario;

use std::time::Duration;

use gpu_remediation_api::{GpuRemediation, Phase};
use gpu_sandbox::{
    capi::{ClusterApi, resource},
    fleet::FLEET_LABEL,
    workload::{self, Budget, Workload},
};
use k8s_openapi::{
    api::core::v1::{Node, Pod},
    jiff::Timestamp,
};
use kube::{
    Api, Client, ResourceExt as _,
    api::{DynamicObject, ListParams},
};
use scenario::{BudgetWatch, RunningController, Scenario, is_ready};

/// One Cluster API manager at a time: each watches every namespace of the shared control plane
/// (`--namespace` breaks its `MachineSet` controller, see `gpu_sandbox::capi`), so two tests'
/// managers running at once would both reconcile every Machine.
static ONE_MANAGER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A Machine as the test sees it.
#[derive(Debug, Clone)]
struct MachineSeen {
    name: String,
    created: Timestamp,
    node: Option<String>,
    deleting: bool,
}

/// The namespace's Machines, those being deleted included.
async fn all_machines(client: &Client, namespace: &str) -> Vec<MachineSeen> {
    Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &resource("Machine", "machines"))
        .list(&ListParams::default())
        .await
        .expect("listing Machines")
        .items
        .into_iter()
        .map(|machine| MachineSeen {
            deleting: machine.metadata.deletion_timestamp.is_some(),
            name: machine.name_any(),
            created: machine
                .metadata
                .creation_timestamp
                .clone()
                .expect("a creation time")
                .0,
            node: machine
                .data
                .pointer("/status/nodeRef/name")
                .and_then(serde_json::Value::as_str)
                .map(str::to_owned),
        })
        .collect()
}

/// The namespace's Machines not being deleted.
async fn machines(client: &Client, namespace: &str) -> Vec<MachineSeen> {
    let mut seen = all_machines(client, namespace).await;
    seen.retain(|machine| !machine.deleting);
    seen
}

async fn pods(client: &Client, namespace: &str, selector: &str) -> Vec<Pod> {
    Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(selector))
        .await
        .expect("listing pods")
        .items
}

#[tokio::test]
#[ignore = "needs the Cluster API binary: make e2e-real"]
async fn delete_machine_recycles_a_cluster_api_node_through_the_machine_set_with_a_health_check_present() {
    let _one_manager = ONE_MANAGER.lock().await;
    let cluster = common::cluster().await;
    // No nodes of its own: every node of this fleet is a Cluster API Machine's.
    let s = Scenario::new(0).await;
    s.fleet.adopt_joining_nodes();
    let capi = ClusterApi::start(cluster, &s.fleet, &s.namespace, "gpu")
        .await
        .unwrap_or_else(|e| panic!("starting Cluster API: {e}"));
    capi.machine_set("pool", 2).await.expect("the MachineSet");
    capi.health_check("pool", 60)
        .await
        .expect("the MachineHealthCheck");
    let initial = common::eventually(
        "two Machines with Ready nodes",
        Duration::from_secs(120),
        || async {
            let seen = machines(&s.client, &s.namespace).await;
            let nodes: Vec<String> = seen.iter().filter_map(|m| m.node.clone()).collect();
            (seen.len() == 2 && nodes.len() == 2).then_some(seen)
        },
    )
    .await;

    // Two pods of 8 GPUs each, one per node.
    let app = s
        .two_training_pods(Duration::from_secs(90), || capi.log_tail(40))
        .await;
    workload::wait_pdb_allows(&s.client, &s.namespace, &app.name, 1, Duration::from_secs(30))
        .await
        .expect("the PDB allows one disruption");
    let broken = initial[0].node.clone().expect("a node");
    let broken_machine = initial[0].name.clone();
    // Cluster API annotated the node with its Machine: that is how DeleteMachine finds it.
    let annotations = s.node(&broken).await.metadata.annotations.unwrap_or_default();
    assert_eq!(
        annotations.get("cluster.x-k8s.io/machine").map(String::as_str),
        Some(broken_machine.as_str())
    );

    let budget = BudgetWatch::start(&s.client, &s.namespace, &app.selector());
    s.policy(serde_json::json!({
        "action": "Replace",
        "replacement": {"strategy": "DeleteMachine", "timeout": "3m"},
    }))
    .await;
    // The pool's Machines predate the fault by more than the API's one-second timestamps.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let controller = RunningController::start(&s.scope).await;
    let fault_at = Timestamp::now();
    s.break_gpu(&broken).await;

    let done = wait_succeeded(&s, &capi, &broken).await;
    let replacement = done
        .status
        .expect("status")
        .replacement
        .expect("the Machine is recorded");
    assert_eq!(
        (replacement.kind.as_str(), replacement.name.as_str()),
        ("Machine", broken_machine.as_str())
    );
    assert!(
        Api::<Node>::all(s.client.clone())
            .get_opt(&broken)
            .await
            .expect("reading the broken node")
            .is_none(),
        "Cluster API deleted the broken Machine's node"
    );
    workload::wait_ready_pods(
        &s.client,
        &s.namespace,
        &app.selector(),
        2,
        Duration::from_secs(90),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}; Cluster API's log ends:\n{}", capi.log_tail(40)));
    // Longer than the MachineSet's and the health check's reaction: a second replacement would
    // show by now.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let after = machines(&s.client, &s.namespace).await;
    let new: Vec<&MachineSeen> = after.iter().filter(|m| m.created >= fault_at).collect();
    assert_eq!(
        new.len(),
        1,
        "one replacement Machine, not two: {initial:?} then {after:?}"
    );
    assert_eq!(after.len(), 2, "{after:?}");
    let new_node = new[0].node.clone().expect("the replacement Machine has its node");
    let node = s.node(&new_node).await;
    assert!(
        gpu_remediator::replace::verify::node_is_ready(&node),
        "{new_node} is Ready"
    );
    let on_new = pods(&s.client, &s.namespace, &app.selector())
        .await
        .into_iter()
        .filter(|pod| pod.spec.as_ref().and_then(|spec| spec.node_name.as_deref()) == Some(new_node.as_str()))
        .filter(is_ready)
        .count();
    assert_eq!(
        on_new, 1,
        "the evicted pod runs on the replacement node {new_node}"
    );

    assert_budget_kept(&budget);

    controller.stop().await;
    capi.stop().await;
}

/// The health check `name`, as the server has it.
async fn health_check_object(client: &Client, namespace: &str, name: &str) -> serde_json::Value {
    let found = Api::<DynamicObject>::namespaced_with(
        client.clone(),
        namespace,
        &resource("MachineHealthCheck", "machinehealthchecks"),
    )
    .get(name)
    .await
    .expect("reading the MachineHealthCheck");
    serde_json::to_value(found).expect("JSON")
}

/// Whether Cluster API's health check marked `machine` unhealthy (its `HealthCheckSucceeded`
/// condition `False`, or `OwnerRemediated` set); `None` once the Machine is gone.
async fn health_check_failed(client: &Client, namespace: &str, machine: &str) -> Option<bool> {
    let found =
        Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &resource("Machine", "machines"))
            .get_opt(machine)
            .await
            .expect("reading the Machine")?;
    let conditions = found
        .data
        .pointer("/status/conditions")
        .and_then(serde_json::Value::as_array)
        .cloned()
        .unwrap_or_default();
    Some(conditions.iter().any(|c| {
        (c["type"] == "HealthCheckSucceeded" && c["status"] == "False") || c["type"] == "OwnerRemediated"
    }))
}

/// A pool of two Machines under a health check that also remediates `GpuHealthy=False` after
/// `gpu_timeout_seconds`, the health check counting both healthy, and two 8-GPU pods (one per
/// node, each taking `termination` to stop) behind `minAvailable: 1`.
struct GpuCheckedPool {
    s: Scenario,
    capi: ClusterApi,
    initial: Vec<MachineSeen>,
    app: Workload,
}

async fn gpu_checked_pool(gpu_timeout_seconds: u32, termination: &str) -> GpuCheckedPool {
    let cluster = common::cluster().await;
    let s = Scenario::new(0).await;
    s.fleet.adopt_joining_nodes();
    let capi = ClusterApi::start(cluster, &s.fleet, &s.namespace, "gpu")
        .await
        .unwrap_or_else(|e| panic!("starting Cluster API: {e}"));
    capi.machine_set("pool", 2).await.expect("the MachineSet");
    capi.health_check_with("pool", 60, &[("GpuHealthy", "False", gpu_timeout_seconds)])
        .await
        .expect("the MachineHealthCheck");
    let initial = common::eventually(
        "two Machines with Ready nodes",
        Duration::from_secs(120),
        || async {
            let seen = machines(&s.client, &s.namespace).await;
            let nodes: Vec<String> = seen.iter().filter_map(|m| m.node.clone()).collect();
            (seen.len() == 2 && nodes.len() == 2).then_some(seen)
        },
    )
    .await;
    // The health check watches the nodes only once Cluster API's cluster cache has connected:
    // wait until it counts both Machines healthy.
    common::eventually(
        "the health check to count two healthy Machines",
        Duration::from_secs(90),
        || async {
            let check = health_check_object(&s.client, &s.namespace, "pool").await;
            (check
                .pointer("/status/currentHealthy")
                .and_then(serde_json::Value::as_i64)
                == Some(2))
            .then_some(())
        },
    )
    .await;
    let app = Workload::new(&s.namespace, "train")
        .replicas(2)
        .gpus(8)
        .node_selector(FLEET_LABEL, s.fleet.name())
        .termination(termination);
    workload::create(&s.client, &app.deployment())
        .await
        .expect("deployment");
    workload::create(&s.client, &app.pdb(&Budget::min_available(1)))
        .await
        .expect("pdb");
    workload::wait_ready_pods(
        &s.client,
        &s.namespace,
        &app.selector(),
        2,
        Duration::from_secs(90),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}; Cluster API's log ends:\n{}", capi.log_tail(40)));
    workload::wait_pdb_allows(&s.client, &s.namespace, &app.name, 1, Duration::from_secs(30))
        .await
        .expect("the PDB allows one disruption");
    GpuCheckedPool {
        s,
        capi,
        initial,
        app,
    }
}

#[tokio::test]
#[ignore = "needs the Cluster API binary: make e2e-real"]
async fn a_health_check_on_the_gpu_condition_and_the_policy_replace_the_broken_machine_once() {
    let _one_manager = ONE_MANAGER.lock().await;
    // The health check remediates GpuHealthy=False after 8 s; our policy acts after 3 s, and its
    // drain takes 20 s (each pod takes 20 s to terminate): the health check fires mid-drain.
    let GpuCheckedPool {
        s,
        capi,
        initial,
        app,
    } = gpu_checked_pool(8, "20s").await;
    let broken = initial[0].node.clone().expect("a node");
    let broken_machine = initial[0].name.clone();

    let budget = BudgetWatch::start(&s.client, &s.namespace, &app.selector());
    s.policy(serde_json::json!({
        "action": "Replace",
        "replacement": {"strategy": "DeleteMachine", "timeout": "3m"},
    }))
    .await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let controller = RunningController::start(&s.scope).await;
    let fault_at = Timestamp::now();
    s.break_gpu(&broken).await;

    // Both act on the same Machine: ours drains it, the health check marks it for remediation.
    let (done, health_check_acted) =
        wait_ended_noting_health_check(&s, &capi, &broken, &broken_machine).await;
    let status = done.status.clone().expect("status");
    eprintln!(
        "the remediation ended {:?} ({:?}); the health check marked the Machine: {health_check_acted}",
        status.phase, status.message
    );
    assert!(
        matches!(status.phase, Phase::Succeeded | Phase::Cancelled),
        "the remediation ends as done or as stopped because the node went, not as failed: {status:#?}"
    );
    assert!(
        health_check_acted,
        "the health check marked {broken_machine} unhealthy (both controllers acted); it reads {:#}\nits log:\n{}",
        health_check_object(&s.client, &s.namespace, "pool").await["status"],
        capi.log_about("machinehealthcheck", 40)
    );

    workload::wait_ready_pods(
        &s.client,
        &s.namespace,
        &app.selector(),
        2,
        Duration::from_secs(90),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}; Cluster API's log ends:\n{}", capi.log_tail(40)));
    tokio::time::sleep(Duration::from_secs(10)).await;
    let after = machines(&s.client, &s.namespace).await;
    let new: Vec<&MachineSeen> = after.iter().filter(|m| m.created >= fault_at).collect();
    assert_eq!(
        new.len(),
        1,
        "one replacement Machine, not two: {initial:?} then {after:?}"
    );
    assert_eq!(after.len(), 2, "{after:?}");
    assert!(
        Api::<Node>::all(s.client.clone())
            .get_opt(&broken)
            .await
            .expect("reading the broken node")
            .is_none(),
        "the broken Machine's node is gone"
    );
    assert_budget_kept(&budget);

    controller.stop().await;
    capi.stop().await;
}

#[tokio::test]
#[ignore = "needs the Cluster API binary: make e2e-real"]
async fn a_health_check_that_acts_before_the_policys_trigger_leaves_it_nothing_to_replace() {
    let _one_manager = ONE_MANAGER.lock().await;
    // The health check remediates GpuHealthy=False after 3 s; the policy's trigger waits 40 s.
    let GpuCheckedPool {
        s,
        capi,
        initial,
        app,
    } = gpu_checked_pool(3, "1s").await;
    let broken = initial[0].node.clone().expect("a node");
    let budget = BudgetWatch::start(&s.client, &s.namespace, &app.selector());
    s.policy(serde_json::json!({
        "triggers": [{"conditionType": "GpuHealthy", "status": "False", "for": "40s"}],
        "action": "Replace",
        "replacement": {"strategy": "DeleteMachine", "timeout": "3m"},
    }))
    .await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let controller = RunningController::start(&s.scope).await;
    let fault_at = Timestamp::now();
    s.break_gpu(&broken).await;

    common::eventually(
        "Cluster API to delete the broken Machine's node",
        Duration::from_secs(90),
        || async {
            Api::<Node>::all(s.client.clone())
                .get_opt(&broken)
                .await
                .expect("reading the broken node")
                .is_none()
                .then_some(())
        },
    )
    .await;
    workload::wait_ready_pods(
        &s.client,
        &s.namespace,
        &app.selector(),
        2,
        Duration::from_secs(90),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}; Cluster API's log ends:\n{}", capi.log_tail(40)));
    // Past the trigger's 40 s: a remediation of the vanished node would have started by now.
    let waited = Timestamp::now().duration_since(fault_at);
    let rest = Duration::from_secs(45).saturating_sub(Duration::try_from(waited).unwrap_or_default());
    tokio::time::sleep(rest).await;
    let after = machines(&s.client, &s.namespace).await;
    let new: Vec<&MachineSeen> = after.iter().filter(|m| m.created >= fault_at).collect();
    assert_eq!(
        new.len(),
        1,
        "one replacement Machine, not two: {initial:?} then {after:?}"
    );
    assert_eq!(after.len(), 2, "{after:?}");
    let remediation = s.remediation_of(&broken).await;
    assert!(
        remediation
            .as_ref()
            .and_then(|r| r.status.as_ref())
            .is_none_or(|st| st.phase == Phase::Cancelled),
        "the policy started nothing on a node Cluster API had already replaced (or stopped it): {:#?}",
        remediation.and_then(|r| r.status)
    );
    assert_budget_kept(&budget);

    controller.stop().await;
    capi.stop().await;
}

/// The remediation of `broken` once it has ended, and whether the health check marked `machine`
/// unhealthy meanwhile; on a timeout, panics with its status, the Machines and Cluster API's log.
async fn wait_ended_noting_health_check(
    s: &Scenario,
    capi: &ClusterApi,
    broken: &str,
    machine: &str,
) -> (GpuRemediation, bool) {
    let mut health_check_acted = false;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    loop {
        if health_check_failed(&s.client, &s.namespace, machine).await == Some(true) {
            health_check_acted = true;
        }
        let remediation = s.remediation_of(broken).await;
        if let Some(done) = remediation
            .as_ref()
            .filter(|r| r.status.as_ref().is_some_and(|st| st.phase.is_terminal()))
        {
            return (done.clone(), health_check_acted);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the remediation of {broken} did not end within 180 s: {:#?}\nMachines: {:#?}\nCluster API's log about {broken}:\n{}",
            remediation.and_then(|r| r.status),
            all_machines(&s.client, &s.namespace).await,
            capi.log_about(broken, 40),
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// No PDB broken across both drains (ours, then Cluster API's), and every pod that left was evicted.
fn assert_budget_kept(budget: &BudgetWatch) {
    assert!(
        budget.fewest_healthy() >= 1,
        "fewest healthy: {}",
        budget.fewest_healthy()
    );
    let left = budget.left();
    assert!(!left.is_empty(), "the broken node's pod left");
    assert!(
        left.values().all(|evicted| *evicted),
        "every pod left through the Eviction API: {left:?}"
    );
}

/// The remediation of `broken` once `Succeeded`; on a timeout, panics with its status, the
/// Machines and the end of Cluster API's log.
async fn wait_succeeded(s: &Scenario, capi: &ClusterApi, broken: &str) -> GpuRemediation {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    loop {
        let remediation = s.remediation_of(broken).await;
        if let Some(done) = remediation
            .as_ref()
            .filter(|r| r.status.as_ref().is_some_and(|st| st.phase == Phase::Succeeded))
        {
            return done.clone();
        }
        if tokio::time::Instant::now() >= deadline {
            let machines = all_machines(&s.client, &s.namespace).await;
            panic!(
                "the remediation of {broken} did not succeed within 180s: {:#?}\nMachines: {machines:#?}\nCluster API's log about {broken}:\n{}\n... and its MachineSet:\n{}",
                remediation.and_then(|r| r.status),
                capi.log_about(broken, 40),
                capi.log_about("controller=\"machineset\"", 30)
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
