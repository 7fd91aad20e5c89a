//! The `gpuremediation.dev/v1alpha1` API: the `GpuRemediationPolicy` and `GpuRemediation` custom
//! resources, the constants every binary shares, and the pure validation that does not need an API
//! server.
//!
//! Both kinds are cluster-scoped because the nodes they govern are.
#![forbid(unsafe_code)]

pub mod bounds;
pub mod constants;
pub mod correlated;
pub mod crds;
pub mod diagnostics;
pub mod duration;
pub mod gangs;
pub mod gpu_pods;
pub mod hardware;
pub mod ladder;
pub mod ladder_schema;
pub mod names;
pub mod node_job;
pub mod object_reference;
pub mod pod_gpus;
pub mod policy;
pub mod remediation;
pub mod safety;
pub mod schema;
pub mod selector;
pub mod text;
pub mod unknown_fields;
pub mod validate;
pub mod validation;
pub mod violation;

pub use duration::Duration;
pub use hardware::{GpuHardwareRecord, GpuHardwareRecordSpec};
pub use policy::{GpuRemediationPolicy, GpuRemediationPolicySpec, GpuRemediationPolicyStatus};
pub use remediation::{GpuRemediation, GpuRemediationSpec, GpuRemediationStatus, Phase};

/// The API group of both kinds.
pub const GROUP: &str = "gpuremediation.dev";
/// The served and stored version of both kinds.
pub const VERSION: &str = "v1alpha1";

/// Whether `value` is its type's default (zero, empty): for `skip_serializing_if` on counts.
pub(crate) fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}
