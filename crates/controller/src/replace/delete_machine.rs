//! `DeleteMachine`: delete the node's Cluster API Machine. Cluster API then deletes the node and
//! its infrastructure, and the owning `MachineSet` (if any) creates a new Machine, whose node must be
//! Ready before the replacement counts as done.
//!
//! The Machine is found from the node's annotations `cluster.x-k8s.io/machine` (name) and
//! `cluster.x-k8s.io/cluster-namespace` (namespace), both set by Cluster API on every node it
//! manages. A node may write its own annotations, so they only say where to look: the Machine is
//! deleted only if its `status.nodeRef` (written by Cluster API, not by the node) names the node
//! back, by name and, where the Machine's API version records one (`v1beta1`), by UID. The version
//! is the group's preferred one, by discovery, so the controller works with `v1beta1` and
//! `v1beta2` management clusters alike.
//!
//! Pure: [`machine_named`] (which Machine to read), [`plan`] (what to write, given it),
//! [`replacement_nodes`]/[`joined`] (the replacement, from the Machines and nodes read); what it
//! observes is [`super::deletion_observed`] of the Machine read and that replacement.

use gpu_remediation_api::{GpuRemediation, object_reference::ObjectReference};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::{
    api::{ApiResource, DynamicObject},
    core::GroupVersionKind,
};
use serde_json::Value;

use super::{
    AdmittedNode, REPLACEMENT_SELECTOR_ANNOTATION, TriggerReplacementError,
    plan::{Plan, Write, node_reference},
    verify::{ReplacementNode, node_is_ready},
};
use crate::observe::NodeView;

/// Cluster API's API group.
pub const GROUP: &str = "cluster.x-k8s.io";
/// Node annotation naming the node's Machine.
pub const MACHINE_ANNOTATION: &str = "cluster.x-k8s.io/machine";
/// Node annotation naming the namespace of the node's Cluster (and Machine).
pub const CLUSTER_NAMESPACE_ANNOTATION: &str = "cluster.x-k8s.io/cluster-namespace";
/// Machine label naming the `MachineSet` that owns it.
pub const MACHINE_SET_LABEL: &str = "cluster.x-k8s.io/set-name";

/// A Machine seen while looking for a replacement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineSeen {
    /// Its UID.
    pub uid: String,
    /// When it was created.
    pub created: Option<Timestamp>,
    /// Whether it is being deleted.
    pub deleting: bool,
    /// `status.nodeRef.name`.
    pub node: Option<String>,
}

/// The replacement Machines' nodes: Machines of the set other than the deleted one, created since
/// the trigger's second, not being deleted. `None` when there is no such Machine; an empty list
/// when they have no node yet.
#[must_use]
pub fn replacement_nodes(
    machines: &[MachineSeen],
    deleted_uid: Option<&str>,
    triggered_at: Timestamp,
) -> Option<Vec<String>> {
    let trigger_second = Timestamp::from_second(triggered_at.as_second()).unwrap_or(triggered_at);
    let mut found = None;
    for machine in machines {
        let is_new = machine.created.is_some_and(|created| created >= trigger_second);
        if Some(machine.uid.as_str()) == deleted_uid || !is_new || machine.deleting {
            continue;
        }
        let nodes = found.get_or_insert_with(Vec::new);
        nodes.extend(machine.node.clone());
    }
    found
}

/// The Machine a node's annotations name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineName {
    /// Its namespace (the Cluster's).
    pub namespace: String,
    /// Its name.
    pub name: String,
}

/// What the trigger does after reading the node.
#[derive(Debug, Clone, PartialEq)]
pub enum Lookup<'a> {
    /// Read this Machine, then [`plan`] over it and the node.
    Machine(MachineName, &'a Node),
    /// Nothing to read: the node is gone (a retry after the Machine was deleted).
    Done(Plan),
}

/// Which Machine deleting `remediation`'s node means, from the node read by name: its annotations
/// name it; a node without them is not managed by Cluster API.
pub fn machine_named<'a>(
    remediation: &GpuRemediation,
    node: Option<&'a Node>,
) -> Result<Lookup<'a>, TriggerReplacementError> {
    let node_name = &remediation.spec.node_name;
    let admitted = AdmittedNode::of(remediation, node);
    let AdmittedNode::Present(node) = admitted else {
        let reason = admitted.gone_because(node_name).unwrap_or_default();
        return Ok(Lookup::Done(Plan::nothing(
            node_reference(node_name, None),
            reason,
        )));
    };
    let annotation = |key: &'static str| {
        node.metadata
            .annotations
            .as_ref()
            .and_then(|annotations| annotations.get(key))
            .filter(|value| !value.is_empty())
            .cloned()
            .ok_or_else(|| TriggerReplacementError::NotAClusterApiNode {
                node: node_name.clone(),
                annotation: key,
            })
    };
    let name = annotation(MACHINE_ANNOTATION)?;
    let namespace = annotation(CLUSTER_NAMESPACE_ANNOTATION)?;
    Ok(Lookup::Machine(MachineName { namespace, name }, node))
}

/// What deleting the Machine `named` (of kind `resource`, read as `machine`) writes for `node`:
/// the replacement Machines' selector recorded on the remediation (when its `MachineSet` is known
/// and not recorded yet), then the Machine deleted, pinned to its UID. Nothing when it is gone
/// already; a refusal, writing nothing, when its `status.nodeRef` does not name the node.
pub fn plan(
    remediation: &GpuRemediation,
    node: &Node,
    named: &MachineName,
    resource: &ApiResource,
    machine: Option<&DynamicObject>,
) -> Result<Plan, TriggerReplacementError> {
    let shown = format!("{}/{}", named.namespace, named.name);
    let reference = ObjectReference {
        api_version: resource.api_version.clone(),
        kind: resource.kind.clone(),
        name: named.name.clone(),
        namespace: Some(named.namespace.clone()),
        uid: machine.and_then(|machine| machine.metadata.uid.clone()),
    };
    let Some(machine) = machine else {
        return Ok(Plan::nothing(
            reference,
            format!("Machine {shown} is gone already"),
        ));
    };
    names_node(machine, node).map_err(|why| TriggerReplacementError::MachineNotTheNodes {
        machine: shown.clone(),
        node: remediation.spec.node_name.clone(),
        why,
    })?;
    let Some(uid) = reference.uid.clone() else {
        return Err(TriggerReplacementError::Unidentified {
            kind: resource.kind.clone(),
            name: shown,
        });
    };
    let mut writes = Vec::new();
    if let Some(set) = machine
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(MACHINE_SET_LABEL))
    {
        let selector = format!("{MACHINE_SET_LABEL}={set}");
        if self::selector(remediation) != Some(selector.as_str()) {
            writes.push(Write::AnnotateRemediation {
                name: remediation.metadata.name.clone().unwrap_or_default(),
                resource_version: remediation.metadata.resource_version.clone(),
                key: REPLACEMENT_SELECTOR_ANNOTATION,
                value: selector,
            });
        }
    }
    writes.push(Write::DeleteWithUid {
        resource: resource.clone(),
        namespace: Some(named.namespace.clone()),
        name: named.name.clone(),
        uid,
    });
    Ok(Plan { reference, writes })
}

/// Whether `machine`'s `status.nodeRef` names `node` (by name, and by UID where it records one);
/// what does not match, if not.
fn names_node(machine: &DynamicObject, node: &Node) -> Result<(), String> {
    let node_ref = machine.data.pointer("/status/nodeRef");
    let field = |key: &str| node_ref.and_then(|r| r.get(key)).and_then(Value::as_str);
    let node_name = node.node_name();
    let Some(named) = field("name") else {
        return Err("its status.nodeRef names no node".to_owned());
    };
    if named != node_name {
        return Err(format!("its status.nodeRef names node {named}"));
    }
    let node_uid = node.node_uid().unwrap_or_default();
    match field("uid") {
        Some(uid) if uid != node_uid => Err(format!(
            "its status.nodeRef names node {named} of UID {uid}, and this node's UID is {node_uid}"
        )),
        _ => Ok(()),
    }
}

/// The replacement Machines' selector the trigger recorded on the remediation, if any.
#[must_use]
pub fn selector(remediation: &GpuRemediation) -> Option<&str> {
    remediation
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(REPLACEMENT_SELECTOR_ANNOTATION))
        .map(String::as_str)
}

/// The replacement, from the nodes that [`replacement_nodes`] named, each as read (`None`: not
/// there yet): the first Ready one, else the last one there, else still awaited.
#[must_use]
pub fn joined(read: &[(String, Option<Node>)]) -> ReplacementNode {
    let mut joined = ReplacementNode::Awaited;
    for (name, node) in read {
        let Some(node) = node else { continue };
        let ready = node_is_ready(node);
        joined = ReplacementNode::Joined {
            node: name.clone(),
            ready,
        };
        if ready {
            break;
        }
    }
    joined
}

/// The API resource of a recorded reference, with the plural this strategy knows.
#[must_use]
pub fn resource_of(reference: &ObjectReference) -> ApiResource {
    let (group, version) = reference
        .api_version
        .split_once('/')
        .unwrap_or(("", reference.api_version.as_str()));
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(group, version, &reference.kind),
        "machines",
    )
}

/// What the replacement search keeps of a listed Machine.
#[must_use]
pub fn machine_seen(machine: &DynamicObject) -> MachineSeen {
    MachineSeen {
        uid: machine.metadata.uid.clone().unwrap_or_default(),
        created: machine.metadata.creation_timestamp.as_ref().map(|time| time.0),
        deleting: machine.metadata.deletion_timestamp.is_some(),
        node: machine
            .data
            .pointer("/status/nodeRef/name")
            .and_then(Value::as_str)
            .map(str::to_owned),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replace::fixtures::{
        machine, machine_of_another_node, node, node_naming_another_machine, remediation,
    };

    fn served() -> ApiResource {
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, "v1beta1", "Machine"), "machines")
    }

    /// The plan for `node` and the Machine its annotations name, read as `found`.
    fn plan_for(node: &Node, found: Option<&DynamicObject>) -> Result<Plan, TriggerReplacementError> {
        let remediation = remediation(Some("uid-gpu-1"));
        let Lookup::Machine(named, node) = machine_named(&remediation, Some(node)).expect("a CAPI node")
        else {
            panic!("the node is there: its Machine is read")
        };
        plan(&remediation, node, &named, &served(), found)
    }

    #[test]
    fn the_nodes_machine_is_deleted_pinned_to_its_uid_after_its_set_is_recorded() {
        let planned = plan_for(&node(), Some(&machine())).expect("corroborated");
        assert_eq!(
            planned.writes,
            [
                Write::AnnotateRemediation {
                    name: "gpu-1-1a2b3c".to_owned(),
                    resource_version: Some("100".to_owned()),
                    key: REPLACEMENT_SELECTOR_ANNOTATION,
                    value: "cluster.x-k8s.io/set-name=pool".to_owned(),
                },
                Write::DeleteWithUid {
                    resource: served(),
                    namespace: Some("capi".to_owned()),
                    name: "pool-gpu-1".to_owned(),
                    uid: "uid-machine-1".to_owned(),
                },
            ]
        );
        assert_eq!(
            planned.reference,
            ObjectReference {
                api_version: "cluster.x-k8s.io/v1beta1".to_owned(),
                kind: "Machine".to_owned(),
                name: "pool-gpu-1".to_owned(),
                namespace: Some("capi".to_owned()),
                uid: Some("uid-machine-1".to_owned()),
            }
        );
    }

    #[test]
    fn a_retry_with_the_selector_recorded_only_deletes() {
        let mut recorded = remediation(Some("uid-gpu-1"));
        recorded.metadata.annotations = Some(
            [(
                REPLACEMENT_SELECTOR_ANNOTATION.to_owned(),
                "cluster.x-k8s.io/set-name=pool".to_owned(),
            )]
            .into(),
        );
        let node = node();
        let named = MachineName {
            namespace: "capi".to_owned(),
            name: "pool-gpu-1".to_owned(),
        };
        let planned = plan(&recorded, &node, &named, &served(), Some(&machine())).expect("corroborated");
        assert!(
            matches!(planned.writes.as_slice(), [Write::DeleteWithUid { name, .. }] if name == "pool-gpu-1"),
            "{:?}",
            planned.writes
        );
    }

    #[test]
    fn a_machine_gone_already_is_nothing_to_delete() {
        let planned = plan_for(&node(), None).expect("nothing to corroborate");
        assert_eq!(
            planned.writes,
            [Write::Nothing {
                reason: "Machine capi/pool-gpu-1 is gone already".to_owned()
            }]
        );
        assert_eq!(planned.reference.uid, None);
    }

    #[test]
    fn a_node_gone_already_reads_no_machine() {
        let looked = machine_named(&remediation(Some("uid-gpu-1")), None).expect("no refusal");
        assert_eq!(
            looked,
            Lookup::Done(Plan::nothing(
                node_reference("gpu-1", None),
                "node gpu-1 is gone already".to_owned()
            ))
        );
    }

    #[test]
    fn a_node_without_cluster_api_annotations_is_refused() {
        let mut bare = node();
        bare.metadata.annotations = None;
        let refused = machine_named(&remediation(Some("uid-gpu-1")), Some(&bare));
        assert!(
            matches!(
                refused,
                Err(TriggerReplacementError::NotAClusterApiNode {
                    annotation: MACHINE_ANNOTATION,
                    ..
                })
            ),
            "{refused:?}"
        );
    }

    #[test]
    fn a_node_naming_another_nodes_machine_deletes_nothing() {
        let forged = node_naming_another_machine();
        let refused = plan_for(&forged, Some(&machine_of_another_node())).expect_err("refused");
        assert_eq!(
            refused.to_string(),
            "Machine capi/pool-gpu-7 is not node gpu-1's (its status.nodeRef names node gpu-7): nothing was deleted"
        );
    }

    #[test]
    fn a_machine_naming_a_node_of_the_same_name_but_another_uid_deletes_nothing() {
        let mut earlier = machine();
        earlier.data["status"]["nodeRef"]["uid"] = "uid-gpu-1-before".into();
        let refused = plan_for(&node(), Some(&earlier)).expect_err("refused");
        assert_eq!(
            refused.to_string(),
            "Machine capi/pool-gpu-1 is not node gpu-1's (its status.nodeRef names node gpu-1 of UID \
             uid-gpu-1-before, and this node's UID is uid-gpu-1): nothing was deleted"
        );
    }

    #[test]
    fn a_machine_without_a_node_ref_deletes_nothing() {
        let mut unjoined = machine();
        unjoined.data["status"] = serde_json::json!({"phase": "Provisioning"});
        let refused = plan_for(&node(), Some(&unjoined)).expect_err("refused");
        assert!(
            matches!(&refused, TriggerReplacementError::MachineNotTheNodes { why, .. } if why == "its status.nodeRef names no node"),
            "{refused:?}"
        );
    }

    #[test]
    fn a_v1beta2_node_ref_without_a_uid_is_corroborated_by_its_name() {
        let mut v1beta2 = machine();
        v1beta2.data["status"]["nodeRef"] = serde_json::json!({"name": "gpu-1"});
        let planned = plan_for(&node(), Some(&v1beta2)).expect("corroborated by name");
        assert!(matches!(planned.writes.last(), Some(Write::DeleteWithUid { .. })));
    }

    #[test]
    fn the_replacement_is_the_first_ready_node_else_the_last_joined() {
        let mut unready = node();
        unready.status = None;
        assert_eq!(joined(&[("gpu-9".to_owned(), None)]), ReplacementNode::Awaited);
        assert_eq!(
            joined(&[
                ("gpu-8".to_owned(), Some(unready.clone())),
                ("gpu-9".to_owned(), None)
            ]),
            ReplacementNode::Joined {
                node: "gpu-8".to_owned(),
                ready: false
            }
        );
        assert_eq!(
            joined(&[
                ("gpu-8".to_owned(), Some(node())),
                ("gpu-9".to_owned(), Some(unready))
            ]),
            ReplacementNode::Joined {
                node: "gpu-8".to_owned(),
                ready: true
            }
        );
    }

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(second).expect("timestamp")
    }

    fn seen(uid: &str, created: i64, node: Option<&str>) -> MachineSeen {
        MachineSeen {
            uid: uid.to_owned(),
            created: Some(at(created)),
            deleting: false,
            node: node.map(str::to_owned),
        }
    }

    #[test]
    fn machines_older_than_the_trigger_are_not_replacements() {
        let machines = [
            seen("old-sibling", 10, Some("gpu-1")),
            seen("deleted", 5, Some("gpu-2")),
        ];
        assert_eq!(replacement_nodes(&machines, Some("deleted"), at(100)), None);
    }

    #[test]
    fn a_new_machine_without_a_node_yet_is_a_replacement_still_coming() {
        let machines = [seen("new", 100, None)];
        assert_eq!(
            replacement_nodes(
                &machines,
                Some("deleted"),
                at(100) + jiff::SignedDuration::from_millis(700)
            ),
            Some(vec![])
        );
    }

    #[test]
    fn a_new_machine_with_a_node_names_the_replacement_node() {
        let machines = [seen("new", 130, Some("gpu-9")), seen("sibling", 1, Some("gpu-1"))];
        assert_eq!(
            replacement_nodes(&machines, Some("deleted"), at(100)),
            Some(vec!["gpu-9".to_owned()])
        );
    }

    #[test]
    fn a_new_machine_already_being_deleted_is_not_a_replacement() {
        let mut dying = seen("new", 130, Some("gpu-9"));
        dying.deleting = true;
        assert_eq!(replacement_nodes(&[dying], Some("deleted"), at(100)), None);
    }
}
