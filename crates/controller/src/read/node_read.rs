//! Admission's last look at a node before its remediation is created (`fleet::no_longer_due`
//! decides from it). The plan was made from our watch cache, which can be a moment behind the
//! API server; the read names the version that cache holds, so the API server answers from its
//! own watch cache, at least that fresh, instead of reading etcd. At 1,000 nodes and 20,000 pods,
//! with ten drains running, a quorum read of one node spent 0.5–0.9 s in etcd while a hundred
//! faults waited on it (`docs/benchmarks-history.md`); the answer the check needs is what the server has
//! seen, which its watch cache holds within milliseconds of etcd.
//!
//! When the server's watch cache is behind the version named (an API server restarted behind a
//! load balancer: it waits up to 3 s for its cache, then answers 504 "Too large resource
//! version"), the node is read from etcd instead, and the log says so.

use k8s_openapi::api::core::v1::Node;
use kube::{Api, api::GetParams};

use super::Reader;

/// Why reading a node failed.
#[derive(Debug, thiserror::Error)]
#[error("reading node {node} failed: {source}")]
pub struct ReadNodeError {
    /// The node.
    pub node: String,
    /// What went wrong.
    #[source]
    pub source: kube::Error,
}

impl Reader {
    /// Reads node `name` (`None`: it is gone) at least as fresh as `known`, the resourceVersion our
    /// cache holds of it: from the API server's watch cache, or from etcd when that cache is behind
    /// `known` or `known` is `None`.
    pub async fn read_node(&self, name: &str, known: Option<&str>) -> Result<Option<Node>, ReadNodeError> {
        let api = Api::<Node>::all(self.client.clone());
        let answer = match known {
            Some(version) => match api.get_with(name, &GetParams::at(version)).await {
                Err(kube::Error::Api(status)) if status.code == 504 => {
                    tracing::warn!(
                        node = name,
                        version,
                        message = %status.message,
                        "the API server's watch cache is behind the node as we saw it; reading it from etcd"
                    );
                    api.get(name).await
                }
                answer => answer,
            },
            None => api.get(name).await,
        };
        match answer {
            Ok(node) => Ok(Some(node)),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
            Err(source) => Err(ReadNodeError {
                node: name.to_owned(),
                source,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::leader::Fence;
    use crate::write::tests::{ops, reply};

    fn node() -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "gpu-1", "uid": "uid-1", "resourceVersion": "9"},
        })
    }

    fn status(code: u16, reason: &str) -> serde_json::Value {
        serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason,
            "message": format!("{reason} from the test server"),
        })
    }

    #[tokio::test]
    async fn the_read_names_the_cached_version_so_the_server_answers_from_its_watch_cache() {
        let (ops, mut handle) = ops(Fence::standalone());
        let server = tokio::spawn(async move {
            let (request, respond) = handle.next_request().await.expect("the read");
            respond.send_response(reply(200, &node()));
            request.uri().to_string()
        });
        let read = ops.reader().read_node("gpu-1", Some("7")).await.unwrap();
        assert_eq!(read.unwrap().metadata.resource_version.as_deref(), Some("9"));
        let uri = server.await.unwrap();
        assert!(uri.starts_with("/api/v1/nodes/gpu-1"), "{uri}");
        assert!(uri.contains("resourceVersion=7"), "{uri}");
    }

    #[tokio::test]
    async fn a_watch_cache_behind_our_version_sends_the_read_to_etcd() {
        let (ops, mut handle) = ops(Fence::standalone());
        let server = tokio::spawn(async move {
            let mut uris = Vec::new();
            loop {
                let (request, respond) = handle.next_request().await.expect("a read");
                let uri = request.uri().to_string();
                let from_cache = uri.contains("resourceVersion=");
                uris.push(uri);
                if from_cache {
                    respond.send_response(reply(504, &status(504, "Timeout")));
                } else {
                    respond.send_response(reply(200, &node()));
                    return uris;
                }
            }
        });
        let read = ops.reader().read_node("gpu-1", Some("7")).await.unwrap();
        assert!(read.is_some());
        let uris = server.await.unwrap();
        let last = uris.last().unwrap();
        assert!(
            !last.contains("resourceVersion"),
            "the last read goes to etcd: {uris:?}"
        );
        assert!(
            uris[0].contains("resourceVersion=7"),
            "the first asks the watch cache: {uris:?}"
        );
        // One 504 is enough: `read_node` does not ask the cache again before etcd. (Nor does the
        // client: `Writer::new` turns kube's retry layer off; this mock client has none.)
        assert_eq!(uris.len(), 2, "{uris:?}");
    }

    #[tokio::test]
    async fn a_node_that_is_gone_reads_as_none_and_other_refusals_are_errors() {
        let (ops, mut handle) = ops(Fence::standalone());
        let server = tokio::spawn(async move {
            let (_, respond) = handle.next_request().await.expect("the first read");
            respond.send_response(reply(404, &status(404, "NotFound")));
            let (_, respond) = handle.next_request().await.expect("the second read");
            respond.send_response(reply(403, &status(403, "Forbidden")));
        });
        assert!(
            ops.reader()
                .read_node("gpu-1", Some("7"))
                .await
                .unwrap()
                .is_none()
        );
        let refused = ops.reader().read_node("gpu-1", None).await.unwrap_err();
        assert!(
            refused.to_string().contains("reading node gpu-1 failed"),
            "{refused}"
        );
        server.await.unwrap();
    }
}
