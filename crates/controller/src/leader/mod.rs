//! Fencing: a replica acts only while its claim on the leader Lease is current, which every
//! mutating call checks first through a [`Fence`]. The election that keeps the claim is
//! [`crate::election`]; this module is what the writer and the reconcilers need of it, below them.
//!
//! - [`fence`]: the [`Fence`] handle reconcilers check, and the [`FenceKeeper`] the elector writes.
//! - [`freeze`]: a test-only hook that stops the process before a chosen write.

pub mod fence;
pub mod freeze;

pub use fence::{Fence, FenceError, FenceKeeper, claim_of};
