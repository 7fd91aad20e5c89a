//! Retries for the harness's requests to a loaded API server: which failures are worth asking
//! again (no answer at all, a timeout, 429, 5xx), and a bounded loop with a growing pause. The
//! harness must be as robust as the controller: a bench that cannot delete 5,000 nodes in one
//! request on a busy machine must not lose the run for it.

use std::{future::Future, time::Duration};

/// Attempts a request gets before its error is returned.
pub const ATTEMPTS: u32 = 6;

/// Whether `error` is one a later attempt may not meet: the request never got an answer (the
/// connection was refused, reset or timed out), or the server said it is too busy (429, 5xx,
/// including 504 for a request it could not finish in time).
#[must_use]
pub fn is_transient(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => status.code == 429 || status.code >= 500,
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}

/// The pause before attempt `attempt` (1-based, after the first): 0.5 s doubling, at most 8 s.
#[must_use]
pub fn pause_before(attempt: u32) -> Duration {
    let doublings = attempt.saturating_sub(2).min(4);
    Duration::from_millis(500 * (1 << doublings))
}

/// Runs `request` until it succeeds, fails with an error that is not transient, or has had
/// [`ATTEMPTS`] attempts; each transient failure is logged with `what`.
///
/// # Errors
/// The last error.
pub async fn retrying<T, F, Fut>(what: &str, request: F) -> Result<T, kube::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    retrying_with(what, pause_before, request).await
}

/// [`retrying`] with its own pauses.
async fn retrying_with<T, F, Fut>(
    what: &str,
    pause: impl Fn(u32) -> Duration,
    mut request: F,
) -> Result<T, kube::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    let mut attempt = 1;
    loop {
        match request().await {
            Ok(value) => return Ok(value),
            Err(error) if attempt < ATTEMPTS && is_transient(&error) => {
                attempt += 1;
                tracing::warn!(%error, attempt, "{what}: the API server did not answer; retrying");
                tokio::time::sleep(pause(attempt)).await;
            }
            Err(error) => return Err(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use kube::core::Status;

    use super::*;

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(Status {
            code,
            ..Status::default()
        }))
    }

    #[test]
    fn no_answer_429_and_5xx_are_worth_another_attempt_but_a_refusal_is_not() {
        assert!(is_transient(&kube::Error::Service(
            "client error (SendRequest)".into()
        )));
        assert!(is_transient(&api(429)));
        assert!(is_transient(&api(500)));
        assert!(is_transient(&api(504)));
        assert!(!is_transient(&api(404)));
        assert!(!is_transient(&api(403)));
        assert!(!is_transient(&api(409)));
    }

    #[test]
    fn the_pause_doubles_from_half_a_second_up_to_eight() {
        let pauses: Vec<u128> = (2..=8).map(|a| pause_before(a).as_millis()).collect();
        assert_eq!(pauses, [500, 1000, 2000, 4000, 8000, 8000, 8000]);
    }

    fn no_pause(_: u32) -> Duration {
        Duration::ZERO
    }

    #[tokio::test]
    async fn a_request_that_fails_to_send_twice_succeeds_on_the_third_attempt() {
        let calls = AtomicU32::new(0);
        let answer = retrying_with("deleting the fleet", no_pause, || async {
            if calls.fetch_add(1, Ordering::SeqCst) < 2 {
                Err(kube::Error::Service("client error (SendRequest)".into()))
            } else {
                Ok(7)
            }
        })
        .await;
        assert_eq!(answer.unwrap(), 7);
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_refusal_is_returned_at_once_and_a_lasting_outage_after_the_last_attempt() {
        let calls = AtomicU32::new(0);
        let refused: Result<(), _> = retrying_with("x", no_pause, || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(api(403))
        })
        .await;
        assert!(refused.is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        calls.store(0, Ordering::SeqCst);
        let down: Result<(), _> = retrying_with("x", no_pause, || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(api(503))
        })
        .await;
        assert!(down.is_err());
        assert_eq!(calls.load(Ordering::SeqCst), ATTEMPTS);
    }
}
