//! The two lanes remediations advance in, and the one rule between them: a fault waiting for its
//! cordon goes first. An advance up to the cordon runs in the starting lane; drains, replacements
//! and releases run in the carrying lane. Each lane has its own concurrency limit, so a starting
//! advance never waits for a permit behind a draining one; and a carrying advance holds back while
//! any starting advance is under way, for at most [`YIELD_AT_MOST`], so that in a burst of faults
//! the API server's time goes to the cordons, and the follow-up writes of nodes already fenced
//! (their status, their drain, their replacement) come after.
//!
//! An advance enters its lane when it is spawned ([`Lanes::enter`], which counts a starting one at
//! once, before its task first runs) and waits for its turn inside the task ([`Ticket::turn`]).

use std::{sync::Arc, time::Duration};

use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

/// The longest a carrying advance waits for the starting lane to empty: a steady stream of faults
/// delays drains and replacements by this much at most, never stops them.
pub const YIELD_AT_MOST: Duration = Duration::from_secs(1);

/// Which lane an advance runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lane {
    /// Up to the cordon: what a fault waits for.
    Starting,
    /// Everything after: drains, replacements, releases.
    Carrying,
}

/// The lanes' permits, and how many starting advances are under way.
#[derive(Debug)]
pub struct Lanes {
    /// Permits for starting advances.
    starting: Arc<Semaphore>,
    /// Permits for carrying advances.
    carrying: Arc<Semaphore>,
    /// Starting advances entered and not yet ended (waiting for a permit or running).
    starting_now: watch::Sender<usize>,
}

impl Lanes {
    /// A starting lane of `starting` concurrent advances and a carrying lane of `carrying` (each at
    /// least one).
    #[must_use]
    pub fn new(starting: usize, carrying: usize) -> Self {
        Self {
            starting: Arc::new(Semaphore::new(starting.max(1))),
            carrying: Arc::new(Semaphore::new(carrying.max(1))),
            starting_now: watch::Sender::new(0),
        }
    }

    /// Enters an advance into `lane`. A starting advance counts from now until its ticket, or the
    /// turn made from it, is dropped.
    #[must_use]
    pub fn enter(&self, lane: Lane) -> Ticket {
        let permits = match lane {
            Lane::Starting => {
                self.starting_now.send_modify(|n| *n += 1);
                self.starting.clone()
            }
            Lane::Carrying => self.carrying.clone(),
        };
        Ticket {
            lane,
            permits,
            starting_now: self.starting_now.clone(),
        }
    }

    /// Starting advances entered and not yet ended.
    #[must_use]
    pub fn starting_now(&self) -> usize {
        *self.starting_now.borrow()
    }
}

/// An advance's place in its lane.
#[derive(Debug)]
pub struct Ticket {
    lane: Lane,
    permits: Arc<Semaphore>,
    starting_now: watch::Sender<usize>,
}

impl Ticket {
    /// Waits for the advance's turn: a carrying one first lets the starting lane empty (at most
    /// [`YIELD_AT_MOST`]), then either takes a permit of its lane. Hold the turn while advancing.
    pub async fn turn(self) -> Turn {
        if self.lane == Lane::Carrying {
            let mut starting = self.starting_now.subscribe();
            // Either the lane empties or the wait is cut short: both end the wait; the sender
            // lives in `self`, so `wait_for` cannot fail for a closed channel.
            let _ = tokio::time::timeout(YIELD_AT_MOST, starting.wait_for(|n| *n == 0)).await;
        }
        // The semaphores are never closed, so a permit always comes.
        let permit = self.permits.clone().acquire_owned().await.ok();
        Turn {
            _permit: permit,
            _ticket: self,
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.lane == Lane::Starting {
            self.starting_now.send_modify(|n| *n = n.saturating_sub(1));
        }
    }
}

/// An advance's turn: its lane's permit, and (in the starting lane) its place in the count.
#[derive(Debug)]
pub struct Turn {
    _permit: Option<OwnedSemaphorePermit>,
    _ticket: Ticket,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How long (in paused time) entering `lane` waited for its turn, and the turn.
    async fn waited(lanes: &Lanes, lane: Lane) -> (Duration, Turn) {
        let started = tokio::time::Instant::now();
        let turn = lanes.enter(lane).turn().await;
        (started.elapsed(), turn)
    }

    #[tokio::test(start_paused = true)]
    async fn a_carrying_advance_goes_at_once_when_no_fault_waits_for_its_cordon() {
        let lanes = Lanes::new(2, 2);
        assert_eq!(waited(&lanes, Lane::Carrying).await.0, Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_carrying_advance_waits_until_the_starting_lane_is_empty() {
        let lanes = Lanes::new(2, 2);
        let cordon = lanes.enter(Lane::Starting);
        // Counted from its entry, before its task runs: a drain spawned just after it waits.
        assert_eq!(lanes.starting_now(), 1);
        let drain = tokio::spawn(lanes.enter(Lane::Carrying).turn());
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !drain.is_finished(),
            "the drain waits while a cordon is under way"
        );
        let cordon_turn = cordon.turn().await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!drain.is_finished(), "and while it runs");
        let ended = tokio::time::Instant::now();
        drop(cordon_turn);
        drain.await.expect("the drain's turn");
        assert_eq!(
            ended.elapsed(),
            Duration::ZERO,
            "the drain goes as soon as the cordon ends"
        );
        assert_eq!(lanes.starting_now(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_of_faults_delays_a_carrying_advance_by_at_most_the_yield() {
        let lanes = Lanes::new(2, 2);
        let _cordon = lanes.enter(Lane::Starting);
        assert_eq!(waited(&lanes, Lane::Carrying).await.0, YIELD_AT_MOST);
    }

    #[tokio::test(start_paused = true)]
    async fn a_starting_advance_never_waits_for_the_carrying_lane() {
        let lanes = Lanes::new(1, 1);
        let _drain = lanes.enter(Lane::Carrying).turn().await;
        assert_eq!(waited(&lanes, Lane::Starting).await.0, Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn each_lane_runs_at_most_its_permits_at_once() {
        let lanes = Lanes::new(1, 1);
        let first = lanes.enter(Lane::Starting).turn().await;
        let second = tokio::spawn(lanes.enter(Lane::Starting).turn());
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!second.is_finished(), "one permit: the second waits");
        assert_eq!(lanes.starting_now(), 2, "both count: one runs, one waits");
        drop(first);
        let _second = second.await.expect("the second's turn");
        assert_eq!(lanes.starting_now(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn each_lane_has_its_own_limit() {
        // Two starting permits and one carrying: a second cordon goes at once, a second drain waits.
        let lanes = Lanes::new(2, 1);
        let _first_cordon = lanes.enter(Lane::Starting).turn().await;
        assert_eq!(waited(&lanes, Lane::Starting).await.0, Duration::ZERO);
        let lanes = Lanes::new(2, 1);
        let _first_drain = lanes.enter(Lane::Carrying).turn().await;
        let second = tokio::spawn(lanes.enter(Lane::Carrying).turn());
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(
            !second.is_finished(),
            "one carrying permit: the second drain waits"
        );
    }
}
