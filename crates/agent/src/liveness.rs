//! `/healthz` for the kubelet's liveness probe: healthy while the agent's loop keeps completing
//! ticks. A hung NVML does not stop ticks (reads have a deadline and report it as `Unknown`); what
//! this catches is the loop itself stuck, which would leave a stale condition on the node.

use std::{
    future::Future,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use axum::{Router, extract::State, http::StatusCode, routing::get};
use tokio::net::TcpListener;

/// When the loop last completed a tick, and how old that may get.
#[derive(Debug, Clone)]
pub struct Liveness {
    last_tick: Arc<Mutex<Instant>>,
    stale_after: Duration,
}

impl Liveness {
    /// Alive until `stale_after` passes without a tick.
    #[must_use]
    pub fn new(stale_after: Duration) -> Self {
        Self {
            last_tick: Arc::new(Mutex::new(Instant::now())),
            stale_after,
        }
    }

    /// Records a completed tick.
    pub fn beat(&self) {
        *self.last_tick.lock().unwrap_or_else(PoisonError::into_inner) = Instant::now();
    }

    /// Whether the last tick is recent enough at `now`.
    #[must_use]
    pub fn alive_at(&self, now: Instant) -> bool {
        let last = *self.last_tick.lock().unwrap_or_else(PoisonError::into_inner);
        now.saturating_duration_since(last) <= self.stale_after
    }
}

async fn healthz(State(liveness): State<Liveness>) -> (StatusCode, &'static str) {
    if liveness.alive_at(Instant::now()) {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "the probe loop stopped ticking")
    }
}

/// Serves `/healthz` on `listener` until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    liveness: Liveness,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let router = Router::new().route("/healthz", get(healthz)).with_state(liveness);
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    async fn status_of_healthz(address: std::net::SocketAddr) -> String {
        let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response.split(' ').nth(1).unwrap_or_default().to_owned()
    }

    #[test]
    fn a_loop_that_stopped_ticking_is_reported_dead_after_the_allowance() {
        let liveness = Liveness::new(Duration::from_secs(60));
        let now = Instant::now();
        assert!(liveness.alive_at(now));
        assert!(liveness.alive_at(now + Duration::from_secs(59)));
        assert!(!liveness.alive_at(now + Duration::from_secs(61)));
    }

    #[tokio::test]
    async fn healthz_answers_200_while_ticking_and_503_once_stale() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let liveness = Liveness::new(Duration::from_millis(300));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, liveness.clone(), async move {
            let _ = stopped.await;
        }));
        assert_eq!(status_of_healthz(address).await, "200");
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(status_of_healthz(address).await, "503");
        liveness.beat();
        assert_eq!(status_of_healthz(address).await, "200");
        let _ = stop.send(());
        server.await.unwrap().unwrap();
    }
}
