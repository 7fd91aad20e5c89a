//! The GPU health agent: probes the GPUs of one node (through NVML, or a JSON file in the sandbox),
//! decides whether they are healthy, and publishes the `GpuHealthy` node condition.
//!
//! Readings flow one way: a [`probe`] produces a [`readings::Snapshot`], [`assess`] turns it into
//! signals using the [`catalog`], [`health`] latches fatal ones and counts warnings, [`condition`]
//! shapes what goes on the Node with the hardware [`inventory`] and the device plugin's GPU assignment
//! read from the kubelet ([`pod_resources`]), and [`publish`] writes it. [`agent`] runs that loop.
//! XIDs also come from the [`kernel_log`] and a [`dcgm`] exporter, merged with NVML's by [`xid_paths`] and [`xid_dedup`].
//! On a DRA-only node the expected GPU count comes from its `ResourceSlice`s ([`dra_slices`]).
#![forbid(unsafe_code)]

pub mod agent;
pub mod assess;
pub mod boot_time;
pub mod catalog;
pub mod condition;
pub mod dcgm;
pub mod dra_slices;
pub mod health;
pub mod inventory;
pub mod kernel_log;
pub mod liveness;
pub mod pod_resources;
pub mod probe;
pub mod publish;
pub mod readings;
pub mod xid_dedup;
pub mod xid_paths;
