//! The one gRPC call the agent makes to its kubelet: `v1.PodResourcesLister/List` over the
//! pod-resources unix socket, under a deadline. The channel connects lazily and reconnects after a
//! kubelet restart; a failed call is an error for the caller to weigh (it keeps the last
//! assignment, which then ages, and never invents one).

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use http::uri::PathAndQuery;
use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint};
use tonic_prost::ProstCodec;

use super::proto::{LIST_PATH, ListPodResourcesRequest, ListPodResourcesResponse};

/// The kubelet's pod-resources socket.
pub const DEFAULT_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";
/// The largest answer read (a node of a few hundred pods answers a few kilobytes).
const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// The kubelet did not answer `List`.
#[derive(Debug, thiserror::Error)]
pub enum ReadPodResourcesError {
    /// No answer within the deadline.
    #[error("the kubelet's pod-resources API at {socket} did not answer within {after:?}")]
    TimedOut {
        /// The socket.
        socket: String,
        /// The deadline.
        after: Duration,
    },
    /// The call failed (no socket, the kubelet refused, a bad answer).
    #[error("listing pod resources at {socket}: {status}")]
    Call {
        /// The socket.
        socket: String,
        /// The gRPC status.
        status: Box<tonic::Status>,
    },
    /// The connection failed.
    #[error("connecting to the kubelet's pod-resources API at {socket}: {source}")]
    Connect {
        /// The socket.
        socket: String,
        /// What failed.
        source: tonic::transport::Error,
    },
}

/// Reads the kubelet's pod resources.
#[derive(Clone, Debug)]
pub struct PodResourcesReader {
    channel: Channel,
    socket: PathBuf,
    deadline: Duration,
}

impl PodResourcesReader {
    /// A reader of the socket at `socket`, each call bounded by `deadline`. Connects on first use.
    #[must_use]
    pub fn new(socket: &Path, deadline: Duration) -> Self {
        let path = socket.to_owned();
        // The URI is required by the API and ignored by the connector.
        let channel =
            Endpoint::from_static("http://[::]:0")
                .connect_timeout(deadline)
                .connect_with_connector_lazy(tower::service_fn(move |_| {
                    let path = path.clone();
                    async move {
                        Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?))
                    }
                }));
        Self {
            channel,
            socket: socket.to_owned(),
            deadline,
        }
    }

    /// The socket read.
    #[must_use]
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// `List`: every pod of the node and its devices.
    pub async fn list(&self) -> Result<ListPodResourcesResponse, ReadPodResourcesError> {
        let socket = self.socket.display().to_string();
        let call = async {
            let mut grpc =
                tonic::client::Grpc::new(self.channel.clone()).max_decoding_message_size(MAX_RESPONSE_BYTES);
            grpc.ready()
                .await
                .map_err(|source| ReadPodResourcesError::Connect {
                    socket: socket.clone(),
                    source,
                })?;
            grpc.unary(
                tonic::Request::new(ListPodResourcesRequest {}),
                PathAndQuery::from_static(LIST_PATH),
                ProstCodec::<ListPodResourcesRequest, ListPodResourcesResponse>::default(),
            )
            .await
            .map(tonic::Response::into_inner)
            .map_err(|status| ReadPodResourcesError::Call {
                socket: socket.clone(),
                status: Box::new(status),
            })
        };
        tokio::time::timeout(self.deadline, call)
            .await
            .map_err(|_| ReadPodResourcesError::TimedOut {
                socket: socket.clone(),
                after: self.deadline,
            })?
    }
}
