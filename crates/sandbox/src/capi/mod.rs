//! Cluster API itself against the sandbox: upstream Cluster API's core manager
//! (`sigs.k8s.io/cluster-api/core`: the `Cluster`, `MachineSet`, `Machine` and `MachineHealthCheck`
//! controllers, built from the pinned module in `tools/capi-manager`), with the sandbox serving as
//! its own workload cluster (the `<cluster>-kubeconfig` Secret points back at the same API server,
//! so Cluster API finds each Machine's Node there and drains it there).
//!
//! What is upstream: every controller and its logic (Machine creation by the `MachineSet`, node
//! lookup by provider ID, the Node annotations, the Machine finalizer, Cluster API's own drain
//! through the Eviction API, health checks and remediation) and the CRDs. What is ours: the
//! infrastructure and control plane kinds ([`objects::infra_crds`]) and the tiny infrastructure
//! provider that "boots" a `SandboxMachine` by creating its Node ([`infra`]); no bootstrap provider
//! runs (Machines name a bootstrap Secret directly). Cluster API's in-memory test provider was not
//! used: it serves its workload clusters from its own in-memory API servers, so its Nodes could
//! never be the sandbox's.
//!
//! The manager runs without leader election, with metrics and health probes on ephemeral
//! 127.0.0.1 ports, and its webhook server on a free port with the API server's serving
//! certificate; no webhook is registered with the API server (no cert-manager), so the objects
//! here spell out what the defaulting webhooks would have added.

pub mod infra;
pub mod objects;

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::{Api, Client};
use serde_json::Value;
use tokio::task::JoinHandle;

use crate::controlplane::OwnedProcess;
use crate::upstream::{self, StartUpstreamError};
use crate::{ControlPlane, Fleet};

/// The environment variable naming the Cluster API manager binary; unset: `tools/build.sh capi-manager`.
pub const BINARY_ENV: &str = "GPU_REMEDIATOR_CAPI";

/// How long Cluster API may take to see the cluster's control plane initialized.
const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// A `cluster.x-k8s.io/v1beta2` kind.
#[must_use]
pub fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(objects::CAPI_GROUP, "v1beta2", kind),
        plural,
    )
}

/// Cluster API running with one cluster (the sandbox) in one namespace; dropping it terminates
/// the manager and the infrastructure provider.
pub struct ClusterApi {
    process: OwnedProcess,
    infra: InfraTask,
    client: Client,
    namespace: String,
    cluster: String,
    fleet: String,
    log: std::path::PathBuf,
}

impl ClusterApi {
    /// Installs Cluster API's CRDs and the sandbox's infrastructure kinds, creates cluster
    /// `cluster` in `namespace` (the sandbox as its workload cluster), starts the infrastructure
    /// provider for `fleet` and the manager, and waits until Cluster API sees the control plane
    /// initialized. Call [`Fleet::adopt_joining_nodes`] on `fleet` so machines' nodes come up.
    pub async fn start(
        control_plane: &ControlPlane,
        fleet: &Fleet,
        namespace: &str,
        cluster: &str,
    ) -> Result<Self, StartUpstreamError> {
        let binary = upstream::locate("capi-manager", BINARY_ENV)?;
        let client = control_plane.client();
        upstream::install_crds(&client, &binary).await?;
        for crd in objects::infra_crds() {
            upstream::apply_crd(&client, &crd).await?;
        }
        let kubeconfig_path = control_plane.kubeconfig_path();
        let kubeconfig =
            std::fs::read_to_string(kubeconfig_path).map_err(|source| StartUpstreamError::Read {
                path: kubeconfig_path.to_owned(),
                source,
            })?;
        let secret: Secret =
            serde_json::from_value(objects::kubeconfig_secret(namespace, cluster, &kubeconfig))
                .expect("a kubeconfig Secret is a valid Secret");
        Api::<Secret>::namespaced(client.clone(), namespace)
            .patch(
                &format!("{cluster}-kubeconfig"),
                &PatchParams::apply("gpu-sandbox").force(),
                &Patch::Apply(&secret),
            )
            .await
            .map_err(|source| StartUpstreamError::Api {
                action: format!("writing the kubeconfig Secret of cluster {cluster}"),
                source,
            })?;
        apply_reported(
            &client,
            namespace,
            &infra_resource("SandboxControlPlane", "sandboxcontrolplanes"),
            &objects::control_plane(namespace, cluster),
            objects::control_plane_status(),
        )
        .await?;
        apply_reported(
            &client,
            namespace,
            &infra_resource("SandboxCluster", "sandboxclusters"),
            &objects::infrastructure_cluster(namespace, cluster),
            objects::infrastructure_cluster_status(),
        )
        .await?;
        let (host, port) = host_port(control_plane.server_url());
        upstream::apply_object(
            &client,
            Some(namespace),
            &resource("Cluster", "clusters"),
            &objects::cluster(namespace, cluster, &host, port),
        )
        .await?;

        let infra = tokio::spawn(infra::run(
            client.clone(),
            fleet.shape().clone(),
            namespace.to_owned(),
        ));
        let dir = control_plane.data_dir().join(format!("capi-{namespace}"));
        let certs = dir.join("webhook-certs");
        std::fs::create_dir_all(&certs).map_err(|source| StartUpstreamError::Write {
            path: certs.clone(),
            source,
        })?;
        for (from, to) in [("apiserver.crt", "tls.crt"), ("apiserver.key", "tls.key")] {
            let source_path = control_plane.data_dir().join("pki").join(from);
            std::fs::copy(&source_path, certs.join(to)).map_err(|source| StartUpstreamError::Write {
                path: certs.join(to),
                source,
            })?;
        }
        let webhook_port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .map(|address| address.port())
            .map_err(|source| StartUpstreamError::Write {
                path: certs.clone(),
                source,
            })?;
        let args = vec![
            "--leader-elect=false".to_owned(),
            "--diagnostics-address=127.0.0.1:0".to_owned(),
            "--insecure-diagnostics=true".to_owned(),
            "--health-addr=127.0.0.1:0".to_owned(),
            format!("--webhook-port={webhook_port}"),
            format!("--webhook-cert-dir={}", certs.display()),
            "--feature-gates=MachinePool=false,MachineSetPreflightChecks=false".to_owned(),
            "--v=2".to_owned(),
        ];
        let env = [("KUBECONFIG", kubeconfig_path.display().to_string())];
        let log = dir.join("capi-manager.log");
        let process = upstream::spawn("capi-manager", &binary, &env, &args, &log).await?;
        let capi = Self {
            process,
            infra: InfraTask(infra),
            client: client.clone(),
            namespace: namespace.to_owned(),
            cluster: cluster.to_owned(),
            fleet: fleet.name().to_owned(),
            log,
        };
        capi.wait_control_plane_initialized().await?;
        Ok(capi)
    }

    /// Creates machine pool `name`: a `SandboxMachineTemplate` and a `MachineSet` of `replicas`.
    pub async fn machine_set(&self, name: &str, replicas: u32) -> Result<(), StartUpstreamError> {
        let templates = infra_resource("SandboxMachineTemplate", "sandboxmachinetemplates");
        upstream::apply_object(
            &self.client,
            Some(&self.namespace),
            &templates,
            &objects::machine_template(&self.namespace, name, &self.fleet),
        )
        .await?;
        upstream::apply_object(
            &self.client,
            Some(&self.namespace),
            &resource("MachineSet", "machinesets"),
            &objects::machine_set(&self.namespace, &self.cluster, name, replicas),
        )
        .await
    }

    /// Creates a `MachineHealthCheck` over pool `pool` ([`objects::machine_health_check`]).
    pub async fn health_check(&self, pool: &str, timeout_seconds: u32) -> Result<(), StartUpstreamError> {
        self.health_check_with(pool, timeout_seconds, &[]).await
    }

    /// Creates a `MachineHealthCheck` over pool `pool` that also watches the conditions `more`
    /// ([`objects::machine_health_check_with`]).
    pub async fn health_check_with(
        &self,
        pool: &str,
        timeout_seconds: u32,
        more: &[(&str, &str, u32)],
    ) -> Result<(), StartUpstreamError> {
        upstream::apply_object(
            &self.client,
            Some(&self.namespace),
            &resource("MachineHealthCheck", "machinehealthchecks"),
            &objects::machine_health_check_with(&self.namespace, &self.cluster, pool, timeout_seconds, more),
        )
        .await
    }

    /// The last `lines` lines of the manager's log.
    #[must_use]
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }

    /// The last `lines` lines of the manager's log that mention `name`.
    #[must_use]
    pub fn log_about(&self, name: &str, lines: usize) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let about: Vec<&str> = log.lines().filter(|line| line.contains(name)).collect();
        about[about.len().saturating_sub(lines)..].join("\n")
    }

    /// Terminates the manager and the infrastructure provider.
    pub async fn stop(self) {
        drop(self.infra);
        self.process.terminate().await;
    }

    async fn wait_control_plane_initialized(&self) -> Result<(), StartUpstreamError> {
        let clusters: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            &self.namespace,
            &resource("Cluster", "clusters"),
        );
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        loop {
            let initialized = clusters
                .get_opt(&self.cluster)
                .await
                .ok()
                .flatten()
                .is_some_and(|cluster| {
                    cluster
                        .data
                        .pointer("/status/initialization/controlPlaneInitialized")
                        == Some(&Value::Bool(true))
                });
            if initialized {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(StartUpstreamError::NotReady {
                    what: format!("Cluster API's Cluster {}/{}", self.namespace, self.cluster),
                    waited: READY_TIMEOUT,
                    log_tail: self.process.log_tail(30),
                });
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

impl std::fmt::Debug for ClusterApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterApi")
            .field("namespace", &self.namespace)
            .field("cluster", &self.cluster)
            .finish_non_exhaustive()
    }
}

/// The infrastructure provider's task, aborted when dropped.
struct InfraTask(JoinHandle<()>);

impl Drop for InfraTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn infra_resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(objects::INFRA_GROUP, objects::INFRA_VERSION, kind),
        plural,
    )
}

/// Server-side applies `object` (one of the sandbox's own kinds, named like the cluster) and
/// writes its `status`, as the provider that owns the kind would report it.
async fn apply_reported(
    client: &Client,
    namespace: &str,
    resource: &ApiResource,
    object: &Value,
    status: Value,
) -> Result<(), StartUpstreamError> {
    upstream::apply_object(client, Some(namespace), resource, object).await?;
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    Api::<DynamicObject>::namespaced_with(client.clone(), namespace, resource)
        .patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await
        .map(|_| ())
        .map_err(|source| StartUpstreamError::Api {
            action: format!("reporting the status of {} {namespace}/{name}", resource.kind),
            source,
        })
}

/// `https://HOST:PORT` split.
fn host_port(url: &str) -> (String, u16) {
    let authority = url.split("://").nth(1).unwrap_or(url);
    let (host, port) = authority.rsplit_once(':').unwrap_or((authority, "443"));
    (host.to_owned(), port.trim_end_matches('/').parse().unwrap_or(443))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_url_splits_into_host_and_port() {
        assert_eq!(
            host_port("https://127.0.0.1:6443"),
            ("127.0.0.1".to_owned(), 6443)
        );
    }
}
