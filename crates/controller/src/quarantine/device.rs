//! Device-level quarantine: where a node's fault names GPUs that are allocated through Dynamic
//! Resource Allocation, take only those devices out of allocation with a `DeviceTaintRule`
//! (KEP-5055, `NoSchedule`) instead of tainting the node, so its healthy GPUs keep taking work
//! while the fault is confirmed. Pure: the acting layer (`device_apply`) reads the slices, asks
//! the server what it serves, and writes what this module decides.
//!
//! The node stays the record: the quarantine's owner (`quarantined-by`) and the devices taken
//! (`quarantined-devices`) are annotations on it, so the node quarantine's rules apply unchanged
//! (hysteresis, the limit, the remediation taking it over, orphans), and the rules follow the
//! annotations ([`reconcile`]): a rule is created for each device a node's annotation names and
//! deleted once no node names it.
//!
//! Minimum server: `DeviceTaintRule` is served as `resource.k8s.io/v1alpha3` from Kubernetes 1.33
//! behind the `DRADeviceTaints` feature gate (API server, scheduler, controller manager) and
//! `--runtime-config=resource.k8s.io/v1alpha3=true`; from 1.35 the scheduler also needs
//! `DRADeviceTaintRules`; `v1beta2` from 1.36 and `v1` from 1.37. The controller speaks the most
//! stable version the server serves ([`TaintRuleVersion::choose`]). Where none is served, or the failed GPU is not a DRA device of
//! the node, the quarantine is the node taint, and the policy's `DeviceQuarantine` condition and
//! the node's Event say which.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use gpu_remediation_api::constants::{
    DEVICE_QUARANTINE_LABEL, FAILED_GPUS_ANNOTATION, NODE_LABEL, QUARANTINE_TAINT_KEY,
    QUARANTINED_BY_ANNOTATION, QUARANTINED_DEVICES_ANNOTATION, policy_conditions, reasons,
};
use jiff::Timestamp;
use k8s_openapi::{api::core::v1::Node, apimachinery::pkg::apis::meta::v1::Condition};
use kube::ResourceExt;
use serde::{Deserialize, Serialize};

use crate::dra::{
    holders::devices_of_gpu,
    wire::{
        self, DeviceTaint, DeviceTaintRule, DeviceTaintRuleSpec, DeviceTaintSelector, ResourceSlice,
        TaintRuleVersion,
    },
};
use crate::observe::NodeView;

/// The oldest Kubernetes release serving `DeviceTaintRule`.
pub const MINIMUM_SERVER_VERSION: &str = "1.33";

/// Why a server without `DeviceTaintRule` quarantines whole nodes.
pub const NOT_SERVED: &str = "the API server serves no DeviceTaintRule (resource.k8s.io/v1 from Kubernetes 1.37, \
     v1beta2 from 1.36, v1alpha3 from 1.33 behind the DRADeviceTaints gate and \
     --runtime-config=resource.k8s.io/v1alpha3=true; from 1.35 the scheduler also needs DRADeviceTaintRules)";

/// What a policy's `status.deviceTaints` says when no `DeviceTaintRule` version is served.
pub const NODE_TAINT_USED: &str = "None: node taint used";

/// What a policy's `status.deviceTaints` says: the `DeviceTaintRule` version spoken, or that the
/// node taint is used.
#[must_use]
pub fn spoken(version: Option<TaintRuleVersion>) -> String {
    version.map_or_else(|| NODE_TAINT_USED.to_owned(), TaintRuleVersion::group_version)
}

/// One device taken out of allocation, as the node's annotation records it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct QuarantinedDevice {
    /// The failed GPU's UUID.
    pub uuid: String,
    /// Its DRA driver.
    pub driver: String,
    /// Its pool.
    pub pool: String,
    /// Its device name in the pool.
    pub device: String,
}

/// How a node's quarantine is carried out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// A `DeviceTaintRule` per device, in the version the server serves; the node stays
    /// schedulable.
    Devices(TaintRuleVersion, Vec<QuarantinedDevice>),
    /// The node taint, and why not the devices.
    Node(String),
}

/// The devices to quarantine for the GPUs `failed` (UUIDs) on `node`, given the node's slices
/// and the `DeviceTaintRule` version served (`None`: the server serves none).
#[must_use]
pub fn target(node: &str, failed: &[String], served: Option<(TaintRuleVersion, &[ResourceSlice])>) -> Target {
    if failed.is_empty() {
        return Target::Node("the fault names no GPU".to_owned());
    }
    let Some((version, slices)) = served else {
        return Target::Node(NOT_SERVED.to_owned());
    };
    let mut devices = BTreeSet::new();
    for uuid in failed {
        let found = devices_of_gpu(node, uuid, slices);
        if found.is_empty() {
            return Target::Node(format!(
                "GPU {uuid} is not allocated through DRA (no ResourceSlice of node {node} publishes it)"
            ));
        }
        if let Some(foreign) = found.iter().find(|d| !in_own_pool(node, &d.pool)) {
            return Target::Node(format!(
                "GPU {uuid} is published by driver {} in pool {}, not in the pool named after node {node}: a \
                 DeviceTaintRule selecting it could match another node's devices",
                foreign.driver, foreign.pool
            ));
        }
        devices.extend(found.into_iter().map(|d| QuarantinedDevice {
            uuid: uuid.clone(),
            driver: d.driver,
            pool: d.pool,
            device: d.device,
        }));
    }
    Target::Devices(version, devices.into_iter().collect())
}

/// The UUIDs of the GPUs the node's fault names (the agent's failed-GPUs annotation).
#[must_use]
pub fn failed_gpus(node: &(impl NodeView + ?Sized)) -> Vec<String> {
    #[derive(Deserialize)]
    struct Failed {
        uuid: String,
    }
    node.annotation(FAILED_GPUS_ANNOTATION)
        .and_then(|text| serde_json::from_str::<Vec<Failed>>(text).ok())
        .map(|failed| failed.into_iter().map(|f| f.uuid).collect())
        .unwrap_or_default()
}

/// The devices the node's device-level quarantine holds (empty: none, or node-level).
#[must_use]
pub fn recorded(node: &(impl NodeView + ?Sized)) -> Vec<QuarantinedDevice> {
    node.annotation(QUARANTINED_DEVICES_ANNOTATION)
        .and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or_default()
}

/// Whether the node carries a device-level quarantine.
#[must_use]
pub fn is_device_level(node: &(impl NodeView + ?Sized)) -> bool {
    node.annotation(QUARANTINED_DEVICES_ANNOTATION).is_some()
}

/// Whether the node's device-level quarantine misses a GPU its fault now names (a second GPU
/// failed during the episode): the quarantine is decided again.
#[must_use]
pub fn misses_a_failed_gpu(node: &(impl NodeView + ?Sized)) -> bool {
    if !is_device_level(node) {
        return false;
    }
    let held: BTreeSet<String> = recorded(node).into_iter().map(|d| d.uuid).collect();
    failed_gpus(node).iter().any(|uuid| !held.contains(uuid))
}

/// Records a device-level quarantine of `devices` by `policy` on the node (no taint). Returns
/// whether anything changed.
pub fn mark(node: &mut Node, policy: &str, devices: &[QuarantinedDevice]) -> bool {
    let text = serde_json::to_string(devices).unwrap_or_default();
    let annotations = node.annotations_mut();
    let before = (
        annotations.get(QUARANTINED_BY_ANNOTATION).cloned(),
        annotations.get(QUARANTINED_DEVICES_ANNOTATION).cloned(),
    );
    annotations.insert(QUARANTINED_BY_ANNOTATION.to_owned(), policy.to_owned());
    annotations.insert(QUARANTINED_DEVICES_ANNOTATION.to_owned(), text.clone());
    before != (Some(policy.to_owned()), Some(text))
}

/// Forgets the node's device-level quarantine (its rules go at the next [`reconcile`]). Returns
/// whether anything changed.
pub fn unmark(node: &mut Node) -> bool {
    node.annotations_mut()
        .remove(QUARANTINED_DEVICES_ANNOTATION)
        .is_some()
}

/// The name of the rule quarantining `device` of `node`: readable, unique per device (a hash
/// of driver and pool), at most 253 characters.
#[must_use]
pub fn rule_name(node: &str, device: &QuarantinedDevice) -> String {
    let hash = format!("{}/{}", device.driver, device.pool)
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
    let node: String = node.chars().take(180).collect();
    let device: String = device.device.chars().take(63).collect();
    format!("{node}-{device}-{:08x}", hash & 0xffff_ffff)
}

/// Whether `pool`, a device's, is the pool named after `node`, the only pool a rule for `node`
/// selects. A rule selects devices by driver, pool and name, whichever node publishes them: a
/// slice of node A's driver naming its pool after node B (a broken or compromised node, or a
/// forged `quarantined-devices` annotation on A) would otherwise have B's device of that name
/// tainted.
#[must_use]
pub fn in_own_pool(node: &str, pool: &str) -> bool {
    pool == node
}

/// The `DeviceTaintRule` (in `version`) quarantining `device` of `node` for `policy`. Its selector is pinned to
/// the device's driver and to the pool named after `node`, whatever `device.pool` says ([`target`]
/// and [`reconcile`] pass only devices [`in_own_pool`]), so no rule of node A's can select
/// another node's devices.
#[must_use]
pub fn rule(
    version: TaintRuleVersion,
    policy: &str,
    node: &str,
    device: &QuarantinedDevice,
) -> DeviceTaintRule {
    let mut rule = DeviceTaintRule::new(
        &rule_name(node, device),
        &wire::device_taint_rules(version),
        DeviceTaintRuleSpec {
            device_selector: Some(DeviceTaintSelector {
                driver: Some(device.driver.clone()),
                pool: Some(node.to_owned()),
                device: Some(device.device.clone()),
            }),
            taint: DeviceTaint {
                key: QUARANTINE_TAINT_KEY.to_owned(),
                value: if is_label_value(&device.uuid) {
                    device.uuid.clone()
                } else {
                    String::new()
                },
                effect: "NoSchedule".to_owned(),
            },
        },
    );
    rule.metadata.labels = Some(BTreeMap::from([(
        DEVICE_QUARANTINE_LABEL.to_owned(),
        "true".to_owned(),
    )]));
    rule.metadata.annotations = Some(BTreeMap::from([
        (QUARANTINED_BY_ANNOTATION.to_owned(), policy.to_owned()),
        (NODE_LABEL.to_owned(), node.to_owned()),
    ]));
    rule
}

/// Whether `text` is a valid label value (a taint's value must be one).
fn is_label_value(text: &str) -> bool {
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    text.len() <= 63
        && edge(text.chars().next())
        && edge(text.chars().last())
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// What [`reconcile`] decided.
#[derive(Clone, Debug, Default)]
pub struct RulePlan {
    /// Rules to create (a node names their device, they do not exist).
    pub create: Vec<DeviceTaintRule>,
    /// Rules of a policy this controller sees to delete (no node names their device any more).
    pub delete: Vec<DeviceTaintRule>,
    /// Rules of a policy this controller does not see that no node names: deleted only once the
    /// server confirms their policy is gone (another controller may own them).
    pub delete_if_owner_gone: Vec<DeviceTaintRule>,
}

/// The rules (`existing`, those carrying our label) made to follow the nodes' annotations:
/// created for nodes whose quarantine's policy this controller sees (`known`), deleted where no
/// node's annotation names their device. A device an annotation names outside its node's own pool
/// (see [`in_own_pool`]) was never the controller's decision and gets no rule. Rules are created
/// in `version`.
#[must_use]
pub fn reconcile<N: NodeView>(
    version: TaintRuleVersion,
    nodes: &[Arc<N>],
    known: impl Fn(&str) -> bool,
    existing: &[DeviceTaintRule],
) -> RulePlan {
    let mut wanted: BTreeMap<String, DeviceTaintRule> = BTreeMap::new();
    let mut named = BTreeSet::new();
    for node in nodes.iter().filter(is_device_level) {
        let Some(policy) = node.annotation(QUARANTINED_BY_ANNOTATION) else {
            continue;
        };
        let name = node.node_name().to_owned();
        for device in recorded(node).into_iter().filter(|d| in_own_pool(&name, &d.pool)) {
            let rule = rule(version, policy, &name, &device);
            named.insert(rule.name_any());
            if known(policy) {
                wanted.insert(rule.name_any(), rule);
            }
        }
    }
    let present: BTreeSet<String> = existing.iter().map(ResourceExt::name_any).collect();
    let mut plan = RulePlan {
        create: wanted
            .into_values()
            .filter(|r| !present.contains(&r.name_any()))
            .collect(),
        ..RulePlan::default()
    };
    for rule in existing.iter().filter(|r| !named.contains(&r.name_any())) {
        let owner = rule
            .annotations()
            .get(QUARANTINED_BY_ANNOTATION)
            .map(String::as_str);
        if owner.is_some_and(&known) {
            plan.delete.push(rule.clone());
        } else {
            plan.delete_if_owner_gone.push(rule.clone());
        }
    }
    plan
}

/// The policy's `DeviceQuarantine` condition: whether its quarantines can be device-level, given
/// the `DeviceTaintRule` version served.
#[must_use]
pub fn condition(
    served: Option<TaintRuleVersion>,
    previous: &[Condition],
    generation: Option<i64>,
    now: Timestamp,
) -> Condition {
    let (reason, message) = if let Some(version) = served {
        (
            reasons::DEVICE_TAINT_RULES_SERVED,
            format!(
                "a fault naming GPUs allocated through DRA quarantines only those devices ({version} DeviceTaintRule, \
                 NoSchedule); other faults taint the node"
            ),
        )
    } else {
        (
            reasons::DEVICE_TAINT_RULES_NOT_SERVED,
            format!("{NOT_SERVED}: quarantines taint the whole node"),
        )
    };
    crate::status_condition::condition(
        previous,
        policy_conditions::DEVICE_QUARANTINE,
        served.is_some(),
        reason.to_owned(),
        message,
        generation,
        now,
    )
}

#[cfg(test)]
#[path = "device_tests.rs"]
mod tests;
