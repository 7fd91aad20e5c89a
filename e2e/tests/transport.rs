//! The controller's transport (`gpu_remediator::transport`) against the real API server: it
//! negotiates HTTP/2 (HTTP/1.1 when told to), and a burst of requests shares its one connection, where kube's default
//! client (the peer, measured in the same test) opens a connection, a TLS handshake, for each
//! request in flight. Connections are counted from this process's own sockets (`/proc/self/fd`
//! matched with `/proc/net/tcp`), so the control plane's other clients do not count.

mod common;

use std::collections::HashSet;

use futures::future::join_all;
use gpu_remediator::transport::Versions;
use kube::{Client, client::Body};

/// Requests sent at once in the burst.
const BURST: usize = 32;

/// The API server's port, from `https://127.0.0.1:<port>`.
fn api_port(server_url: &str) -> u16 {
    server_url
        .rsplit(':')
        .next()
        .and_then(|port| port.trim_end_matches('/').parse().ok())
        .unwrap_or_else(|| panic!("no port in {server_url}"))
}

/// This process's established TCP connections to `port` on the loopback address, by socket inode.
fn connections_to(port: u16) -> HashSet<String> {
    let ours: HashSet<String> = std::fs::read_dir("/proc/self/fd")
        .expect("reading /proc/self/fd")
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter_map(|target| {
            let target = target.to_string_lossy().into_owned();
            Some(target.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
        })
        .collect();
    let remote = format!("0100007F:{port:04X}");
    std::fs::read_to_string("/proc/net/tcp")
        .expect("reading /proc/net/tcp")
        .lines()
        .skip(1)
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // local, remote, state ("01" is ESTABLISHED), ..., inode (the tenth field)
            fields.len() > 9 && fields[2] == remote && fields[3] == "01" && ours.contains(fields[9])
        })
        .map(|line| line.split_whitespace().nth(9).unwrap_or_default().to_owned())
        .collect()
}

/// Sends one `GET /version` and returns the HTTP version it was answered with.
async fn version_of_one_request(client: &Client) -> http::Version {
    let request = http::Request::get("/version")
        .body(Body::empty())
        .expect("a valid request");
    let response = client.send(request).await.expect("GET /version");
    assert!(response.status().is_success(), "GET /version: {}", response.status());
    response.version()
}

/// Warms `client` with one request, then sends [`BURST`] list requests at once and returns how many
/// of the connections this process then holds to the API server were opened for the burst.
async fn connections_opened_by_a_burst(client: &Client, port: u16) -> usize {
    version_of_one_request(client).await;
    let before = connections_to(port);
    let requests = (0..BURST).map(|_| async {
        let request = http::Request::get("/api/v1/namespaces?limit=500")
            .body(Body::empty())
            .expect("a valid request");
        let response = client.send(request).await.expect("listing namespaces");
        assert!(response.status().is_success(), "listing namespaces: {}", response.status());
        // Read the body whole, so each response takes its connection for a while.
        response
            .into_body()
            .collect_bytes()
            .await
            .expect("reading the list");
    });
    join_all(requests).await;
    connections_to(port).difference(&before).count()
}

#[tokio::test]
async fn the_transport_speaks_http2_and_a_burst_shares_one_connection_where_kubes_client_opens_many() {
    let cluster = common::cluster().await;
    let port = api_port(cluster.server_url());

    // Each burst is counted against the sockets open just before it (its client's warm connection
    // among them): the count never depends on how soon another client's sockets close. One test, so that no
    // other test's client opens sockets in this process meanwhile.
    let ours = gpu_remediator::transport::client(&cluster.config()).expect("building the client");
    assert_eq!(version_of_one_request(&ours).await, http::Version::HTTP_2);
    let ours_opened = connections_opened_by_a_burst(&ours, port).await;

    let peer = Client::try_from(cluster.config()).expect("building kube's client");
    assert_eq!(version_of_one_request(&peer).await, http::Version::HTTP_11);
    let peer_opened = connections_opened_by_a_burst(&peer, port).await;

    eprintln!("{BURST} requests at once opened {ours_opened} new connection(s) here, {peer_opened} with kube's client");
    // DISABLE_HTTP2's choice: kube's own HTTP/1.1.
    let http1 = gpu_remediator::transport::client_with(&cluster.config(), Versions::Http1Only)
        .expect("building the HTTP/1.1 client");
    assert_eq!(version_of_one_request(&http1).await, http::Version::HTTP_11);

    // The peer's figure shows the count sees a burst: HTTP/1.1 runs one request per connection.
    assert!(
        peer_opened >= BURST / 4,
        "kube's client opened {peer_opened} connections for {BURST} requests at once"
    );
    assert_eq!(
        ours_opened, 0,
        "the transport opened {ours_opened} connections for {BURST} requests at once (kube's: {peer_opened})"
    );
}
