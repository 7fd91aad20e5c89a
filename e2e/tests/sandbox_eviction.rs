//! What the real server does with `policy/v1` evictions of pods on simulated nodes, which the
//! controller's drain depends on: a PDB with no budget left refuses with 429 naming itself; once
//! the budget allows, the eviction succeeds and the simulated kubelet finalises the pod; a pod
//! matched by two PDBs cannot be evicted at all (500).

mod common;

use std::time::Duration;

use gpu_sandbox::workload::{self, Budget, Workload};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::{Eviction, PodDisruptionBudget};
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

/// Posts a typed `policy/v1` Eviction (so `DeleteOptions` would be honoured) with a client that does
/// not retry 429 by itself.
async fn evict(client: &Client, namespace: &str, pod: &str) -> Result<(), Box<kube::core::Status>> {
    let eviction = Eviction {
        metadata: ObjectMeta {
            name: Some(pod.to_owned()),
            namespace: Some(namespace.to_owned()),
            ..ObjectMeta::default()
        },
        delete_options: None,
    };
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    match pods
        .create_subresource::<_, serde_json::Value>("eviction", pod, &PostParams::default(), &eviction)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) => Err(status),
        Err(other) => panic!("evicting {namespace}/{pod}: {other}"),
    }
}

#[tokio::test]
async fn an_eviction_is_refused_with_429_naming_the_budget_until_the_budget_allows_it() {
    let cluster = common::cluster().await;
    let client = cluster.client();
    let evictor = cluster.client_without_retry();
    let namespace = common::namespace().await;
    let fleet = common::fleet(2).await;
    let app = Workload::new(&namespace, "web")
        .replicas(2)
        .gpus(1)
        .on_nodes(&fleet.node_names());
    workload::create(&client, &app.deployment()).await.unwrap();
    workload::create(&client, &app.pdb(&Budget::min_available(2)))
        .await
        .unwrap();
    let pods = workload::wait_ready_pods(&client, &namespace, &app.selector(), 2, Duration::from_secs(60))
        .await
        .unwrap();
    workload::wait_pdb_allows(&client, &namespace, "web", 0, Duration::from_secs(30))
        .await
        .unwrap();
    let victim = pods[0].name_any();

    let refusal = evict(&evictor, &namespace, &victim)
        .await
        .expect_err("no budget left: the eviction must be refused");
    assert_eq!(refusal.code, 429, "{refusal:?}");
    let causes: Vec<String> = refusal
        .details
        .iter()
        .flat_map(|d| d.causes.iter())
        .map(|c| format!("{} {}", c.reason, c.message))
        .collect();
    assert!(
        causes
            .iter()
            .any(|c| c.contains("DisruptionBudget") && c.contains("web")),
        "the refusal names the budget: {refusal:?}"
    );

    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), &namespace);
    pdbs.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": { "minAvailable": 1 } })),
    )
    .await
    .unwrap();
    workload::wait_pdb_allows(&client, &namespace, "web", 1, Duration::from_secs(30))
        .await
        .unwrap();
    evict(&evictor, &namespace, &victim)
        .await
        .expect("the budget allows one disruption");
    // The eviction leaves the pod terminating with its 30s grace period; only the simulated
    // kubelet's grace-0 delete makes it go this fast.
    workload::wait_pod_gone(&client, &namespace, &victim, Duration::from_secs(15))
        .await
        .unwrap();
    // The Deployment replaces it, and the budget returns.
    workload::wait_ready_pods(&client, &namespace, &app.selector(), 2, Duration::from_secs(60))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_pod_matched_by_two_budgets_cannot_be_evicted() {
    let cluster = common::cluster().await;
    let client = cluster.client();
    let namespace = common::namespace().await;
    let fleet = common::fleet(1).await;
    let app = Workload::new(&namespace, "twice")
        .replicas(2)
        .on_nodes(&fleet.node_names());
    workload::create(&client, &app.deployment()).await.unwrap();
    workload::create(&client, &app.pdb_named("first", &Budget::max_unavailable(1)))
        .await
        .unwrap();
    workload::create(&client, &app.pdb_named("second", &Budget::max_unavailable(1)))
        .await
        .unwrap();
    let pods = workload::wait_ready_pods(&client, &namespace, &app.selector(), 2, Duration::from_secs(60))
        .await
        .unwrap();
    // The disruption controller counts a pod under only one of its budgets, so what each allows
    // varies; that both were observed is what matters.
    for pdb in ["first", "second"] {
        workload::wait_pdb_observed(&client, &namespace, pdb, Duration::from_secs(30))
            .await
            .unwrap();
    }
    let refusal = evict(&cluster.client_without_retry(), &namespace, &pods[0].name_any())
        .await
        .expect_err("two budgets: the eviction must fail");
    assert_eq!(refusal.code, 500, "{refusal:?}");
    assert!(
        refusal.message.contains("more than one PodDisruptionBudget"),
        "{refusal:?}"
    );
}

#[tokio::test]
async fn a_pending_pod_is_evicted_even_when_its_budget_is_spent() {
    let cluster = common::cluster().await;
    let client = cluster.client();
    let namespace = common::namespace().await;
    let fleet = common::fleet(1).await;
    // Three 4-GPU replicas on one 8-GPU node: two run, one stays Pending.
    let app = Workload::new(&namespace, "pending")
        .replicas(3)
        .gpus(4)
        .on_nodes(&fleet.node_names());
    workload::create(&client, &app.deployment()).await.unwrap();
    workload::create(&client, &app.pdb(&Budget::min_available(3)))
        .await
        .unwrap();
    workload::wait_ready_pods(&client, &namespace, &app.selector(), 2, Duration::from_secs(60))
        .await
        .unwrap();
    workload::wait_pdb_allows(&client, &namespace, "pending", 0, Duration::from_secs(30))
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let pending = common::eventually("the unschedulable pod", Duration::from_secs(30), || {
        let pods = pods.clone();
        async move {
            pods.list(&kube::api::ListParams::default())
                .await
                .ok()?
                .items
                .into_iter()
                .find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Pending"))
        }
    })
    .await;
    evict(&cluster.client_without_retry(), &namespace, &pending.name_any())
        .await
        .expect("a Pending pod bypasses its budget");
}

#[tokio::test]
async fn a_bare_pod_under_a_max_unavailable_budget_cannot_be_evicted() {
    let cluster = common::cluster().await;
    let client = cluster.client();
    let namespace = common::namespace().await;
    let fleet = common::fleet(1).await;
    let node = &fleet.node_names()[0];
    // No controller owns the pod, so the disruption controller cannot tell how many pods the
    // budget expects and allows no disruption at all.
    let app = Workload::new(&namespace, "lonely");
    workload::create(&client, &app.bare_pod("lonely", node))
        .await
        .unwrap();
    workload::create(&client, &app.pdb(&Budget::max_unavailable(1)))
        .await
        .unwrap();
    workload::wait_ready_pods(&client, &namespace, &app.selector(), 1, Duration::from_secs(30))
        .await
        .unwrap();
    workload::wait_pdb_observed(&client, &namespace, "lonely", Duration::from_secs(30))
        .await
        .unwrap();
    let refusal = evict(&cluster.client_without_retry(), &namespace, "lonely")
        .await
        .expect_err("the budget allows nothing for a pod without a controller");
    assert_eq!(refusal.code, 429, "{refusal:?}");
}
