//! A real local Kubernetes control plane plus a simulated GPU fleet, for e2e tests, `make demo` and
//! `make bench`.
//!
//! - [`ControlPlane`]: etcd, kube-apiserver, kube-controller-manager and kube-scheduler built from
//!   the pinned upstream release, on 127.0.0.1, that never outlive the process that started them.
//! - [`Fleet`]: simulated GPU nodes with heartbeats, and a simulated kubelet for their pods.
//! - [`fault`]: what a GPU agent would report about a failing GPU.
//! - [`workload`]: `Deployments`, `StatefulSets`, PDBs, `DaemonSets` and special pods to put on a fleet.
//! - [`population`]: many Deployments behind PDBs spread over a whole fleet.
//! - [`demo`]: `make demo`, and installing `manifests/` on a sandbox.
#![forbid(unsafe_code)]

pub mod bench;
pub mod controlplane;
pub mod demo;
pub mod fault;
pub mod fleet;
pub mod population;
pub mod provider;
pub mod workload;

pub use controlplane::{ControlPlane, ControlPlaneOptions, StartControlPlaneError};
pub use fleet::{Fleet, FleetOptions};
