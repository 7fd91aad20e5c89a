//! The `resource.k8s.io` objects the controller reads and writes, as small serde structs holding
//! only the fields its decisions use (unknown fields are ignored on read).
//!
//! Why not k8s-openapi's types: the binaries build k8s-openapi with `v1_33`, which has no
//! `resource.k8s.io/v1` (GA in Kubernetes 1.34), and from 1.35 the API server serves only `v1`
//! of `ResourceClaim` and `ResourceSlice` (the betas are off by default). `DeviceTaintRule` exists
//! (KEP-5055) as `v1alpha3` from 1.33 (behind `DRADeviceTaints`), `v1beta2` from 1.36 and `v1` from
//! 1.37 ([`TaintRuleVersion`]); the selector lost fields between 1.33 and 1.35, and the fields below
//! (`driver`, `pool`, `device`; `key`, `value`, `effect`) are the ones every release and version
//! accepts, with the same meaning: the versions differ only in `apiVersion` for what the controller
//! writes (`timeAdded` is set by the server; the effect `None` exists in all three from 1.35 and is
//! not used). Shapes checked against `k8s.io/api` v0.35.4 `resource/v1` and `resource/v1alpha3`,
//! v0.36.3 `resource/v1beta2` and v0.37.0-beta.0 `resource/v1`.

use std::collections::BTreeMap;

use kube::{
    api::ApiResource,
    core::{GroupVersionKind, NotUsed, Object},
};
use serde::{Deserialize, Serialize};

/// The API group.
pub const GROUP: &str = "resource.k8s.io";
/// The version of `ResourceClaim` and `ResourceSlice` read (GA since 1.34).
pub const VERSION: &str = "v1";
/// The plural of `DeviceTaintRule`, as discovery names it.
pub const TAINT_RULES: &str = "devicetaintrules";

/// A version of `resource.k8s.io` that can serve `DeviceTaintRule`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TaintRuleVersion {
    /// GA, from Kubernetes 1.37.
    V1,
    /// Beta, from Kubernetes 1.36.
    V1beta2,
    /// Alpha, from Kubernetes 1.33, behind the `DRADeviceTaints` gate and
    /// `--runtime-config=resource.k8s.io/v1alpha3=true`.
    V1alpha3,
}

impl TaintRuleVersion {
    /// Every version, the most preferred (the most stable) first.
    pub const PREFERRED: [Self; 3] = [Self::V1, Self::V1beta2, Self::V1alpha3];

    /// The version's name (`v1beta2`).
    #[must_use]
    pub const fn version(self) -> &'static str {
        match self {
            Self::V1 => "v1",
            Self::V1beta2 => "v1beta2",
            Self::V1alpha3 => "v1alpha3",
        }
    }

    /// `resource.k8s.io/<version>`.
    #[must_use]
    pub fn group_version(self) -> String {
        format!("{GROUP}/{}", self.version())
    }

    /// The first of [`Self::PREFERRED`] that `served` holds (`None`: the server serves none).
    #[must_use]
    pub fn choose(served: &[Self]) -> Option<Self> {
        Self::PREFERRED.into_iter().find(|v| served.contains(v))
    }
}

impl std::fmt::Display for TaintRuleVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.group_version())
    }
}

/// `resource.k8s.io/v1` `ResourceSlice` (cluster-scoped; no status).
pub type ResourceSlice = Object<ResourceSliceSpec, NotUsed>;
/// `resource.k8s.io/v1` `ResourceClaim` (namespaced).
pub type ResourceClaim = Object<ResourceClaimSpec, ResourceClaimStatus>;
/// `resource.k8s.io` `DeviceTaintRule` (cluster-scoped), of any [`TaintRuleVersion`].
pub type DeviceTaintRule = Object<DeviceTaintRuleSpec, NotUsed>;

/// The `ApiResource` of `ResourceSlice`.
#[must_use]
pub fn resource_slices() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(GROUP, VERSION, "ResourceSlice"),
        "resourceslices",
    )
}

/// The `ApiResource` of `ResourceClaim`.
#[must_use]
pub fn resource_claims() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(GROUP, VERSION, "ResourceClaim"),
        "resourceclaims",
    )
}

/// The `ApiResource` of `DeviceTaintRule` in `version`.
#[must_use]
pub fn device_taint_rules(version: TaintRuleVersion) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(GROUP, version.version(), "DeviceTaintRule"),
        TAINT_RULES,
    )
}

/// `ResourceSlice` `spec`: one driver's devices in one pool, for one node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceSliceSpec {
    /// The driver's name (`gpu.nvidia.com`).
    pub driver: String,
    /// The pool the slice belongs to.
    pub pool: ResourcePool,
    /// The node whose local devices these are (absent for network-attached devices).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// The devices.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<Device>,
}

/// A pool: slices of an older `generation` are stale.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourcePool {
    /// The pool's name.
    pub name: String,
    /// Its generation; only slices of the highest one count.
    pub generation: i64,
    /// How many slices the pool has in this generation.
    pub resource_slice_count: i64,
}

/// One device in a slice.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    /// Unique within the pool.
    pub name: String,
    /// Attributes by (optionally domain-qualified) name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attributes: BTreeMap<String, DeviceAttribute>,
}

/// A device attribute: exactly one of its fields is set.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceAttribute {
    /// An integer.
    #[serde(default, rename = "int", skip_serializing_if = "Option::is_none")]
    pub int: Option<i64>,
    /// A boolean.
    #[serde(default, rename = "bool", skip_serializing_if = "Option::is_none")]
    pub bool: Option<bool>,
    /// A string.
    #[serde(default, rename = "string", skip_serializing_if = "Option::is_none")]
    pub string: Option<String>,
    /// A semantic version.
    #[serde(default, rename = "version", skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// `ResourceClaim` `spec` (read only; its contents do not matter to the mapping).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ResourceClaimSpec {
    /// What was asked for, kept as sent.
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub devices: serde_json::Value,
}

/// `ResourceClaim` `status`: what was allocated and to whom it is reserved.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceClaimStatus {
    /// Set once the scheduler allocated the claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation: Option<AllocationResult>,
    /// The consumers (pods) allowed to use the claim.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reserved_for: Vec<ConsumerReference>,
}

/// The allocation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocationResult {
    /// The devices allocated.
    #[serde(default)]
    pub devices: DeviceAllocationResult,
}

/// The devices allocated.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceAllocationResult {
    /// One per allocated device.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub results: Vec<AllocatedDevice>,
}

/// One allocated device, named as its slice names it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocatedDevice {
    /// The request it satisfies.
    #[serde(default)]
    pub request: String,
    /// The driver.
    pub driver: String,
    /// The pool.
    pub pool: String,
    /// The device's name in the pool.
    pub device: String,
}

/// A consumer a claim is reserved for.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConsumerReference {
    /// Empty for the core group (pods).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_group: String,
    /// `pods` for a pod.
    pub resource: String,
    /// Its name (in the claim's namespace).
    pub name: String,
    /// Its UID.
    pub uid: String,
}

/// `DeviceTaintRule` `spec`: a taint on the devices its selector picks.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceTaintRuleSpec {
    /// Which devices; every field set must match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_selector: Option<DeviceTaintSelector>,
    /// The taint.
    pub taint: DeviceTaint,
}

/// Which devices a `DeviceTaintRule` taints.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceTaintSelector {
    /// The driver.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    /// The pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// The device's name in the pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
}

/// A device taint.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceTaint {
    /// The key.
    pub key: String,
    /// The value.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub value: String,
    /// `NoSchedule`, `NoExecute` (or `None` from 1.35).
    pub effect: String,
}
