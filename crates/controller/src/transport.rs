//! How the controller's clients reach the API server: over HTTP/2 where the server offers it (a
//! Kubernetes API server always does over TLS), HTTP/1.1 otherwise.
//!
//! kube's own client speaks HTTP/1.1 only (kube-rs issue 1923): one request per connection at a
//! time, so every request that finds no idle connection opens a new one, a TLS handshake that took
//! ~45 ms on the 2-core bench machine, and each open watch holds a connection of its own. Ten
//! faults at once were ten cordons of which the tenth waited for that handshake
//! (`docs/benchmarks.md`, "Scale fleets"). Over HTTP/2 every request and watch of one client is a
//! stream on one connection, as client-go does it.
//!
//! The stack is kube's default one (`ClientBuilder::try_from(Config)`) with three differences:
//! - the TLS connector offers `h2` and `http/1.1` by ALPN, and the connection pool shares an HTTP/2
//!   connection between requests;
//! - the HTTP/2 connection is pinged every [`PING_INTERVAL`] while idle and dropped when a ping
//!   goes unanswered for [`PING_TIMEOUT`] (client-go's `ReadIdleTimeout` and `PingTimeout`): a
//!   multiplexed connection that dies silently would otherwise stall every watch and request at
//!   once;
//! - no retry layer: the controller never wants the client to retry on its own (a write retried
//!   after its claim's deadline, an eviction's 429 hidden for seconds); the next pass retries, after
//!   checking the fence again.
//!
//! `DISABLE_HTTP2` set to anything non-empty in the controller's environment keeps it on HTTP/1.1,
//! as it does client-go's transports (`k8s.io/apimachinery/pkg/util/net`): for a proxy in front of
//! the API server that mishandles HTTP/2, and for the scale bench's same-machine comparison.
//!
//! It also leaves out kube's tracing layer (a debug span per request) and its exec-credential expiry
//! (`Client::valid_until`): the controller authenticates by a token file or a certificate, never by
//! an exec plugin.

use std::time::Duration;

use hyper_util::{
    client::legacy::{Client as HyperClient, connect::HttpConnector},
    rt::{TokioExecutor, TokioTimer},
};
use kube::{
    Client, Config,
    client::{Body, ConfigExt},
};
use tower::{BoxError, ServiceBuilder};

/// How often an idle HTTP/2 connection is pinged (client-go: `ReadIdleTimeout`, 30 s).
pub const PING_INTERVAL: Duration = Duration::from_secs(30);

/// How long a ping may go unanswered before the connection is closed (client-go: `PingTimeout`).
pub const PING_TIMEOUT: Duration = Duration::from_secs(15);

/// Why a client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The configuration's credentials or TLS settings could not be used.
    #[error("the client configuration cannot be used: {0}")]
    Config(#[from] kube::Error),
    /// The TLS server name override is not a valid name.
    #[error("tls-server-name {name:?} is not a valid server name")]
    ServerName {
        /// The name as configured.
        name: String,
    },
}

/// The environment variable that keeps the transport on HTTP/1.1 (client-go's name).
pub const DISABLE_HTTP2: &str = "DISABLE_HTTP2";

/// Which HTTP versions the transport offers the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Versions {
    /// HTTP/2 where the server offers it by ALPN, HTTP/1.1 otherwise.
    Http2OrHttp1,
    /// HTTP/1.1 only (kube's own client).
    Http1Only,
}

impl Versions {
    /// [`Versions::Http1Only`] when [`DISABLE_HTTP2`] is set and not empty.
    #[must_use]
    pub fn from_env() -> Self {
        match std::env::var_os(DISABLE_HTTP2) {
            Some(value) if !value.is_empty() => Self::Http1Only,
            _ => Self::Http2OrHttp1,
        }
    }
}

/// A client for `config` over the versions [`Versions::from_env`] allows; it never retries by
/// itself (whatever `config.default_retry` says).
pub fn client(config: &Config) -> Result<Client, TransportError> {
    let versions = Versions::from_env();
    if versions == Versions::Http1Only {
        tracing::info!("{DISABLE_HTTP2} is set: the API server is reached over HTTP/1.1 only");
    }
    client_with(config, versions)
}

/// A client for `config` that offers the server `versions`; it never retries by itself.
pub fn client_with(config: &Config, versions: Versions) -> Result<Client, TransportError> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(config.connect_timeout);

    let tls = config.rustls_client_config()?;
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    let https = match &config.tls_server_name {
        Some(name) => https.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(
            name.clone()
                .try_into()
                .map_err(|_| TransportError::ServerName { name: name.clone() })?,
        )),
        None => https,
    };
    let connector = match versions {
        Versions::Http2OrHttp1 => https.enable_all_versions().wrap_connector(http),
        Versions::Http1Only => https.enable_http1().wrap_connector(http),
    };

    let transport: HyperClient<_, Body> = HyperClient::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .http2_keep_alive_interval(PING_INTERVAL)
        .http2_keep_alive_timeout(PING_TIMEOUT)
        .http2_keep_alive_while_idle(true)
        .build(connector);

    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(transport);
    Ok(Client::new(service, config.default_namespace.clone()))
}
