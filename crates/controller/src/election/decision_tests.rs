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
