//! Leader election on a `coordination.k8s.io/v1` Lease, with fencing: a replica acts only while its
//! claim on the Lease is current, which every mutating call checks first through a [`Fence`].
//!
//! - [`fence`]: the [`Fence`] handle reconcilers check, and the [`FenceKeeper`] the elector writes.

pub mod fence;

pub use fence::{Fence, FenceError, FenceKeeper};
