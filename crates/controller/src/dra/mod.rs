//! Dynamic Resource Allocation (`resource.k8s.io`), as far as GPU remediation needs it: which pods
//! hold a failed GPU (so a GPU-scoped drain evicts only those) and which device a failed GPU is
//! (so a quarantine can take only that device out of allocation).
//!
//! - [`wire`]: the few `resource.k8s.io` objects read and written, as small serde structs;
//! - [`holders`]: pure: failed GPU UUIDs + slices + claims + the agent's device-plugin assignment +
//!   pods → the pods holding them, or why that is unknown;
//! - [`device_plugin`]: pure: the device-plugin half of that, from the assignment the node's agent
//!   publishes (pods holding GPUs through `nvidia.com/...` resources are not DRA's, but a GPU-scoped
//!   drain must know them too);
//! - [`read`]: lists one node's slices, its pods' claims and the node's assignment for [`holders`].

pub mod device_plugin;
pub mod holders;
pub mod pod_key;
pub mod read;
pub mod wire;

pub use holders::{DeviceId, Holders, Sources, pods_holding};
pub use pod_key::PodKey;
pub use read::{NodeDevices, ReadDevicesError, node_devices, pods_holding_on};
