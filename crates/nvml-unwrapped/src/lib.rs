//! The NVML calls the agent needs that nvml-wrapper 0.13 binds (`NvmlLib` has the symbols) but
//! offers no safe method for, or whose method drops what the agent needs. The agent forbids
//! `unsafe`; this crate makes those calls through the library nvml-wrapper already loaded and
//! returns plain values. A library without a symbol answers [`NvmlError::FailedToLoadSymbol`], as
//! nvml-wrapper's own methods do.
//!
//! - [`fabric`]: `nvmlDeviceGetGpuFabricInfo`, the NVLink fabric registration;
//! - [`mig`]: `nvmlDeviceGetGpuInstanceId` and `nvmlDeviceGetComputeInstanceId` of a MIG device;
//! - [`event`]: `nvmlEventSetWait_v2` keeping the event's GPU and compute instance, which
//!   nvml-wrapper's `EventSet::wait` drops.
//!
//! [`NvmlError::FailedToLoadSymbol`]: nvml_wrapper::error::NvmlError::FailedToLoadSymbol

pub mod event;
pub mod fabric;
pub mod mig;

pub use fabric::{FabricInfo, FabricState, gpu_fabric_info};
