//! A real local Kubernetes control plane plus a simulated GPU fleet, for e2e tests, `make demo` and
//! `make bench`.
//!
//! - [`ControlPlane`]: etcd, kube-apiserver, kube-controller-manager and kube-scheduler built from
//!   the pinned upstream release, on 127.0.0.1, that never outlive the process that started them.
#![forbid(unsafe_code)]

pub mod controlplane;

pub use controlplane::{ControlPlane, ControlPlaneOptions, StartControlPlaneError};
