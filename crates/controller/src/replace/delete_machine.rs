//! `DeleteMachine`: delete the node's Cluster API Machine. Cluster API then deletes the node and
//! its infrastructure, and the owning `MachineSet` (if any) creates a new Machine, whose node must be
//! Ready before the replacement counts as done.
//!
//! The Machine is found from the node's annotations `cluster.x-k8s.io/machine` (name) and
//! `cluster.x-k8s.io/cluster-namespace` (namespace), both set by Cluster API on every node it
//! manages. The version is the group's preferred one, by discovery, so the controller works with
//! `v1beta1` and `v1beta2` management clusters alike.

use futures::{FutureExt as _, future::BoxFuture};
use gpu_remediation_api::{GpuRemediation, object_reference::ObjectReference, policy::Replacement};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::{
    Resource as _,
    api::{ApiResource, DeleteParams, DynamicObject, ListParams},
    core::GroupVersionKind,
};
use serde_json::{Value, json};

use crate::{
    read::{ReadApi, Scope},
    write::WriteError,
};

use super::{
    Kube, ObserveReplacementError, REPLACEMENT_SELECTOR_ANNOTATION, Replace, TriggerReplacementError,
    Triggered, node_presence, presence,
    verify::{Observation, ReplacementNode, Reported, node_is_ready},
};

/// Cluster API's API group.
pub const GROUP: &str = "cluster.x-k8s.io";
/// Node annotation naming the node's Machine.
pub const MACHINE_ANNOTATION: &str = "cluster.x-k8s.io/machine";
/// Node annotation naming the namespace of the node's Cluster (and Machine).
pub const CLUSTER_NAMESPACE_ANNOTATION: &str = "cluster.x-k8s.io/cluster-namespace";
/// Machine label naming the `MachineSet` that owns it.
pub const MACHINE_SET_LABEL: &str = "cluster.x-k8s.io/set-name";

/// The `DeleteMachine` strategy.
pub struct DeleteMachine {
    kube: Kube,
}

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

impl DeleteMachine {
    pub(crate) fn new(kube: Kube) -> Self {
        Self { kube }
    }

    async fn delete(&self, remediation: &GpuRemediation) -> Result<Triggered, TriggerReplacementError> {
        let node_name = &remediation.spec.node_name;
        let nodes: ReadApi<Node> = self.kube.reader.api(Scope::Cluster, &());
        let node = nodes
            .get_opt(node_name)
            .await
            .map_err(|source| TriggerReplacementError::Api {
                action: format!("reading node {node_name}"),
                source,
            })?;
        let Some(node) = node else {
            // Gone already (a retry after the Machine was deleted): nothing left to find.
            return Ok(Triggered::from(ObjectReference {
                api_version: "v1".to_owned(),
                kind: "Node".to_owned(),
                name: node_name.clone(),
                namespace: None,
                uid: None,
            }));
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
        let machine_name = annotation(MACHINE_ANNOTATION)?;
        let namespace = annotation(CLUSTER_NAMESPACE_ANNOTATION)?;
        let resource = self.kube.served_resource(GROUP, "Machine").await?;
        let machines: ReadApi<DynamicObject> = self.kube.reader.api(Scope::Namespace(&namespace), &resource);
        let action = |verb: &str| format!("{verb} Machine {namespace}/{machine_name}");
        let machine =
            machines
                .get_opt(&machine_name)
                .await
                .map_err(|source| TriggerReplacementError::Api {
                    action: action("reading"),
                    source,
                })?;
        let reference = ObjectReference {
            api_version: resource.api_version.clone(),
            kind: resource.kind.clone(),
            name: machine_name.clone(),
            namespace: Some(namespace.clone()),
            uid: machine.as_ref().and_then(|machine| machine.metadata.uid.clone()),
        };
        let Some(machine) = machine else {
            return Ok(Triggered::from(reference));
        };
        let rewritten = match machine
            .metadata
            .labels
            .as_ref()
            .and_then(|labels| labels.get(MACHINE_SET_LABEL))
        {
            Some(set) => {
                self.remember_selector(remediation, &format!("{MACHINE_SET_LABEL}={set}"))
                    .await?
            }
            None => None,
        };
        self.kube
            .delete_stamped(
                &machines,
                &machine_name,
                reference.uid.as_deref(),
                &DeleteParams::default(),
            )
            .await
            .map_err(|error| error.during(action("deleting")))?;
        Ok(Triggered { reference, rewritten })
    }

    /// Records on the remediation which Machines may replace the deleted one, before deleting it;
    /// with the remediation as written, if this wrote it. The write is made over the version read
    /// (a person's edit since is a conflict, and the next pass reads again), so the version it
    /// returns differs from the one read by this write alone.
    async fn remember_selector(
        &self,
        remediation: &GpuRemediation,
        selector: &str,
    ) -> Result<Option<GpuRemediation>, TriggerReplacementError> {
        let recorded = remediation
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(REPLACEMENT_SELECTOR_ANNOTATION));
        if recorded.map(String::as_str) == Some(selector) {
            return Ok(None);
        }
        let name = remediation.meta().name.clone().unwrap_or_default();
        // Over the version given: the status write that follows is made over the one written here.
        let patch = json!({"metadata": {
            "annotations": {REPLACEMENT_SELECTOR_ANNOTATION: selector},
            "resourceVersion": remediation.meta().resource_version,
        }});
        match self
            .kube
            .writer
            .patch::<GpuRemediation>(&(), Scope::Cluster, &name, patch)
            .await
        {
            Ok(written) => Ok(Some(written)),
            Err(WriteError::Fenced(fenced)) => Err(fenced.into()),
            Err(WriteError::Api(source)) => Err(TriggerReplacementError::Api {
                action: format!("annotating GpuRemediation {name}"),
                source,
            }),
        }
    }

    async fn look(
        &self,
        remediation: &GpuRemediation,
        reference: &ObjectReference,
        triggered_at: Timestamp,
    ) -> Result<Observation, ObserveReplacementError> {
        let read_error = |action: String| move |source| ObserveReplacementError::Api { action, source };
        let nodes: ReadApi<Node> = self.kube.reader.api(Scope::Cluster, &());
        let node = nodes
            .get_opt(&remediation.spec.node_name)
            .await
            .map_err(read_error(format!("reading node {}", remediation.spec.node_name)))?;
        let node = node_presence(
            node.as_ref().map(|node| &node.metadata),
            remediation.spec.node_uid.as_deref(),
            triggered_at,
        );
        if reference.kind == "Node" {
            // The node was already gone when the replacement was triggered.
            return Ok(Observation {
                target: node,
                node,
                reported: Reported::Nothing,
                replacement: ReplacementNode::NotExpected,
            });
        }
        let resource = resource_of(reference, "machines");
        let namespace = reference.namespace.clone().unwrap_or_default();
        let machines: ReadApi<DynamicObject> = self.kube.reader.api(Scope::Namespace(&namespace), &resource);
        let machine = machines
            .get_opt(&reference.name)
            .await
            .map_err(read_error(format!(
                "reading Machine {namespace}/{}",
                reference.name
            )))?;
        let target = presence(
            machine.as_ref().map(|machine| &machine.metadata),
            reference.uid.as_deref(),
        );
        let selector = remediation
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(REPLACEMENT_SELECTOR_ANNOTATION));
        let Some(selector) = selector else {
            return Ok(Observation {
                target,
                node,
                reported: Reported::Nothing,
                replacement: ReplacementNode::NotExpected,
            });
        };
        let listed = machines
            .list(&ListParams::default().labels(selector))
            .await
            .map_err(read_error(format!("listing Machines {selector} in {namespace}")))?;
        let seen: Vec<MachineSeen> = listed.items.iter().map(machine_seen).collect();
        let replacement = match replacement_nodes(&seen, reference.uid.as_deref(), triggered_at) {
            None => ReplacementNode::Awaited,
            Some(names) if names.is_empty() => ReplacementNode::Awaited,
            Some(names) => {
                let mut joined = ReplacementNode::Awaited;
                for name in names {
                    let new_node = nodes
                        .get_opt(&name)
                        .await
                        .map_err(read_error(format!("reading replacement node {name}")))?;
                    let ready = new_node.as_ref().is_some_and(node_is_ready);
                    if new_node.is_some() {
                        joined = ReplacementNode::Joined { node: name, ready };
                        if ready {
                            break;
                        }
                    }
                }
                joined
            }
        };
        Ok(Observation {
            target,
            node,
            reported: Reported::Nothing,
            replacement,
        })
    }
}

/// The API resource of a recorded reference, with the plural this strategy knows.
fn resource_of(reference: &ObjectReference, plural: &str) -> ApiResource {
    let (group, version) = reference
        .api_version
        .split_once('/')
        .unwrap_or(("", reference.api_version.as_str()));
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, &reference.kind), plural)
}

fn machine_seen(machine: &DynamicObject) -> MachineSeen {
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

impl Replace for DeleteMachine {
    fn trigger<'a>(
        &'a self,
        remediation: &'a GpuRemediation,
        _replacement: &'a Replacement,
    ) -> BoxFuture<'a, Result<Triggered, TriggerReplacementError>> {
        self.delete(remediation).boxed()
    }

    fn observe<'a>(
        &'a self,
        remediation: &'a GpuRemediation,
        reference: &'a ObjectReference,
        triggered_at: Timestamp,
    ) -> BoxFuture<'a, Result<Observation, ObserveReplacementError>> {
        self.look(remediation, reference, triggered_at).boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(second).expect("timestamp")
    }

    fn machine(uid: &str, created: i64, node: Option<&str>) -> MachineSeen {
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
            machine("old-sibling", 10, Some("gpu-1")),
            machine("deleted", 5, Some("gpu-2")),
        ];
        assert_eq!(replacement_nodes(&machines, Some("deleted"), at(100)), None);
    }

    #[test]
    fn a_new_machine_without_a_node_yet_is_a_replacement_still_coming() {
        let machines = [machine("new", 100, None)];
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
        let machines = [
            machine("new", 130, Some("gpu-9")),
            machine("sibling", 1, Some("gpu-1")),
        ];
        assert_eq!(
            replacement_nodes(&machines, Some("deleted"), at(100)),
            Some(vec!["gpu-9".to_owned()])
        );
    }

    #[test]
    fn a_new_machine_already_being_deleted_is_not_a_replacement() {
        let mut dying = machine("new", 130, Some("gpu-9"));
        dying.deleting = true;
        assert_eq!(replacement_nodes(&[dying], Some("deleted"), at(100)), None);
    }
}
