//! Leader election on a `coordination.k8s.io/v1` Lease: the elector acquires and renews the
//! Lease (through [`crate::write::lease`]) and keeps the [`crate::leader::FenceKeeper`] in step,
//! so that every other write is fenced by the claim it holds.
//!
//! - [`decision`]: when to acquire, renew, wait or step down (pure).
//! - [`elector`]: the loop that reads and writes the Lease and keeps the fence in step.
//! - [`fence_probe`]: whether the API server enforces the fence, judged from a new leader's probe
//!   (pure).
//! - [`identity`]: this replica's identity on the Lease, from its pod (pure).

pub mod decision;
pub mod elector;
pub mod fence_probe;
pub mod identity;

pub use decision::ElectionTimings;
pub use elector::{ElectionConfig, ElectionEnd, Elector, FenceRequirement, RunElectionError, lease_client};
