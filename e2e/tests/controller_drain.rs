//! The drain against the real control plane: evictions that never break a budget, budgets that
//! refuse (one, two), `onTimeout` (`Block`, `ForceDelete`, `Proceed`), dry runs, the hand-over to
//! `DeleteNode`, and a drain round that hangs without holding other nodes' cordons.

mod common;
mod scenario;

use std::time::Duration;

use common::eventually;
use gpu_remediation_api::{
    Phase,
    constants::{CORDONED_BY_ANNOTATION, NODE_LABEL},
};
use gpu_sandbox::workload::{self, Budget, Workload};
use k8s_openapi::{
    api::{admissionregistration::v1::ValidatingWebhookConfiguration, core::v1::Node},
    jiff::Timestamp,
};
use kube::{Api, Client, ResourceExt, api::PostParams};
use scenario::{
    BudgetWatch, RunningController, Scenario, evictions_sent, gpu_condition_since, has_our_taint,
    is_unschedulable, phase_at,
};

#[tokio::test]
#[allow(
    clippy::too_many_lines,
    reason = "one scenario, asserted step by step as it unfolds"
)]
async fn an_unhealthy_node_is_cordoned_within_a_second_and_drained_through_evictions_without_breaking_its_budget()
 {
    let s = Scenario::new(8).await;
    let nodes = s.nodes();
    let (broken, spares) = (nodes[0].clone(), nodes[1..3].to_vec());
    let web = s
        .protected_workload("web", &broken, &spares, 4, &Budget::min_available(3))
        .await;
    workload::wait_pdb_allows(&s.client, &s.namespace, "web", 1, Duration::from_secs(60))
        .await
        .unwrap();
    let solo = Workload::new(&s.namespace, "solo");
    workload::create(&s.client, &solo.bare_pod("solo", &broken))
        .await
        .unwrap();
    let agent = Workload::new(&s.namespace, "agent").on_nodes(std::slice::from_ref(&broken));
    workload::create(&s.client, &agent.daemon_set()).await.unwrap();
    let mirror = Workload::new(&s.namespace, "static");
    workload::create(&s.client, &mirror.mirror_pod("static-gpu", &broken))
        .await
        .unwrap();
    workload::wait_ready_pods(
        &s.client,
        &s.namespace,
        &agent.selector(),
        1,
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    workload::wait_ready_pods(
        &s.client,
        &s.namespace,
        &solo.selector(),
        1,
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    let budget = BudgetWatch::start(&s.client, &s.namespace, &web.selector());
    let solo_watch = BudgetWatch::start(&s.client, &s.namespace, &solo.selector());

    let controller = s.enforce_and_break(serde_json::json!({}), &broken).await;
    let due = {
        let since = gpu_condition_since(&s.node(&broken).await);
        since
            .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(3))
            .unwrap()
    };

    // Before `for` elapses nothing happens; within a second after, the node is cordoned and tainted.
    let cordoned_at = eventually(
        "the broken node to be cordoned and tainted",
        Duration::from_secs(20),
        || async {
            let node = s.node(&broken).await;
            (is_unschedulable(&node) && has_our_taint(&node)).then(Timestamp::now)
        },
    )
    .await;
    let late = cordoned_at.duration_since(due);
    assert!(late.as_secs_f64() >= 0.0, "cordoned {late} before `for` elapsed");
    assert!(
        late.as_secs_f64() <= 1.0,
        "cordoned {late} after `for` elapsed (must be within 1s)"
    );
    eprintln!("figure: cordoned {:.3}s after `for` elapsed", late.as_secs_f64());

    // Action None: drained, the node is held cordoned (Verifying) for a person or for recovery.
    let done = s
        .wait_phase(&broken, Phase::Verifying, Duration::from_secs(90))
        .await;
    let status = done.status.clone().unwrap();
    let drain = status.drain.clone().unwrap();
    assert_eq!(
        (drain.pods_total, drain.pods_evicted, drain.pods_remaining),
        (5, 5, 0),
        "{drain:?}"
    );
    assert_eq!(
        status.phase_history.first().map(|t| t.phase),
        Some(Phase::Pending),
        "{:?}",
        status.phase_history
    );
    let (cordoned, draining, held) = (
        phase_at(&done, Phase::Cordoned).unwrap(),
        phase_at(&done, Phase::Draining).unwrap(),
        phase_at(&done, Phase::Verifying).unwrap(),
    );
    assert!(
        cordoned <= draining && draining <= held,
        "{:?}",
        status.phase_history
    );
    assert_eq!(done.spec.trigger.reason, "XID79");
    assert_eq!(done.labels().get(NODE_LABEL), Some(&broken));
    eprintln!("figure: drain of 5 pods took {}", held.duration_since(draining));

    // What had to leave left through evictions; what had to stay stayed.
    let remaining: Vec<String> = s
        .pods_on(&broken)
        .await
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    assert!(
        remaining.iter().any(|n| n.starts_with("agent-")),
        "the DaemonSet pod stays: {remaining:?}"
    );
    assert!(
        remaining.contains(&"static-gpu".to_owned()),
        "the mirror pod stays: {remaining:?}"
    );
    assert!(
        !remaining.contains(&"solo".to_owned()) && !remaining.iter().any(|n| n.starts_with("web-")),
        "{remaining:?}"
    );
    let left = budget.left();
    assert_eq!(left.len(), 4, "every web pod on the node left: {left:?}");
    assert!(
        left.values().all(|evicted| *evicted),
        "each left through the Eviction API: {left:?}"
    );
    let solo_left = solo_watch.left();
    assert_eq!(
        solo_left.get("solo"),
        Some(&true),
        "the bare pod left through the Eviction API too: {solo_left:?}"
    );
    assert!(
        budget.fewest_healthy() >= 3,
        "the budget (minAvailable 3) was violated: {} healthy",
        budget.fewest_healthy()
    );

    let node = s.node(&broken).await;
    assert!(
        is_unschedulable(&node) && has_our_taint(&node),
        "action None keeps the node cordoned"
    );
    assert_eq!(
        node.annotations().get(CORDONED_BY_ANNOTATION),
        Some(&done.name_any())
    );
    controller.stop().await;
}

#[tokio::test]
async fn a_budget_that_allows_nothing_blocks_the_drain_and_names_itself() {
    let (s, broken, web) = scenario::pinned::pinned_behind_a_closed_budget().await;
    let budget = BudgetWatch::start(&s.client, &s.namespace, &web.selector());
    let controller = s.enforce_and_break(serde_json::json!({"drain": {"timeout": "4s", "onTimeout": "Block"}, "safety": {"maxUnhealthy": "100%"}}), &broken).await;

    let blocked = s
        .wait_phase(&broken, Phase::Blocked, Duration::from_secs(40))
        .await;
    let drain = blocked.status.clone().unwrap().drain.unwrap();
    assert_eq!(drain.pods_remaining, 2);
    assert!(!drain.blockers.is_empty());
    let expected = format!("{}/pinned", s.namespace);
    assert!(
        drain
            .blockers
            .iter()
            // Held for the budget's room: the planner never sent an eviction it would refuse (code
            // 0: no server answer; before the planner, each was sent and refused with 429).
            .all(|b| b.pdb.as_deref() == Some(expected.as_str()) && b.code == 0),
        "{:?}",
        drain.blockers
    );
    assert!(blocked.status.unwrap().message.unwrap().contains(&expected));
    let node = s.node(&broken).await;
    assert!(is_unschedulable(&node), "a blocked node stays cordoned");
    assert!(budget.fewest_healthy() >= 2);
    assert!(budget.left().is_empty(), "nothing left: {:?}", budget.left());
    controller.stop().await;
}

#[tokio::test]
async fn forty_pods_under_four_budgets_of_max_unavailable_one_drain_with_at_most_42_evictions_sent() {
    let s = Scenario::new(4).await;
    let nodes = s.nodes();
    let (broken, spares) = (nodes[0].clone(), nodes[1..4].to_vec());
    let mut watches = Vec::new();
    for app in ["alpha", "beta", "gamma", "delta"] {
        let web = s
            .protected_workload(app, &broken, &spares, 10, &Budget::max_unavailable(1))
            .await;
        workload::wait_pdb_allows(&s.client, &s.namespace, app, 1, Duration::from_secs(60))
            .await
            .unwrap();
        watches.push(BudgetWatch::start(&s.client, &s.namespace, &web.selector()));
    }
    s.policy(serde_json::json!({"drain": {"timeout": "120s"}})).await;
    let metrics = gpu_remediator::telemetry::Metrics::new();
    let controller = RunningController::start_reporting(&s.scope, metrics.clone()).await;
    s.break_gpu(&broken).await;

    let done = s
        .wait_phase(&broken, Phase::Verifying, Duration::from_secs(150))
        .await;
    let drain = done.status.clone().unwrap().drain.unwrap();
    assert_eq!((drain.pods_total, drain.pods_remaining), (40, 0), "{drain:?}");
    let sent = evictions_sent(&metrics);
    let total: u64 = sent.values().sum();
    eprintln!(
        "figure: 40 pods under 4 budgets (maxUnavailable 1): {total} evictions sent {sent:?}, drain {}",
        phase_at(&done, Phase::Verifying)
            .unwrap()
            .duration_since(phase_at(&done, Phase::Draining).unwrap())
    );
    assert!(total <= 42, "{total} evictions sent for 40 pods: {sent:?}");
    assert_eq!(sent.get("Evicted"), Some(&40), "{sent:?}");
    for watch in &watches {
        let left = watch.left();
        assert_eq!(left.len(), 10, "{left:?}");
        assert!(left.values().all(|evicted| *evicted), "{left:?}");
        assert!(
            watch.fewest_healthy() >= 9,
            "a budget (maxUnavailable 1 of 10) was violated: {} healthy",
            watch.fewest_healthy()
        );
    }
    controller.stop().await;
}

#[tokio::test]
async fn force_delete_removes_what_the_budget_protects_after_the_timeout() {
    let (s, broken, _) = scenario::pinned::pinned_behind_a_closed_budget().await;
    let controller = s.enforce_and_break(serde_json::json!({"drain": {"timeout": "3s", "onTimeout": "ForceDelete"}, "safety": {"maxUnhealthy": "100%"}}), &broken).await;
    let done = s
        .wait_phase(&broken, Phase::Verifying, Duration::from_secs(60))
        .await;
    let left: Vec<_> = s
        .pods_on(&broken)
        .await
        .into_iter()
        .filter(|p| p.name_any().starts_with("pinned-"))
        .map(|p| {
            (
                p.name_any(),
                p.metadata.uid,
                p.metadata.deletion_timestamp,
                p.metadata.creation_timestamp,
            )
        })
        .collect();
    assert!(
        left.is_empty(),
        "pinned pods left on {broken}: {left:?}; status {:?}",
        done.status
    );
    let history = &done.status.unwrap().phase_history;
    assert!(!history.iter().any(|t| t.phase == Phase::Blocked), "{history:?}");
    controller.stop().await;
}

#[tokio::test]
async fn proceed_hands_over_with_the_protected_pods_still_there() {
    let (s, broken, _) = scenario::pinned::pinned_behind_a_closed_budget().await;
    let controller = s.enforce_and_break(serde_json::json!({"drain": {"timeout": "3s", "onTimeout": "Proceed"}, "safety": {"maxUnhealthy": "100%"}}), &broken).await;
    let done = s
        .wait_phase(&broken, Phase::Verifying, Duration::from_secs(60))
        .await;
    let still: Vec<_> = s
        .pods_on(&broken)
        .await
        .into_iter()
        .filter(|p| p.name_any().starts_with("pinned-"))
        .collect();
    assert_eq!(still.len(), 2, "Proceed leaves the refused pods in place");
    let drained = done
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Drained")
        .unwrap();
    assert_eq!(drained.reason, "DrainTimeout");
    controller.stop().await;
}

#[tokio::test]
async fn a_pod_under_two_budgets_is_a_500_blocker_naming_both() {
    let s = Scenario::new(3).await;
    let nodes = s.nodes();
    let (broken, spares) = (nodes[0].clone(), nodes[1..2].to_vec());
    let app = s
        .protected_workload("doubled", &broken, &spares, 2, &Budget::min_available(1))
        .await;
    workload::create(
        &s.client,
        &app.pdb_named("doubled-too", &Budget::min_available(1)),
    )
    .await
    .unwrap();
    let controller = s.enforce_and_break(serde_json::json!({"drain": {"timeout": "4s", "onTimeout": "Block"}, "safety": {"maxUnhealthy": "100%"}}), &broken).await;
    let blocked = s
        .wait_phase(&broken, Phase::Blocked, Duration::from_secs(40))
        .await;
    let drain = blocked.status.unwrap().drain.unwrap();
    let both = format!("{ns}/doubled,{ns}/doubled-too", ns = s.namespace);
    assert_eq!(drain.blockers.len(), 2, "{:?}", drain.blockers);
    assert!(
        drain
            .blockers
            .iter()
            .all(|b| b.code == 500 && b.pdb.as_deref() == Some(both.as_str())),
        "{:?}",
        drain.blockers
    );
    assert_eq!(s.pods_on(&broken).await.len(), 2, "nothing left");
    controller.stop().await;
}

/// The Events the controller published about `name` (of any kind), by reason, with their counts
/// (an Event repeated by the recorder becomes a series with a count).

#[tokio::test]
async fn a_drained_node_is_replaced_by_deleting_it() {
    let s = Scenario::new(3).await;
    let nodes = s.nodes();
    let broken = nodes[0].clone();
    let solo = Workload::new(&s.namespace, "solo");
    workload::create(&s.client, &solo.bare_pod("solo", &broken))
        .await
        .unwrap();
    let controller = s
        .enforce_and_break(
            serde_json::json!({
                "action": "Replace",
                "replacement": {"strategy": "DeleteNode", "timeout": "5s"},
                "safety": {"maxUnhealthy": "100%"},
            }),
            &broken,
        )
        .await;
    let done = s
        .wait_phase(&broken, Phase::Succeeded, Duration::from_secs(60))
        .await;
    let status = done.status.unwrap();
    // No node group here: no replacement joins, so the record ends at replacement.timeout saying
    // so, not a proven success (slow start does not count it).
    let complete = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Complete")
        .expect("a Complete condition");
    assert_eq!(complete.reason, "ReplacementNotSeen");
    assert!(
        complete.message.starts_with("gone, replacement not seen"),
        "{}",
        complete.message
    );
    let replacement = status.replacement.expect("the replacement's object is recorded");
    assert_eq!(
        (replacement.kind.as_str(), replacement.name.as_str()),
        ("Node", broken.as_str())
    );
    for phase in [
        Phase::Cordoned,
        Phase::Draining,
        Phase::Replacing,
        Phase::Verifying,
        Phase::Succeeded,
    ] {
        assert!(
            status.phase_history.iter().any(|t| t.phase == phase),
            "{phase} missing: {:?}",
            status.phase_history
        );
    }
    assert_eq!(status.drain.unwrap().pods_evicted, 1);
    assert!(
        Api::<Node>::all(s.client.clone())
            .get_opt(&broken)
            .await
            .unwrap()
            .is_none(),
        "the node is gone"
    );
    controller.stop().await;
}

#[tokio::test]
async fn dry_run_changes_nothing_and_names_the_budget_that_would_refuse() {
    let (s, broken, _) = scenario::pinned::pinned_behind_a_closed_budget().await;
    workload::create(
        &s.client,
        &Workload::new(&s.namespace, "solo").bare_pod("solo", &broken),
    )
    .await
    .unwrap();
    let controller = s
        .enforce_and_break(
            serde_json::json!({"mode": "DryRun", "safety": {"maxUnhealthy": "100%"}}),
            &broken,
        )
        .await;
    let recorded = s
        .wait_phase(&broken, Phase::DryRun, Duration::from_secs(30))
        .await;
    let drain = recorded.status.unwrap().drain.unwrap();
    assert_eq!(drain.would_evict.len(), 3, "{:?}", drain.would_evict);
    let expected = format!("{}/pinned", s.namespace);
    assert_eq!(drain.blockers.len(), 2, "{:?}", drain.blockers);
    assert!(
        drain
            .blockers
            .iter()
            .all(|b| b.pdb.as_deref() == Some(expected.as_str()))
    );
    let node = s.node(&broken).await;
    assert!(
        !is_unschedulable(&node) && !has_our_taint(&node),
        "a dry run changes nothing"
    );
    assert_eq!(s.pods_on(&broken).await.len(), 3, "every pod is still there");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        s.remediations().await.len(),
        1,
        "a dry run is recorded once per episode"
    );
    controller.stop().await;
}

#[tokio::test]
async fn a_node_failing_while_another_drain_round_hangs_is_cordoned_without_waiting_for_it() {
    let s = Scenario::new(3).await;
    let nodes = s.nodes();
    let (first, second, spare) = (nodes[0].clone(), nodes[1].clone(), nodes[2].clone());
    s.protected_workload(
        "held",
        &first,
        std::slice::from_ref(&spare),
        2,
        &Budget::max_unavailable(2),
    )
    .await;
    // Every eviction of the first node's pods hangs 15 s in the webhook before it goes through.
    let webhook = SilentEvictionWebhook::install(&s.client, &s.namespace, 15).await;
    s.policy(serde_json::json!({"safety": {"maxConcurrent": 2, "maxUnhealthy": "100%"}}))
        .await;
    let controller = RunningController::start(&s.scope).await;
    s.break_gpu(&first).await;
    eventually(&format!("{first} cordoned"), Duration::from_secs(20), || async {
        is_unschedulable(&s.node(&first).await).then_some(())
    })
    .await;
    // The first node's drain round is now waiting on the webhook.
    s.break_gpu(&second).await;
    eventually(&format!("{second} cordoned"), Duration::from_secs(30), || async {
        is_unschedulable(&s.node(&second).await).then_some(())
    })
    .await;
    let first_pods = s.pods_on(&first).await;
    assert_eq!(
        first_pods
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .count(),
        2,
        "the second node was cordoned only after the first node's evictions came back: {:?}",
        first_pods.iter().map(ResourceExt::name_any).collect::<Vec<_>>()
    );
    // And the hung evictions do go through once the webhook times out.
    s.wait_phase(&first, Phase::Verifying, Duration::from_secs(60))
        .await;
    webhook.remove(&s.client).await;
    controller.stop().await;
}

/// A validating webhook on the evictions of one namespace whose endpoint accepts connections and
/// never answers: each eviction there waits the webhook's `timeoutSeconds`, then goes through
/// (`failurePolicy: Ignore`), as behind a slow policy engine.
struct SilentEvictionWebhook {
    name: String,
    held: tokio::task::JoinHandle<()>,
}

impl SilentEvictionWebhook {
    async fn install(client: &Client, namespace: &str, timeout_seconds: i32) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        // Accept and hold every connection, answering nothing (not even the TLS handshake).
        let held = tokio::spawn(async move {
            let mut sockets = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                sockets.push(socket);
            }
        });
        let name = format!("silent-evictions-{namespace}");
        let config: ValidatingWebhookConfiguration = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "webhooks": [{
                "name": "silent-evictions.e2e.gpuremediation.dev",
                "clientConfig": {"url": format!("https://127.0.0.1:{port}/validate")},
                "rules": [{
                    "operations": ["CREATE"],
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "resources": ["pods/eviction"],
                }],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "failurePolicy": "Ignore",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": timeout_seconds,
            }],
        }))
        .expect("a valid webhook configuration");
        Api::<ValidatingWebhookConfiguration>::all(client.clone())
            .create(&PostParams::default(), &config)
            .await
            .expect("creating the webhook configuration");
        Self { name, held }
    }

    async fn remove(self, client: &Client) {
        Api::<ValidatingWebhookConfiguration>::all(client.clone())
            .delete(&self.name, &kube::api::DeleteParams::default())
            .await
            .expect("deleting the webhook configuration");
        self.held.abort();
    }
}
