//! The index's promise, checked over random histories of a small fleet: whenever it says no node but
//! the asking ones lists a serial, no other live node's inventory (as the ledger reads it) lists
//! it. And, so that it spares the walk at all: in a fleet where each board is listed once, it says
//! so.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use proptest::prelude::{ProptestConfig, prop, prop_assert, proptest};

use super::*;
use crate::{hardware::ledger::inventory_of, test_fixtures::at};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;

const SERIALS: usize = 6;

fn serial(k: usize) -> String {
    format!("16500000000{k:02}")
}

/// Node `i` listing the serials whose bits are set in `mask`; `shape` varies how the agent spells
/// the list (1: an entry without a UUID, which the ledger skips; 2: text that is not a list).
fn node(i: usize, mask: u8, shape: u8) -> Node {
    let mut entries: Vec<serde_json::Value> = (0..SERIALS)
        .filter(|k| mask & (1 << k) != 0)
        .map(|k| serde_json::json!({"index": k, "uuid": format!("GPU-{k}"), "serial": serial(k)}))
        .collect();
    if shape == 1
        && let Some(first) = entries.first_mut()
    {
        first["uuid"] = serde_json::json!("");
    }
    let text = if shape == 2 {
        "not a list".to_owned()
    } else {
        serde_json::Value::Array(entries).to_string()
    };
    let mut node = Node::default();
    node.metadata.name = Some(format!("n{i}"));
    node.annotations_mut()
        .insert(GPU_INVENTORY_ANNOTATION.to_owned(), text);
    node
}

/// Whether a live node other than those of `asking` lists `serial`, as the ledger reads it.
fn listed_elsewhere(fleet: &BTreeMap<usize, Node>, asking: &[usize], serial: &str) -> bool {
    fleet
        .iter()
        .filter(|(i, n)| !asking.contains(i) && n.metadata.deletion_timestamp.is_none())
        .any(|(_, n)| {
            inventory_of(n)
                .iter()
                .any(|gpu| gpu.serial.as_deref() == Some(serial))
        })
}

fn live(fleet: &BTreeMap<usize, Node>) -> Vec<Arc<Node>> {
    fleet.values().cloned().map(Arc::new).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Steps: (node, what happens to it, its new inventory, its shape). What happens: 0-2 its
    /// inventory changes (the watch shows it), 3 its deletion starts, 4 it is gone, 5 the resync
    /// rebuilds the index from the fleet as it is.
    #[test]
    fn a_no_from_the_index_means_no_other_live_node_lists_the_serial(
        start in prop::collection::vec((0..64u8, 0..3u8), 1..8),
        steps in prop::collection::vec((0..10usize, 0..6u8, 0..64u8, 0..3u8), 0..24),
    ) {
        let mut fleet: BTreeMap<usize, Node> = start
            .iter()
            .enumerate()
            .map(|(i, (mask, shape))| (i, node(i, *mask, *shape)))
            .collect();
        let mut index = Claimants::of(&live(&fleet));
        for (i, event, mask, shape) in steps {
            match event {
                0..=2 => {
                    let changed = node(i, mask, shape);
                    index.note(&changed);
                    fleet.insert(i, changed);
                }
                3 => {
                    if let Some(n) = fleet.get_mut(&i) {
                        n.metadata.deletion_timestamp = Some(Time(at(1)));
                        index.note(n);
                    }
                }
                4 => {
                    fleet.remove(&i);
                }
                _ => index = Claimants::of(&live(&fleet)),
            }
            for a in fleet.keys() {
                for b in fleet.keys() {
                    let asking = [*a, *b];
                    let names = [format!("n{a}"), format!("n{b}")];
                    for k in 0..SERIALS {
                        let serials = BTreeSet::from([serial(k)]);
                        if index.none_but(&serials, names.iter().map(String::as_str)) {
                            prop_assert!(
                                !listed_elsewhere(&fleet, &asking, &serial(k)),
                                "the index ruled out another claimant of {} for n{a}, n{b}", serial(k)
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn in_a_fleet_where_each_board_is_listed_once_the_walk_is_spared() {
    // Node i lists serials 2i and 2i+1.
    let fleet: BTreeMap<usize, Node> = (0..3).map(|i| (i, node(i, 0b11 << (2 * i), 0))).collect();
    let index = Claimants::of(&live(&fleet));
    assert_eq!(index.len(), 6);
    for i in 0..3 {
        let own = BTreeSet::from([serial(2 * i), serial(2 * i + 1)]);
        assert!(index.none_but(&own, [format!("n{i}").as_str()]), "n{i}");
        let other = BTreeSet::from([serial((2 * i + 2) % 6)]);
        assert!(
            !index.none_but(&other, [format!("n{i}").as_str()]),
            "n{i} asks of another's board"
        );
    }
    // A serial nobody lists: nobody else lists it.
    assert!(index.none_but(&BTreeSet::from(["X".to_owned()]), ["n0"]));
}

#[test]
fn a_board_that_moved_costs_a_walk_until_the_rebuild() {
    let mut fleet: BTreeMap<usize, Node> = [(0, node(0, 0b01, 0)), (1, node(1, 0b10, 0))].into();
    let mut index = Claimants::of(&live(&fleet));
    // Board 0 moves from n0 to n1.
    fleet.insert(0, node(0, 0, 0));
    fleet.insert(1, node(1, 0b11, 0));
    index.note(&fleet[&0]);
    index.note(&fleet[&1]);
    let moved = BTreeSet::from([serial(0)]);
    assert!(
        !index.none_but(&moved, ["n1"]),
        "n0's old claim stands until the rebuild"
    );
    let index = Claimants::of(&live(&fleet));
    assert!(index.none_but(&moved, ["n1"]));
}

#[test]
fn a_node_being_deleted_claims_nothing_once_rebuilt() {
    let mut fleet: BTreeMap<usize, Node> = [(0, node(0, 0b01, 0)), (1, node(1, 0b01, 0))].into();
    assert!(!Claimants::of(&live(&fleet)).none_but(&BTreeSet::from([serial(0)]), ["n1"]));
    fleet.get_mut(&0).unwrap().metadata.deletion_timestamp = Some(Time(at(1)));
    assert!(Claimants::of(&live(&fleet)).none_but(&BTreeSet::from([serial(0)]), ["n1"]));
}

#[test]
fn stale_claims_that_double_the_index_ask_for_a_rebuild() {
    let fleet: BTreeMap<usize, Node> = [(0, node(0, 0b11, 0))].into();
    let mut index = Claimants::of(&live(&fleet));
    assert!(!index.stale());
    // Nodes come and go with new boards: each leaves its serials behind.
    let mut noted = 0;
    for i in 1.. {
        let mut moved = node(i, 0, 0);
        let serials: Vec<serde_json::Value> = (0..8)
            .map(|g| serde_json::json!({"uuid": format!("GPU-{i}-{g}"), "serial": format!("S{i}-{g}")}))
            .collect();
        moved.annotations_mut().insert(
            GPU_INVENTORY_ANNOTATION.to_owned(),
            serde_json::Value::Array(serials).to_string(),
        );
        index.note(&moved);
        noted += 8;
        if index.stale() {
            break;
        }
    }
    assert_eq!(
        noted, 4096,
        "stale once grown by the least growth past a small index"
    );
    assert!(!Claimants::of(&live(&fleet)).stale());
}
