//! The HTTP server for `/metrics` (`OpenMetrics`), `/healthz` and `/readyz`.

use std::future::Future;

use axum::{
    Router,
    extract::State,
    http::{StatusCode, header},
    response::IntoResponse,
    routing::get,
};
use tokio::net::TcpListener;

use super::{
    health::{Health, Readiness},
    metrics::{Metrics, OPENMETRICS_CONTENT_TYPE},
};

#[derive(Clone)]
struct Served {
    metrics: Metrics,
    health: Health,
}

/// The routes, for `serve` and for tests.
pub fn router(metrics: Metrics, health: Health) -> Router {
    Router::new()
        .route("/metrics", get(metrics_text))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready))
        .with_state(Served { metrics, health })
}

async fn metrics_text(State(served): State<Served>) -> impl IntoResponse {
    // The leader and fence gauges are read from the fence at scrape time, so they are never stale.
    served.metrics.set_leader(served.health.is_leader());
    served.metrics.set_fence_unproven(served.health.fence_unproven());
    (
        [(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)],
        served.metrics.encode(),
    )
}

async fn ready(State(served): State<Served>) -> impl IntoResponse {
    let readiness = served.health.readiness();
    let status = if readiness == Readiness::Ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, readiness.as_str().into_owned())
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    metrics: Metrics,
    health: Health,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(metrics, health))
        .with_graceful_shutdown(shutdown)
        .await
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;
    use crate::leader::Fence;

    async fn get_path(address: std::net::SocketAddr, path: &str) -> (u16, String) {
        let mut stream = tokio::net::TcpStream::connect(address).await.expect("connect");
        let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.expect("write");
        let mut response = String::new();
        stream.read_to_string(&mut response).await.expect("read");
        let status = response
            .split(' ')
            .nth(1)
            .and_then(|code| code.parse().ok())
            .expect("status code");
        (status, response)
    }

    #[tokio::test]
    async fn readyz_turns_ready_when_caches_sync_and_metrics_report_the_leader() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let (fence, keeper) = Fence::keeper(None);
        let health = Health::new(fence);
        let metrics = Metrics::new();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, metrics.clone(), health.clone(), async {
            let _ = stopped.await;
        }));

        assert_eq!(get_path(address, "/healthz").await.0, 200);
        let (status, body) = get_path(address, "/readyz").await;
        assert_eq!(status, 503);
        assert!(body.ends_with("caches not synced"));
        health.mark_caches_synced();
        assert_eq!(get_path(address, "/readyz").await.0, 200);

        let (status, body) = get_path(address, "/metrics").await;
        assert_eq!(status, 200);
        assert!(body.contains("application/openmetrics-text"));
        assert!(body.contains("\ngpu_remediator_leader 0\n"));
        keeper.hold_until(tokio::time::Instant::now() + std::time::Duration::from_secs(10));
        assert!(
            get_path(address, "/metrics")
                .await
                .1
                .contains("\ngpu_remediator_leader 1\n")
        );

        stop.send(()).expect("server running");
        server.await.expect("server task").expect("serve");
    }
}
