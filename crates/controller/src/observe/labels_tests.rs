//! The labels the cache keeps. The promise, checked over random policies and fleets: a plan over
//! nodes pruned to the keys the policies read is the plan over the whole nodes (a `DoesNotExist` or
//! `NotIn` selector, a failure domain, a suspect attribute, an opt-out: each reads what was kept).
//! And the rules that keep it so: the keys only grow, a new key relists, and nothing is covered
//! before the list that keeps it has completed.

use std::{collections::BTreeMap, sync::Arc};

use futures::StreamExt as _;
use gpu_remediation_api::{
    GpuRemediation, GpuRemediationPolicy, GpuRemediationPolicySpec, Phase, constants::OPT_OUT_LABEL,
};
use k8s_openapi::{
    api::core::v1::{NodeCondition, NodeStatus},
    apimachinery::pkg::apis::meta::v1::Time,
};
use kube::api::ObjectMeta;
use proptest::prelude::{ProptestConfig, prop, prop_assert_eq, proptest};

use super::*;
use crate::{fleet, test_fixtures::at};

/// The keys policies are drawn over, and the keys no policy reads (a GPU node's hundred, in
/// small).
const READ: [&str; 4] = ["pool", "zone", "rack", "driver"];
const NOISE: [&str; 3] = [
    "feature.node.kubernetes.io/cpu-cpuid.AVX512F",
    "nvidia.com/cuda.runtime.major",
    "team",
];

fn keys(of: &[&str]) -> BTreeSet<String> {
    of.iter().map(|k| (*k).to_owned()).collect()
}

/// A policy spec of `fields` (with the one trigger every policy needs).
fn spec(mut fields: serde_json::Value) -> GpuRemediationPolicySpec {
    fields["triggers"] =
        serde_json::json!([{"conditionType": "GpuHealthy", "status": "False", "for": "30s"}]);
    serde_json::from_value(fields).unwrap()
}

fn labelled(labels: &[(&str, &str)]) -> Node {
    crate::test_fixtures::labelled("gpu-1", labels)
}

#[test]
fn a_node_keeps_the_keys_asked_for_and_ours_and_nothing_else() {
    let mut node = labelled(&[("pool", "a"), ("team", "x"), (OPT_OUT_LABEL, "true")]);
    Kept::Keys(Arc::new(keys(&["pool", "zone"]))).prune(&mut node);
    assert_eq!(
        node.metadata.labels.unwrap().into_keys().collect::<Vec<_>>(),
        ["gpuremediation.dev/exclude", "pool"]
    );
    let mut bare = labelled(&[("team", "x")]);
    Kept::Keys(Arc::new(keys(&["pool"]))).prune(&mut bare);
    assert_eq!(bare.metadata.labels, None, "an emptied map is not kept");
    let mut whole = labelled(&[("team", "x")]);
    Kept::All.prune(&mut whole);
    assert_eq!(whole, labelled(&[("team", "x")]));
}

#[test]
fn a_policy_reads_its_selectors_domains_and_suspect_labels_not_node_info() {
    let spec = spec(serde_json::json!({
        "nodeSelector": {
            "matchLabels": {"pool": "a"},
            "matchExpressions": [{"key": "team", "operator": "DoesNotExist"}],
        },
        "safety": {
            "failureDomains": [{"topologyKey": "rack", "maxUnhealthyCount": 1}],
            "suspect": {"attributes": ["driver", "nodeInfo.kernelVersion"]},
        },
    }));
    assert_eq!(keys_read_by(&spec), keys(&["driver", "pool", "rack", "team"]));
    // A suspect rule without attributes reads the default ones.
    let mut defaults = spec.clone();
    defaults.safety.suspect.as_mut().unwrap().attributes.clear();
    assert!(keys_read_by(&defaults).contains("topology.kubernetes.io/zone"));
    assert!(!keys_read_by(&defaults).iter().any(|k| k.starts_with("nodeInfo.")));
}

#[test]
fn a_new_key_is_asked_for_once_and_covered_only_once_a_list_keeping_it_has_completed() {
    let (labels, mut relist) = NodeLabels::keeping(keys(&["pool"]));
    assert_eq!(
        labels.cover(&keys(&["pool"])),
        Coverage::Listing(keys(&["pool"])),
        "no list yet"
    );
    assert_eq!(labels.start_listing(), Kept::Keys(Arc::new(keys(&["pool"]))));
    labels.listed();
    assert_eq!(labels.cover(&keys(&["pool"])), Coverage::Covered);
    assert!(!relist.has_changed().unwrap());

    // A policy names `team`: one relist asked for; asking again waits for it.
    let wanted = keys(&["pool", "team"]);
    assert_eq!(labels.cover(&wanted), Coverage::Relisting(keys(&["team"])));
    assert!(relist.has_changed().unwrap());
    relist.mark_unchanged();
    assert_eq!(labels.cover(&wanted), Coverage::Listing(keys(&["team"])));
    assert!(!relist.has_changed().unwrap(), "asked once");

    // A list under way that started before the ask does not cover it.
    labels.listed();
    assert_eq!(labels.cover(&wanted), Coverage::Listing(keys(&["team"])));
    assert_eq!(labels.start_listing(), Kept::Keys(Arc::new(wanted.clone())));
    assert_eq!(
        labels.cover(&wanted),
        Coverage::Listing(keys(&["team"])),
        "listing, not listed"
    );
    labels.listed();
    assert_eq!(labels.cover(&wanted), Coverage::Covered);
    // The keys only grow: a policy dropping `pool` relists nothing.
    assert_eq!(labels.cover(&keys(&["team"])), Coverage::Covered);
    assert!(!relist.has_changed().unwrap());
}

#[test]
fn a_policy_is_covered_only_by_a_completed_list_of_its_keys() {
    let spec = spec(serde_json::json!({"nodeSelector": {"matchLabels": {"pool": "a"}}}));
    let (labels, _relist) = NodeLabels::keeping(BTreeSet::new());
    let _ = labels.start_listing();
    labels.listed();
    assert!(!labels.covers(&spec));
    assert!(matches!(
        labels.cover(&keys_read_by(&spec)),
        Coverage::Relisting(_)
    ));
    let _ = labels.start_listing();
    labels.listed();
    assert!(labels.covers(&spec));
    assert!(NodeLabels::keeping_all().covers(&spec));
}

#[tokio::test]
async fn an_ask_restarts_the_stream_and_the_new_one_starts_with_its_own_list() {
    let (labels, relist) = NodeLabels::keeping(keys(&["pool"]));
    let started = Arc::new(Mutex::new(Vec::new()));
    let (feed, items) = tokio::sync::mpsc::unbounded_channel::<(usize, &'static str)>();
    let items = Arc::new(tokio::sync::Mutex::new(items));
    let stream = relisting(
        {
            let (labels, started, items) = (labels.clone(), started.clone(), items.clone());
            move || {
                let kept = labels.start_listing();
                let generation = {
                    let mut started = started.lock().unwrap();
                    started.push(kept);
                    started.len()
                };
                let items = items.clone();
                // Each stream passes on the items fed to its own generation.
                futures::stream::unfold((), move |()| {
                    let items = items.clone();
                    async move {
                        loop {
                            let (to, item) = items.lock().await.recv().await?;
                            if to == generation {
                                return Some((item, ()));
                            }
                        }
                    }
                })
            }
        },
        relist,
    );
    let mut stream = std::pin::pin!(stream);
    feed.send((1, "first list")).unwrap();
    assert_eq!(stream.next().await, Some("first list"));
    labels.listed();
    assert_eq!(
        labels.cover(&keys(&["pool", "team"])),
        Coverage::Relisting(keys(&["team"]))
    );
    feed.send((1, "the old stream's, dropped")).unwrap();
    feed.send((2, "second list")).unwrap();
    assert_eq!(stream.next().await, Some("second list"));
    assert_eq!(
        *started.lock().unwrap(),
        [
            Kept::Keys(Arc::new(keys(&["pool"]))),
            Kept::Keys(Arc::new(keys(&["pool", "team"])))
        ]
    );
}

/// A selector requirement, as drawn: (key, operator, value).
type Requirement = (usize, u8, u8);
/// A policy, as drawn: (matchLabels, requirements, failure domain key, suspect attribute,
/// priority).
type DrawnPolicy = (
    Vec<(usize, u8)>,
    Vec<Requirement>,
    Option<usize>,
    Option<usize>,
    i32,
);
/// A node, as drawn: its value of each key read (if any), of each noise key, whether it opts out,
/// its `GpuHealthy` status and since when.
type DrawnNode = (Vec<Option<u8>>, Vec<bool>, bool, bool, i64);

fn drawn_policy() -> impl proptest::strategy::Strategy<Value = DrawnPolicy> {
    (
        prop::collection::vec((0..READ.len(), 0..2u8), 0..2),
        prop::collection::vec((0..READ.len() + NOISE.len(), 0..4u8, 0..2u8), 0..3),
        prop::option::of(0..READ.len()),
        prop::option::of(0..READ.len()),
        0..3i32,
    )
}

fn drawn_node() -> impl proptest::strategy::Strategy<Value = DrawnNode> {
    (
        prop::collection::vec(prop::option::of(0..2u8), READ.len()),
        prop::collection::vec(prop::bool::ANY, NOISE.len()),
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.4),
        0..60i64,
    )
}

fn value(v: u8) -> String {
    ["a", "b"][usize::from(v)].to_owned()
}

fn policy(index: usize, drawn: &DrawnPolicy) -> Arc<GpuRemediationPolicy> {
    let (match_labels, requirements, domain, suspect, priority) = drawn;
    let every_key: Vec<&str> = READ.iter().chain(&NOISE).copied().collect();
    let requirements: Vec<serde_json::Value> = requirements
        .iter()
        .map(|(key, operator, v)| {
            let operator = ["In", "NotIn", "Exists", "DoesNotExist"][usize::from(*operator)];
            let values = if operator.ends_with("In") {
                vec![value(*v)]
            } else {
                Vec::new()
            };
            serde_json::json!({"key": every_key[*key], "operator": operator, "values": values})
        })
        .collect();
    let match_labels: serde_json::Map<String, serde_json::Value> = match_labels
        .iter()
        .map(|(key, v)| (READ[*key].to_owned(), value(*v).into()))
        .collect();
    let mut safety = serde_json::json!({"maxConcurrent": 2, "maxUnhealthy": "50%"});
    if let Some(key) = domain {
        safety["failureDomains"] = serde_json::json!([{"topologyKey": READ[*key], "maxUnhealthyCount": 1}]);
    }
    if let Some(key) = suspect {
        safety["suspect"] = serde_json::json!({
            "window": "1h", "share": "60%", "minFailures": 2, "attributes": [READ[*key]], "hold": true,
        });
    }
    let spec: GpuRemediationPolicySpec = serde_json::from_value(serde_json::json!({
        "nodeSelector": {"matchLabels": match_labels, "matchExpressions": requirements},
        "priority": priority,
        "triggers": [{"conditionType": "GpuHealthy", "status": "False", "for": "30s"}],
        "action": "None",
        "safety": safety,
        "quarantine": {"enabled": true},
    }))
    .unwrap();
    let mut policy = GpuRemediationPolicy::new(&format!("p{index}"), spec);
    policy.metadata.generation = Some(1);
    Arc::new(policy)
}

fn node(index: usize, drawn: &DrawnNode) -> Arc<Node> {
    let (read, noise, opted_out, failing, since) = drawn;
    let mut labels: BTreeMap<String, String> = READ
        .iter()
        .zip(read)
        .filter_map(|(key, v)| Some(((*key).to_owned(), value((*v)?))))
        .collect();
    labels.extend(
        NOISE
            .iter()
            .zip(noise)
            .filter(|(_, on)| **on)
            .map(|(key, _)| ((*key).to_owned(), "x".to_owned())),
    );
    if *opted_out {
        labels.insert(OPT_OUT_LABEL.to_owned(), "true".to_owned());
    }
    Arc::new(Node {
        metadata: ObjectMeta {
            name: Some(format!("n{index:02}")),
            uid: Some(format!("uid-{index}")),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        status: Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "GpuHealthy".into(),
                status: if *failing { "False" } else { "True" }.into(),
                reason: Some("Drawn".into()),
                last_transition_time: Some(Time(at(*since))),
                ..NodeCondition::default()
            }]),
            ..NodeStatus::default()
        }),
        ..Node::default()
    })
}

/// A finished record of node `index` under policy `policy`, its episode begun at `since` (the
/// suspect rule counts it).
fn record(index: usize, policy: usize, since: i64) -> Arc<GpuRemediation> {
    fleet::tests::existing(
        &format!("n{index:02}"),
        &format!("p{policy}"),
        since,
        Phase::Succeeded,
        since + 5,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn a_plan_over_nodes_pruned_to_the_keys_read_is_the_plan_over_the_whole_nodes(
        drawn_policies in prop::collection::vec(drawn_policy(), 1..4),
        fleet in prop::collection::vec(drawn_node(), 1..24),
        records in prop::collection::vec((0..24usize, 0..4usize, 0..60i64), 0..4),
        now in 60..120i64,
    ) {
        let policies: Vec<_> = drawn_policies.iter().enumerate().map(|(i, d)| policy(i, d)).collect();
        let whole: Vec<Arc<Node>> = fleet.iter().enumerate().map(|(i, d)| node(i, d)).collect();
        let records: Vec<_> = records
            .into_iter()
            .map(|(i, p, since)| record(i % whole.len(), p % policies.len(), since))
            .collect();
        let kept = Kept::Keys(Arc::new(keys_read_by_all(policies.iter().map(|p| &p.spec))));
        let pruned: Vec<Arc<Node>> = whole
            .iter()
            .map(|n| {
                let mut n = (**n).clone();
                kept.prune(&mut n);
                Arc::new(n)
            })
            .collect();

        prop_assert_eq!(
            format!("{:?}", fleet::plan(&policies, &pruned, &records, at(now))),
            format!("{:?}", fleet::plan(&policies, &whole, &records, at(now)))
        );
    }
}

/// The property's power: pruned to fewer keys than a `DoesNotExist` selector reads, the plan
/// changes (the pruned node reads as one without the label, and the policy takes it).
#[test]
fn a_plan_over_nodes_pruned_short_of_a_selectors_key_differs() {
    let drawn: DrawnPolicy = (vec![], vec![(READ.len() + 2, 3, 0)], None, None, 0);
    let policies = vec![policy(0, &drawn)];
    let whole = vec![node(
        0,
        &(vec![None; READ.len()], vec![false, false, true], false, true, 0),
    )];
    let mut short = (*whole[0]).clone();
    Kept::Keys(Arc::new(BTreeSet::new())).prune(&mut short);
    let plan = |nodes: &[Arc<Node>]| format!("{:?}", fleet::plan(&policies, nodes, &[], at(100)));
    assert_ne!(plan(&[Arc::new(short)]), plan(&whole));
}
