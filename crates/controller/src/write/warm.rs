//! Keeps connections to the API server open for the fault path. kube's client speaks HTTP/1.1: a
//! request that finds no idle connection opens one (a TCP and TLS handshake, tens of milliseconds
//! on a loaded server, and the server's core to spare), and the API server closes a connection left
//! idle for 90 s. So a burst of faults after a quiet hour would open a connection for nearly every
//! request of its first cordons. While this replica leads, every [`WARM_EVERY`] it asks the server
//! for its version (no etcd, no object) that many times at once, so that as many connections stay
//! open: a fixed cost of `connections` small requests a minute.

use std::time::Duration;

use crate::{leader::Fence, read::Reader};

/// How often the connections are used: under the API server's 90 s idle timeout.
pub const WARM_EVERY: Duration = Duration::from_secs(60);

/// The longest one round of requests may take; the next round comes a minute later all the same.
const ROUND_DEADLINE: Duration = Duration::from_secs(10);

/// Keeps `connections` connections of the writer's client open (through `reader`, which shares
/// them) while `fence` is held, until aborted (0: returns at once).
pub async fn keep_warm(reader: Reader, fence: Fence, connections: usize) {
    if connections == 0 {
        return;
    }
    loop {
        fence.acquired().await;
        let round = futures::future::join_all((0..connections).map(|_| reader.version()));
        let failed = match tokio::time::timeout(ROUND_DEADLINE, round).await {
            Ok(answers) => answers.iter().filter(|answer| answer.is_err()).count(),
            Err(_) => connections,
        };
        if failed > 0 {
            // Only latency is at stake: the fault path opens what it needs.
            tracing::warn!(
                failed,
                connections,
                "keeping connections to the API server open: version requests failed or took over 10 s"
            );
        }
        tokio::time::sleep(WARM_EVERY).await;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::tests::{held_at_once, ops, reply};
    use super::*;

    fn version() -> serde_json::Value {
        serde_json::json!({"major": "1", "minor": "35", "gitVersion": "v1.35.4"})
    }

    #[tokio::test]
    async fn a_leader_asks_as_many_times_at_once_as_connections_it_keeps() {
        let (ops, mut handle) = ops(Fence::standalone());
        let warm = tokio::spawn(keep_warm(ops.reader(), ops.fence().clone(), 3));
        // All three are in flight before any is answered: three connections, not one used thrice.
        for (request, respond) in held_at_once(&mut handle, 3).await {
            assert_eq!(request.uri().path(), "/version");
            respond.send_response(reply(200, &version()));
        }
        let more = tokio::time::timeout(Duration::from_millis(200), handle.next_request()).await;
        assert!(more.is_err(), "nothing more until the next round");
        warm.abort();
    }

    #[tokio::test]
    async fn none_asked_for_ends_at_once_and_sends_nothing() {
        let (ops, mut handle) = ops(Fence::standalone());
        tokio::time::timeout(
            Duration::from_secs(1),
            keep_warm(ops.reader(), ops.fence().clone(), 0),
        )
        .await
        .expect("keeping no connection ends at once");
        let request = tokio::time::timeout(Duration::from_millis(200), handle.next_request()).await;
        assert!(request.is_err(), "nothing is sent");
    }

    #[tokio::test]
    async fn a_replica_that_does_not_lead_keeps_nothing_open() {
        let (fence, _keeper) = Fence::keeper(None);
        let (ops, mut handle) = ops(fence);
        let warm = tokio::spawn(keep_warm(ops.reader(), ops.fence().clone(), 3));
        let request = tokio::time::timeout(Duration::from_millis(200), handle.next_request()).await;
        assert!(request.is_err(), "a follower sends nothing");
        warm.abort();
    }
}
