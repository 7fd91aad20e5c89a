//! Leader election on a `coordination.k8s.io/v1` Lease, with fencing: a replica acts only while its
//! claim on the Lease is current, which every mutating call checks first through a [`Fence`].
//!
//! - [`fence`]: the [`Fence`] handle reconcilers check, and the [`FenceKeeper`] the elector writes.
//! - [`decision`]: when to acquire, renew, wait or step down (pure).
//! - [`elector`]: the loop that reads and writes the Lease and keeps the fence in step.
//! - [`freeze`]: a test-only hook that stops the process before a chosen write.

pub mod decision;
pub mod elector;
pub mod fence;
pub mod freeze;

pub use decision::ElectionTimings;
pub use elector::{ElectionConfig, ElectionEnd, Elector, RunElectionError, lease_client};
pub use fence::{Fence, FenceError, FenceKeeper};
