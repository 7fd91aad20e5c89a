//! When this replica is alive and when it is ready.
//!
//! Liveness (`/healthz`) is the process answering at all: a replica that lost its Lease exits
//! rather than reporting unhealthy. Readiness (`/readyz`) follows the design: ready after the
//! caches synced; and for the leader, only while its Lease is held. A follower with warm caches is
//! ready (it can take over at any moment, and a rolling update must be able to proceed); a replica
//! whose claim lapsed (it led but could not renew in time) is not ready until it exits.

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use crate::leader::{Fence, FenceError};

/// Why a replica is or is not ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    /// Caches synced, and leading with a current claim or following.
    Ready,
    /// The informer caches have not synced yet.
    CachesNotSynced,
    /// This replica led but its claim lapsed before a renewal: it is stepping down.
    LeaderClaimLapsed,
}

impl Readiness {
    /// A short human explanation, served as the `/readyz` body.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Ready => "ready",
            Self::CachesNotSynced => "caches not synced",
            Self::LeaderClaimLapsed => "leader claim lapsed: stepping down",
        }
    }
}

/// Decides readiness from the two facts it depends on.
#[must_use]
pub fn readiness(caches_synced: bool, claim: &Result<(), FenceError>) -> Readiness {
    if !caches_synced {
        return Readiness::CachesNotSynced;
    }
    match claim {
        Ok(()) | Err(FenceError::NotHolder) => Readiness::Ready,
        Err(FenceError::RenewDeadlinePassed { .. }) => Readiness::LeaderClaimLapsed,
    }
}

/// Shared health state: the controller marks the caches synced; the fence says the rest.
#[derive(Debug, Clone)]
pub struct Health {
    caches_synced: Arc<AtomicBool>,
    fence: Fence,
}

impl Health {
    /// Health for a replica whose leadership is `fence` (use `Fence::standalone()` without
    /// leader election).
    #[must_use]
    pub fn new(fence: Fence) -> Self {
        Self {
            caches_synced: Arc::new(AtomicBool::new(false)),
            fence,
        }
    }

    /// Call once every watch the controller needs has delivered its initial list.
    pub fn mark_caches_synced(&self) {
        self.caches_synced.store(true, Ordering::Release);
    }

    /// Readiness now.
    #[must_use]
    pub fn readiness(&self) -> Readiness {
        readiness(self.caches_synced.load(Ordering::Acquire), &self.fence.check())
    }

    /// Whether this replica may act now (drives the `leader` gauge).
    #[must_use]
    pub fn is_leader(&self) -> bool {
        self.fence.is_current()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_replica_is_not_ready_before_its_caches_sync_even_as_leader() {
        assert_eq!(readiness(false, &Ok(())), Readiness::CachesNotSynced);
        assert_eq!(
            readiness(false, &Err(FenceError::NotHolder)),
            Readiness::CachesNotSynced
        );
    }

    #[test]
    fn a_synced_follower_is_ready_to_take_over() {
        assert_eq!(readiness(true, &Err(FenceError::NotHolder)), Readiness::Ready);
    }

    #[test]
    fn a_synced_leader_holding_its_lease_is_ready() {
        assert_eq!(readiness(true, &Ok(())), Readiness::Ready);
    }

    #[test]
    fn a_leader_whose_claim_lapsed_is_not_ready() {
        let lapsed = Err(FenceError::RenewDeadlinePassed {
            overdue: Duration::from_secs(1),
        });
        assert_eq!(readiness(true, &lapsed), Readiness::LeaderClaimLapsed);
    }

    #[test]
    fn marking_caches_synced_makes_a_standalone_replica_ready() {
        let health = Health::new(Fence::standalone());
        assert_eq!(health.readiness(), Readiness::CachesNotSynced);
        health.mark_caches_synced();
        assert_eq!(health.clone().readiness(), Readiness::Ready);
        assert!(health.is_leader());
    }
}
