//! Karpenter itself (upstream `sigs.k8s.io/karpenter/kwok`: Karpenter's controllers with its KWOK
//! cloud provider, built from the pinned module in `tools/karpenter-kwok`) running against the
//! sandbox for one fleet. The KWOK provider "launches" an instance by creating its Node object; the
//! fleet adopts those nodes ([`Fleet::adopt_joining_nodes`]): they become `Ready`, run pods and
//! renew Leases like the fleet's own. Karpenter's provisioning, registration, termination (its
//! finalizer and its drain through the Eviction API), consolidation and, when enabled, node repair
//! are all upstream code; the sandbox supplies only what a cloud account would: an instance type,
//! a node class marked `Ready`, and a `NodePool`.
//!
//! Karpenter runs with leader election off, no webhooks (it has none since v1.1), metrics and
//! health probes on ephemeral ports, and a one-second provisioning batch window.

pub mod objects;

use std::path::PathBuf;
use std::time::Duration;

use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::{Api, Client};

use crate::controlplane::OwnedProcess;
use crate::upstream::{self, StartUpstreamError};
use crate::{ControlPlane, Fleet};

pub use objects::Disruption;

/// The environment variable naming the Karpenter (KWOK) binary; unset: `tools/build.sh karpenter-kwok`.
pub const BINARY_ENV: &str = "GPU_REMEDIATOR_KARPENTER";

/// How long Karpenter may take to report the pool `Ready`.
const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// How to run Karpenter.
#[derive(Debug, Clone, Default)]
pub struct KarpenterOptions {
    /// Feature gate `NodeRepair`: Karpenter replaces nodes whose conditions match its provider's
    /// repair policies (for KWOK: `Ready` `False` or `Unknown` for 10 minutes).
    pub node_repair: bool,
    /// The pool's consolidation.
    pub disruption: Disruption,
    /// The kubeconfig Karpenter talks with (default: the sandbox admin's). The bench gives it an
    /// identity of its own so the API server's audit log can tell its requests apart.
    pub kubeconfig: Option<PathBuf>,
}

/// `karpenter.sh/v1` `NodePool`.
#[must_use]
pub fn node_pool_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("karpenter.sh", "v1", "NodePool"),
        "nodepools",
    )
}

/// `karpenter.sh/v1` `NodeClaim`.
#[must_use]
pub fn node_claim_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("karpenter.sh", "v1", "NodeClaim"),
        "nodeclaims",
    )
}

fn node_class_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(objects::NODE_CLASS_GROUP, "v1alpha1", "KWOKNodeClass"),
        "kwoknodeclasses",
    )
}

/// Karpenter running for one or more fleets (a `NodePool` each); dropping it terminates the
/// process.
#[derive(Debug)]
pub struct Karpenter {
    process: OwnedProcess,
    pools: Vec<String>,
    log: PathBuf,
}

impl Karpenter {
    /// Installs Karpenter's CRDs, the fleet's instance type, node class and `NodePool`, starts
    /// Karpenter and waits until it reports the pool `Ready`. Call
    /// [`Fleet::adopt_joining_nodes`] on `fleet` so the nodes it launches come up.
    pub async fn start(
        control_plane: &ControlPlane,
        fleet: &Fleet,
        options: &KarpenterOptions,
    ) -> Result<Self, StartUpstreamError> {
        Self::start_for_fleets(control_plane, &[fleet], options).await
    }

    /// As [`Karpenter::start`], one process for several fleets: a node class and a `NodePool`
    /// per fleet (each named after its fleet), the fleets' instance types in one file. One
    /// Karpenter per cluster, as in production: two would both reconcile every pool.
    pub async fn start_for_fleets(
        control_plane: &ControlPlane,
        fleets: &[&Fleet],
        options: &KarpenterOptions,
    ) -> Result<Self, StartUpstreamError> {
        let binary = upstream::locate("karpenter-kwok", BINARY_ENV)?;
        let client = control_plane.client();
        upstream::install_crds(&client, &binary).await?;
        let names: Vec<String> = fleets.iter().map(|f| f.shape().fleet.clone()).collect();
        let dir = control_plane
            .data_dir()
            .join(format!("karpenter-{}", names.join("-")));
        std::fs::create_dir_all(&dir).map_err(|source| StartUpstreamError::Write {
            path: dir.clone(),
            source,
        })?;
        let types_path = dir.join("instance-types.json");
        let shapes: Vec<&crate::fleet::NodeShape> = fleets.iter().map(|f| f.shape()).collect();
        std::fs::write(&types_path, objects::instance_types_of(&shapes).to_string()).map_err(|source| {
            StartUpstreamError::Write {
                path: types_path.clone(),
                source,
            }
        })?;
        for shape in shapes {
            upstream::apply_object(&client, None, &node_class_resource(), &objects::node_class(shape))
                .await?;
            Api::<DynamicObject>::all_with(client.clone(), &node_class_resource())
                .patch_status(
                    &shape.fleet,
                    &PatchParams::default(),
                    &Patch::Merge(objects::node_class_ready_status(
                        &jiff::Timestamp::now().to_string(),
                    )),
                )
                .await
                .map_err(|source| StartUpstreamError::Api {
                    action: format!("marking KWOKNodeClass {} Ready", shape.fleet),
                    source,
                })?;
            upstream::apply_object(
                &client,
                None,
                &node_pool_resource(),
                &objects::node_pool(shape, &options.disruption),
            )
            .await?;
        }

        let log = dir.join("karpenter.log");
        let env = [
            (
                "KUBECONFIG",
                options
                    .kubeconfig
                    .as_deref()
                    .unwrap_or(control_plane.kubeconfig_path())
                    .display()
                    .to_string(),
            ),
            ("DISABLE_LEADER_ELECTION", "true".to_owned()),
            ("METRICS_PORT", "0".to_owned()),
            ("HEALTH_PROBE_PORT", "0".to_owned()),
            ("SYSTEM_NAMESPACE", "kube-system".to_owned()),
            ("LOG_LEVEL", "debug".to_owned()),
            ("BATCH_IDLE_DURATION", "1s".to_owned()),
            ("BATCH_MAX_DURATION", "3s".to_owned()),
            ("INSTANCE_TYPES_FILE_PATH", types_path.display().to_string()),
            (
                "FEATURE_GATES",
                format!(
                    "NodeRepair={},ReservedCapacity=false,SpotToSpotConsolidation=false,NodeOverlay=false,\
                     StaticCapacity=false,CapacityBuffer=false",
                    options.node_repair
                ),
            ),
        ];
        let process = upstream::spawn("karpenter", &binary, &env, &[], &log).await?;
        let karpenter = Self {
            process,
            pools: names,
            log,
        };
        for pool in &karpenter.pools {
            karpenter.wait_pool_ready(&client, pool).await?;
        }
        Ok(karpenter)
    }

    /// The (first) fleet's `NodePool` (named after the fleet).
    #[must_use]
    pub fn pool(&self) -> &str {
        self.pools.first().map_or("", String::as_str)
    }

    /// Karpenter's log file.
    #[must_use]
    pub fn log_path(&self) -> &std::path::Path {
        &self.log
    }

    /// The last `lines` lines of Karpenter's log.
    #[must_use]
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }

    /// Terminates Karpenter.
    pub async fn stop(self) {
        self.process.terminate().await;
    }

    async fn wait_pool_ready(&self, client: &Client, pool: &str) -> Result<(), StartUpstreamError> {
        let pools: Api<DynamicObject> = Api::all_with(client.clone(), &node_pool_resource());
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        loop {
            let ready = pools.get_opt(pool).await.ok().flatten().is_some_and(|pool| {
                pool.data
                    .pointer("/status/conditions")
                    .and_then(serde_json::Value::as_array)
                    .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
            });
            if ready {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(StartUpstreamError::NotReady {
                    what: format!("Karpenter's NodePool {pool}"),
                    waited: READY_TIMEOUT,
                    log_tail: self.process.log_tail(30),
                });
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}
