//! A real local Kubernetes control plane plus a simulated GPU fleet, for e2e tests, `make demo` and
//! `make bench`.
//!
//! - [`ControlPlane`]: etcd, kube-apiserver, kube-controller-manager and kube-scheduler built from
//!   the pinned upstream release, on 127.0.0.1, that never outlive the process that started them.
//! - [`Fleet`]: simulated GPU nodes with heartbeats, and a simulated kubelet for their pods.
//! - [`dra`]: a simulated DRA driver publishing the fleet's GPUs as `ResourceSlice` devices.
//! - [`fault`]: what a GPU agent would report about a failing GPU.
//! - [`workload`]: `Deployments`, `StatefulSets`, PDBs, `DaemonSets` and special pods to put on a fleet.
//! - [`population`]: many Deployments behind PDBs spread over a whole fleet.
//! - [`demo`]: `make demo`, and installing `manifests/` on a sandbox.
//! - [`karpenter`]: upstream Karpenter (KWOK provider) running for a fleet; [`upstream`] finds,
//!   installs and starts the upstream controllers built from their pinned Go modules.
//! - [`capi`]: upstream Cluster API's core manager with the sandbox as its workload cluster, and
//!   the sandbox's own infrastructure provider.
//! - [`jobset`]: upstream `JobSet`'s controller manager and webhooks, and a `JobSet` gang builder.
//!
//! ```no_run
//! use std::time::Duration;
//! use gpu_sandbox::workload::{self, Budget, Workload};
//! use gpu_sandbox::{ControlPlane, ControlPlaneOptions, Fleet, FleetOptions, fault};
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let control_plane = ControlPlane::start(ControlPlaneOptions::default()).await?;
//! let client = control_plane.client();
//! let fleet = Fleet::start(client.clone(), FleetOptions { nodes: 3, ..FleetOptions::default() }).await?;
//! let app = Workload::new("default", "train").replicas(3).gpus(8).on_nodes(&fleet.node_names());
//! workload::create(&client, &app.deployment()).await?;
//! workload::create(&client, &app.pdb(&Budget::max_unavailable(1))).await?;
//! workload::wait_ready_pods(&client, "default", &app.selector(), 3, Duration::from_secs(60)).await?;
//! fault::set_gpu_condition(&client, &fleet.node_names()[0], "False", "XID79", "fell off the bus").await?;
//! // Evict with `control_plane.client_without_retry()`, so a 429 reaches you at once.
//! fleet.stop().await?;
//! control_plane.stop().await;
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]

pub mod bench;
pub mod capi;
pub mod controlplane;
pub mod demo;
pub mod dra;
pub mod fault;
pub mod fleet;
pub mod hardware;
pub mod jobset;
pub mod karpenter;
pub mod population;
pub mod provider;
pub mod real_node;
pub mod repair;
pub mod retry;
pub mod upstream;
pub mod workload;

pub use controlplane::start_error::StartControlPlaneError;
pub use controlplane::{ControlPlane, ControlPlaneOptions, Dra};
pub use fleet::{Fleet, FleetOptions};
