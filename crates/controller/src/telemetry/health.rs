//! When this replica is alive and when it is ready.
//!
//! Liveness (`/healthz`) is the process answering at all: a replica that lost its Lease exits
//! rather than reporting unhealthy. Readiness (`/readyz`) follows the design: ready after the
//! caches synced; and for the leader, only while its Lease is held. A follower with warm caches is
//! ready (it can take over at any moment, and a rolling update must be able to proceed); a replica
//! whose claim lapsed (it led but could not renew in time) is not ready until it exits, and nor is
//! one that cannot take part in the election at all (the Lease's namespace is missing, or it may
//! not read or write the Lease), nor one that refuses to lead because the API server's fence is
//! not proven enforced: the body says why.

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use crate::leader::{Fence, FenceError};

/// Why a replica is or is not ready.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// Caches synced, and leading with a current claim or following.
    Ready,
    /// The informer caches have not synced yet.
    CachesNotSynced,
    /// This replica led but its claim lapsed before a renewal: it is stepping down.
    LeaderClaimLapsed,
    /// This replica cannot take part in the leader election (the Lease's namespace is missing, or
    /// it may not read or write the Lease): it could never take over, so it is not ready.
    CannotTakePartInElection(Arc<str>),
}

impl Readiness {
    /// A short human explanation, served as the `/readyz` body.
    #[must_use]
    pub fn as_str(&self) -> std::borrow::Cow<'static, str> {
        match self {
            Self::Ready => "ready".into(),
            Self::CachesNotSynced => "caches not synced".into(),
            Self::LeaderClaimLapsed => "leader claim lapsed: stepping down".into(),
            Self::CannotTakePartInElection(why) => {
                format!("cannot take part in leader election: {why}").into()
            }
        }
    }
}

/// Decides readiness from the facts it depends on.
#[must_use]
pub fn readiness(
    caches_synced: bool,
    claim: &Result<(), FenceError>,
    election_problem: Option<Arc<str>>,
) -> Readiness {
    if !caches_synced {
        return Readiness::CachesNotSynced;
    }
    if let Some(why) = election_problem {
        return Readiness::CannotTakePartInElection(why);
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
        readiness(
            self.caches_synced.load(Ordering::Acquire),
            &self.fence.check(),
            self.fence.election_problem(),
        )
    }

    /// Whether this replica may act now (drives the `leader` gauge).
    #[must_use]
    pub fn is_leader(&self) -> bool {
        self.fence.is_current()
    }

    /// Whether this replica's last fence probe could not prove the fence enforced (drives the
    /// `fence_unproven` gauge).
    #[must_use]
    pub fn fence_unproven(&self) -> bool {
        self.fence.fence_unproven().is_some()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_replica_is_not_ready_before_its_caches_sync_even_as_leader() {
        assert_eq!(readiness(false, &Ok(()), None), Readiness::CachesNotSynced);
        assert_eq!(
            readiness(false, &Err(FenceError::NotHolder), None),
            Readiness::CachesNotSynced
        );
    }

    #[test]
    fn a_synced_follower_is_ready_to_take_over() {
        assert_eq!(
            readiness(true, &Err(FenceError::NotHolder), None),
            Readiness::Ready
        );
    }

    #[test]
    fn a_synced_leader_holding_its_lease_is_ready() {
        assert_eq!(readiness(true, &Ok(()), None), Readiness::Ready);
    }

    #[test]
    fn a_leader_whose_claim_lapsed_is_not_ready() {
        let lapsed = Err(FenceError::RenewDeadlinePassed {
            overdue: Duration::from_secs(1),
        });
        assert_eq!(readiness(true, &lapsed, None), Readiness::LeaderClaimLapsed);
    }

    #[test]
    fn a_replica_that_cannot_take_part_in_the_election_is_not_ready_and_says_why() {
        let why: Arc<str> = "no permission on the leader Lease gpu-remediation/gpu-remediator".into();
        let readiness = readiness(true, &Err(FenceError::NotHolder), Some(why));
        assert!(matches!(readiness, Readiness::CannotTakePartInElection(_)));
        assert_eq!(
            readiness.as_str(),
            "cannot take part in leader election: no permission on the leader Lease gpu-remediation/gpu-remediator"
        );
        let (fence, keeper) = Fence::keeper(None);
        let health = Health::new(fence);
        health.mark_caches_synced();
        assert_eq!(health.readiness(), Readiness::Ready);
        keeper.cannot_take_part("namespaces \"nowhere\" not found", true);
        assert!(matches!(
            health.readiness(),
            Readiness::CannotTakePartInElection(_)
        ));
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
