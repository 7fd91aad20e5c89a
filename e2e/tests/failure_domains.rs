//! Correlated failures against the real control plane: a failing rack held while another rack's
//! node is remediated, the rack going on when its limit is raised; slow start earning a second
//! slot from a proven success and keeping it over a controller restart, doubling to `maxConcurrent`
//! and falling back to 1 after a `Failed` remediation; the driver label most failures share named, and its nodes held; a policy
//! that yields nodes to another counting and naming them, in its status and in `kubectl get`;
//! recovery, uncordon and cancellation going through while the policy breaker or a domain holds;
//! a held rack resuming when its nodes recover; `maxUnhealthy` as a count and a share, the lower
//! deciding.

mod common;
mod scenario;

use std::time::Duration;

use common::eventually;
use gpu_remediation_api::{
    GpuRemediationPolicy, GpuRemediationPolicyStatus, Phase,
    constants::{policy_conditions, reasons},
};
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, Patch, PatchParams},
};
use scenario::{RunningController, SCOPE_LABEL, Scenario, is_unschedulable};

const RACK: &str = "e2e.gpuremediation.dev/rack";
const DRIVER: &str = "nvidia.com/cuda.driver.major";

async fn label(s: &Scenario, node: &str, key: &str, value: &str) {
    let patch = serde_json::json!({"metadata": {"labels": {key: value}}});
    Api::<Node>::all(s.client.clone())
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

async fn status_when(
    s: &Scenario,
    what: &str,
    within: Duration,
    ok: impl Fn(&GpuRemediationPolicyStatus) -> bool,
) -> GpuRemediationPolicyStatus {
    let policies = Api::<GpuRemediationPolicy>::all(s.client.clone());
    eventually(what, within, || async {
        let status = policies.get(&s.scope).await.ok()?.status?;
        ok(&status).then_some(status)
    })
    .await
}

async fn in_flight_nodes(s: &Scenario) -> Vec<String> {
    s.remediations()
        .await
        .into_iter()
        .filter(|r| !r.status.as_ref().is_some_and(|st| st.phase.is_terminal()))
        .map(|r| r.spec.node_name)
        .collect()
}

#[tokio::test]
async fn a_failing_rack_is_held_while_another_rack_is_remediated_and_goes_on_when_its_limit_is_raised() {
    let s = Scenario::new(18).await;
    let nodes = s.nodes();
    let racks: Vec<&[String]> = nodes.chunks(6).collect();
    for (rack, members) in ["a", "b", "c"].iter().zip(&racks) {
        for node in *members {
            label(&s, node, RACK, rack).await;
        }
    }
    s.policy(serde_json::json!({"safety": {
        "maxConcurrent": 10, "maxUnhealthy": "100%",
        "failureDomains": [{"topologyKey": RACK, "maxUnhealthyCount": 2}],
    }}))
    .await;
    let rack_b = racks[1];
    for node in &rack_b[..4] {
        s.break_gpu(node).await;
    }
    // Past `for` (3s) for all four before the controller's first look.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let controller = RunningController::start(&s.scope).await;
    let status = status_when(&s, "rack b held", Duration::from_secs(30), |st| {
        st.held_domains.len() == 1 && st.waiting.len() == 4
    })
    .await;
    assert_eq!(status.held_domains[0].name(), format!("{RACK}=b"));
    assert_eq!(
        (
            status.held_domains[0].unhealthy_nodes,
            status.held_domains[0].selected_nodes
        ),
        (4, 6)
    );
    assert!(status.waiting.iter().all(|w| w.reason == reasons::DOMAIN_HELD
        && w.message.contains(&format!("{RACK}=b: 4 of 6 nodes unhealthy"))));
    let held = status
        .conditions
        .iter()
        .find(|c| c.type_ == policy_conditions::DOMAIN_HELD)
        .unwrap();
    assert_eq!(held.status, "True");
    assert!(held.message.contains("4 of 6"), "{}", held.message);

    // Rack a's node failing meanwhile is remediated.
    let rack_a_node = &racks[0][0];
    s.break_gpu(rack_a_node).await;
    s.wait_phase(rack_a_node, Phase::Verifying, Duration::from_secs(30))
        .await;
    assert!(is_unschedulable(&s.node(rack_a_node).await));
    assert!(
        in_flight_nodes(&s).await == vec![rack_a_node.clone()],
        "nothing of rack b started"
    );

    // Raising the limit lets rack b's held nodes proceed.
    Api::<GpuRemediationPolicy>::all(s.client.clone())
        .patch(
            &s.scope,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"safety": {"failureDomains": [
                {"topologyKey": RACK, "maxUnhealthyCount": 4}
            ]}}})),
        )
        .await
        .unwrap();
    eventually("rack b's nodes to start", Duration::from_secs(30), || async {
        let running = in_flight_nodes(&s).await;
        rack_b[..4].iter().all(|n| running.contains(n)).then_some(())
    })
    .await;
    let resumed = status_when(&s, "rack b resumed", Duration::from_secs(15), |st| {
        st.held_domains.is_empty()
    })
    .await;
    assert!(resumed.waiting.is_empty());
    let events = eventually("the resume announced", Duration::from_secs(15), || async {
        let events = scenario::events_about(&s.client, &s.scope).await;
        events.contains_key(reasons::DOMAIN_RESUMED).then_some(events)
    })
    .await;
    // One for the rack and one naming the nodes it holds, never one per pass.
    assert_eq!(events.get(reasons::DOMAIN_HELD), Some(&2), "{events:?}");
    let held_notes = scenario::event_notes(&s.client, &s.scope, reasons::DOMAIN_HELD).await;
    assert!(
        held_notes.iter().any(|note| note.starts_with("4 at once")),
        "{held_notes:?}"
    );
    assert_eq!(events.get(reasons::DOMAIN_RESUMED), Some(&1), "{events:?}");
    controller.stop().await;
}

#[tokio::test]
async fn slow_start_earns_a_second_slot_from_a_proven_success_and_keeps_it_over_a_restart() {
    let s = Scenario::new(6).await;
    let nodes = s.nodes();
    s.policy(serde_json::json!({
        "safety": {"maxConcurrent": 4, "maxUnhealthy": "100%", "slowStart": true},
        "release": {"healthyFor": "2s"},
    }))
    .await;
    for node in &nodes {
        s.break_gpu(node).await;
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    let controller = RunningController::start(&s.scope).await;
    let status = status_when(&s, "one in flight", Duration::from_secs(30), |st| {
        st.in_flight == 1 && st.waiting.len() == 5
    })
    .await;
    assert_eq!(status.slow_start.as_ref().map(|a| a.allowed), Some(1));
    assert!(
        status
            .waiting
            .iter()
            .all(|w| w.reason == reasons::DEFERRED_SLOW_START)
    );
    let first = in_flight_nodes(&s).await.remove(0);
    s.wait_phase(&first, Phase::Verifying, Duration::from_secs(30))
        .await;
    // It recovers: Succeeded, then proven 2s (healthyFor) later.
    s.heal_gpu(&first).await;
    s.wait_phase(&first, Phase::Succeeded, Duration::from_secs(30))
        .await;
    let status = status_when(&s, "two allowed", Duration::from_secs(30), |st| st.in_flight == 2).await;
    let allowance = status.slow_start.unwrap();
    assert_eq!(allowance.allowed, 2);
    assert!(allowance.message.contains("doubled"), "{}", allowance.message);

    // A restart, with the status wiped: the new controller reads the allowance back from the
    // records, it does not start again from 1.
    controller.stop().await;
    Api::<GpuRemediationPolicy>::all(s.client.clone())
        .patch_status(
            &s.scope,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"slowStart": null, "inFlight": 0, "waiting": null}})),
        )
        .await
        .unwrap();
    let controller = RunningController::start(&s.scope).await;
    let status = status_when(&s, "two again after the restart", Duration::from_secs(15), |st| {
        st.slow_start.is_some() && st.in_flight > 0
    })
    .await;
    assert_eq!(status.slow_start.map(|a| a.allowed), Some(2));
    assert_eq!(status.in_flight, 2);
    assert_eq!(in_flight_nodes(&s).await.len(), 2);
    controller.stop().await;
}

/// Takes `node`'s in-flight reboot to `Succeeded` and heals its GPU, so the success is proven
/// `release.healthyFor` later.
async fn reboot_succeeds(s: &Scenario, node: &str) {
    let replacing = eventually(
        &format!("{node}'s reboot object"),
        Duration::from_secs(30),
        || async {
            s.remediation_of(node)
                .await
                .and_then(|r| r.status.and_then(|st| st.replacement).map(|o| o.name))
        },
    )
    .await;
    scenario::report_rebooted(s, &replacing).await;
    // The reboot reported done, the node standing, may already count as a success before the heal.
    eventually(
        &format!("{node}'s remediation to see the reboot"),
        Duration::from_secs(30),
        || async {
            s.remediation_of(node)
                .await
                .and_then(|r| r.status)
                .filter(|st| matches!(st.phase, Phase::Verifying | Phase::Succeeded))
        },
    )
    .await;
    s.heal_gpu(node).await;
    s.wait_phase(node, Phase::Succeeded, Duration::from_secs(30))
        .await;
}

#[tokio::test]
async fn slow_start_doubles_to_max_concurrent_and_a_failed_remediation_brings_it_back_to_one() {
    let s = Scenario::new(6).await;
    common::install_crd(&s.client, common::REBOOT_CRD).await;
    let nodes = s.nodes();
    let mut spec = scenario::reboot_policy(&s, "5m");
    scenario::merge(
        &mut spec,
        serde_json::json!({
            "safety": {"maxConcurrent": 4, "slowStart": true},
            "release": {"healthyFor": "2s"},
        }),
    );
    s.policy(spec).await;
    for node in &nodes {
        s.break_gpu(node).await;
    }
    let controller = RunningController::start(&s.scope).await;
    let status = status_when(&s, "one in flight", Duration::from_secs(30), |st| {
        st.in_flight == 1 && st.waiting.len() == 5
    })
    .await;
    assert_eq!(status.slow_start.map(|a| a.allowed), Some(1));

    let first = in_flight_nodes(&s).await.remove(0);
    reboot_succeeds(&s, &first).await;
    let status = status_when(&s, "two in flight", Duration::from_secs(30), |st| {
        st.in_flight == 2
    })
    .await;
    assert_eq!(status.slow_start.map(|a| a.allowed), Some(2));

    // The second proven success doubles it to 4, maxConcurrent: every remaining node in flight.
    let second = in_flight_nodes(&s).await.remove(0);
    reboot_succeeds(&s, &second).await;
    let status = status_when(&s, "four in flight", Duration::from_secs(30), |st| {
        st.in_flight == 4
    })
    .await;
    let allowance = status.slow_start.unwrap();
    assert_eq!(allowance.allowed, 4);
    assert!(
        allowance.message.contains("maxConcurrent 4") && allowance.message.contains("doubled"),
        "{}",
        allowance.message
    );
    assert!(status.waiting.is_empty(), "{:?}", status.waiting);

    // One reboot reports failure: the remediation is Failed and the allowance falls back to 1.
    let third = in_flight_nodes(&s).await.remove(0);
    let object = eventually("the third reboot object", Duration::from_secs(30), || async {
        s.remediation_of(&third)
            .await
            .and_then(|r| r.status.and_then(|st| st.replacement).map(|o| o.name))
    })
    .await;
    scenario::report_reboot_failed(&s, &object).await;
    let failed = s.wait_phase(&third, Phase::Failed, Duration::from_secs(30)).await;
    let status = status_when(&s, "back to one", Duration::from_secs(30), |st| {
        st.slow_start.as_ref().is_some_and(|a| a.allowed == 1)
    })
    .await;
    let allowance = status.slow_start.unwrap();
    assert!(
        allowance.message.contains("back to 1") && allowance.message.contains(&failed.name_any()),
        "{}",
        allowance.message
    );
    // With 3 still in flight, a node failing again now waits for the slow start (once a minute
    // has passed since its first record: until then its new episode is held off,
    // `fleet::episodes::EPISODE_FLOOR`).
    s.break_gpu(&first).await;
    let status = status_when(
        &s,
        "the first node waiting again for the slow start",
        Duration::from_secs(90),
        |st| {
            st.waiting
                .iter()
                .any(|w| w.node == first && w.reason == reasons::DEFERRED_SLOW_START)
        },
    )
    .await;
    assert_eq!(status.in_flight, 3);
    assert!(
        status
            .waiting
            .iter()
            .all(|w| w.reason == reasons::DEFERRED_SLOW_START),
        "{:?}",
        status.waiting
    );
    controller.stop().await;
}

#[tokio::test]
async fn five_of_six_failures_on_one_driver_are_named_and_with_the_hold_their_nodes_wait() {
    let s = Scenario::new(6).await;
    let nodes = s.nodes();
    for (i, node) in nodes.iter().enumerate() {
        label(&s, node, DRIVER, if i == 5 { "550" } else { "570" }).await;
    }
    s.policy(serde_json::json!({"safety": {
        "maxConcurrent": 6, "maxUnhealthy": "100%",
        "suspect": {"window": "1h", "share": "60%", "minFailures": 3, "attributes": [DRIVER], "hold": true},
    }}))
    .await;
    for node in &nodes {
        s.break_gpu(node).await;
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    let controller = RunningController::start(&s.scope).await;
    let status = status_when(&s, "the suspect named", Duration::from_secs(30), |st| {
        st.suspect.is_some() && st.waiting.len() == 5
    })
    .await;
    let suspect = status.suspect.unwrap();
    assert_eq!(
        suspect.message,
        format!("5 of 6 failures in the last 1h are on {DRIVER}=570")
    );
    assert!(status.waiting.iter().all(|w| w.reason == reasons::SUSPECT_HELD));
    assert!(!status.waiting.iter().any(|w| w.node == nodes[5]));
    assert_eq!(in_flight_nodes(&s).await, vec![nodes[5].clone()]);
    controller.stop().await;
}

#[tokio::test]
async fn a_policy_that_yields_nodes_to_a_higher_priority_counts_and_names_them_and_kubectl_shows_it() {
    let s = Scenario::new(4).await;
    let nodes = s.nodes();
    for node in &nodes[..3] {
        label(&s, node, RACK, "a").await;
    }
    s.policy(serde_json::json!({})).await;
    let winner = format!("{}-rack-a", s.scope);
    let policy: GpuRemediationPolicy = serde_json::from_value(serde_json::json!({
        "apiVersion": "gpuremediation.dev/v1alpha1",
        "kind": "GpuRemediationPolicy",
        "metadata": {"name": winner, "labels": {SCOPE_LABEL: s.scope}},
        "spec": {
            "nodeSelector": {"matchLabels": {RACK: "a"}},
            "priority": 10,
            "triggers": [{"conditionType": "GpuHealthy", "status": "False", "for": "3s"}],
            "action": "None",
        },
    }))
    .unwrap();
    let policies = Api::<GpuRemediationPolicy>::all(s.client.clone());
    policies
        .create(&kube::api::PostParams::default(), &policy)
        .await
        .unwrap();
    let controller = RunningController::start(&s.scope).await;
    let status = status_when(&s, "three nodes yielded", Duration::from_secs(30), |st| {
        st.yielded_nodes == 3
    })
    .await;
    assert_eq!(status.selected_nodes, 1);
    let named: Vec<(&str, &str)> = status
        .yielded
        .iter()
        .map(|y| (y.node.as_str(), y.governed_by.as_str()))
        .collect();
    let expected: Vec<(&str, &str)> = nodes[..3].iter().map(|n| (n.as_str(), winner.as_str())).collect();
    assert_eq!(named, expected);
    let overlap = status
        .conditions
        .iter()
        .find(|c| c.type_ == policy_conditions::OVERLAP)
        .unwrap();
    assert_eq!(overlap.status, "True");
    assert!(
        overlap
            .message
            .starts_with(&format!("3 selected nodes are governed by {winner} ")),
        "{}",
        overlap.message
    );
    assert!(
        overlap.message.contains(&format!("{} ({winner})", nodes[0])),
        "{}",
        overlap.message
    );

    // What `kubectl get gpupolicy` prints: the server's table, YIELDED next to SELECTED.
    let request = http::Request::get(format!(
        "/apis/gpuremediation.dev/v1alpha1/gpuremediationpolicies/{}",
        s.scope
    ))
    .header("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
    .body(Vec::new())
    .unwrap();
    let table: serde_json::Value = s.client.request(request).await.unwrap();
    let columns: Vec<&str> = table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    let cells = table["rows"][0]["cells"].as_array().unwrap();
    let cell = |name: &str| cells[columns.iter().position(|c| *c == name).unwrap()].clone();
    assert_eq!(
        (cell("SELECTED"), cell("YIELDED")),
        (1.into(), 3.into()),
        "{columns:?} {cells:?}"
    );
    controller.stop().await;
    policies
        .delete(&winner, &kube::api::DeleteParams::default())
        .await
        .unwrap();
}

/// Two remediations in flight, then two more failures put the policy over `held`'s limit: the
/// first node recovers and is released, the second's record is deleted by a person and its node
/// let go, both while the limit still holds.
async fn released_and_cancelled_while_held(
    limits: serde_json::Value,
    held: impl Fn(&GpuRemediationPolicyStatus) -> bool,
) {
    let s = Scenario::new(6).await;
    let nodes = s.nodes();
    for node in &nodes {
        label(&s, node, RACK, "b").await;
    }
    s.policy(serde_json::json!({"safety": limits})).await;
    let controller = RunningController::start(&s.scope).await;
    for node in &nodes[..2] {
        s.break_gpu(node).await;
    }
    let cancelled = s
        .wait_phase(&nodes[1], Phase::Verifying, Duration::from_secs(30))
        .await;
    s.wait_phase(&nodes[0], Phase::Verifying, Duration::from_secs(30))
        .await;
    for node in &nodes[2..4] {
        s.break_gpu(node).await;
    }
    // Both new failures counted and held before the first node heals: were only one counted, the
    // heal would bring the unhealthy count under the limit and rightly let that one start (make test
    // once healed the first node 0.5 s before the controller counted the fourth failure).
    let both_waiting = |st: &GpuRemediationPolicyStatus| {
        held(st)
            && nodes[2..4]
                .iter()
                .all(|n| st.waiting.iter().any(|w| &w.node == n))
    };
    status_when(
        &s,
        "the limit holding both new failures",
        Duration::from_secs(30),
        both_waiting,
    )
    .await;

    s.heal_gpu(&nodes[0]).await;
    s.wait_phase(&nodes[0], Phase::Succeeded, Duration::from_secs(30))
        .await;
    assert!(!is_unschedulable(&s.node(&nodes[0]).await), "released");

    Api::<gpu_remediation_api::GpuRemediation>::all(s.client.clone())
        .delete(&cancelled.name_any(), &DeleteParams::default())
        .await
        .unwrap();
    eventually("the cancelled node let go", Duration::from_secs(30), || async {
        let gone = s.remediation_of(&nodes[1]).await.is_none();
        (gone && !is_unschedulable(&s.node(&nodes[1]).await)).then_some(())
    })
    .await;
    // Still held: neither waited for the limit to fall.
    status_when(&s, "the limit still holding", Duration::from_secs(10), &held).await;
    assert!(in_flight_nodes(&s).await.is_empty(), "nothing new started");
    controller.stop().await;
}

#[tokio::test]
async fn recovery_and_cancellation_go_through_while_the_policy_breaker_is_open() {
    released_and_cancelled_while_held(
        serde_json::json!({"maxConcurrent": 10, "maxUnhealthy": 2}),
        |st| {
            st.conditions
                .iter()
                .any(|c| c.type_ == policy_conditions::CIRCUIT_OPEN && c.status == "True")
        },
    )
    .await;
}

#[tokio::test]
async fn recovery_and_cancellation_go_through_while_the_nodes_domain_is_held() {
    released_and_cancelled_while_held(
        serde_json::json!({
            "maxConcurrent": 10, "maxUnhealthy": "100%",
            "failureDomains": [{"topologyKey": RACK, "maxUnhealthyCount": 2}],
        }),
        |st| st.held_domains.len() == 1,
    )
    .await;
}

#[tokio::test]
async fn a_held_rack_resumes_when_its_nodes_recover() {
    let s = Scenario::new(6).await;
    let nodes = s.nodes();
    for node in &nodes {
        label(&s, node, RACK, "b").await;
    }
    s.policy(serde_json::json!({"safety": {
        "maxConcurrent": 10, "maxUnhealthy": "100%",
        "failureDomains": [{"topologyKey": RACK, "maxUnhealthyCount": 2}],
    }}))
    .await;
    for node in &nodes[..4] {
        s.break_gpu(node).await;
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    let controller = RunningController::start(&s.scope).await;
    status_when(&s, "the rack held", Duration::from_secs(30), |st| {
        st.held_domains.len() == 1 && st.waiting.len() == 4
    })
    .await;
    assert!(in_flight_nodes(&s).await.is_empty());
    // Two recover: 2 of 6 is within the limit again, the other two start.
    for node in &nodes[..2] {
        s.heal_gpu(node).await;
    }
    eventually("the other two started", Duration::from_secs(30), || async {
        let mut running = in_flight_nodes(&s).await;
        running.sort();
        (running == nodes[2..4]).then_some(())
    })
    .await;
    let status = status_when(&s, "the rack resumed", Duration::from_secs(10), |st| {
        st.held_domains.is_empty()
    })
    .await;
    assert!(status.waiting.is_empty(), "{:?}", status.waiting);
    controller.stop().await;
}

#[tokio::test]
async fn max_unhealthy_given_as_a_count_and_a_share_holds_at_the_lower() {
    let s = Scenario::new(10).await;
    let nodes = s.nodes();
    // 50% of 10 is 5; the count 2 is lower and decides.
    s.policy(serde_json::json!({"safety": {
        "maxConcurrent": 10, "maxUnhealthy": "50%", "maxUnhealthyCount": 2,
    }}))
    .await;
    for node in &nodes[..3] {
        s.break_gpu(node).await;
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    let controller = RunningController::start(&s.scope).await;
    let open = |st: &GpuRemediationPolicyStatus| {
        st.conditions
            .iter()
            .find(|c| c.type_ == policy_conditions::CIRCUIT_OPEN && c.status == "True")
            .map(|c| c.message.clone())
    };
    let status = status_when(
        &s,
        "the breaker open at the count",
        Duration::from_secs(30),
        |st| open(st).is_some(),
    )
    .await;
    let message = open(&status).unwrap();
    assert!(message.starts_with("3 of 10 nodes unhealthy"), "{message}");
    assert!(in_flight_nodes(&s).await.is_empty());
    // The count raised past the share: 50% (5) is now the lower, and 3 of 10 is within it.
    Api::<GpuRemediationPolicy>::all(s.client.clone())
        .patch(
            &s.scope,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"safety": {"maxUnhealthyCount": 8}}})),
        )
        .await
        .unwrap();
    eventually("all three started", Duration::from_secs(30), || async {
        (in_flight_nodes(&s).await.len() == 3).then_some(())
    })
    .await;
    let status = status_when(&s, "the breaker closed", Duration::from_secs(10), |st| {
        open(st).is_none()
    })
    .await;
    assert_eq!(status.unhealthy_nodes, 3);
    // Three more fail: 6 of 10 is over 50% (5, now the lower).
    for node in &nodes[3..6] {
        s.break_gpu(node).await;
    }
    let status = status_when(
        &s,
        "the breaker open at the share",
        Duration::from_secs(30),
        |st| open(st).is_some(),
    )
    .await;
    let message = open(&status).unwrap();
    assert!(message.starts_with("6 of 10 nodes unhealthy"), "{message}");
    controller.stop().await;
}
