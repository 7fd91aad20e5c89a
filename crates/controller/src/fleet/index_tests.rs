//! The index's promise, checked over random fleets: a plan over the candidates it names, with its
//! census, is the plan over the whole fleet; and an index kept up to date from changed names
//! names the same candidates and holds the same census as one built afresh.

use std::collections::BTreeSet;

use gpu_remediation_api::{
    GpuRemediationPolicySpec, Phase,
    constants::{
        FAILED_GPUS_ANNOTATION, GPU_FIRST_SEEN_ANNOTATION, GPU_INVENTORY_ANNOTATION, GPU_PODS_ANNOTATION,
        QUARANTINE_TAINT_KEY, QUARANTINED_BY_ANNOTATION, REPEAT_OFFENDER_LABEL,
    },
    policy::ConditionStatus,
};
use k8s_openapi::{
    api::core::v1::{NodeCondition, NodeSpec, NodeStatus, Taint},
    apimachinery::pkg::apis::meta::v1::Time,
};
use kube::{ResourceExt as _, api::ObjectMeta};
use proptest::prelude::{ProptestConfig, prop, prop_assert_eq, proptest};

use super::*;
use crate::fleet;
use crate::test_fixtures::at;
use k8s_openapi::api::core::v1::Node;

/// Two overlapping policies: one over group `a` with racks as failure domains, slow start, a
/// suspect rule and quarantine; one over `h100` nodes, of higher priority.
fn policies() -> Vec<Arc<GpuRemediationPolicy>> {
    let spec = |selector: serde_json::Value, priority: i32, safety: serde_json::Value| {
        let spec: GpuRemediationPolicySpec = serde_json::from_value(serde_json::json!({
            "nodeSelector": selector,
            "priority": priority,
            "triggers": [
                {"conditionType": "GpuHealthy", "status": "False", "for": "30s"},
                {"conditionType": "Ready", "status": "Unknown", "for": "60s", "quarantine": false},
            ],
            "action": "None",
            "safety": safety,
            "quarantine": {"enabled": true, "hysteresis": "20s"},
            "release": {"healthyFor": "30s"},
        }))
        .unwrap();
        spec
    };
    let group = spec(
        serde_json::json!({"matchLabels": {"group": "a"}}),
        0,
        serde_json::json!({
            "maxConcurrent": 3, "maxUnhealthy": "50%", "slowStart": true,
            "failureDomains": [{"topologyKey": "rack", "maxUnhealthyCount": 2, "maxInFlight": 1}],
            "suspect": {"window": "1h", "share": "60%", "minFailures": 2, "attributes": ["driver"], "hold": true},
        }),
    );
    let h100 = spec(
        serde_json::json!({"matchLabels": {"model": "h100"}}),
        10,
        serde_json::json!({"maxConcurrent": "20%", "maxUnhealthy": "100%"}),
    );
    [("group", group), ("h100", h100)]
        .into_iter()
        .map(|(name, spec)| {
            let mut p = GpuRemediationPolicy::new(name, spec);
            p.metadata.generation = Some(1);
            Arc::new(p)
        })
        .collect()
}

/// One node, as drawn: (group, rack, h100, driver, `GpuHealthy` status, since, `Ready` unknown,
/// cordoned, quarantined by a policy).
type Drawn = (u8, u8, bool, bool, u8, i64, bool, bool, u8);

fn drawn() -> impl proptest::strategy::Strategy<Value = Drawn> {
    (
        0..3u8,
        0..3u8,
        prop::bool::weighted(0.3),
        prop::bool::ANY,
        0..6u8,
        0..120i64,
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.1),
        0..6u8,
    )
}

fn node(index: usize, drawn: Drawn) -> Arc<Node> {
    let (group, rack, h100, driver, gpu, since, unknown, cordoned, quarantined) = drawn;
    let mut labels = vec![
        ("rack".to_owned(), format!("r{rack}")),
        ("driver".to_owned(), if driver { "570" } else { "550" }.to_owned()),
    ];
    if group < 2 {
        labels.push(("group".to_owned(), ["a", "b"][usize::from(group)].to_owned()));
    }
    if h100 {
        labels.push(("model".to_owned(), "h100".to_owned()));
    }
    let condition = |type_: &str, status: &str| NodeCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some("Drawn".into()),
        last_transition_time: Some(Time(at(since))),
        ..NodeCondition::default()
    };
    // Mostly healthy, as fleets are.
    let gpu = ["True", "True", "True", "False", "Unknown", "True"][usize::from(gpu)];
    let ready = if unknown { "Unknown" } else { "True" };
    let owner = match quarantined {
        0 => Some("group"),
        1 => Some("h100"),
        _ => None,
    };
    Arc::new(Node {
        metadata: ObjectMeta {
            name: Some(format!("n{index:02}")),
            uid: Some(format!("uid-{index}")),
            labels: Some(labels.into_iter().collect()),
            annotations: Some(
                owner
                    .map(|o| (QUARANTINED_BY_ANNOTATION.to_owned(), o.to_owned()))
                    .into_iter()
                    .chain(reports(index).filter(|_| driver))
                    .collect(),
            ),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec {
            unschedulable: cordoned.then_some(true),
            taints: owner.map(|_| {
                vec![Taint {
                    key: QUARANTINE_TAINT_KEY.into(),
                    effect: "NoSchedule".into(),
                    ..Taint::default()
                }]
            }),
            ..NodeSpec::default()
        }),
        status: Some(NodeStatus {
            conditions: Some(vec![condition("Ready", ready), condition("GpuHealthy", gpu)]),
            ..NodeStatus::default()
        }),
    })
}

/// The agent's inventory and the controller's first-seen stamp, as an installed node carries them
/// (drawn on the nodes of one driver: a fleet mid-install).
fn reports(index: usize) -> impl Iterator<Item = (String, String)> {
    let serial = format!("1650{index:04}");
    [
        (
            GPU_INVENTORY_ANNOTATION.to_owned(),
            format!(r#"[{{"index":0,"uuid":"GPU-{index}","serial":"{serial}"}}]"#),
        ),
        (
            GPU_FIRST_SEEN_ANNOTATION.to_owned(),
            format!(r#"{{"{serial}":"{}"}}"#, at(0)),
        ),
    ]
    .into_iter()
}

/// A record of node `index` under `policy` in `phase`, its episode begun at `since`.
fn record(index: usize, policy: u8, phase: u8, since: i64) -> Arc<GpuRemediation> {
    let policy = ["group", "h100"][usize::from(policy % 2)];
    let phase = [Phase::Succeeded, Phase::Failed, Phase::Draining, Phase::Pending][usize::from(phase % 4)];
    fleet::tests::existing(&format!("n{index:02}"), policy, since, phase, since + 30)
}

/// The plan over the index's candidates, as text (plans hold no map of unstable order).
fn planned_from(index: &NodeIndex, nodes: &[Arc<Node>], records: &[Arc<GpuRemediation>], now: i64) -> String {
    let candidates = index.candidates(records, &[]);
    let looked_at: Vec<Arc<Node>> = nodes
        .iter()
        .filter(|n| candidates.contains(n.metadata.name.as_deref().unwrap_or_default()))
        .cloned()
        .collect();
    format!(
        "{:?}",
        fleet::plan_with(
            &policies(),
            &index.census(),
            &looked_at,
            records,
            &crate::first_seen::FirstSeen::default(),
            at(now)
        )
    )
}

/// Long after every drawn transition: no node is recovering.
const LATER: i64 = 10_000;

fn built(nodes: &[Arc<Node>], now: i64) -> NodeIndex {
    let mut index = NodeIndex::default();
    index.refresh(
        &policies(),
        NodeChanges::Everything,
        at(now),
        |_| None,
        || nodes.to_vec(),
    );
    index
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn a_plan_over_the_candidates_is_the_plan_over_the_whole_fleet(
        fleet in prop::collection::vec(drawn(), 1..30),
        records in prop::collection::vec((0..30usize, 0..2u8, 0..4u8, 0..120i64), 0..6),
        now in 100..200i64,
    ) {
        let nodes: Vec<Arc<Node>> = fleet.into_iter().enumerate().map(|(i, d)| node(i, d)).collect();
        let records: Vec<Arc<GpuRemediation>> = records
            .into_iter()
            .map(|(i, policy, phase, since)| record(i % nodes.len(), policy, phase, since))
            .collect();
        let whole = format!("{:?}", fleet::plan(&policies(), &nodes, &records, at(now)));

        prop_assert_eq!(planned_from(&built(&nodes, now), &nodes, &records, now), whole);
    }

    #[test]
    fn an_index_kept_from_changed_names_is_the_index_built_afresh(
        before in prop::collection::vec(drawn(), 1..30),
        edits in prop::collection::vec((0..40usize, prop::option::weighted(0.8, drawn())), 1..12),
    ) {
        let mut nodes: Vec<Option<Arc<Node>>> =
            before.into_iter().enumerate().map(|(i, d)| Some(node(i, d))).collect();
        let present = |nodes: &[Option<Arc<Node>>]| nodes.iter().flatten().cloned().collect::<Vec<_>>();
        let mut index = built(&present(&nodes), 150);
        let mut changed = BTreeSet::new();
        // Nodes change, join (beyond the fleet) and leave (`None`).
        for (i, edit) in edits {
            if i >= nodes.len() {
                nodes.resize(i + 1, None);
            }
            nodes[i] = edit.map(|d| node(i, d));
            changed.insert(format!("n{i:02}"));
        }
        let now = present(&nodes);
        let lookup = |name: &str| now.iter().find(|n| n.metadata.name.as_deref() == Some(name)).cloned();
        index.refresh(&policies(), NodeChanges::Nodes(&changed), at(150), lookup, || now.clone());
        let afresh = built(&now, 150);

        prop_assert_eq!(index.candidates(&[], &[]), afresh.candidates(&[], &[]));
        prop_assert_eq!(index.census(), afresh.census());
        prop_assert_eq!(planned_from(&index, &now, &[], 150), planned_from(&afresh, &now, &[], 150));
    }
}

#[test]
fn a_healthy_untouched_node_is_not_a_candidate_and_a_signalling_or_touched_one_is() {
    let healthy = (0, 0, false, true, 0, 0, false, false, 5);
    let broken = (0, 0, false, true, 3, 0, false, false, 5);
    let cordoned = (0, 0, false, true, 0, 0, false, true, 5);
    let quarantined = (0, 0, false, true, 0, 0, false, false, 0);
    let nodes: Vec<Arc<Node>> = [healthy, broken, cordoned, quarantined, healthy]
        .into_iter()
        .enumerate()
        .map(|(i, d)| node(i, d))
        .collect();
    let index = built(&nodes, LATER);
    let named = [record(4, 0, 0, 10)];

    assert_eq!(index.candidates(&[], &[]), BTreeSet::from(["n01", "n02", "n03"]));
    assert_eq!(
        index.candidates(&named, &["n00".to_owned()]),
        BTreeSet::from(["n00", "n01", "n02", "n03", "n04"])
    );
    assert_eq!(index.census().of("group").selected, 5);
}

#[test]
fn the_reports_every_installed_node_carries_make_no_node_notable_a_failed_gpu_does() {
    // Driver 570: the agent's inventory and the first-seen stamp.
    let reporting = node(0, (0, 0, false, true, 0, 0, false, false, 5));
    assert!(reporting.annotations().contains_key(GPU_INVENTORY_ANNOTATION));
    let mut gpu_pods = (*reporting).clone();
    gpu_pods.metadata.name = Some("n01".to_owned());
    gpu_pods
        .annotations_mut()
        .insert(GPU_PODS_ANNOTATION.to_owned(), "{}".to_owned());
    let mut failed = (*reporting).clone();
    failed.metadata.name = Some("n02".to_owned());
    failed.annotations_mut().insert(
        FAILED_GPUS_ANNOTATION.to_owned(),
        r#"[{"uuid":"GPU-0"}]"#.to_owned(),
    );

    let index = built(&[reporting, Arc::new(gpu_pods), Arc::new(failed)], LATER);

    assert_eq!(index.candidates(&[], &[]), BTreeSet::from(["n02"]));
}

#[test]
fn a_label_of_our_group_the_controller_does_not_write_makes_no_node_notable() {
    let mut fleet_labelled = (*node(0, (0, 0, false, true, 0, 0, false, false, 5))).clone();
    fleet_labelled
        .labels_mut()
        .insert("gpuremediation.dev/sim-fleet".to_owned(), "scale".to_owned());
    let mut flagged = (*node(1, (0, 0, false, true, 0, 0, false, false, 5))).clone();
    flagged
        .labels_mut()
        .insert(REPEAT_OFFENDER_LABEL.to_owned(), "true".to_owned());

    let index = built(&[Arc::new(fleet_labelled), Arc::new(flagged)], LATER);

    assert_eq!(index.candidates(&[], &[]), BTreeSet::from(["n01"]));
}

#[test]
fn another_policy_spec_indexes_afresh() {
    let nodes = vec![node(0, (0, 0, false, true, 0, 0, false, false, 5))];
    let mut index = built(&nodes, LATER);
    let mut changed_policies = policies();
    let mut spec = changed_policies[0].spec.clone();
    spec.triggers[0].status = ConditionStatus::True;
    changed_policies[0] = Arc::new(GpuRemediationPolicy::new("group", spec));

    index.refresh(
        &changed_policies,
        NodeChanges::Nodes(&BTreeSet::new()),
        at(LATER),
        |_| None,
        || nodes.clone(),
    );

    // `GpuHealthy=True` is now a trigger: the healthy node signals.
    assert_eq!(index.candidates(&[], &[]), BTreeSet::from(["n00"]));
}
