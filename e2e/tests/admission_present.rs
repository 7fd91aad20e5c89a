//! Admission decides on the present, against the real control plane: three nodes of a policy
//! broken with room for two, so the circuit breaker holds all three; two of them recover within
//! 100 ms of each other. The third is admitted, and neither recovering node ever gets a
//! remediation (so is never cordoned), however the recoveries fall against the passes.

mod common;
mod scenario;

use std::time::{Duration, Instant};

use common::eventually;
use gpu_remediation_api::{GpuRemediationPolicy, constants::reasons};
use kube::Api;
use scenario::{RunningController, Scenario, is_unschedulable};

#[tokio::test]
async fn two_nodes_recovering_within_100_ms_at_the_breaker_s_limit_leave_only_the_third_admitted() {
    let s = Scenario::new(10).await;
    let nodes = s.nodes();
    let (recovering, waiting) = (&nodes[..2], &nodes[2]);
    s.policy(serde_json::json!({
        "triggers": [{"conditionType": "GpuHealthy", "status": "False", "for": "1s"}],
        "safety": {"maxUnhealthy": 2, "maxConcurrent": 5},
    }))
    .await;
    for node in &nodes[..3] {
        s.break_gpu(node).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let controller = RunningController::start(&s.scope).await;
    let policies = Api::<GpuRemediationPolicy>::all(s.client.clone());
    eventually(
        "the breaker holding all three",
        Duration::from_secs(30),
        || async {
            let status = policies.get(&s.scope).await.ok()?.status?;
            let held = status
                .waiting
                .iter()
                .filter(|w| w.reason == reasons::CIRCUIT_OPEN);
            (held.count() == 3).then_some(())
        },
    )
    .await;
    assert!(s.remediations().await.is_empty());

    // The first recovery closes the breaker; the second follows within 100 ms.
    s.heal_gpu(&recovering[0]).await;
    let first = Instant::now();
    tokio::time::sleep(Duration::from_millis(40)).await;
    s.heal_gpu(&recovering[1]).await;
    let between = first.elapsed();
    assert!(
        between < Duration::from_millis(100),
        "recoveries {between:?} apart"
    );

    eventually("the third node admitted", Duration::from_secs(30), || async {
        s.remediation_of(waiting).await
    })
    .await;
    // Passes enough for a late admission of a recovering node to show.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let admitted: Vec<String> = s
        .remediations()
        .await
        .into_iter()
        .map(|r| r.spec.node_name)
        .collect();
    assert_eq!(
        admitted,
        std::slice::from_ref(waiting),
        "only the third is admitted"
    );
    for node in recovering {
        assert!(!is_unschedulable(&s.node(node).await), "{node} cordoned");
    }
    controller.stop().await;
}
