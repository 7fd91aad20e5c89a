//! The sandbox's Cluster API infrastructure provider (ours, not upstream): for every
//! `SandboxMachine` of its fleet it "boots a host": creates the machine's Node (the fleet adopts
//! it, as it adopts Karpenter's), then reports the machine's provider ID and
//! `status.initialization.provisioned`, the two fields Cluster API's v1beta2 infrastructure
//! contract requires. A deleted `SandboxMachine` (it has no finalizer) is a terminated host; Cluster
//! API deletes its Node afterwards. Polls every 200ms like the fake provider.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::{Api, Client, ResourceExt as _};
use serde_json::Value;

use super::objects;
use crate::fleet::NodeShape;

const POLL: Duration = Duration::from_millis(200);

/// `SandboxMachine`.
#[must_use]
pub fn machine_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(objects::INFRA_GROUP, objects::INFRA_VERSION, "SandboxMachine"),
        "sandboxmachines",
    )
}

/// Provisions `namespace`'s `SandboxMachines` of fleet `shape.fleet` until aborted.
pub(super) async fn run(client: Client, shape: NodeShape, namespace: String) {
    let machines: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &machine_resource());
    let nodes: Api<Node> = Api::all(client);
    loop {
        match machines.list(&kube::api::ListParams::default()).await {
            Ok(listed) => {
                for machine in &listed.items {
                    if let Err(error) = provision(&machines, &nodes, &shape, &namespace, machine).await {
                        tracing::warn!(machine = %machine.name_any(), %error, "sandbox infrastructure: provisioning failed; retrying");
                    }
                }
            }
            Err(error) => tracing::warn!(%error, "sandbox infrastructure: listing SandboxMachines failed"),
        }
        tokio::time::sleep(POLL).await;
    }
}

async fn provision(
    machines: &Api<DynamicObject>,
    nodes: &Api<Node>,
    shape: &NodeShape,
    namespace: &str,
    machine: &DynamicObject,
) -> Result<(), kube::Error> {
    let fleet = machine.data.pointer("/spec/fleet").and_then(Value::as_str);
    let provisioned = machine
        .data
        .pointer("/status/initialization/provisioned")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if machine.metadata.deletion_timestamp.is_some() || fleet != Some(shape.fleet.as_str()) || provisioned {
        return Ok(());
    }
    let name = machine.name_any();
    let node: Node = serde_json::from_value(objects::machine_node(shape, namespace, &name))
        .expect("a machine's node is a valid Node");
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => tracing::info!(machine = %name, "sandbox infrastructure: host up, node created"),
        Err(kube::Error::Api(status)) if status.is_already_exists() => {}
        Err(error) => return Err(error),
    }
    let (spec, status) = objects::provisioned(&objects::provider_id(namespace, &name));
    machines
        .patch(&name, &PatchParams::default(), &Patch::Merge(&spec))
        .await?;
    machines
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(())
}
