//! The cached node's promise, over random nodes as the server sends them: every read of
//! [`NodeView`] answers on the `CachedNode` as on the node pruned as the cache prunes it (the
//! shape every decision read before the cache kept its own type), and the `Node` it rebuilds for an
//! edit gives the same merge patch for the same edit (`node_patch`); nodes kept through one table
//! of shared texts, as the node store keeps them, each read as their own pruned node.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{Node, NodeCondition, NodeSpec, NodeStatus, NodeSystemInfo, Taint},
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
};
use proptest::prelude::{Just, ProptestConfig, Strategy, prop, prop_assert_eq, prop_oneof, proptest};

use super::{
    cached_node::{CachedNode, NodeView},
    relevant::prune_node,
    shared_text::SharedText,
};
use crate::{node_patch::merge_patch, test_fixtures::at};

/// A few keys of each kind, ours and others', so that lookups hit and miss.
const KEYS: [&str; 6] = [
    "gpuremediation.dev/quarantined",
    "gpuremediation.dev/gpu-inventory",
    "nvidia.com/gpu.product",
    "kubernetes.io/hostname",
    "node.alpha.kubernetes.io/ttl",
    "zone",
];
const CONDITIONS: [&str; 3] = ["Ready", "GpuHealthy", "MemoryPressure"];

fn text() -> impl Strategy<Value = String> {
    prop_oneof![Just(String::new()), "[a-z0-9-]{1,12}"]
}

fn map() -> impl Strategy<Value = Option<BTreeMap<String, String>>> {
    prop::option::of(prop::collection::btree_map(
        prop::sample::select(&KEYS[..]).prop_map(str::to_owned),
        text(),
        0..5,
    ))
}

fn time() -> impl Strategy<Value = Option<Time>> {
    prop::option::of((0..1_000_i64).prop_map(|s| Time(at(s))))
}

fn taint() -> impl Strategy<Value = Taint> {
    (
        prop::sample::select(&KEYS[..]),
        prop::option::of(text()),
        0..3_usize,
    )
        .prop_map(|(key, value, effect)| Taint {
            key: key.to_owned(),
            value,
            effect: ["NoSchedule", "NoExecute", "PreferNoSchedule"][effect].to_owned(),
            time_added: None,
        })
}

fn condition() -> impl Strategy<Value = NodeCondition> {
    (
        prop::sample::select(&CONDITIONS[..]),
        prop::sample::select(&["True", "False", "Unknown"][..]),
        prop::option::of(text()),
        prop::option::of(text()),
        time(),
        time(),
    )
        .prop_map(
            |(type_, status, reason, message, heartbeat, transition)| NodeCondition {
                type_: type_.to_owned(),
                status: status.to_owned(),
                reason,
                message,
                last_heartbeat_time: heartbeat,
                last_transition_time: transition,
            },
        )
}

fn info() -> impl Strategy<Value = Option<NodeSystemInfo>> {
    prop::option::of(prop::collection::vec(text(), 8).prop_map(|t| NodeSystemInfo {
        system_uuid: t[0].clone(),
        boot_id: t[1].clone(),
        kernel_version: t[2].clone(),
        kubelet_version: t[3].clone(),
        os_image: t[4].clone(),
        container_runtime_version: t[5].clone(),
        machine_id: t[6].clone(),
        architecture: t[7].clone(),
        ..NodeSystemInfo::default()
    }))
}

/// A random `Node` as the server may send it (with a field the cache drops, `podCIDR`).
fn node() -> impl Strategy<Value = Node> {
    let metadata = (
        text(),
        prop::option::of(text()),
        prop::option::of(text()),
        time(),
        time(),
        map(),
        map(),
    );
    let spec = prop::option::of((
        prop::option::of(prop::bool::ANY),
        prop::option::of(text()),
        prop::option::of(prop::collection::vec(taint(), 0..3)),
    ));
    let status = prop::option::of((prop::option::of(prop::collection::vec(condition(), 0..4)), info()));
    (metadata, spec, status).prop_map(
        |((name, uid, version, created, deleting, labels, annotations), spec, status)| Node {
            metadata: ObjectMeta {
                name: Some(name),
                uid,
                resource_version: version,
                creation_timestamp: created,
                deletion_timestamp: deleting,
                labels,
                annotations,
                ..ObjectMeta::default()
            },
            spec: spec.map(|(unschedulable, provider_id, taints)| NodeSpec {
                unschedulable,
                provider_id,
                taints,
                pod_cidr: Some("10.0.0.0/24".into()),
                ..NodeSpec::default()
            }),
            status: status.map(|(conditions, node_info)| NodeStatus {
                conditions,
                node_info,
                ..NodeStatus::default()
            }),
        },
    )
}

/// Every read, written out to be compared.
fn reads(node: &impl NodeView) -> String {
    let keyed = |read: &dyn Fn(&str) -> Option<String>| KEYS.map(read);
    let reads = (
        (
            node.node_name().to_owned(),
            node.node_uid().map(str::to_owned),
            node.version().map(str::to_owned),
            node.created().cloned(),
            node.deleting().cloned(),
        ),
        keyed(&|key| node.label(key).map(str::to_owned)),
        keyed(&|key| node.node_labels().label(key).map(str::to_owned)),
        node.labels_hash(),
        keyed(&|key| node.annotation(key).map(str::to_owned)),
        KEYS.map(|key| node.any_annotation(&mut |k, v| k == key && !v.is_empty())),
        (
            node.unschedulable(),
            node.taints().to_vec(),
            node.provider_id().map(str::to_owned),
        ),
        node.conditions().iter().collect::<Vec<_>>(),
        CONDITIONS.map(|type_| node.condition(type_)),
        node.node_info(),
    );
    format!("{reads:#?}")
}

/// The edits the controller makes to a node: a label, an annotation, `unschedulable`, the taints.
fn edit(node: &mut Node, which: u8) {
    match which % 4 {
        0 => {
            node.metadata
                .labels
                .get_or_insert_default()
                .insert(KEYS[0].into(), "true".into());
        }
        1 => {
            node.metadata.annotations.get_or_insert_default().remove(KEYS[1]);
        }
        2 => node.spec.get_or_insert_default().unschedulable = Some(true),
        _ => node
            .spec
            .get_or_insert_default()
            .taints
            .get_or_insert_default()
            .push(Taint {
                key: KEYS[0].into(),
                effect: "NoSchedule".into(),
                ..Taint::default()
            }),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn a_cached_node_answers_every_read_as_the_pruned_node_does(node in node()) {
        let mut pruned = node.clone();
        prune_node(&mut pruned);
        let cached = CachedNode::from(node);
        prop_assert_eq!(reads(&cached), reads(&pruned));
        prop_assert_eq!(reads(&cached.to_node()), reads(&pruned), "the rebuilt node reads alike");
    }

    /// As the node store keeps them: many nodes' texts through one table, equal texts shared.
    #[test]
    fn nodes_kept_through_one_shared_table_each_read_as_their_pruned_node(
        nodes in prop::collection::vec(node(), 1..12),
    ) {
        let mut texts = SharedText::default();
        let cached: Vec<CachedNode> = nodes.iter().map(|n| CachedNode::sharing(n.clone(), &mut texts)).collect();
        for (node, cached) in nodes.into_iter().zip(&cached) {
            let mut pruned = node;
            prune_node(&mut pruned);
            prop_assert_eq!(reads(cached), reads(&pruned));
        }
    }

    #[test]
    fn an_edit_over_the_rebuilt_node_patches_as_over_the_pruned_one(node in node(), which in 0..4_u8) {
        let mut pruned = node.clone();
        prune_node(&mut pruned);
        let rebuilt = CachedNode::from(node).to_node();
        let patch_over = |before: &Node| {
            let mut after = before.clone();
            edit(&mut after, which);
            merge_patch(before, &after)
        };
        prop_assert_eq!(patch_over(&rebuilt), patch_over(&pruned));
    }
}
