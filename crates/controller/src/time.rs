//! Time arithmetic the decisions share: saturating, so a huge policy duration clamps instead of
//! failing, and policy durations (`std` durations) converted once, here.

use jiff::{SignedDuration, Timestamp};

/// `t + d`, clamped to the largest timestamp.
#[must_use]
pub fn plus(t: Timestamp, d: SignedDuration) -> Timestamp {
    t.checked_add(d).unwrap_or(Timestamp::MAX)
}

/// `t - d`, clamped to the smallest timestamp.
#[must_use]
pub fn minus(t: Timestamp, d: SignedDuration) -> Timestamp {
    t.checked_sub(d).unwrap_or(Timestamp::MIN)
}

/// A policy duration as a signed one, clamped (policy durations are far below the limit).
#[must_use]
pub fn signed(duration: std::time::Duration) -> SignedDuration {
    SignedDuration::try_from(duration).unwrap_or(SignedDuration::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_clamps_instead_of_failing() {
        assert_eq!(plus(Timestamp::MAX, SignedDuration::from_secs(1)), Timestamp::MAX);
        assert_eq!(
            minus(Timestamp::MIN, SignedDuration::from_secs(1)),
            Timestamp::MIN
        );
        assert_eq!(
            signed(std::time::Duration::from_secs(90)),
            SignedDuration::from_secs(90)
        );
    }
}
