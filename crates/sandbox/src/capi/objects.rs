//! The objects of a Cluster API cluster whose workload cluster is the sandbox itself: the
//! sandbox's own infrastructure kinds (CRDs for `SandboxMachine`, `SandboxMachineTemplate` and
//! `SandboxControlPlane`, which carry Cluster API's contract label), the kubeconfig Secret, the
//! `Cluster`, a `MachineSet` and a `MachineHealthCheck` (all `cluster.x-k8s.io/v1beta2`), and the
//! Node an infrastructure machine stands for. Pure builders, no IO.

use serde_json::{Value, json};

use crate::fleet::node::{NodeShape, node_labels};

/// The sandbox's infrastructure API group.
pub const INFRA_GROUP: &str = "infrastructure.sandbox.gpuremediation.dev";
/// Its version.
pub const INFRA_VERSION: &str = "v1alpha1";
/// Cluster API's group.
pub const CAPI_GROUP: &str = "cluster.x-k8s.io";
/// Machine (and template) label naming the cluster.
pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";
/// Machine label the `MachineSet` and health check select by.
pub const POOL_LABEL: &str = "gpuremediation.dev/machine-pool";
/// Prefix of the provider IDs of the sandbox's machines.
pub const PROVIDER_ID_PREFIX: &str = "sandbox-capi://";

/// The CRD of one of the sandbox's infrastructure kinds (`kind`, plural `plural`), labelled with
/// Cluster API's contract (`cluster.x-k8s.io/v1beta2: v1alpha1`) so Cluster API reads it.
#[must_use]
pub fn infra_crd(kind: &str, plural: &str) -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": format!("{plural}.{INFRA_GROUP}"),
            "labels": {"cluster.x-k8s.io/v1beta2": INFRA_VERSION},
        },
        "spec": {
            "group": INFRA_GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": format!("{kind}List"),
                "plural": plural,
                "singular": kind.to_lowercase(),
            },
            "versions": [{
                "name": INFRA_VERSION,
                "served": true,
                "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
            }],
        },
    })
}

/// The three infrastructure CRDs.
#[must_use]
pub fn infra_crds() -> Vec<Value> {
    vec![
        infra_crd("SandboxMachine", "sandboxmachines"),
        infra_crd("SandboxMachineTemplate", "sandboxmachinetemplates"),
        infra_crd("SandboxControlPlane", "sandboxcontrolplanes"),
        infra_crd("SandboxCluster", "sandboxclusters"),
    ]
}

/// The Secret Cluster API reads the workload cluster's kubeconfig from (`<cluster>-kubeconfig`,
/// key `value`).
#[must_use]
pub fn kubeconfig_secret(namespace: &str, cluster: &str, kubeconfig: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": format!("{cluster}-kubeconfig"),
            "namespace": namespace,
            "labels": {CLUSTER_NAME_LABEL: cluster},
        },
        "type": "cluster.x-k8s.io/secret",
        "stringData": {"value": kubeconfig},
    })
}

/// The cluster's control plane: the sandbox's own, always initialized.
#[must_use]
pub fn control_plane(namespace: &str, cluster: &str) -> Value {
    json!({
        "apiVersion": format!("{INFRA_GROUP}/{INFRA_VERSION}"),
        "kind": "SandboxControlPlane",
        "metadata": {"name": cluster, "namespace": namespace},
        "spec": {},
    })
}

/// The control plane's status under Cluster API's v1beta2 contract: initialized, and managed
/// outside Cluster API (as EKS or AKS control planes are), so Cluster API expects no control
/// plane Machines; without that it refuses to delete any Machine's Node ("no control plane
/// members").
#[must_use]
pub fn control_plane_status() -> Value {
    json!({"status": {
        "initialization": {"controlPlaneInitialized": true},
        "externalManagedControlPlane": true,
    }})
}

/// The cluster's infrastructure object (`SandboxCluster`): nothing to provision, the sandbox is
/// the cluster.
#[must_use]
pub fn infrastructure_cluster(namespace: &str, name: &str) -> Value {
    json!({
        "apiVersion": format!("{INFRA_GROUP}/{INFRA_VERSION}"),
        "kind": "SandboxCluster",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {},
    })
}

/// The infrastructure cluster's status under the v1beta2 contract: provisioned. Without an
/// infrastructure cluster reported provisioned the `Cluster`'s `InfrastructureReady` is `False`,
/// and a `MachineHealthCheck` then remediates nothing ("don't penalize any Machine/Node if the
/// cluster infrastructure is not ready").
#[must_use]
pub fn infrastructure_cluster_status() -> Value {
    json!({"status": {"initialization": {"provisioned": true}}})
}

/// The `Cluster`: its control plane is the sandbox's (at `host:port`), its infrastructure a
/// `SandboxCluster` of the same name.
#[must_use]
pub fn cluster(namespace: &str, name: &str, host: &str, port: u16) -> Value {
    json!({
        "apiVersion": format!("{CAPI_GROUP}/v1beta2"),
        "kind": "Cluster",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "controlPlaneRef": {"apiGroup": INFRA_GROUP, "kind": "SandboxControlPlane", "name": name},
            "infrastructureRef": {"apiGroup": INFRA_GROUP, "kind": "SandboxCluster", "name": name},
            "controlPlaneEndpoint": {"host": host, "port": port},
        },
    })
}

/// The machine template of a pool: its machines' nodes join `fleet`.
#[must_use]
pub fn machine_template(namespace: &str, name: &str, fleet: &str) -> Value {
    json!({
        "apiVersion": format!("{INFRA_GROUP}/{INFRA_VERSION}"),
        "kind": "SandboxMachineTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"template": {"spec": {"fleet": fleet}}},
    })
}

/// A `MachineSet` of `replicas` machines from template `name` (the webhook's defaults written
/// out: selector and template labels name the cluster; the bootstrap data is a fixed Secret name,
/// as no bootstrap provider runs).
#[must_use]
pub fn machine_set(namespace: &str, cluster: &str, name: &str, replicas: u32) -> Value {
    let labels = json!({CLUSTER_NAME_LABEL: cluster, POOL_LABEL: name});
    json!({
        "apiVersion": format!("{CAPI_GROUP}/v1beta2"),
        "kind": "MachineSet",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {CLUSTER_NAME_LABEL: cluster},
        },
        "spec": {
            "clusterName": cluster,
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "clusterName": cluster,
                    "bootstrap": {"dataSecretName": format!("{name}-bootstrap")},
                    "infrastructureRef": {"apiGroup": INFRA_GROUP, "kind": "SandboxMachineTemplate", "name": name},
                },
            },
        },
    })
}

/// A `MachineHealthCheck` over pool `pool`: a node `Ready` `Unknown` or `False` for
/// `timeout_seconds`, or a machine without a node for as long, is remediated (Cluster API deletes
/// the Machine and the `MachineSet` replaces it).
#[must_use]
pub fn machine_health_check(namespace: &str, cluster: &str, pool: &str, timeout_seconds: u32) -> Value {
    machine_health_check_with(namespace, cluster, pool, timeout_seconds, &[])
}

/// [`machine_health_check`] with more unhealthy node conditions: `(type, status, timeout
/// seconds)` each, e.g. `("GpuHealthy", "False", 8)` (a health check on the GPU condition too).
#[must_use]
pub fn machine_health_check_with(
    namespace: &str,
    cluster: &str,
    pool: &str,
    timeout_seconds: u32,
    more: &[(&str, &str, u32)],
) -> Value {
    let mut conditions = vec![
        json!({"type": "Ready", "status": "Unknown", "timeoutSeconds": timeout_seconds}),
        json!({"type": "Ready", "status": "False", "timeoutSeconds": timeout_seconds}),
    ];
    conditions.extend(
        more.iter().map(
            |(kind, status, timeout)| json!({"type": kind, "status": status, "timeoutSeconds": timeout}),
        ),
    );
    json!({
        "apiVersion": format!("{CAPI_GROUP}/v1beta2"),
        "kind": "MachineHealthCheck",
        "metadata": {"name": pool, "namespace": namespace},
        "spec": {
            "clusterName": cluster,
            "selector": {"matchLabels": {POOL_LABEL: pool}},
            "checks": {
                "nodeStartupTimeoutSeconds": timeout_seconds,
                "unhealthyNodeConditions": conditions,
            },
        },
    })
}

/// The provider ID of infrastructure machine `namespace/name`.
#[must_use]
pub fn provider_id(namespace: &str, name: &str) -> String {
    format!("{PROVIDER_ID_PREFIX}{namespace}/{name}")
}

/// The Node that infrastructure machine `namespace/name` brings up: named after the machine, with
/// the fleet's label and GPU labels; the fleet adopts it (status, Lease, pods).
#[must_use]
pub fn machine_node(shape: &NodeShape, namespace: &str, name: &str) -> Value {
    let labels = node_labels(shape, name);
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {"providerID": provider_id(namespace, name)},
    })
}

/// The infrastructure machine's provider ID and status once its node exists (v1beta2 contract).
#[must_use]
pub fn provisioned(provider_id: &str) -> (Value, Value) {
    (
        json!({"spec": {"providerID": provider_id}}),
        json!({"status": {"initialization": {"provisioned": true}}}),
    )
}

#[cfg(test)]
mod tests {
    use gpu_remediation_api::constants::GPU_COUNT_LABEL;

    use crate::fleet::FLEET_LABEL;
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn infrastructure_crds_carry_the_cluster_api_contract_label() {
        for crd in infra_crds() {
            assert_eq!(crd["metadata"]["labels"]["cluster.x-k8s.io/v1beta2"], "v1alpha1");
            assert_eq!(crd["spec"]["group"], INFRA_GROUP);
        }
    }

    #[test]
    fn the_machine_set_selects_what_its_template_labels_and_names_the_sandbox_template() {
        let set = machine_set("ns", "gpu", "pool", 2);
        assert_eq!(
            set["spec"]["selector"]["matchLabels"],
            set["spec"]["template"]["metadata"]["labels"]
        );
        let reference = &set["spec"]["template"]["spec"]["infrastructureRef"];
        assert_eq!(reference["kind"], "SandboxMachineTemplate");
        assert_eq!(reference["apiGroup"], INFRA_GROUP);
    }

    #[test]
    fn a_machines_node_is_named_after_it_and_carries_its_provider_id_and_the_fleet_label() {
        let shape = NodeShape {
            fleet: "capi-1".to_owned(),
            gpus: 8,
            product: "NVIDIA-H100-80GB-HBM3".to_owned(),
            labels: BTreeMap::new(),
        };
        let node = machine_node(&shape, "ns", "pool-abcde");
        assert_eq!(node["metadata"]["name"], "pool-abcde");
        assert_eq!(node["spec"]["providerID"], "sandbox-capi://ns/pool-abcde");
        assert_eq!(node["metadata"]["labels"][FLEET_LABEL], "capi-1");
        assert_eq!(node["metadata"]["labels"][GPU_COUNT_LABEL], "8");
    }

    #[test]
    fn a_health_check_can_watch_the_gpu_condition_beside_ready() {
        let check = machine_health_check_with("ns", "gpu", "pool", 60, &[("GpuHealthy", "False", 8)]);
        let conditions = check["spec"]["checks"]["unhealthyNodeConditions"]
            .as_array()
            .expect("a list");
        assert_eq!(conditions.len(), 3);
        assert_eq!(conditions[2]["type"], "GpuHealthy");
        assert_eq!(conditions[2]["status"], "False");
        assert_eq!(conditions[2]["timeoutSeconds"], 8);
        assert_eq!(conditions[0]["timeoutSeconds"], 60);
    }
}
