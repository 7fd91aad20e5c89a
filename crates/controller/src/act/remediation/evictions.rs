//! The evictions one drain step has asked and not yet heard back from. The step decides again as
//! soon as any of them is answered or a budget changes, not once the whole round is answered: a
//! budget that shows room while the round's slowest eviction is still in the server is used at
//! once. At most `limit` are in the server at a time; the rest wait here, built but not sent.
//!
//! Only asking and collecting: what to ask is `lifecycle`'s, what an answer means is the step's.

use std::collections::{BTreeSet, VecDeque};

use futures::{FutureExt, StreamExt, future::BoxFuture, stream::FuturesUnordered};

/// Requests in flight, each under the UID of the pod it asks about.
pub(super) struct InFlight<'a, T> {
    /// Built and not yet sent (over the limit).
    waiting: VecDeque<BoxFuture<'a, (String, T)>>,
    /// In the server.
    running: FuturesUnordered<BoxFuture<'a, (String, T)>>,
    /// Every UID asked and not yet answered, waiting or running.
    unanswered: BTreeSet<String>,
    /// How many may be in the server at once.
    limit: usize,
}

impl<'a, T: Send + 'a> InFlight<'a, T> {
    /// Nothing in flight; at most `limit` (at least one) in the server at once.
    pub(super) fn new(limit: usize) -> Self {
        Self {
            waiting: VecDeque::new(),
            running: FuturesUnordered::new(),
            unanswered: BTreeSet::new(),
            limit: limit.max(1),
        }
    }

    /// Whether every request asked has been answered.
    pub(super) fn is_empty(&self) -> bool {
        self.unanswered.is_empty()
    }

    /// The UIDs asked and not yet answered.
    pub(super) fn unanswered(&self) -> &BTreeSet<String> {
        &self.unanswered
    }

    /// Asks `request` about the pod `uid`: sent at once if fewer than the limit are in the server.
    pub(super) fn ask(&mut self, uid: String, request: impl Future<Output = T> + Send + 'a) {
        self.unanswered.insert(uid.clone());
        self.waiting
            .push_back(async move { (uid, request.await) }.boxed());
        self.start();
    }

    /// Waits until the next answer comes or `woken` resolves first, and hands back that answer
    /// with every other one already come (none if `woken` came first or nothing is in flight).
    pub(super) async fn next(&mut self, woken: impl Future<Output = ()>) -> Vec<T> {
        self.start();
        if self.running.is_empty() {
            return Vec::new();
        }
        let first = tokio::select! {
            biased;
            answer = self.running.next() => answer,
            () = woken => None,
        };
        let mut answers = Vec::new();
        for (uid, answer) in first.into_iter().chain(std::iter::from_fn(|| {
            self.running.next().now_or_never().flatten()
        })) {
            self.unanswered.remove(&uid);
            answers.push(answer);
        }
        self.start();
        answers
    }

    /// Waits for every answer.
    pub(super) async fn all(&mut self) -> Vec<T> {
        let mut answers = Vec::new();
        while !self.is_empty() {
            answers.extend(self.next(std::future::pending()).await);
        }
        answers
    }

    fn start(&mut self) {
        while self.running.len() < self.limit {
            let Some(request) = self.waiting.pop_front() else {
                break;
            };
            self.running.push(request);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    async fn answered_after(ms: u64, answer: &'static str) -> &'static str {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        answer
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_answer_is_handed_back_before_the_slowest_of_the_round() {
        let mut flying = InFlight::new(8);
        flying.ask("slow".to_owned(), answered_after(200, "slow"));
        flying.ask("fast".to_owned(), answered_after(10, "fast"));
        let started = tokio::time::Instant::now();
        assert_eq!(flying.next(std::future::pending()).await, ["fast"]);
        assert_eq!(started.elapsed(), Duration::from_millis(10));
        assert_eq!(flying.unanswered().iter().collect::<Vec<_>>(), ["slow"]);
        assert_eq!(flying.all().await, ["slow"]);
        assert!(flying.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_wake_hands_back_nothing_and_keeps_every_request_in_flight() {
        let mut flying = InFlight::new(8);
        flying.ask("slow".to_owned(), answered_after(200, "slow"));
        let woken = tokio::time::sleep(Duration::from_millis(5));
        assert!(flying.next(woken).await.is_empty());
        assert!(!flying.is_empty());
        assert_eq!(flying.all().await, ["slow"]);
    }

    #[tokio::test(start_paused = true)]
    async fn answers_already_come_are_handed_back_together() {
        let mut flying = InFlight::new(8);
        flying.ask("a".to_owned(), answered_after(10, "a"));
        flying.ask("b".to_owned(), answered_after(10, "b"));
        flying.ask("c".to_owned(), answered_after(50, "c"));
        let mut first = flying.next(std::future::pending()).await;
        first.sort_unstable();
        assert_eq!(first, ["a", "b"]);
        assert_eq!(flying.unanswered().len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn no_more_than_the_limit_are_in_the_server_at_once() {
        let sent = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut flying = InFlight::new(2);
        for uid in ["a", "b", "c"] {
            let sent = std::sync::Arc::clone(&sent);
            flying.ask(uid.to_owned(), async move {
                sent.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(10)).await;
                uid
            });
        }
        // Polled once: two sent, the third waits for a place.
        assert!(flying.next(std::future::ready(())).await.is_empty());
        assert_eq!(sent.load(std::sync::atomic::Ordering::SeqCst), 2);
        assert_eq!(flying.unanswered().len(), 3);
        assert_eq!(flying.all().await.len(), 3);
        assert_eq!(sent.load(std::sync::atomic::Ordering::SeqCst), 3);
    }
}
