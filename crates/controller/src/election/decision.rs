//! When to acquire, renew, wait or step down: the pure part of leader election, with no clock and
//! no API calls of its own (the caller passes `now` and what it observed).
//!
//! Time is measured only on the local monotonic clock, never by comparing the Lease's timestamps
//! with ours: like client-go, a follower notes *when it first saw* the current version of the
//! Lease and considers the holder gone only after `leaseDuration` has passed on its own clock with
//! no change. Clock skew between replicas therefore cannot make two replicas leaders at once; only
//! a difference in clock *rates* over a few seconds could, which the gap between the renew
//! deadline and the lease duration absorbs.

use std::time::Duration;

use tokio::time::Instant;

/// Timings of the election. The defaults are client-go's (15s / 10s / 2s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ElectionTimings {
    /// How long a follower waits, after the Lease last changed, before taking it over. Written to
    /// the Lease's `leaseDurationSeconds`.
    pub lease_duration: Duration,
    /// How long the leader may act after sending its last successful renewal; past it, the leader
    /// stops acting and steps down. Must be shorter than `lease_duration`: the difference is the
    /// margin for in-flight requests and clock-rate differences.
    pub renew_deadline: Duration,
    /// How often the leader renews and followers look at the Lease.
    pub retry_period: Duration,
    /// How long a new leader waits, once no earlier holder's lease can still be believed, before
    /// its first write: time for the API server's caches (the fence policy reads the Lease from
    /// one) and this replica's watches to catch up with the Lease it just wrote and with the last
    /// writes of its predecessor. See [`first_write_at`].
    pub cache_lag_allowance: Duration,
}

impl Default for ElectionTimings {
    fn default() -> Self {
        Self {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
            cache_lag_allowance: Duration::from_secs(1),
        }
    }
}

/// Why a set of [`ElectionTimings`] is unsafe.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidateTimingsError {
    /// The leader could act after a follower may already have taken over.
    #[error("renew deadline {renew_deadline:?} must be shorter than the lease duration {lease_duration:?}")]
    RenewDeadlineNotShorterThanLease {
        /// The configured renew deadline.
        renew_deadline: Duration,
        /// The configured lease duration.
        lease_duration: Duration,
    },
    /// The leader would not try to renew at least once before its deadline.
    #[error("retry period {retry_period:?} must be shorter than the renew deadline {renew_deadline:?}")]
    RetryNotShorterThanRenewDeadline {
        /// The configured retry period.
        retry_period: Duration,
        /// The configured renew deadline.
        renew_deadline: Duration,
    },
    /// The Lease stores whole seconds.
    #[error("lease duration {0:?} must be a whole number of seconds, at least 1")]
    LeaseDurationNotWholeSeconds(Duration),
}

impl ElectionTimings {
    /// Checks the orderings that make fencing safe: `retry < renew deadline < lease duration`.
    pub fn validate(&self) -> Result<(), ValidateTimingsError> {
        if self.lease_duration.subsec_nanos() != 0 || self.lease_duration.as_secs() == 0 {
            return Err(ValidateTimingsError::LeaseDurationNotWholeSeconds(
                self.lease_duration,
            ));
        }
        if self.renew_deadline >= self.lease_duration {
            return Err(ValidateTimingsError::RenewDeadlineNotShorterThanLease {
                renew_deadline: self.renew_deadline,
                lease_duration: self.lease_duration,
            });
        }
        if self.retry_period >= self.renew_deadline {
            return Err(ValidateTimingsError::RetryNotShorterThanRenewDeadline {
                retry_period: self.retry_period,
                renew_deadline: self.renew_deadline,
            });
        }
        Ok(())
    }
}

/// The parts of a Lease the decision reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRecord {
    /// `spec.holderIdentity`; `None` or empty when released.
    pub holder: Option<String>,
    /// `spec.leaseDurationSeconds`, as the holder wrote it.
    pub lease_duration: Option<Duration>,
    /// `metadata.resourceVersion`: any write changes it, so it identifies a version of the record.
    pub resource_version: String,
}

impl LeaseRecord {
    fn holder(&self) -> Option<&str> {
        self.holder.as_deref().filter(|holder| !holder.is_empty())
    }
}

/// What this replica has seen of the Lease: the record, and when (local clock) it first saw this
/// version of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observed {
    /// The Lease object does not exist.
    Absent,
    /// The Lease as last read or written.
    Present {
        /// The record.
        record: LeaseRecord,
        /// When this replica first saw this version (this resourceVersion) of the record.
        since: Instant,
    },
}

impl Observed {
    /// The observation after reading `record` at `now`: the `since` instant moves only when the
    /// record changed, so a holder that keeps renewing keeps pushing a follower's takeover out.
    #[must_use]
    pub fn update(self, record: Option<LeaseRecord>, now: Instant) -> Self {
        match (self, record) {
            (_, None) => Self::Absent,
            (Self::Present { record: old, since }, Some(record))
                if old.resource_version == record.resource_version =>
            {
                Self::Present { record, since }
            }
            (_, Some(record)) => Self::Present { record, since: now },
        }
    }
}

/// This replica's own role, as far as it knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Not holding the Lease.
    Follower,
    /// Holding the Lease since the last successful acquire or renew, sent at `renewed_at`.
    Leader {
        /// When the last successful acquire or renew request was sent (local clock).
        renewed_at: Instant,
    },
}

/// The next step of the election loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Create the Lease, naming this replica as holder.
    Create,
    /// Take the Lease over (it is released, or its holder stopped renewing): replace it with this
    /// replica as holder, with the observed resourceVersion as precondition.
    Acquire,
    /// Renew our own Lease: replace it with a fresh `renewTime`, with the resourceVersion as
    /// precondition.
    Renew,
    /// Nothing to do before `until`; then look again.
    Wait {
        /// When to look again.
        until: Instant,
    },
    /// Stop acting and exit: this replica was leader and can no longer prove it still is.
    StepDown {
        /// Why.
        reason: StepDownReason,
    },
}

/// Why a leader steps down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepDownReason {
    /// No renewal succeeded within the renew deadline.
    RenewDeadlinePassed,
    /// The Lease names another holder (or none, or is gone): someone took it over.
    LeaseTakenOver,
}

/// Who held the Lease just before this replica's acquiring write, as far as this replica knew.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Predecessor {
    /// Nobody anyone could still believe: there was no Lease (this replica created it), it was
    /// released (no holder), or its holder was this replica itself.
    Nobody,
    /// Another replica, whose record this replica first saw at `since`, with `lease_duration`.
    Other {
        /// When this replica first saw that version of the record (local clock).
        since: Instant,
        /// The lease duration that holder wrote (or ours when it wrote none).
        lease_duration: Duration,
    },
}

impl Predecessor {
    /// The predecessor as `observed` (the observation the acquiring write was based on) names it.
    #[must_use]
    pub fn of(observed: &Observed, identity: &str, timings: &ElectionTimings) -> Self {
        match observed {
            Observed::Present { record, since } => match record.holder() {
                Some(holder) if holder != identity => Self::Other {
                    since: *since,
                    lease_duration: record.lease_duration.unwrap_or(timings.lease_duration),
                },
                _ => Self::Nobody,
            },
            Observed::Absent => Self::Nobody,
        }
    }
}

/// When a replica whose acquiring write was sent at `acquired_at` may make its first write: once
/// the predecessor's lease can no longer be believed by anyone (its holder stops acting by its
/// renew deadline, counted from a renewal sent before this replica saw it, so `since +
/// lease_duration` bounds it on our clock), plus the cache-lag allowance. A take-over decided by
/// [`decide`] happens only after that bound, so there the wait is the allowance alone; the bound
/// still holds should an acquisition ever come sooner.
#[must_use]
pub fn first_write_at(predecessor: Predecessor, acquired_at: Instant, timings: &ElectionTimings) -> Instant {
    let believed_until = match predecessor {
        Predecessor::Nobody => acquired_at,
        Predecessor::Other {
            since,
            lease_duration,
        } => (since + lease_duration).max(acquired_at),
    };
    believed_until + timings.cache_lag_allowance
}

/// Decides the next election step for `identity` at `now`.
#[must_use]
pub fn decide(
    observed: &Observed,
    identity: &str,
    role: Role,
    now: Instant,
    timings: &ElectionTimings,
) -> Decision {
    match role {
        Role::Leader { renewed_at } => {
            if now >= renewed_at + timings.renew_deadline {
                return Decision::StepDown {
                    reason: StepDownReason::RenewDeadlinePassed,
                };
            }
            let still_ours =
                matches!(observed, Observed::Present { record, .. } if record.holder() == Some(identity));
            if !still_ours {
                return Decision::StepDown {
                    reason: StepDownReason::LeaseTakenOver,
                };
            }
            let next_renewal = renewed_at + timings.retry_period;
            if now >= next_renewal {
                Decision::Renew
            } else {
                Decision::Wait { until: next_renewal }
            }
        }
        Role::Follower => match observed {
            Observed::Absent => Decision::Create,
            Observed::Present { record, since } => match record.holder() {
                // Released, or a record of an earlier run of this very identity: nobody acts on it.
                None => Decision::Acquire,
                Some(holder) if holder == identity => Decision::Acquire,
                Some(_) => {
                    let lease_duration = record.lease_duration.unwrap_or(timings.lease_duration);
                    let expires = *since + lease_duration;
                    if now >= expires {
                        Decision::Acquire
                    } else {
                        Decision::Wait {
                            until: expires.min(now + timings.retry_period),
                        }
                    }
                }
            },
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: &str = "replica-a";
    const OTHER: &str = "replica-b";

    fn timings() -> ElectionTimings {
        ElectionTimings::default()
    }

    fn record(holder: Option<&str>, resource_version: &str) -> LeaseRecord {
        LeaseRecord {
            holder: holder.map(str::to_owned),
            lease_duration: Some(Duration::from_secs(15)),
            resource_version: resource_version.to_owned(),
        }
    }

    fn seen(holder: Option<&str>, since: Instant) -> Observed {
        Observed::Present {
            record: record(holder, "1"),
            since,
        }
    }

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn the_default_timings_are_safe() {
        assert_eq!(timings().validate(), Ok(()));
    }

    #[test]
    fn a_renew_deadline_as_long_as_the_lease_is_refused() {
        let unsafe_timings = ElectionTimings {
            renew_deadline: secs(15),
            ..timings()
        };
        assert!(matches!(
            unsafe_timings.validate(),
            Err(ValidateTimingsError::RenewDeadlineNotShorterThanLease { .. })
        ));
    }

    #[test]
    fn a_retry_period_as_long_as_the_renew_deadline_is_refused() {
        let unsafe_timings = ElectionTimings {
            retry_period: secs(10),
            ..timings()
        };
        assert!(matches!(
            unsafe_timings.validate(),
            Err(ValidateTimingsError::RetryNotShorterThanRenewDeadline { .. })
        ));
    }

    #[test]
    fn a_fractional_lease_duration_is_refused_because_the_lease_stores_seconds() {
        let fractional = ElectionTimings {
            lease_duration: Duration::from_millis(15_500),
            ..timings()
        };
        assert!(matches!(
            fractional.validate(),
            Err(ValidateTimingsError::LeaseDurationNotWholeSeconds(_))
        ));
    }

    #[test]
    fn a_follower_creates_a_missing_lease() {
        let now = Instant::now();
        assert_eq!(
            decide(&Observed::Absent, ME, Role::Follower, now, &timings()),
            Decision::Create
        );
    }

    #[test]
    fn a_follower_acquires_a_released_lease_at_once() {
        let now = Instant::now();
        assert_eq!(
            decide(&seen(None, now), ME, Role::Follower, now, &timings()),
            Decision::Acquire
        );
        let empty = Observed::Present {
            record: record(Some(""), "1"),
            since: now,
        };
        assert_eq!(
            decide(&empty, ME, Role::Follower, now, &timings()),
            Decision::Acquire
        );
    }

    #[test]
    fn a_follower_waits_while_the_holder_could_still_be_renewing() {
        let since = Instant::now();
        let now = since + secs(14);
        assert_eq!(
            decide(&seen(Some(OTHER), since), ME, Role::Follower, now, &timings()),
            Decision::Wait {
                until: since + secs(15)
            }
        );
    }

    #[test]
    fn a_follower_looks_again_after_the_retry_period_when_expiry_is_far() {
        let since = Instant::now();
        let now = since + secs(1);
        assert_eq!(
            decide(&seen(Some(OTHER), since), ME, Role::Follower, now, &timings()),
            Decision::Wait { until: now + secs(2) }
        );
    }

    #[test]
    fn a_follower_takes_over_a_lease_unchanged_for_its_whole_duration() {
        let since = Instant::now();
        let now = since + secs(15);
        assert_eq!(
            decide(&seen(Some(OTHER), since), ME, Role::Follower, now, &timings()),
            Decision::Acquire
        );
    }

    #[test]
    fn a_follower_honours_the_duration_the_holder_wrote_not_its_own() {
        let since = Instant::now();
        let long = Observed::Present {
            record: LeaseRecord {
                lease_duration: Some(secs(60)),
                ..record(Some(OTHER), "1")
            },
            since,
        };
        assert!(matches!(
            decide(&long, ME, Role::Follower, since + secs(30), &timings()),
            Decision::Wait { .. }
        ));
        assert_eq!(
            decide(&long, ME, Role::Follower, since + secs(60), &timings()),
            Decision::Acquire
        );
    }

    #[test]
    fn a_follower_acquires_a_lease_left_by_an_earlier_run_of_its_own_identity() {
        let now = Instant::now();
        assert_eq!(
            decide(&seen(Some(ME), now), ME, Role::Follower, now, &timings()),
            Decision::Acquire
        );
    }

    #[test]
    fn a_renewed_lease_restarts_the_followers_wait() {
        let first = Instant::now();
        let observed = Observed::Absent.update(Some(record(Some(OTHER), "1")), first);
        let observed = observed.update(Some(record(Some(OTHER), "1")), first + secs(10));
        assert_eq!(
            observed,
            seen(Some(OTHER), first),
            "same version: the wait keeps counting"
        );
        let renewed_at = first + secs(12);
        let observed = observed.update(Some(record(Some(OTHER), "2")), renewed_at);
        assert_eq!(
            decide(&observed, ME, Role::Follower, first + secs(16), &timings()),
            Decision::Wait {
                until: first + secs(18)
            }
        );
        assert_eq!(
            decide(&observed, ME, Role::Follower, renewed_at + secs(15), &timings()),
            Decision::Acquire
        );
    }

    #[test]
    fn a_deleted_lease_is_observed_as_absent() {
        let now = Instant::now();
        assert_eq!(seen(Some(OTHER), now).update(None, now), Observed::Absent);
    }

    #[test]
    fn a_new_leader_that_took_over_an_expired_lease_waits_only_the_cache_lag_allowance() {
        let since = Instant::now();
        let observed = seen(Some(OTHER), since);
        let acquired_at = since + secs(15);
        assert_eq!(
            decide(&observed, ME, Role::Follower, acquired_at, &timings()),
            Decision::Acquire
        );
        let predecessor = Predecessor::of(&observed, ME, &timings());
        assert_eq!(
            predecessor,
            Predecessor::Other {
                since,
                lease_duration: secs(15)
            }
        );
        assert_eq!(
            first_write_at(predecessor, acquired_at, &timings()),
            acquired_at + secs(1)
        );
    }

    #[test]
    fn a_new_leader_waits_out_a_predecessors_lease_that_may_still_be_believed() {
        let since = Instant::now();
        let long = Observed::Present {
            record: LeaseRecord {
                lease_duration: Some(secs(60)),
                ..record(Some(OTHER), "1")
            },
            since,
        };
        let acquired_at = since + secs(20);
        assert_eq!(
            first_write_at(Predecessor::of(&long, ME, &timings()), acquired_at, &timings()),
            since + secs(61),
            "the rest of the predecessor's 60s, then the allowance"
        );
    }

    #[test]
    fn a_new_leader_with_no_believable_predecessor_waits_only_the_allowance() {
        let now = Instant::now();
        for observed in [Observed::Absent, seen(None, now), seen(Some(ME), now)] {
            let predecessor = Predecessor::of(&observed, ME, &timings());
            assert_eq!(predecessor, Predecessor::Nobody, "{observed:?}");
            assert_eq!(first_write_at(predecessor, now, &timings()), now + secs(1));
        }
    }

    #[test]
    fn a_leader_waits_for_the_retry_period_between_renewals() {
        let renewed_at = Instant::now();
        assert_eq!(
            decide(
                &seen(Some(ME), renewed_at),
                ME,
                Role::Leader { renewed_at },
                renewed_at + secs(1),
                &timings()
            ),
            Decision::Wait {
                until: renewed_at + secs(2)
            }
        );
    }

    #[test]
    fn a_leader_renews_after_the_retry_period() {
        let renewed_at = Instant::now();
        assert_eq!(
            decide(
                &seen(Some(ME), renewed_at),
                ME,
                Role::Leader { renewed_at },
                renewed_at + secs(2),
                &timings()
            ),
            Decision::Renew
        );
    }

    #[test]
    fn a_leader_keeps_trying_to_renew_until_the_deadline() {
        let renewed_at = Instant::now();
        let just_before = renewed_at + secs(10) - Duration::from_millis(1);
        assert_eq!(
            decide(
                &seen(Some(ME), renewed_at),
                ME,
                Role::Leader { renewed_at },
                just_before,
                &timings()
            ),
            Decision::Renew
        );
    }

    #[test]
    fn a_leader_that_could_not_renew_by_the_deadline_steps_down() {
        let renewed_at = Instant::now();
        assert_eq!(
            decide(
                &seen(Some(ME), renewed_at),
                ME,
                Role::Leader { renewed_at },
                renewed_at + secs(10),
                &timings()
            ),
            Decision::StepDown {
                reason: StepDownReason::RenewDeadlinePassed
            }
        );
    }

    #[test]
    fn a_leader_that_sees_another_holder_steps_down_at_once() {
        let renewed_at = Instant::now();
        assert_eq!(
            decide(
                &seen(Some(OTHER), renewed_at),
                ME,
                Role::Leader { renewed_at },
                renewed_at,
                &timings()
            ),
            Decision::StepDown {
                reason: StepDownReason::LeaseTakenOver
            }
        );
        assert_eq!(
            decide(
                &Observed::Absent,
                ME,
                Role::Leader { renewed_at },
                renewed_at,
                &timings()
            ),
            Decision::StepDown {
                reason: StepDownReason::LeaseTakenOver
            }
        );
    }
}
