//! Unit tests of `explain`.

use gpu_remediation_api::GpuRemediationStatus;
use serde_json::json;

use super::*;
use k8s_openapi::api::core::v1::Node;

fn now() -> Timestamp {
    "2026-06-01T12:00:00Z".parse().unwrap()
}

fn node(name: &str, labels: &serde_json::Value, gpu: Option<(&str, &str, &str)>) -> Arc<Node> {
    let conditions = gpu.map_or_else(Vec::new, |(status, reason, since)| {
        vec![json!({"type": "GpuHealthy", "status": status, "reason": reason,
                    "message": "GPU 3 fell off the bus", "lastTransitionTime": since})]
    });
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels},
            "status": {"conditions": conditions},
        }))
        .unwrap(),
    )
}

fn policy(name: &str, spec: &serde_json::Value) -> Arc<GpuRemediationPolicy> {
    let mut full = json!({
        "nodeSelector": {"matchLabels": {"gpu": "true"}},
        "triggers": [{"conditionType": "GpuHealthy", "status": "False", "for": "2m"}],
        "safety": {"maxConcurrent": 1, "maxUnhealthy": "100%"},
    });
    for (k, v) in spec.as_object().unwrap() {
        full[k] = v.clone();
    }
    Arc::new(
        serde_json::from_value(json!({
            "apiVersion": "gpuremediation.dev/v1alpha1", "kind": "GpuRemediationPolicy",
            "metadata": {"name": name}, "spec": full,
        }))
        .unwrap(),
    )
}

fn remediation(node: &str, since: &str, phase: Phase) -> Arc<GpuRemediation> {
    let mut r: GpuRemediation = serde_json::from_value(json!({
        "apiVersion": "gpuremediation.dev/v1alpha1", "kind": "GpuRemediation",
        "metadata": {"name": format!("{node}-abc"), "creationTimestamp": "2026-06-01T11:59:00Z"},
        "spec": {"nodeName": node, "policyName": "gpus", "action": "Replace", "mode": "Enforce",
                 "trigger": {"conditionType": "GpuHealthy", "status": "False", "reason": "XID79",
                             "message": "", "since": since}},
    }))
    .unwrap();
    r.status = Some(GpuRemediationStatus {
        phase,
        ..GpuRemediationStatus::default()
    });
    Arc::new(r)
}

const LONG_AGO: &str = "2026-06-01T11:00:00Z";
const JUST_NOW: &str = "2026-06-01T11:59:30Z";

#[test]
fn a_node_no_policy_selects_is_explained_as_unselected() {
    let nodes = [node("cpu-1", &json!({}), None)];
    let e = explain("cpu-1", &nodes, &[policy("gpus", &json!({}))], &[], now());
    assert_eq!(e.outcome, Outcome::Unselected);
}

#[test]
fn an_unknown_node_is_said_to_be_unknown() {
    assert_eq!(
        explain::<Node>("nope", &[], &[], &[], now()).outcome,
        Outcome::NoSuchNode
    );
}

#[test]
fn an_opted_out_node_is_left_alone_whatever_its_gpus_say() {
    let nodes = [node(
        "gpu-1",
        &json!({"gpu": "true", "gpuremediation.dev/exclude": "true"}),
        Some(("False", "XID79", LONG_AGO)),
    )];
    let e = explain("gpu-1", &nodes, &[policy("gpus", &json!({}))], &[], now());
    assert_eq!(e.outcome, Outcome::OptedOut);
}

#[test]
fn a_trigger_that_has_not_held_for_its_duration_says_when_it_will() {
    let nodes = [node(
        "gpu-1",
        &json!({"gpu": "true"}),
        Some(("False", "XID79", JUST_NOW)),
    )];
    let e = explain("gpu-1", &nodes, &[policy("gpus", &json!({}))], &[], now());
    assert_eq!(
        e.outcome,
        Outcome::Pending {
            due: "2026-06-01T12:01:30Z".parse().unwrap()
        }
    );
    assert!(
        e.to_string()
            .contains("trigger spec.triggers[0]: GpuHealthy=False reason XID79"),
        "{e}"
    );
}

#[test]
fn a_node_of_a_held_rack_names_its_rack_with_its_counts_and_waits_for_it() {
    let nodes: Vec<Arc<Node>> = (0..4)
        .map(|i| {
            node(
                &format!("gpu-{i}"),
                &json!({"gpu": "true", "rack": "b"}),
                (i < 3).then_some(("False", "XID79", LONG_AGO)),
            )
        })
        .chain([node("gpu-a", &json!({"gpu": "true", "rack": "a"}), None)])
        .collect();
    let policies = [policy(
        "gpus",
        &json!({"safety": {"maxConcurrent": 5, "maxUnhealthy": "100%",
            "failureDomains": [{"topologyKey": "rack", "maxUnhealthyCount": 2}]}}),
    )];
    let e = explain("gpu-0", &nodes, &policies, &[], now());
    assert!(
        matches!(&e.outcome, Outcome::Waiting { reason, .. } if reason == "DomainHeld"),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains("failure domain rack=b: 3 of 4 nodes unhealthy"),
        "{e}"
    );
    let healthy = explain("gpu-a", &nodes, &policies, &[], now());
    assert_eq!(healthy.outcome, Outcome::Healthy);
}

#[test]
fn a_node_with_a_fresh_signal_is_said_to_be_quarantined_before_its_for_and_a_quarantined_one_held() {
    let mut broken = (*node(
        "gpu-1",
        &json!({"gpu": "true"}),
        Some(("False", "XID79", JUST_NOW)),
    ))
    .clone();
    let policies = [policy("gpus", &json!({}))];
    let fresh = explain("gpu-1", &[Arc::new(broken.clone())], &policies, &[], now());
    assert!(
        fresh
            .to_string()
            .contains("quarantine: taken on the controller's next pass"),
        "{fresh}"
    );
    crate::quarantine::taint::quarantine(&mut broken, "gpus");
    let held = explain("gpu-1", &[Arc::new(broken)], &policies, &[], now());
    assert!(held.to_string().contains("quarantine: held (taint"), "{held}");
}

#[test]
fn a_device_level_quarantine_is_explained_naming_the_gpus_taken_out() {
    let mut broken = (*node(
        "gpu-1",
        &json!({"gpu": "true"}),
        Some(("False", "XID79", JUST_NOW)),
    ))
    .clone();
    let device = crate::quarantine::device::QuarantinedDevice {
        uuid: "GPU-3".into(),
        driver: "gpu.example.com".into(),
        pool: "gpu-1".into(),
        device: "gpu-3".into(),
    };
    crate::quarantine::device::mark(&mut broken, "gpus", &[device]);
    let held = explain(
        "gpu-1",
        &[Arc::new(broken)],
        &[policy("gpus", &json!({}))],
        &[],
        now(),
    );
    assert!(
        held.to_string()
            .contains("held at device level by policy gpus: only GPU GPU-3 (gpu.example.com/gpu-1/gpu-3)"),
        "{held}"
    );
}

#[test]
fn an_unhealthy_node_within_budget_starts_now() {
    let nodes = [node(
        "gpu-1",
        &json!({"gpu": "true"}),
        Some(("False", "XID79", LONG_AGO)),
    )];
    let e = explain("gpu-1", &nodes, &[policy("gpus", &json!({}))], &[], now());
    assert_eq!(e.outcome, Outcome::StartsNow, "{e}");
}

#[test]
fn an_unhealthy_node_behind_a_busy_concurrency_slot_names_the_limit() {
    let nodes = [
        node(
            "gpu-1",
            &json!({"gpu": "true"}),
            Some(("False", "XID79", LONG_AGO)),
        ),
        node(
            "gpu-2",
            &json!({"gpu": "true"}),
            Some(("False", "XID79", LONG_AGO)),
        ),
    ];
    let busy = remediation("gpu-1", LONG_AGO, Phase::Draining);
    let e = explain("gpu-2", &nodes, &[policy("gpus", &json!({}))], &[busy], now());
    let Outcome::Waiting { reason, message } = &e.outcome else {
        panic!("{e}");
    };
    assert_eq!(
        reason,
        gpu_remediation_api::constants::reasons::DEFERRED_CONCURRENCY
    );
    assert!(message.contains("maxConcurrent is 1"), "{message}");
}

#[test]
fn a_node_under_remediation_names_the_remediation_and_its_phase() {
    let nodes = [node(
        "gpu-1",
        &json!({"gpu": "true"}),
        Some(("False", "XID79", LONG_AGO)),
    )];
    let busy = remediation("gpu-1", LONG_AGO, Phase::Draining);
    let e = explain("gpu-1", &nodes, &[policy("gpus", &json!({}))], &[busy], now());
    assert_eq!(
        e.outcome,
        Outcome::InFlight {
            remediation: "gpu-1-abc".into(),
            phase: Phase::Draining
        }
    );
}

#[test]
fn a_remediation_on_the_ladder_shows_each_step_with_its_evidence_and_pods() {
    let nodes = [node(
        "gpu-1",
        &json!({"gpu": "true"}),
        Some(("False", "XID95", LONG_AGO)),
    )];
    let mut climbing = (*remediation("gpu-1", LONG_AGO, Phase::Replacing)).clone();
    climbing.status.as_mut().unwrap().steps = serde_yaml::from_str(
        "- {step: ResetGpu, start: '2026-06-01T11:59:10Z', evictedPods: [train/worker-3], \
         message: 'GPU-scoped drain: only the 1 pods holding GPU-3 leave (train/worker-3)'}",
    )
    .unwrap();
    let e = explain(
        "gpu-1",
        &nodes,
        &[policy("gpus", &json!({}))],
        &[Arc::new(climbing)],
        now(),
    );
    let text = e.to_string();
    assert!(
        text.contains(
            "\n  step 1 ResetGpu: running, since 2026-06-01T11:59:10Z\n    evicted (1): train/worker-3\n    \
             GPU-scoped drain: only the 1 pods holding GPU-3 leave (train/worker-3)\n"
        ),
        "{text}"
    );
}

#[test]
fn a_draining_remediation_names_the_gangs_it_touched_their_nodes_and_what_the_drain_cost() {
    let nodes = [node(
        "gpu-1",
        &json!({"gpu": "true"}),
        Some(("False", "XID79", LONG_AGO)),
    )];
    let mut draining = (*remediation("gpu-1", LONG_AGO, Phase::Draining)).clone();
    draining.status.as_mut().unwrap().drain = Some(
        serde_yaml::from_str(
            "{podsTotal: 1, podsEvicted: 1, podsRemaining: 0, gpuSeconds: 960, gangs: [\
             {gang: JobSet ml/llm, namespace: ml, nodes: [gpu-1, gpu-2, gpu-3], evicted: [\
             {pod: ml/llm-1, uid: u1, node: gpu-2}, {pod: ml/llm-2, uid: u2, node: gpu-3}]}, \
             {gang: IndexedJob ml/eval, namespace: ml, nodes: [gpu-1, gpu-4]}]}",
        )
        .unwrap(),
    );
    let e = explain(
        "gpu-1",
        &nodes,
        &[policy("gpus", &json!({}))],
        &[Arc::new(draining)],
        now(),
    );
    let text = e.to_string();
    for line in [
        "gang: JobSet ml/llm on nodes gpu-1, gpu-2, gpu-3; 2 members on other nodes evicted with it",
        "gang: IndexedJob ml/eval on nodes gpu-1, gpu-4\n",
        "drain cost: 960 GPU-seconds",
    ] {
        assert!(text.contains(line), "{line:?} in:\n{text}");
    }
}

#[test]
fn a_finished_remediation_of_the_same_episode_is_not_repeated() {
    let nodes = [node(
        "gpu-1",
        &json!({"gpu": "true"}),
        Some(("False", "XID79", LONG_AGO)),
    )];
    let done = remediation("gpu-1", LONG_AGO, Phase::Cancelled);
    let e = explain("gpu-1", &nodes, &[policy("gpus", &json!({}))], &[done], now());
    assert!(matches!(e.outcome, Outcome::AlreadyHandled { .. }), "{e}");
}

#[test]
fn a_paused_policy_holds_an_unhealthy_node_and_the_overlapping_policy_is_named() {
    let nodes = [node(
        "gpu-1",
        &json!({"gpu": "true"}),
        Some(("False", "XID79", LONG_AGO)),
    )];
    let policies = [
        policy("a-paused", &json!({"paused": true, "priority": 5})),
        policy("b-other", &json!({})),
    ];
    let e = explain("gpu-1", &nodes, &policies, &[], now());
    assert!(
        matches!(&e.outcome, Outcome::Waiting { reason, .. } if reason == gpu_remediation_api::constants::reasons::PAUSED),
        "{e}"
    );
    assert!(
        e.facts[0].contains("policy a-paused governs the node; b-other also select it"),
        "{e}"
    );
}

#[test]
fn a_remediation_whose_agent_named_another_node_s_board_shows_the_conflict() {
    let nodes = [node(
        "gpu-1",
        &json!({"gpu": "true"}),
        Some(("False", "XID79", LONG_AGO)),
    )];
    let mut claimed = (*remediation("gpu-1", LONG_AGO, Phase::Draining)).clone();
    claimed.spec.hardware = Some(
        serde_json::from_value(json!({
            "failed": [{"uuid": "GPU-b", "serial": "1650000000002"}],
            "untrusted": [{"uuid": "GPU-b", "serial": "1650000000002", "why": "Conflict",
                           "claimedBy": ["gpu-2"]}],
        }))
        .unwrap(),
    );
    let e = explain(
        "gpu-1",
        &nodes,
        &[policy("gpus", &json!({}))],
        &[Arc::new(claimed)],
        now(),
    );
    let said = e.to_string();
    assert!(
        said.contains("hardware: not counted as failed hardware: serial 1650000000002 is also listed by live node(s) gpu-2: a conflict"),
        "{said}"
    );
}
