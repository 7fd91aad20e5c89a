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
    /// How long a new leader waits after its acquiring write was sent before its first write:
    /// time for the API server's caches (the fence policy reads the Lease from one) and this
    /// replica's watches to catch up with the Lease it just wrote and with the last writes of its
    /// predecessor. The predecessor's lease itself needs no wait of its own: [`decide`] takes a
    /// Lease over from another holder only once `leaseDuration` has passed since this replica saw
    /// its last renewal.
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
#[path = "decision_tests.rs"]
mod tests;
