//! Dynamic Resource Allocation (`resource.k8s.io`), as far as GPU remediation needs it: which pods
//! hold a failed GPU (so a GPU-scoped drain evicts only those) and which device a failed GPU is
//! (so a quarantine can take only that device out of allocation).
//!
//! - [`wire`]: the few `resource.k8s.io` objects read and written, as small serde structs;
//! - [`holders`]: pure: failed GPU UUIDs + slices + claims + pods → the pods holding them, or why
//!   that is unknown;
//! - [`read`]: lists one node's slices and its pods' claims for [`holders`].

pub mod holders;
pub mod read;
pub mod wire;

pub use holders::{DeviceId, Holders, PodKey, pods_holding};
pub use read::{NodeDevices, ReadDevicesError, node_devices, pods_holding_on};
