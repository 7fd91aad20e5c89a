//! Runs each probe read on its own OS thread and gives up waiting after a timeout. A read that
//! hangs keeps its thread (NVML calls cannot be cancelled), and no second read starts until it
//! returns: every read meanwhile reports the hang, so a stuck driver costs one thread, not one per
//! tick.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use super::{Probe, ReadGpusError};
use crate::readings::Snapshot;

/// A probe behind a deadline.
pub struct DeadlineReader {
    probe: Arc<dyn Probe>,
    timeout: Duration,
    in_flight: Arc<AtomicBool>,
    started: Arc<Mutex<Option<Instant>>>,
}

impl DeadlineReader {
    /// Wraps `probe`; each read gets `timeout`.
    #[must_use]
    pub fn new(probe: Arc<dyn Probe>, timeout: Duration) -> Self {
        Self {
            probe,
            timeout,
            in_flight: Arc::new(AtomicBool::new(false)),
            started: Arc::default(),
        }
    }

    /// The wrapped probe's name.
    #[must_use]
    pub fn name(&self) -> &'static str {
        self.probe.name()
    }

    /// One read, or the reason there is none.
    pub async fn read(&self) -> Result<Snapshot, ReadGpusError> {
        if self.in_flight.swap(true, Ordering::AcqRel) {
            let started = *self
                .started
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            return Err(ReadGpusError::StillHung(
                started.map_or(self.timeout, |at| at.elapsed()),
            ));
        }
        *self
            .started
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Instant::now());
        let (send, receive) = tokio::sync::oneshot::channel();
        let probe = Arc::clone(&self.probe);
        let in_flight = Arc::clone(&self.in_flight);
        let spawned = std::thread::Builder::new()
            .name("gpu-probe-read".to_owned())
            .spawn(move || {
                let result = probe.read();
                in_flight.store(false, Ordering::Release);
                // The receiver is gone when the read timed out; the late result is dropped on purpose.
                let _ = send.send(result);
            });
        if let Err(err) = spawned {
            self.in_flight.store(false, Ordering::Release);
            return Err(ReadGpusError::ThreadFailed(err.to_string()));
        }
        match tokio::time::timeout(self.timeout, receive).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(ReadGpusError::ThreadFailed("the read thread panicked".to_owned())),
            Err(_) => Err(ReadGpusError::Hung(self.timeout)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU32;

    use super::*;

    /// Sleeps for as long as the test says, counting reads.
    struct SlowProbe {
        delay: Duration,
        reads: AtomicU32,
    }

    impl Probe for SlowProbe {
        fn name(&self) -> &'static str {
            "slow"
        }

        fn read(&self) -> Result<Snapshot, ReadGpusError> {
            self.reads.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(self.delay);
            Ok(Snapshot {
                device_count: 1,
                ..Snapshot::default()
            })
        }
    }

    #[tokio::test]
    async fn a_read_that_finishes_in_time_returns_its_snapshot() {
        let probe = Arc::new(SlowProbe {
            delay: Duration::ZERO,
            reads: AtomicU32::new(0),
        });
        let reader = DeadlineReader::new(probe, Duration::from_secs(5));
        assert_eq!(reader.read().await.unwrap().device_count, 1);
        assert_eq!(
            reader.read().await.unwrap().device_count,
            1,
            "a finished read frees the slot"
        );
    }

    #[tokio::test]
    async fn a_hung_read_is_reported_and_no_second_read_piles_up_behind_it() {
        let probe = Arc::new(SlowProbe {
            delay: Duration::from_millis(600),
            reads: AtomicU32::new(0),
        });
        let reader = DeadlineReader::new(Arc::clone(&probe) as Arc<dyn Probe>, Duration::from_millis(100));
        assert_eq!(
            reader.read().await,
            Err(ReadGpusError::Hung(Duration::from_millis(100)))
        );
        assert!(matches!(reader.read().await, Err(ReadGpusError::StillHung(_))));
        assert_eq!(probe.reads.load(Ordering::SeqCst), 1);
        tokio::time::sleep(Duration::from_millis(700)).await;
        // The stuck read returned: the next one is a fresh read (and itself too slow again).
        assert_eq!(
            reader.read().await,
            Err(ReadGpusError::Hung(Duration::from_millis(100)))
        );
        assert_eq!(probe.reads.load(Ordering::SeqCst), 2);
    }
}
