//! Which failed requests are worth asking again, and when. Pure.
//!
//! A failure is classified by what it is ([`Cause`]):
//! - the server answered with an HTTP status: a 4xx other than 408 (request timeout), 409
//!   (conflict) and 429 (throttled) is the server's last word on that request (forbidden,
//!   invalid, not found): asking again gets the same answer, so the step fails at once with it;
//!   408, 409, 429 and every 5xx may pass if asked again;
//! - the answer could not be decoded: the same request reads the same answer: permanent;
//! - no answer (the connection failed, closed or timed out, credentials could not be refreshed):
//!   transient;
//! - the request could not be formed from what we have (a template that does not render, a kind
//!   the server does not serve, an object that is not the node's, someone else's object holding
//!   the template's name, a malformed group/version): permanent;
//! - something of ours must settle first (a previous attempt's object being removed, an object
//!   others kept writing between our read and our delete): transient.
//!
//! Transient failures are asked again after a backoff that grows exponentially with the
//! consecutive failures (or the time since the first one), with jitter (so many records refused
//! together do not come back together), up to a cap; each step's own timeout still bounds them.

use std::{
    hash::{DefaultHasher, Hash as _, Hasher as _},
    time::Duration,
};

use jiff::SignedDuration;

/// The longest wait between two tries of a failed request.
pub const CAP: Duration = Duration::from_secs(60);

/// What a failed request's error is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// The server answered with this HTTP status.
    Answered(u16),
    /// The server's answer could not be decoded.
    Decode,
    /// No answer: the connection failed, closed or timed out.
    Connection,
    /// The request could not be formed from what we have.
    Invalid,
    /// Something of ours must settle first (a previous attempt's object going, an object others
    /// kept writing between our read and our delete): asked again.
    Pending,
}

impl Cause {
    /// Whether asking again may succeed (see the module docs).
    #[must_use]
    pub const fn is_transient(self) -> bool {
        match self {
            Self::Answered(code) => !(code >= 400 && code < 500) || matches!(code, 408 | 409 | 429),
            Self::Connection | Self::Pending => true,
            Self::Decode | Self::Invalid => false,
        }
    }

    /// The cause as a person reads it, for a status message.
    #[must_use]
    pub const fn describe(self) -> &'static str {
        match self {
            Self::Answered(_) if !self.is_transient() => "the server's last word on this request",
            Self::Answered(_) => "the server may accept it later",
            Self::Decode => "the server's answer could not be decoded",
            Self::Connection => "no answer from the server",
            Self::Invalid => "the request cannot be made from the policy and what was found",
            Self::Pending => "waiting for an earlier change to settle",
        }
    }
}

/// What `error` is, from the first `kube::Error` along its chain of sources (an error of ours with
/// none is one of our own checks refusing the request: [`Cause::Invalid`]; an I/O error or an
/// elapsed timeout along the chain is no answer).
#[must_use]
pub fn cause_of(error: &(dyn std::error::Error + 'static)) -> Cause {
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(
            crate::replace::TriggerReplacementError::PreviousAttemptGoing { .. }
            | crate::replace::TriggerReplacementError::KeptConflicting { .. },
        ) = error.downcast_ref::<crate::replace::TriggerReplacementError>()
        {
            return Cause::Pending;
        }
        if let Some(kube) = error.downcast_ref::<kube::Error>() {
            return match kube {
                kube::Error::Api(status) => Cause::Answered(status.code),
                kube::Error::SerdeError(_)
                | kube::Error::FromUtf8(_)
                | kube::Error::LinesCodecMaxLineLengthExceeded => Cause::Decode,
                kube::Error::HyperError(_)
                | kube::Error::Service(_)
                | kube::Error::ReadEvents(_)
                | kube::Error::Auth(_)
                | kube::Error::RustlsTls(_) => Cause::Connection,
                _ => Cause::Invalid,
            };
        }
        if error.is::<std::io::Error>() || error.is::<tokio::time::error::Elapsed>() {
            return Cause::Connection;
        }
        if error.is::<serde_json::Error>() {
            return Cause::Decode;
        }
        next = error.source();
    }
    Cause::Invalid
}

/// How long to wait before try `attempt + 1` after `attempt` consecutive failures (1 for the
/// first): `base` doubled per failure, capped at `cap`, then with "equal jitter": half of it
/// fixed, the other half spread by a hash of `seed` and `attempt` (deterministic, so the decision
/// stays a pure function).
#[must_use]
pub fn backoff(base: Duration, cap: Duration, attempt: u32, seed: &str) -> Duration {
    let doubled = base.saturating_mul(1 << attempt.saturating_sub(1).min(20));
    let full = doubled.min(cap).max(base.min(cap));
    let mut hasher = DefaultHasher::new();
    seed.hash(&mut hasher);
    attempt.hash(&mut hasher);
    let spread = f64::from(u32::try_from(hasher.finish() % 1001).unwrap_or(0)) / 1000.0;
    full / 2 + (full / 2).mul_f64(spread)
}

/// [`backoff`] for a failure that has lasted `failing_for` since its first occurrence, retried every
/// `base` at first: the attempt is how many doublings of `base` fit in that time.
#[must_use]
pub fn backoff_since(base: SignedDuration, failing_for: SignedDuration, seed: &str) -> SignedDuration {
    let base = base.unsigned_abs().max(Duration::from_millis(1));
    let failing_for = failing_for.unsigned_abs();
    let ratio = failing_for.as_secs_f64() / base.as_secs_f64();
    // The attempt whose doubled waits add up to about `failing_for`: 1 + log2(1 + ratio).
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "a small non-negative count, clamped to 32"
    )]
    let attempt = 1 + (1.0 + ratio).log2().floor().clamp(0.0, 31.0) as u32;
    SignedDuration::try_from(backoff(base, CAP, attempt, seed)).unwrap_or(SignedDuration::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn four_hundreds_are_permanent_but_timeout_conflict_and_throttling_as_are_server_errors_are_not() {
        for code in [400, 401, 403, 404, 405, 410, 422] {
            assert!(!Cause::Answered(code).is_transient(), "{code}");
        }
        for code in [408, 409, 429, 500, 503, 504] {
            assert!(Cause::Answered(code).is_transient(), "{code}");
        }
        assert!(Cause::Connection.is_transient());
        assert!(!Cause::Decode.is_transient());
        assert!(!Cause::Invalid.is_transient());
    }

    /// Our own error wrapping a client error.
    #[derive(Debug, thiserror::Error)]
    #[error("reading: {0}")]
    struct Ours(#[source] kube::Error);

    /// Our own check, with nothing beneath it.
    #[derive(Debug, thiserror::Error)]
    #[error("the template does not render")]
    struct Check;

    #[test]
    fn errors_are_classified_by_what_they_are() {
        let status = kube::core::Status::failure("forbidden", "Forbidden").with_code(403);
        assert_eq!(
            cause_of(&kube::Error::Api(Box::new(status))),
            Cause::Answered(403)
        );
        let decode = serde_json::from_str::<u8>("x").unwrap_err();
        assert_eq!(cause_of(&kube::Error::SerdeError(decode)), Cause::Decode);
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert_eq!(cause_of(&kube::Error::ReadEvents(refused)), Cause::Connection);
        assert_eq!(
            cause_of(&kube::Error::Service("connect timed out".into())),
            Cause::Connection
        );
        assert_eq!(
            cause_of(&kube::Error::LinesCodecMaxLineLengthExceeded),
            Cause::Decode
        );
        // Our own error wrapping a decode error: found along the chain.
        let decode = serde_json::from_str::<u8>("x").unwrap_err();
        assert_eq!(cause_of(&Ours(kube::Error::SerdeError(decode))), Cause::Decode);
        // Our own check with nothing beneath it.
        assert_eq!(cause_of(&Check), Cause::Invalid);
    }

    #[test]
    fn the_backoff_doubles_with_jitter_up_to_the_cap() {
        let base = Duration::from_secs(2);
        for attempt in 1..=10 {
            let full = base.saturating_mul(1 << (attempt - 1)).min(CAP);
            let waited = backoff(base, CAP, attempt, "gpu-1-r");
            assert!(
                waited >= full / 2 && waited <= full,
                "{attempt}: {waited:?} of {full:?}"
            );
        }
        assert!(backoff(base, CAP, 30, "x") <= CAP);
        // Jitter: records refused together come back apart.
        let spread: std::collections::BTreeSet<Duration> = (0..20)
            .map(|i| backoff(base, CAP, 4, &format!("gpu-{i}")))
            .collect();
        assert!(spread.len() > 10, "{spread:?}");
    }

    #[test]
    fn the_backoff_since_the_first_failure_grows_with_it() {
        let base = SignedDuration::from_secs(2);
        let at = |secs| backoff_since(base, SignedDuration::from_secs(secs), "r");
        assert!(at(0) <= base && at(0) >= base / 2, "{:?}", at(0));
        assert!(at(30) >= SignedDuration::from_secs(8), "{:?}", at(30));
        assert!(at(3600) <= SignedDuration::try_from(CAP).unwrap());
    }
}
