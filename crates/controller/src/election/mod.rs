//! Leader election on a `coordination.k8s.io/v1` Lease: the elector acquires and renews the
//! Lease (through [`crate::write::lease`]) and keeps the [`crate::leader::FenceKeeper`] in step,
//! so that every other write is fenced by the claim it holds.
//!
//! - [`decision`]: when to acquire, renew, wait or step down (pure).
//! - [`elector`]: the loop that reads and writes the Lease and keeps the fence in step.

pub mod decision;
pub mod elector;

pub use decision::ElectionTimings;
pub use elector::{ElectionConfig, ElectionEnd, Elector, RunElectionError, lease_client};
