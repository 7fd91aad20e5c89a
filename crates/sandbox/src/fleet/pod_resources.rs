//! The kubelet's pod-resources API (`v1.PodResourcesLister/List`) for one simulated node, served
//! over gRPC on a unix socket as the real kubelet serves
//! `/var/lib/kubelet/pod-resources/kubelet.sock`: what the fleet's simulated device plugin handed
//! the node's pods ([`super::device_plugin`]). A real agent started with `--pod-resources-socket`
//! reads it. Other methods answer `UNIMPLEMENTED`.

use std::{
    convert::Infallible,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, PoisonError},
};

use gpu_health_agent::pod_resources::proto::{LIST_PATH, ListPodResourcesRequest, ListPodResourcesResponse};
use tokio::task::JoinHandle;
use tonic_prost::ProstCodec;

use super::device_plugin::DevicePlugin;

/// A running server; dropping it stops it and removes its socket.
pub struct PodResourcesServer {
    task: JoinHandle<()>,
    socket: PathBuf,
}

impl Drop for PodResourcesServer {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl PodResourcesServer {
    /// The socket it listens on.
    #[must_use]
    pub fn socket(&self) -> &Path {
        &self.socket
    }
}

/// Serves `node`'s pod resources from `plugin` on the unix socket `socket` (replacing a stale
/// one).
pub fn serve(
    socket: &Path,
    node: &str,
    plugin: Arc<Mutex<DevicePlugin>>,
) -> std::io::Result<PodResourcesServer> {
    let _ = std::fs::remove_file(socket);
    let listener = tokio::net::UnixListener::bind(socket)?;
    let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
    let node = node.to_owned();
    let service = tower::service_fn(move |request: http::Request<tonic::body::Body>| {
        let plugin = Arc::clone(&plugin);
        let node = node.clone();
        async move {
            if request.uri().path() != LIST_PATH {
                let status =
                    tonic::Status::unimplemented(format!("{} is not simulated", request.uri().path()));
                return Ok::<_, Infallible>(status.into_http());
            }
            let list = tower::service_fn(move |_: tonic::Request<ListPodResourcesRequest>| {
                let listed = plugin.lock().unwrap_or_else(PoisonError::into_inner).list(&node);
                async move { Ok::<_, tonic::Status>(tonic::Response::new(listed)) }
            });
            let mut grpc = tonic::server::Grpc::new(ProstCodec::<
                ListPodResourcesResponse,
                ListPodResourcesRequest,
            >::default());
            Ok(grpc.unary(list, request).await)
        }
    });
    let task = tokio::spawn(async move {
        if let Err(error) = tonic::transport::Server::builder()
            .serve_with_incoming(service, incoming)
            .await
        {
            tracing::warn!(%error, "simulated pod-resources server stopped");
        }
    });
    Ok(PodResourcesServer {
        task,
        socket: socket.to_owned(),
    })
}
