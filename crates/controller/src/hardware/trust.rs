//! What the ledger believes of a node's agent: a serial counts as failed on a node only if that
//! node's own inventory listed it before the fault (the controller stamps when it first saw each
//! serial listed, in the node annotation `gpuremediation.dev/gpu-first-seen`, which the agent's
//! admission policy does not let it write), and never while another live node lists it too (a
//! conflict, reported on the remediation). A broken or compromised agent can thus neither name
//! another node's boards as failed nor make a board it never carried a repeat offender. Pure.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use gpu_remediation_api::{
    constants::GPU_FIRST_SEEN_ANNOTATION,
    hardware::{Distrust, HardwareLedger, LedgerGpu, UntrustedGpu},
};
use jiff::Timestamp;
use k8s_openapi::{api::core::v1::Node, apimachinery::pkg::apis::meta::v1::Time};
use kube::ResourceExt;

use super::ledger::inventory_of;
use crate::observe::NodeView;

/// The most other claimants an untrusted GPU names.
const CLAIMANTS_MAX: usize = 8;

/// When the controller first saw each serial in the node's inventory (empty when never stamped or
/// unreadable).
#[must_use]
pub fn first_seen_of(node: &(impl NodeView + ?Sized)) -> BTreeMap<String, Timestamp> {
    node.annotation(GPU_FIRST_SEEN_ANNOTATION)
        .and_then(|text| serde_json::from_str::<BTreeMap<String, Timestamp>>(text).ok())
        .unwrap_or_default()
}

/// The first-seen stamps the node should carry at `now`: each serial its inventory lists, at the
/// time already stamped or else `now`; serials no longer listed are dropped (one that comes back
/// is new again). `None` when the stamps on the node are already those.
#[must_use]
pub fn first_seen_update(
    node: &(impl NodeView + ?Sized),
    now: Timestamp,
) -> Option<BTreeMap<String, Timestamp>> {
    let stamped = first_seen_of(node);
    let wanted: BTreeMap<String, Timestamp> = inventory_of(node)
        .into_iter()
        .filter_map(|gpu| gpu.serial)
        .map(|serial| {
            let at = stamped.get(&serial).copied().unwrap_or(now);
            (serial, at)
        })
        .collect();
    let unchanged =
        wanted == stamped || (wanted.is_empty() && node.annotation(GPU_FIRST_SEEN_ANNOTATION).is_none());
    (!unchanged).then_some(wanted)
}

/// Writes `stamps` on the node (the annotation gone when there are none); whether it changed.
pub fn stamp_first_seen(node: &mut Node, stamps: &BTreeMap<String, Timestamp>) -> bool {
    if stamps.is_empty() {
        return node.annotations_mut().remove(GPU_FIRST_SEEN_ANNOTATION).is_some();
    }
    let text = serde_json::to_string(stamps).unwrap_or_default();
    node.annotations_mut()
        .insert(GPU_FIRST_SEEN_ANNOTATION.to_owned(), text.clone())
        .is_none_or(|before| before != text)
}

/// Which live nodes' inventories list each serial asked about.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Claims {
    by_serial: HashMap<String, BTreeSet<String>>,
}

impl Claims {
    /// The claims of `nodes` (those not being deleted) to `serials` only.
    #[must_use]
    pub fn of<'n, N: NodeView + 'n>(
        nodes: impl IntoIterator<Item = &'n N>,
        serials: &BTreeSet<String>,
    ) -> Self {
        let mut by_serial: HashMap<String, BTreeSet<String>> = HashMap::new();
        for node in nodes.into_iter().filter(|n| n.deleting().is_none()) {
            // Most nodes list none of the few serials asked about: a look at the text first.
            let text = node.annotation(gpu_remediation_api::constants::GPU_INVENTORY_ANNOTATION);
            if !text.is_some_and(|t| serials.iter().any(|s| t.contains(s.as_str()))) {
                continue;
            }
            for serial in inventory_of(node).into_iter().filter_map(|g| g.serial) {
                if serials.contains(&serial) {
                    by_serial
                        .entry(serial)
                        .or_default()
                        .insert(node.node_name().to_owned());
                }
            }
        }
        Self { by_serial }
    }

    /// The claims of nodes whose inventories are already read: `(name, inventory)` of each live
    /// node.
    #[must_use]
    pub fn of_inventories<'n>(inventories: impl IntoIterator<Item = (&'n str, &'n [LedgerGpu])>) -> Self {
        let mut by_serial: HashMap<String, BTreeSet<String>> = HashMap::new();
        for (node, inventory) in inventories {
            for serial in inventory.iter().filter_map(|g| g.serial.as_ref()) {
                by_serial
                    .entry(serial.clone())
                    .or_default()
                    .insert(node.to_owned());
            }
        }
        Self { by_serial }
    }

    /// The live nodes other than `node` that list `serial`, by name.
    #[must_use]
    pub fn others(&self, serial: &str, node: &str) -> Vec<String> {
        self.by_serial
            .get(serial)
            .into_iter()
            .flatten()
            .filter(|n| n.as_str() != node)
            .take(CLAIMANTS_MAX)
            .cloned()
            .collect()
    }
}

/// Marks which of the ledger's failed GPUs do not count (`ledger.untrusted`; `failed` keeps what
/// the agent said, for the node's own steps), for a fault of `node` that began at `fault_at`, given
/// when the controller first saw each of the node's serials (`seen`) and who else claims them.
/// Stamps each GPU with its first-seen time.
pub fn sift(
    ledger: &mut HardwareLedger,
    node: &str,
    seen: &BTreeMap<String, Timestamp>,
    fault_at: Timestamp,
    claims: &Claims,
) {
    for gpu in &mut ledger.gpus {
        gpu.first_seen = gpu.serial.as_ref().and_then(|s| seen.get(s)).map(|t| Time(*t));
    }
    let mut untrusted = Vec::new();
    for failed in &mut ledger.failed {
        match verdict(&ledger.gpus, failed, node, seen, fault_at, claims) {
            Ok(first_seen) => failed.first_seen = first_seen.map(Time),
            Err((why, claimed_by)) => untrusted.push(UntrustedGpu {
                uuid: failed.uuid.clone(),
                serial: failed.serial.clone(),
                why,
                claimed_by,
            }),
        }
    }
    ledger.untrusted = untrusted;
}

/// Whether one failed GPU counts (with its first-seen time; a GPU without a serial names no
/// hardware and is kept as the agent said), or why not.
fn verdict(
    inventory: &[LedgerGpu],
    failed: &LedgerGpu,
    node: &str,
    seen: &BTreeMap<String, Timestamp>,
    fault_at: Timestamp,
    claims: &Claims,
) -> Result<Option<Timestamp>, (Distrust, Vec<String>)> {
    let Some(serial) = failed.serial.as_deref() else {
        return Ok(None);
    };
    let listed = inventory
        .iter()
        .any(|gpu| gpu.uuid == failed.uuid && gpu.serial.as_deref() == Some(serial));
    if !listed {
        return Err((Distrust::NotInInventory, Vec::new()));
    }
    // Stamps and the trigger's `since` are whole seconds: listed in the fault's second counts.
    let Some(first_seen) = seen.get(serial).copied().filter(|at| *at <= fault_at) else {
        return Err((Distrust::ListedAfterFault, Vec::new()));
    };
    let others = claims.others(serial, node);
    if !others.is_empty() {
        return Err((Distrust::Conflict, others));
    }
    Ok(Some(first_seen))
}

/// One sentence on the GPUs a ledger does not count, for Events and people (`None`: all count).
#[must_use]
pub fn describe_untrusted(ledger: &HardwareLedger) -> Option<String> {
    let parts: Vec<String> = ledger
        .untrusted
        .iter()
        .map(|gpu| {
            let serial = gpu.serial.as_deref().unwrap_or("?");
            match gpu.why {
                Distrust::NotInInventory => {
                    format!("serial {serial} ({}) is not in this node's inventory", gpu.uuid)
                }
                Distrust::ListedAfterFault => format!(
                    "serial {serial} ({}) was not listed in this node's inventory before the fault",
                    gpu.uuid
                ),
                Distrust::Conflict => format!(
                    "serial {serial} is also listed by live node(s) {}: a conflict",
                    gpu.claimed_by.join(", ")
                ),
            }
        })
        .collect();
    (!parts.is_empty()).then(|| format!("not counted as failed hardware: {}", parts.join("; ")))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use gpu_remediation_api::constants::GPU_INVENTORY_ANNOTATION;

    use super::*;
    use crate::hardware::{history::tests::at, ledger::counts};

    fn node(name: &str, serials: &[&str], seen: &[(&str, i64)]) -> Arc<Node> {
        let inventory: Vec<String> = serials
            .iter()
            .enumerate()
            .map(|(i, s)| format!(r#"{{"index":{i},"uuid":"GPU-{s}","serial":"{s}"}}"#))
            .collect();
        let mut node = Node::default();
        node.metadata.name = Some(name.to_owned());
        node.annotations_mut().insert(
            GPU_INVENTORY_ANNOTATION.to_owned(),
            format!("[{}]", inventory.join(",")),
        );
        if !seen.is_empty() {
            let stamps: BTreeMap<String, Timestamp> =
                seen.iter().map(|(s, h)| ((*s).to_owned(), at(*h))).collect();
            stamp_first_seen(&mut node, &stamps);
        }
        Arc::new(node)
    }

    fn failed(serial: &str) -> LedgerGpu {
        LedgerGpu {
            uuid: format!("GPU-{serial}"),
            serial: Some(serial.to_owned()),
            ..LedgerGpu::default()
        }
    }

    fn ledger_of(node: &Node, failed_serials: &[&str]) -> HardwareLedger {
        HardwareLedger {
            gpus: inventory_of(node),
            failed: failed_serials.iter().map(|s| failed(s)).collect(),
            ..HardwareLedger::default()
        }
    }

    #[test]
    fn new_serials_are_stamped_when_first_seen_and_keep_that_time() {
        let fresh = node("a", &["S1", "S2"], &[]);
        let stamps = first_seen_update(&fresh, at(1)).expect("stamps to write");
        assert_eq!(
            stamps,
            BTreeMap::from([("S1".to_owned(), at(1)), ("S2".to_owned(), at(1))])
        );
        let mut stamped = Node::clone(&fresh);
        assert!(stamp_first_seen(&mut stamped, &stamps));
        assert_eq!(first_seen_update(&stamped, at(5)), None, "nothing new");
        // S2 leaves, S3 arrives: S1 keeps its time.
        let moved = node("a", &["S1", "S3"], &[("S1", 1), ("S2", 1)]);
        assert_eq!(
            first_seen_update(&moved, at(5)),
            Some(BTreeMap::from([
                ("S1".to_owned(), at(1)),
                ("S3".to_owned(), at(5))
            ]))
        );
    }

    /// The serials a claim is asked about.
    fn serials(serials: &[&str]) -> BTreeSet<String> {
        serials.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_serial_counts_only_if_the_node_listed_it_before_the_fault_and_nobody_else_does() {
        let a = node("a", &["A1"], &[("A1", 0)]);
        let claims = Claims::of([a.as_ref()], &serials(&["A1"]));
        let mut ledger = ledger_of(&a, &["A1"]);
        sift(&mut ledger, "a", &first_seen_of(&a), at(2), &claims);
        assert_eq!(ledger.failed[0].first_seen, Some(Time(at(0))));
        assert!(ledger.untrusted.is_empty());
        assert!(counts(&ledger, "A1"));
    }

    #[test]
    fn another_node_s_serial_named_as_failed_is_not_in_the_inventory_and_does_not_count() {
        let a = node("a", &["A1"], &[("A1", 0)]);
        let b = node("b", &["B1"], &[("B1", 0)]);
        let claims = Claims::of([a.as_ref(), b.as_ref()], &serials(&["B1"]));
        let mut ledger = ledger_of(&a, &["B1"]);
        sift(&mut ledger, "a", &first_seen_of(&a), at(2), &claims);
        assert_eq!(ledger.untrusted[0].why, Distrust::NotInInventory);
        assert!(!counts(&ledger, "B1"));
    }

    #[test]
    fn a_serial_listed_only_with_the_fault_does_not_count() {
        let a = node("a", &["A1", "X9"], &[("A1", 0), ("X9", 3)]);
        let claims = Claims::of([a.as_ref()], &serials(&["X9"]));
        let mut ledger = ledger_of(&a, &["X9"]);
        sift(&mut ledger, "a", &first_seen_of(&a), at(2), &claims);
        assert_eq!(ledger.untrusted[0].why, Distrust::ListedAfterFault);
        let unstamped = node("a", &["X9"], &[]);
        let mut ledger = ledger_of(&unstamped, &["X9"]);
        sift(&mut ledger, "a", &BTreeMap::new(), at(2), &claims);
        assert_eq!(ledger.untrusted[0].why, Distrust::ListedAfterFault);
    }

    #[test]
    fn a_serial_two_live_nodes_list_is_a_conflict_naming_the_other() {
        let a = node("a", &["A1", "B1"], &[("A1", 0), ("B1", 0)]);
        let b = node("b", &["B1"], &[("B1", 0)]);
        let claims = Claims::of([a.as_ref(), b.as_ref()], &serials(&["B1"]));
        let mut ledger = ledger_of(&a, &["B1"]);
        sift(&mut ledger, "a", &first_seen_of(&a), at(2), &claims);
        assert!(!counts(&ledger, "B1"));
        assert_eq!(
            (ledger.untrusted[0].why, ledger.untrusted[0].claimed_by.as_slice()),
            (Distrust::Conflict, ["b".to_owned()].as_slice())
        );
        let said = describe_untrusted(&ledger).unwrap();
        assert!(
            said.contains("B1") && said.contains("conflict") && said.contains('b'),
            "{said}"
        );
        // A node being deleted claims nothing: the board moved.
        let mut leaving = Node::clone(&node("b", &["B1"], &[]));
        leaving.metadata.deletion_timestamp = Some(Time(at(1)));
        assert!(
            Claims::of([&leaving], &serials(&["B1"]))
                .others("B1", "a")
                .is_empty()
        );
    }
}
