//! A simulated Dynamic Resource Allocation driver for the fleet's GPUs: one `DeviceClass`
//! ([`DEVICE_CLASS`]) selecting the driver's devices, and per GPU node one `ResourceSlice` (owned
//! by the node, so it goes with it) listing its GPUs as devices `gpu-<index>` with the attributes
//! a real GPU driver publishes: `uuid` (the same UUIDs as the node's inventory annotation and
//! [`crate::hardware::fail_gpu`]) and `index`. The real kube-scheduler then allocates these
//! devices to pods whose `ResourceClaim`s (from a `ResourceClaimTemplate`, see [`claim_template`])
//! ask for the class, and kube-controller-manager's resourceclaim controller creates and cleans up
//! the claims; nothing here plays the kubelet's part of DRA (preparing devices), the simulated
//! kubelet just runs the pods.
//!
//! Everything is `resource.k8s.io/v1` (GA since Kubernetes 1.34), written as JSON: k8s-openapi's
//! `v1_33` types have no `v1`.

use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, GroupVersionKind, PostParams},
};
use serde_json::{Value, json};

use crate::hardware::SimGpu;

/// The driver's name, also the pool's driver in every slice.
pub const DRIVER: &str = "gpu.sandbox.gpuremediation.dev";
/// The `DeviceClass` selecting every device of [`DRIVER`].
pub const DEVICE_CLASS: &str = DRIVER;
/// The request name in claims made by [`claim_template`], and the pod's claim name.
pub const GPU_REQUEST: &str = "gpu";

/// The GPUs of simulated node `node`: boards with serials `<node>-<index>`, so their UUIDs are
/// unique across fleets.
#[must_use]
pub fn node_gpus(node: &str, count: u32) -> Vec<SimGpu> {
    (0..count)
        .map(|i| SimGpu::new(i, &format!("{node}-{i}")))
        .collect()
}

/// The device name of the GPU of NVML index `index` in its node's slice.
#[must_use]
pub fn device_name(index: u32) -> String {
    format!("gpu-{index}")
}

/// The pool (and slice) name of node `node`'s GPUs.
#[must_use]
pub fn pool_name(node: &str) -> String {
    node.to_owned()
}

/// The `DeviceClass` object.
#[must_use]
pub fn device_class() -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DEVICE_CLASS},
        "spec": {"selectors": [{"cel": {"expression": format!("device.driver == \"{DRIVER}\"")}}]},
    })
}

/// Node `node`'s `ResourceSlice`: one device per GPU, owned by the node (`node_uid`).
#[must_use]
pub fn resource_slice(node: &str, node_uid: &str, gpus: &[SimGpu]) -> Value {
    let devices: Vec<Value> = gpus
        .iter()
        .map(|gpu| {
            json!({
                "name": device_name(gpu.index),
                "attributes": {
                    "uuid": {"string": gpu.uuid},
                    "index": {"int": gpu.index},
                    "serial": {"string": gpu.serial},
                },
            })
        })
        .collect();
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {
            "name": format!("{node}-{}", DRIVER.replace('.', "-")),
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}],
        },
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": pool_name(node), "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    })
}

/// A `ResourceClaimTemplate` asking for `gpus` GPUs of [`DEVICE_CLASS`] in one request
/// [`GPU_REQUEST`].
#[must_use]
pub fn claim_template(namespace: &str, name: &str, gpus: u32) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": [{
            "name": GPU_REQUEST,
            "exactly": {"deviceClassName": DEVICE_CLASS, "allocationMode": "ExactCount", "count": gpus},
        }]}}},
    })
}

fn api_resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("resource.k8s.io", "v1", kind), plural)
}

/// Creates `object` of `kind`, accepting one that already exists.
async fn create(client: &Client, kind: &str, plural: &str, object: &Value) -> Result<(), kube::Error> {
    let resource = api_resource(kind, plural);
    let object: DynamicObject = serde_json::from_value(object.clone()).map_err(kube::Error::SerdeError)?;
    let api: Api<DynamicObject> = match object.metadata.namespace.as_deref() {
        Some(namespace) => Api::namespaced_with(client.clone(), namespace, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    match api.create(&PostParams::default(), &object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.is_already_exists() => Ok(()),
        Err(error) => Err(error),
    }
}

/// Installs the [`DEVICE_CLASS`] (once per cluster; an existing one is kept).
pub async fn install_device_class(client: &Client) -> Result<(), kube::Error> {
    create(client, "DeviceClass", "deviceclasses", &device_class()).await
}

/// Publishes node `node`'s slice of `gpus`.
pub async fn publish_slice(
    client: &Client,
    node: &str,
    node_uid: &str,
    gpus: &[SimGpu],
) -> Result<(), kube::Error> {
    create(
        client,
        "ResourceSlice",
        "resourceslices",
        &resource_slice(node, node_uid, gpus),
    )
    .await
}

/// Creates [`claim_template`]`(namespace, name, gpus)`.
pub async fn create_claim_template(
    client: &Client,
    namespace: &str,
    name: &str,
    gpus: u32,
) -> Result<(), kube::Error> {
    create(
        client,
        "ResourceClaimTemplate",
        "resourceclaimtemplates",
        &claim_template(namespace, name, gpus),
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nodes_slice_lists_each_gpu_with_the_uuid_its_inventory_reports() {
        let gpus = node_gpus("gpu-0001", 8);
        let slice = resource_slice("gpu-0001", "uid-1", &gpus);
        let devices = slice["spec"]["devices"].as_array().unwrap();
        assert_eq!(devices.len(), 8);
        assert_eq!(devices[3]["name"], "gpu-3");
        assert_eq!(devices[3]["attributes"]["uuid"]["string"], gpus[3].uuid);
        assert_eq!(devices[3]["attributes"]["index"]["int"], 3);
        assert_eq!(slice["spec"]["nodeName"], "gpu-0001");
        assert_eq!(slice["metadata"]["ownerReferences"][0]["uid"], "uid-1");
        let inventory: Vec<Value> = serde_json::from_str(&crate::hardware::inventory_text(&gpus)).unwrap();
        assert_eq!(inventory[3]["uuid"], gpus[3].uuid);
    }

    #[test]
    fn gpu_uuids_differ_between_nodes() {
        assert_ne!(
            node_gpus("gpu-a-0000", 1)[0].uuid,
            node_gpus("gpu-b-0000", 1)[0].uuid
        );
    }
}
