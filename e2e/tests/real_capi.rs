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
    workload::Workload,
};
use k8s_openapi::jiff::Timestamp;
use kube::{
    Api, Client, ResourceExt as _,
    api::{DynamicObject, ListParams},
};
use scenario::{BudgetWatch, RunningController, Scenario};

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

/// A scenario without nodes of its own (every node of its fleet is a Cluster API Machine's) and
/// Cluster API running on it with a `MachineSet` `pool` of two Machines under a health check that
/// also watches `gpu_rules`; returns once both Machines have Ready nodes, with those Machines.
async fn machine_pool(gpu_rules: &[(&str, &str, u32)]) -> (Scenario, ClusterApi, Vec<MachineSeen>) {
    let cluster = common::cluster().await;
    let s = Scenario::new(0).await;
    s.fleet.adopt_joining_nodes();
    let capi = ClusterApi::start(cluster, &s.fleet, &s.namespace, "gpu")
        .await
        .unwrap_or_else(|e| panic!("starting Cluster API: {e}"));
    capi.machine_set("pool", 2).await.expect("the MachineSet");
    capi.health_check_with("pool", 60, gpu_rules)
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
    (s, capi, initial)
}

/// Creates the policy (`DeleteMachine`, `more` merged over it) once the pool's Machines predate
/// the fault by more than the API's one-second timestamps, starts the controller and breaks the
/// GPU of `broken`: the controller and the instant of the fault.
async fn delete_machine_on_a_fault(
    s: &Scenario,
    more: serde_json::Value,
    broken: &str,
) -> (RunningController, Timestamp) {
    let mut spec = serde_json::json!({
        "action": "Replace",
        "replacement": {"strategy": "DeleteMachine", "timeout": "3m"},
    });
    scenario::merge(&mut spec, more);
    s.policy(spec).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let controller = RunningController::start(&s.scope).await;
    let fault_at = Timestamp::now();
    s.break_gpu(broken).await;
    (controller, fault_at)
}

/// The Machines some seconds after the fault: one replacement Machine (created since
/// `fault_at`), not two, and two in all; returns the replacement.
async fn one_replacement_machine(s: &Scenario, initial: &[MachineSeen], fault_at: Timestamp) -> MachineSeen {
    let after = machines(&s.client, &s.namespace).await;
    let new: Vec<&MachineSeen> = after.iter().filter(|m| m.created >= fault_at).collect();
    assert_eq!(
        new.len(),
        1,
        "one replacement Machine, not two: {initial:?} then {after:?}"
    );
    assert_eq!(after.len(), 2, "{after:?}");
    new[0].clone()
}

#[tokio::test]
#[ignore = "needs the Cluster API binary: make e2e-real"]
async fn delete_machine_recycles_a_cluster_api_node_through_the_machine_set_with_a_health_check_present() {
    let _one_manager = ONE_MANAGER.lock().await;
    let (s, capi, initial) = machine_pool(&[]).await;

    // Two pods of 8 GPUs each, one per node.
    let app = s
        .two_training_pods(Duration::from_secs(90), || capi.log_tail(40), |app| app)
        .await;
    let broken = initial[0].node.clone().expect("a node");
    let broken_machine = initial[0].name.clone();
    // Cluster API annotated the node with its Machine: that is how DeleteMachine finds it.
    let annotations = s.node(&broken).await.metadata.annotations.unwrap_or_default();
    assert_eq!(
        annotations.get("cluster.x-k8s.io/machine").map(String::as_str),
        Some(broken_machine.as_str())
    );

    let budget = BudgetWatch::start(&s.client, &s.namespace, &app.selector());
    let (controller, fault_at) = delete_machine_on_a_fault(&s, serde_json::json!({}), &broken).await;

    let done = wait_succeeded(&s, &capi, &broken).await;
    common::assert_replaced_through(&done, "Machine", &broken_machine);
    assert!(
        s.node_is_gone(&broken).await,
        "Cluster API deleted the broken Machine's node"
    );
    s.wait_ready_pods_showing(&app, Duration::from_secs(90), || capi.log_tail(40))
        .await;
    // Longer than the MachineSet's and the health check's reaction: a second replacement would
    // show by now.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let new = one_replacement_machine(&s, &initial, fault_at).await;
    let new_node = new.node.expect("the replacement Machine has its node");
    s.assert_the_evicted_pod_runs_on(&app, &new_node).await;

    budget.assert_kept_across_both_drains();

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
    let (s, capi, initial) = machine_pool(&[("GpuHealthy", "False", gpu_timeout_seconds)]).await;
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
    let app = s
        .two_training_pods(
            Duration::from_secs(90),
            || capi.log_tail(40),
            |app| app.termination(termination),
        )
        .await;
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
    let (controller, fault_at) = delete_machine_on_a_fault(&s, serde_json::json!({}), &broken).await;

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

    s.wait_ready_pods_showing(&app, Duration::from_secs(90), || capi.log_tail(40))
        .await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    one_replacement_machine(&s, &initial, fault_at).await;
    assert!(s.node_is_gone(&broken).await, "the broken Machine's node is gone");
    budget.assert_kept_across_both_drains();

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
    let triggers = serde_json::json!({
        "triggers": [{"conditionType": "GpuHealthy", "status": "False", "for": "40s"}],
    });
    let (controller, fault_at) = delete_machine_on_a_fault(&s, triggers, &broken).await;

    common::eventually(
        "Cluster API to delete the broken Machine's node",
        Duration::from_secs(90),
        || async { s.node_is_gone(&broken).await.then_some(()) },
    )
    .await;
    s.wait_ready_pods_showing(&app, Duration::from_secs(90), || capi.log_tail(40))
        .await;
    // Past the trigger's 40 s: a remediation of the vanished node would have started by now.
    let waited = Timestamp::now().duration_since(fault_at);
    let rest = Duration::from_secs(45).saturating_sub(Duration::try_from(waited).unwrap_or_default());
    tokio::time::sleep(rest).await;
    one_replacement_machine(&s, &initial, fault_at).await;
    let remediation = s.remediation_of(&broken).await;
    assert!(
        remediation
            .as_ref()
            .and_then(|r| r.status.as_ref())
            .is_none_or(|st| st.phase == Phase::Cancelled),
        "the policy started nothing on a node Cluster API had already replaced (or stopped it): {:#?}",
        remediation.and_then(|r| r.status)
    );
    budget.assert_kept_across_both_drains();

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
