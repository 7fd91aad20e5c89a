//! A loopback TCP proxy to put between the controller and the API server: it adds latency to
//! every chunk in both directions and can cut every open connection at once, as a flaky network
//! or a load balancer failing over does. TLS passes through untouched (the API server's
//! certificate names 127.0.0.1, whatever the port).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// The proxy could not listen.
#[derive(Debug, thiserror::Error)]
#[error("binding the proxy on 127.0.0.1: {0}")]
pub struct StartProxyError(#[source] std::io::Error);

/// A running proxy; it stops when dropped.
pub struct FaultyProxy {
    address: SocketAddr,
    latency_ms: Arc<AtomicU64>,
    cut: watch::Sender<u64>,
    connections: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl FaultyProxy {
    /// Listens on a free 127.0.0.1 port and forwards every connection to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Result<Self, StartProxyError> {
        let listener = TcpListener::bind("127.0.0.1:0").await.map_err(StartProxyError)?;
        let address = listener.local_addr().map_err(StartProxyError)?;
        let latency_ms = Arc::new(AtomicU64::new(0));
        let connections = Arc::new(AtomicU64::new(0));
        let (cut, cuts) = watch::channel(0u64);
        let (latency, count) = (latency_ms.clone(), connections.clone());
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::Relaxed);
                let (latency, mut cuts) = (latency.clone(), cuts.clone());
                cuts.mark_unchanged();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    let up = pump(client_read, server_write, latency.clone());
                    let down = pump(server_read, client_write, latency);
                    // Whichever ends first (a side closes, or a cut) drops both halves of both
                    // sockets, which closes the connection for both peers.
                    tokio::select! {
                        () = up => {}
                        () = down => {}
                        _ = cuts.changed() => {}
                    }
                });
            }
        });
        Ok(Self {
            address,
            latency_ms,
            cut,
            connections,
            task,
        })
    }

    /// Where clients connect.
    #[must_use]
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// `https://127.0.0.1:<port>`, to put in a client config.
    #[must_use]
    pub fn url(&self) -> String {
        format!("https://{}", self.address)
    }

    /// Delay added before each chunk is forwarded, in both directions.
    pub fn set_latency(&self, latency: Duration) {
        self.latency_ms.store(
            u64::try_from(latency.as_millis()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// Closes every connection open now (new ones are accepted as before).
    pub fn cut_connections(&self) {
        self.cut.send_modify(|n| *n += 1);
    }

    /// Connections accepted so far.
    #[must_use]
    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }
}

impl Drop for FaultyProxy {
    fn drop(&mut self) {
        self.cut_connections();
        self.task.abort();
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    latency_ms: Arc<AtomicU64>,
) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let latency = latency_ms.load(Ordering::Relaxed);
        if latency > 0 {
            tokio::time::sleep(Duration::from_millis(latency)).await;
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buffer = [0u8; 1024];
                    while let Ok(n) = socket.read(&mut buffer).await {
                        if n == 0 || socket.write_all(&buffer[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        address
    }

    #[tokio::test]
    async fn bytes_pass_through_with_the_latency_added_each_way() {
        let proxy = FaultyProxy::start(echo_server().await).await.unwrap();
        proxy.set_latency(Duration::from_millis(100));
        let mut client = TcpStream::connect(proxy.address()).await.unwrap();
        let started = tokio::time::Instant::now();
        client.write_all(b"ping").await.unwrap();
        let mut answer = [0u8; 4];
        client.read_exact(&mut answer).await.unwrap();
        assert_eq!(&answer, b"ping");
        assert!(
            started.elapsed() >= Duration::from_millis(200),
            "{:?}",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn a_cut_closes_open_connections_and_new_ones_still_work() {
        let proxy = FaultyProxy::start(echo_server().await).await.unwrap();
        let mut old = TcpStream::connect(proxy.address()).await.unwrap();
        old.write_all(b"a").await.unwrap();
        let mut one = [0u8; 1];
        old.read_exact(&mut one).await.unwrap();
        proxy.cut_connections();
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(5), old.read_to_end(&mut rest)).await;
        assert!(matches!(closed, Ok(Ok(0) | Err(_))), "{closed:?}");
        let mut new = TcpStream::connect(proxy.address()).await.unwrap();
        new.write_all(b"b").await.unwrap();
        new.read_exact(&mut one).await.unwrap();
        assert_eq!(&one, b"b");
        assert_eq!(proxy.connections(), 2);
    }
}
