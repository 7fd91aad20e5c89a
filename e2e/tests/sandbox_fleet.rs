//! The simulated GPU fleet against the real control plane: nodes register Ready with GPU labels
//! and capacity, heartbeats renew Leases, the simulated kubelet runs and finalises pods, workloads
//! land on chosen nodes, and faults show up as a GPU agent would write them.

mod common;

use std::time::{Duration, Instant};

use common::eventually;
use gpu_remediation_api::constants::{GPU_COUNT_LABEL, GPU_PRESENT_LABEL, GPU_RESOURCE};
use gpu_sandbox::fault;
use gpu_sandbox::fleet::NODE_LEASE_NAMESPACE;
use gpu_sandbox::workload::{self, Budget, Workload};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, ListParams};
use kube::{Api, Client};

fn condition(node: &Node, kind: &str) -> Option<(String, Option<String>)> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == kind)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

async fn renew_time(client: &Client, node: &str) -> String {
    let lease = Api::<Lease>::namespaced(client.clone(), NODE_LEASE_NAMESPACE)
        .get(node)
        .await
        .expect("reading the node lease");
    serde_json::to_string(&lease.spec.unwrap().renew_time).unwrap()
}

#[tokio::test]
async fn fleet_nodes_register_ready_with_gpus_and_keep_renewing_their_leases() {
    let client = common::cluster().await.client();
    let fleet = common::fleet(2).await;
    let names = fleet.node_names();
    assert_eq!(names.len(), 2);
    let nodes: Api<Node> = Api::all(client.clone());
    let listed = nodes
        .list(&ListParams::default().labels(&fleet.selector()))
        .await
        .unwrap();
    assert_eq!(listed.items.len(), 2);
    for node in &listed.items {
        let labels = node.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[GPU_PRESENT_LABEL], "true");
        assert_eq!(labels[GPU_COUNT_LABEL], "8");
        let capacity = node.status.as_ref().unwrap().capacity.as_ref().unwrap();
        assert_eq!(capacity[GPU_RESOURCE].0, "8");
        assert_eq!(condition(node, "Ready").unwrap().0, "True");
        assert!(node.spec.as_ref().unwrap().taints.is_none(), "{:?}", node.spec);
    }
    let first = renew_time(&client, &names[0]).await;
    eventually("the lease to be renewed", Duration::from_secs(10), || {
        let (client, first, node) = (client.clone(), first.clone(), names[0].clone());
        async move { (renew_time(&client, &node).await != first).then_some(()) }
    })
    .await;
    fleet.stop().await.unwrap();
    let left = nodes
        .list(&ListParams::default().labels(&format!(
            "{}={}",
            gpu_sandbox::fleet::FLEET_LABEL,
            names[0].rsplit_once('-').unwrap().0
        )))
        .await
        .unwrap();
    assert!(left.items.is_empty(), "stop deletes the fleet's nodes");
}

#[tokio::test]
async fn a_scheduled_deployment_pinned_to_fleet_nodes_runs_ready_on_them() {
    let client = common::cluster().await.client();
    let namespace = common::namespace().await;
    let fleet = common::fleet(2).await;
    let nodes = fleet.node_names();
    let app = Workload::new(&namespace, "train")
        .replicas(4)
        .gpus(2)
        .on_nodes(&nodes);
    workload::create(&client, &app.deployment()).await.unwrap();
    let ready = workload::wait_ready_pods(&client, &namespace, &app.selector(), 4, Duration::from_secs(60))
        .await
        .unwrap();
    for pod in &ready {
        let node = pod.spec.as_ref().unwrap().node_name.clone().unwrap();
        assert!(nodes.contains(&node), "{node} is not one of {nodes:?}");
        assert_eq!(pod.status.as_ref().unwrap().phase.as_deref(), Some("Running"));
    }
}

#[tokio::test]
async fn gpu_requests_beyond_capacity_stay_pending() {
    let client = common::cluster().await.client();
    let namespace = common::namespace().await;
    let fleet = common::fleet(1).await;
    // 8 GPUs on the node: two 4-GPU pods fit, the third cannot be scheduled.
    let app = Workload::new(&namespace, "big")
        .replicas(3)
        .gpus(4)
        .on_nodes(&fleet.node_names());
    workload::create(&client, &app.deployment()).await.unwrap();
    workload::wait_ready_pods(&client, &namespace, &app.selector(), 2, Duration::from_secs(60))
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let pending = eventually("a pod the scheduler refused", Duration::from_secs(30), || {
        let pods = pods.clone();
        async move {
            let list = pods.list(&ListParams::default()).await.ok()?;
            list.items.into_iter().find(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| {
                        cs.iter().any(|c| {
                            c.type_ == "PodScheduled"
                                && c.status == "False"
                                && c.reason.as_deref() == Some("Unschedulable")
                        })
                    })
            })
        }
    })
    .await;
    assert!(pending.spec.unwrap().node_name.is_none());
}

#[tokio::test]
async fn a_deleted_pod_is_finalised_at_once_unless_its_annotation_delays_or_stalls_it() {
    let client = common::cluster().await.client();
    let namespace = common::namespace().await;
    let fleet = common::fleet(1).await;
    let node = &fleet.node_names()[0];
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let quick = Workload::new(&namespace, "quick");
    let slow = Workload::new(&namespace, "slow").termination("3s");
    let stuck = Workload::new(&namespace, "stuck").termination("stall");
    for (w, name) in [(&quick, "quick"), (&slow, "slow"), (&stuck, "stuck")] {
        workload::create(&client, &w.bare_pod(name, node)).await.unwrap();
        workload::wait_ready_pods(&client, &namespace, &w.selector(), 1, Duration::from_secs(30))
            .await
            .unwrap();
    }
    let deleted_at = Instant::now();
    for name in ["quick", "slow", "stuck"] {
        pods.delete(name, &DeleteParams::default()).await.unwrap();
    }
    workload::wait_pod_gone(&client, &namespace, "quick", Duration::from_secs(10))
        .await
        .unwrap();
    workload::wait_pod_gone(&client, &namespace, "slow", Duration::from_secs(20))
        .await
        .unwrap();
    assert!(
        deleted_at.elapsed() >= Duration::from_secs(3),
        "the slow pod took its 3s"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stuck_pod = pods.get("stuck").await.expect("a stalled pod stays");
    assert!(stuck_pod.metadata.deletion_timestamp.is_some());
}

#[tokio::test]
async fn daemon_set_bare_empty_dir_and_mirror_pods_all_run_on_fleet_nodes() {
    let client = common::cluster().await.client();
    let namespace = common::namespace().await;
    let fleet = common::fleet(2).await;
    let nodes = fleet.node_names();
    let agent = Workload::new(&namespace, "agent").on_nodes(&nodes);
    workload::create(&client, &agent.daemon_set()).await.unwrap();
    workload::wait_ready_pods(&client, &namespace, &agent.selector(), 2, Duration::from_secs(60))
        .await
        .unwrap();
    let special = Workload::new(&namespace, "special");
    workload::create(&client, &special.empty_dir_pod("scratch", &nodes[0]))
        .await
        .unwrap();
    workload::create(&client, &special.mirror_pod("static", &nodes[1]))
        .await
        .unwrap();
    let ready = workload::wait_ready_pods(
        &client,
        &namespace,
        &special.selector(),
        2,
        Duration::from_secs(30),
    )
    .await
    .unwrap();
    let mirror = ready
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some("static"))
        .unwrap();
    assert!(
        mirror
            .metadata
            .annotations
            .as_ref()
            .unwrap()
            .contains_key(workload::MIRROR_ANNOTATION)
    );
}

#[tokio::test]
async fn statefulsets_and_percentage_pdbs_are_computed_by_the_disruption_controller() {
    let client = common::cluster().await.client();
    let namespace = common::namespace().await;
    let fleet = common::fleet(2).await;
    let db = Workload::new(&namespace, "db")
        .replicas(4)
        .on_nodes(&fleet.node_names());
    workload::create(&client, &db.stateful_set()).await.unwrap();
    workload::create(&client, &db.pdb(&Budget::max_unavailable_percent(50)))
        .await
        .unwrap();
    workload::wait_ready_pods(&client, &namespace, &db.selector(), 4, Duration::from_secs(60))
        .await
        .unwrap();
    // 50% of 4 may be unavailable: 2 disruptions allowed.
    workload::wait_pdb_allows(&client, &namespace, "db", 2, Duration::from_secs(30))
        .await
        .unwrap();
}

#[tokio::test]
async fn gpu_faults_show_on_the_node_as_an_agent_would_write_them() {
    let client = common::cluster().await.client();
    let fleet = common::fleet(1).await;
    let node = &fleet.node_names()[0];
    let nodes: Api<Node> = Api::all(client.clone());
    fault::set_gpu_condition(&client, node, "False", "XID79", "GPU fell off the bus")
        .await
        .unwrap();
    let read = nodes.get(node).await.unwrap();
    assert_eq!(
        condition(&read, "GpuHealthy"),
        Some(("False".to_owned(), Some("XID79".to_owned())))
    );
    assert_eq!(
        condition(&read, "Ready").unwrap().0,
        "True",
        "other conditions stay"
    );
    fault::flap(&client, node, "XID79", 2, Duration::from_millis(200))
        .await
        .unwrap();
    let read = nodes.get(node).await.unwrap();
    assert_eq!(condition(&read, "GpuHealthy").unwrap().0, "True");
    assert_eq!(fault::drop_gpu(&client, node).await.unwrap(), 7);
    let read = nodes.get(node).await.unwrap();
    let status = read.status.unwrap();
    assert_eq!(status.capacity.unwrap()[GPU_RESOURCE].0, "7");
    assert_eq!(status.allocatable.unwrap()[GPU_RESOURCE].0, "7");
    assert_eq!(
        read.metadata.labels.unwrap()[GPU_COUNT_LABEL],
        "8",
        "the expected count stays"
    );
}

#[tokio::test]
async fn a_node_whose_heartbeat_stops_goes_unknown_and_comes_back_when_it_resumes() {
    let client = common::cluster().await.client();
    let fleet = common::fleet(2).await;
    let (silent, alive) = (&fleet.node_names()[0], &fleet.node_names()[1]);
    assert!(fleet.stop_heartbeat(silent));
    let nodes: Api<Node> = Api::all(client.clone());
    // kube-controller-manager's default grace period is 50s.
    eventually("the silent node to go Unknown", Duration::from_secs(90), || {
        let nodes = nodes.clone();
        async move {
            let node = nodes.get(silent).await.ok()?;
            (condition(&node, "Ready")?.0 == "Unknown").then_some(())
        }
    })
    .await;
    let alive_node = nodes.get(alive).await.unwrap();
    assert_eq!(condition(&alive_node, "Ready").unwrap().0, "True");
    fleet.resume_heartbeat(silent).await.unwrap();
    eventually("the node to be Ready again", Duration::from_secs(30), || {
        let nodes = nodes.clone();
        async move {
            let node = nodes.get(silent).await.ok()?;
            (condition(&node, "Ready")?.0 == "True").then_some(())
        }
    })
    .await;
}

#[tokio::test]
async fn a_pod_on_a_downed_node_stays_terminating_until_its_kubelet_comes_back() {
    let client = common::cluster().await.client();
    let namespace = common::namespace().await;
    let fleet = common::fleet(1).await;
    let node = &fleet.node_names()[0];
    let app = Workload::new(&namespace, "orphaned");
    workload::create(&client, &app.bare_pod("orphaned", node))
        .await
        .unwrap();
    workload::wait_ready_pods(&client, &namespace, &app.selector(), 1, Duration::from_secs(30))
        .await
        .unwrap();
    assert!(fleet.stop_kubelet(node));
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    pods.delete("orphaned", &DeleteParams::default()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let stuck = pods.get("orphaned").await.expect("nobody finalises it");
    assert!(stuck.metadata.deletion_timestamp.is_some());
    fleet.start_kubelet(node).await.unwrap();
    workload::wait_pod_gone(&client, &namespace, "orphaned", Duration::from_secs(10))
        .await
        .unwrap();
}

#[tokio::test]
async fn the_garbage_collector_and_namespace_controller_clean_up_after_workloads() {
    use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
    use k8s_openapi::api::core::v1::Namespace;

    let client = common::cluster().await.client();
    let namespace = common::namespace().await;
    let fleet = common::fleet(1).await;
    let app = Workload::new(&namespace, "gc")
        .replicas(2)
        .on_nodes(&fleet.node_names());
    workload::create(&client, &app.deployment()).await.unwrap();
    workload::wait_ready_pods(&client, &namespace, &app.selector(), 2, Duration::from_secs(60))
        .await
        .unwrap();
    Api::<Deployment>::namespaced(client.clone(), &namespace)
        .delete("gc", &DeleteParams::background())
        .await
        .unwrap();
    let replica_sets: Api<ReplicaSet> = Api::namespaced(client.clone(), &namespace);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    eventually(
        "the garbage collector to remove the ReplicaSet and its pods",
        Duration::from_secs(60),
        || {
            let (replica_sets, pods) = (replica_sets.clone(), pods.clone());
            async move {
                let sets = replica_sets.list(&ListParams::default()).await.ok()?;
                let left = pods.list(&ListParams::default()).await.ok()?;
                (sets.items.is_empty() && left.items.is_empty()).then_some(())
            }
        },
    )
    .await;

    let leftover = Workload::new(&namespace, "leftover");
    workload::create(&client, &leftover.bare_pod("leftover", &fleet.node_names()[0]))
        .await
        .unwrap();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .delete(&namespace, &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "the namespace controller to empty and remove the namespace",
        Duration::from_secs(90),
        || {
            let (namespaces, namespace) = (namespaces.clone(), namespace.clone());
            async move { matches!(namespaces.get_opt(&namespace).await, Ok(None)).then_some(()) }
        },
    )
    .await;
}
