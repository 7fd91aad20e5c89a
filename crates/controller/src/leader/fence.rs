//! The fence: the one question every mutating API call asks first, "is this replica's claim on
//! the leader Lease still current?".
//!
//! A [`Fence`] is a cheap, cloneable, read-only view of the claim; the elector (see
//! `leader::election`) holds the matching [`FenceKeeper`] and extends or revokes the claim. The
//! claim is current only while both hold:
//!
//! - this replica holds the Lease (the last acquire or renew it sent succeeded), and
//! - the local *monotonic* clock has not passed the renew deadline, counted from the instant the
//!   last successful acquire/renew request was *sent*. A replica that is frozen (GC pause, SIGSTOP,
//!   a partition) therefore fences itself even if nobody tells it that it lost the Lease: another
//!   replica may only take over `leaseDuration` after it *observed* our last renew, which is later
//!   than we sent it, and the renew deadline is shorter than the lease duration.
//!
//! Why a deadline and not only a flag: a flag flipped by the renew loop is only as fresh as the
//! loop; if the loop itself is stuck, the flag lies. The deadline expires by itself.
//!
//! Building one:
//! - leader-elected run: [`Fence::keeper`] gives an unheld fence and its keeper; hand the keeper to
//!   the elector and clones of the fence to every reconciler.
//! - single replica (`--leader-elect=false`) and tests that do not exercise leadership:
//!   [`Fence::standalone`], which is always current.
//! - tests of fencing itself: [`Fence::keeper`], then [`FenceKeeper::hold_until`] /
//!   [`FenceKeeper::revoke`] (the clock is `tokio::time`, so `#[tokio::test(start_paused = true)]`
//!   can move it).

use std::{sync::Arc, time::Duration};

use tokio::{sync::watch, time::Instant};

/// Why a replica must not act now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FenceError {
    /// This replica does not hold the leader Lease (never acquired it, lost it, or released it).
    #[error("not the leader: this replica does not hold the leader Lease")]
    NotHolder,
    /// This replica held the Lease but has not renewed it in time; another replica may take over.
    #[error("leader claim expired {overdue:?} ago: the Lease was not renewed before the renew deadline")]
    RenewDeadlinePassed {
        /// How long ago the deadline passed.
        overdue: Duration,
    },
}

/// The state of this replica's claim, as the keeper last recorded it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Claim {
    /// Leader election is off: this replica is the only one and always acts.
    Standalone,
    /// Not holding the Lease.
    NotHeld,
    /// Holding the Lease; acting is allowed until this instant of the local monotonic clock.
    HeldUntil(Instant),
}

impl Claim {
    fn check(self, now: Instant) -> Result<(), FenceError> {
        match self {
            Self::Standalone => Ok(()),
            Self::NotHeld => Err(FenceError::NotHolder),
            Self::HeldUntil(deadline) if now < deadline => Ok(()),
            Self::HeldUntil(deadline) => Err(FenceError::RenewDeadlinePassed {
                overdue: now - deadline,
            }),
        }
    }
}

/// Why this replica cannot take part in the election at all (the Lease's namespace is missing, or
/// it may not read or write the Lease), as the elector last found; `None` while it can.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Participation {
    problem: Option<Arc<str>>,
    /// Whether a write found it: a later successful read does not show that a write would pass.
    on_write: bool,
}

/// What the last probe of the API server's fence found (see `election::fence_probe`): `None`
/// until a probe failed to prove it, and again once one proves it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct FenceProof {
    /// Why the fence is not proven enforced.
    unproven: Option<Arc<str>>,
    /// Whether this replica refuses to lead because of it (the default; `--allow-unfenced` leads
    /// anyway).
    refusing: bool,
}

/// The claim a holder's writes carry: `<holder>/<leaseTransitions>`, the value of
/// `gpuremediation.dev/claim` that the fence policy compares with the Lease.
#[must_use]
pub fn claim_of(holder: &str, transitions: i32) -> String {
    format!("{holder}/{transitions}")
}

/// A read-only handle on this replica's leader claim. Clone it freely (it is a channel receiver);
/// call [`Fence::check`] immediately before every create, update, patch, delete or eviction.
#[derive(Debug, Clone)]
pub struct Fence {
    claim: watch::Receiver<Claim>,
    participation: watch::Receiver<Participation>,
    holder: watch::Receiver<Option<Arc<str>>>,
    proof: watch::Receiver<FenceProof>,
    lease_namespace: Option<Arc<str>>,
}

/// The writing side of a [`Fence`], held by the elector only. Dropping it leaves the last claim in
/// place, which still expires at its deadline.
#[derive(Debug)]
pub struct FenceKeeper {
    claim: watch::Sender<Claim>,
    participation: watch::Sender<Participation>,
    holder: watch::Sender<Option<Arc<str>>>,
    proof: watch::Sender<FenceProof>,
}

impl Fence {
    /// A fence that is always current: for a single-replica run with leader election disabled, and
    /// for tests that are not about leadership.
    #[must_use]
    pub fn standalone() -> Self {
        // The sender is dropped at once: a standalone claim never changes.
        let (_, claim) = watch::channel(Claim::Standalone);
        let (_, participation) = watch::channel(Participation::default());
        let (_, holder) = watch::channel(None);
        let (_, proof) = watch::channel(FenceProof::default());
        Self {
            claim,
            participation,
            holder,
            proof,
            lease_namespace: None,
        }
    }

    /// An unheld fence and the keeper that the elector uses to extend and revoke it.
    /// `lease_namespace` is the namespace of the leader Lease (`--lease-namespace`), stamped on
    /// every object written under a claim as the `gpuremediation.dev/fenced` label; `None` stamps
    /// no label (tests of the claim alone).
    #[must_use]
    pub fn keeper(lease_namespace: Option<&str>) -> (Self, FenceKeeper) {
        let (sender, claim) = watch::channel(Claim::NotHeld);
        let (participating, participation) = watch::channel(Participation::default());
        let (holding, holder) = watch::channel(None);
        let (proving, proof) = watch::channel(FenceProof::default());
        (
            Self {
                claim,
                participation,
                holder,
                proof,
                lease_namespace: lease_namespace.map(Arc::from),
            },
            FenceKeeper {
                claim: sender,
                participation: participating,
                holder: holding,
                proof: proving,
            },
        )
    }

    /// The claim this replica's writes carry (`<holder>/<leaseTransitions>`, the value of
    /// `gpuremediation.dev/claim`) while it is current; `None` when it is not, or without leader
    /// election. The admission policy `manifests/controller/fence-policy.yaml` compares it with
    /// the Lease.
    #[must_use]
    pub fn claim(&self) -> Option<Arc<str>> {
        if !self.is_current() {
            return None;
        }
        self.holder.borrow().clone()
    }

    /// The namespace of the Lease this replica's claims are on (given to [`Fence::keeper`]): the
    /// value of the `gpuremediation.dev/fenced` label its writes carry, which the fence policy's
    /// fail-closed binding selects. `None` without leader election.
    #[must_use]
    pub fn lease_namespace(&self) -> Option<Arc<str>> {
        self.lease_namespace.clone()
    }

    /// Why this replica cannot take part in the leader election (it can never lead, so it is not
    /// ready), or `None` while it can: it may not use the Lease, or it refuses to lead because the
    /// API server's fence is not proven enforced.
    #[must_use]
    pub fn election_problem(&self) -> Option<Arc<str>> {
        if let Some(problem) = self.participation.borrow().problem.clone() {
            return Some(problem);
        }
        let proof = self.proof.borrow();
        proof.unproven.as_ref().filter(|_| proof.refusing).map(|why| {
            format!("refusing to lead: the API server's fence is not proven enforced: {why}").into()
        })
    }

    /// Why the last probe could not prove that the API server enforces the fence (whether or not
    /// this replica leads anyway), or `None`: not probed yet, or proven.
    #[must_use]
    pub fn fence_unproven(&self) -> Option<Arc<str>> {
        self.proof.borrow().unproven.clone()
    }

    /// `Ok` when this replica may act now; call it right before every mutating API call and do not
    /// make the call on `Err`. Cheap: a read lock and a clock read.
    pub fn check(&self) -> Result<(), FenceError> {
        let claim = *self.claim.borrow();
        claim.check(Instant::now())
    }

    /// Whether [`Fence::check`] passes now.
    #[must_use]
    pub fn is_current(&self) -> bool {
        self.check().is_ok()
    }

    /// Waits until the claim is current (returns at once if it already is). Use it to hold a
    /// follower's reconcilers back until this replica becomes leader.
    pub async fn acquired(&self) {
        let mut claim = self.claim.clone();
        loop {
            if claim.borrow_and_update().check(Instant::now()).is_ok() {
                return;
            }
            if claim.changed().await.is_err() {
                // The keeper is gone and the claim is not current: it never will be again.
                std::future::pending::<()>().await;
            }
        }
    }

    /// Waits until the claim stops being current: revoked by the keeper, or its deadline passed
    /// without a renewal. Never returns for a standalone fence. Use it to abort in-flight work.
    pub async fn lost(&self) {
        let mut claim = self.claim.clone();
        loop {
            let current = *claim.borrow_and_update();
            match current {
                Claim::Standalone => std::future::pending::<()>().await,
                Claim::NotHeld => return,
                Claim::HeldUntil(deadline) => {
                    if Instant::now() >= deadline {
                        return;
                    }
                    tokio::select! {
                        () = tokio::time::sleep_until(deadline) => {}
                        changed = claim.changed() => {
                            if changed.is_err() {
                                // No more renewals can come: the claim ends at its deadline.
                                tokio::time::sleep_until(deadline).await;
                                return;
                            }
                        }
                    }
                }
            }
        }
    }
}

impl FenceKeeper {
    /// Records that this replica holds the Lease and may act until `deadline` (local monotonic
    /// clock): the instant the successful acquire/renew request was sent plus the renew deadline.
    pub fn hold_until(&self, deadline: Instant) {
        self.claim.send_replace(Claim::HeldUntil(deadline));
    }

    /// Records that this replica no longer holds the Lease: every check fails from now on.
    pub fn revoke(&self) {
        self.claim.send_replace(Claim::NotHeld);
    }

    /// Records which claim the Lease now names: `holder` with `transitions` (`leaseTransitions`);
    /// returns it.
    #[allow(
        clippy::must_use_candidate,
        reason = "recording is the point; the elector alone keeps what it returns"
    )]
    pub fn claimed_as(&self, holder: &str, transitions: i32) -> Arc<str> {
        let claim: Arc<str> = claim_of(holder, transitions).into();
        self.holder.send_if_modified(|current| {
            (current.as_ref() != Some(&claim))
                .then(|| *current = Some(claim.clone()))
                .is_some()
        });
        claim
    }

    /// Whether the claim is current now, as the fences see it.
    #[must_use]
    pub fn is_current(&self) -> bool {
        self.claim.borrow().check(Instant::now()).is_ok()
    }

    /// Records that this replica cannot take part in the election, and why; `on_write` when a
    /// write of the Lease found it (only a successful write clears that).
    pub fn cannot_take_part(&self, why: impl Into<Arc<str>>, on_write: bool) {
        self.participation.send_replace(Participation {
            problem: Some(why.into()),
            on_write,
        });
    }

    /// Records that a read of the Lease succeeded: clears a problem a read found.
    pub fn read_succeeded(&self) {
        self.participation.send_if_modified(|p| {
            let clear = p.problem.is_some() && !p.on_write;
            if clear {
                *p = Participation::default();
            }
            clear
        });
    }

    /// Records that a probe proved the API server's fence enforced.
    pub fn fence_proven(&self) {
        self.proof.send_if_modified(|proof| {
            let was = proof.unproven.is_some();
            *proof = FenceProof::default();
            was
        });
    }

    /// Records that probes could not prove the API server's fence enforced, and why; `refusing`
    /// when this replica refuses to lead because of it.
    pub fn fence_not_proven(&self, why: impl Into<Arc<str>>, refusing: bool) {
        self.proof.send_replace(FenceProof {
            unproven: Some(why.into()),
            refusing,
        });
    }

    /// Records that a write of the Lease succeeded: this replica takes part.
    pub fn write_succeeded(&self) {
        self.participation.send_if_modified(|p| {
            let was = p.problem.is_some();
            *p = Participation::default();
            was
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_standalone_fence_always_lets_the_replica_act() {
        let fence = Fence::standalone();
        assert_eq!(fence.check(), Ok(()));
        assert!(fence.clone().is_current());
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_fence_refuses_until_the_lease_is_held() {
        let (fence, keeper) = Fence::keeper(None);
        assert_eq!(fence.check(), Err(FenceError::NotHolder));
        keeper.hold_until(Instant::now() + Duration::from_secs(10));
        assert_eq!(fence.check(), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_not_renewed_before_its_deadline_expires_by_itself() {
        let (fence, keeper) = Fence::keeper(None);
        keeper.hold_until(Instant::now() + Duration::from_secs(10));
        tokio::time::advance(Duration::from_millis(9_999)).await;
        assert_eq!(fence.check(), Ok(()));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(
            fence.check(),
            Err(FenceError::RenewDeadlinePassed {
                overdue: Duration::ZERO
            })
        );
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(
            fence.check(),
            Err(FenceError::RenewDeadlinePassed {
                overdue: Duration::from_secs(3)
            })
        );
        assert!(!keeper.is_current());
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewal_pushes_the_deadline_out() {
        let (fence, keeper) = Fence::keeper(None);
        keeper.hold_until(Instant::now() + Duration::from_secs(10));
        tokio::time::advance(Duration::from_secs(8)).await;
        keeper.hold_until(Instant::now() + Duration::from_secs(10));
        tokio::time::advance(Duration::from_secs(8)).await;
        assert!(fence.is_current());
    }

    #[tokio::test(start_paused = true)]
    async fn a_revoked_claim_fails_every_clone_at_once() {
        let (fence, keeper) = Fence::keeper(None);
        let clone = fence.clone();
        keeper.hold_until(Instant::now() + Duration::from_secs(10));
        keeper.revoke();
        assert_eq!(fence.check(), Err(FenceError::NotHolder));
        assert_eq!(clone.check(), Err(FenceError::NotHolder));
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_keeper_leaves_the_claim_to_expire_at_its_deadline() {
        let (fence, keeper) = Fence::keeper(None);
        keeper.hold_until(Instant::now() + Duration::from_secs(5));
        drop(keeper);
        assert!(fence.is_current());
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(!fence.is_current());
    }

    #[tokio::test(start_paused = true)]
    async fn lost_resolves_when_the_deadline_passes_without_renewal() {
        let (fence, keeper) = Fence::keeper(None);
        let start = Instant::now();
        keeper.hold_until(start + Duration::from_secs(10));
        fence.lost().await;
        assert_eq!(Instant::now() - start, Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn lost_follows_renewals_and_resolves_on_revoke() {
        let (fence, keeper) = Fence::keeper(None);
        let start = Instant::now();
        keeper.hold_until(start + Duration::from_secs(10));
        let lost = tokio::spawn({
            let fence = fence.clone();
            async move { fence.lost().await }
        });
        tokio::time::advance(Duration::from_secs(6)).await;
        keeper.hold_until(Instant::now() + Duration::from_secs(10));
        tokio::time::advance(Duration::from_secs(6)).await;
        tokio::task::yield_now().await;
        assert!(!lost.is_finished(), "the renewal moved the deadline to 16s");
        keeper.revoke();
        lost.await.expect("lost task");
        assert_eq!(Instant::now() - start, Duration::from_secs(12));
    }

    #[tokio::test(start_paused = true)]
    async fn acquired_waits_for_the_keeper_to_grant_the_claim() {
        let (fence, keeper) = Fence::keeper(None);
        let acquired = tokio::spawn({
            let fence = fence.clone();
            async move { fence.acquired().await }
        });
        tokio::task::yield_now().await;
        assert!(!acquired.is_finished());
        keeper.hold_until(Instant::now() + Duration::from_secs(10));
        acquired.await.expect("acquired task");
    }

    #[test]
    fn a_problem_found_by_a_write_outlasts_reads_until_a_write_succeeds() {
        let (fence, keeper) = Fence::keeper(None);
        assert_eq!(fence.election_problem(), None);
        keeper.cannot_take_part("namespaces \"x\" not found", true);
        keeper.read_succeeded();
        assert_eq!(
            fence.election_problem().as_deref(),
            Some("namespaces \"x\" not found")
        );
        keeper.write_succeeded();
        assert_eq!(fence.election_problem(), None);
        keeper.cannot_take_part("forbidden", false);
        keeper.read_succeeded();
        assert_eq!(fence.election_problem(), None);
        assert_eq!(Fence::standalone().election_problem(), None);
    }

    #[test]
    fn an_unproven_fence_keeps_a_refusing_replica_unready_until_a_probe_proves_it() {
        let (fence, keeper) = Fence::keeper(None);
        keeper.fence_not_proven("a write with a stale claim was admitted", true);
        let problem = fence.election_problem().expect("a problem");
        assert!(
            problem.contains("refusing to lead") && problem.contains("stale claim was admitted"),
            "{problem}"
        );
        keeper.write_succeeded();
        assert!(
            fence.election_problem().is_some(),
            "a Lease write does not prove the fence"
        );
        keeper.fence_proven();
        assert_eq!(fence.election_problem(), None);
        assert_eq!(fence.fence_unproven(), None);
        keeper.fence_not_proven("no fence", false);
        assert_eq!(
            fence.election_problem(),
            None,
            "leading anyway (--allow-unfenced)"
        );
        assert_eq!(fence.fence_unproven().as_deref(), Some("no fence"));
    }

    #[tokio::test(start_paused = true)]
    async fn the_claim_is_named_only_while_it_is_current() {
        let (fence, keeper) = Fence::keeper(None);
        keeper.claimed_as("replica-a-12", 3);
        assert_eq!(fence.claim(), None, "not held yet");
        keeper.hold_until(Instant::now() + Duration::from_secs(10));
        assert_eq!(fence.claim().as_deref(), Some("replica-a-12/3"));
        tokio::time::advance(Duration::from_secs(11)).await;
        assert_eq!(fence.claim(), None, "lapsed");
        assert_eq!(Fence::standalone().claim(), None);
    }
}
