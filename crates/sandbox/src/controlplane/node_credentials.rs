//! A node's own credentials against the sandbox's control plane: the kubelet's client certificate
//! (user `system:node:<name>`, group `system:nodes`), signed by the control plane's CA, as a
//! bootstrapped kubelet holds it. With the API server's Node authorizer and `NodeRestriction`
//! admission plugin (both on, see [`super::ControlPlane::start`]) it may write only its own Node
//! and the objects bound to it: what an attacker on a compromised node holds.

use super::ControlPlane;
use super::pki::{self, CreatePkiError};

impl ControlPlane {
    /// Node `node`'s kubelet client certificate and key, minted now (under the data directory's
    /// `pki/nodes/`): what a real node's kubeconfig names.
    ///
    /// # Errors
    /// When `openssl` cannot make or sign the certificate.
    pub fn node_certificate(&self, node: &str) -> Result<pki::ClientCertificate, CreatePkiError> {
        pki::node_client_certificate(&self.data_dir.join("pki"), node)
    }

    /// The CA that signed the API server's serving certificate and every client's.
    #[must_use]
    pub fn ca_certificate(&self) -> std::path::PathBuf {
        self.data_dir.join("pki").join("ca.crt")
    }

    /// A client config that authenticates as node `node`'s kubelet, with a client certificate minted
    /// now (under the data directory's `pki/nodes/`).
    ///
    /// # Errors
    /// When `openssl` cannot make or sign the certificate.
    pub fn node_config(&self, node: &str) -> Result<kube::Config, CreatePkiError> {
        let certificate = pki::node_client_certificate(&self.data_dir.join("pki"), node)?;
        let mut config = self.config();
        config.auth_info = serde_json::from_value(serde_json::json!({
            "client-certificate": certificate.cert,
            "client-key": certificate.key,
        }))
        .expect("an AuthInfo with certificate files deserialises");
        Ok(config)
    }

    /// A new client that authenticates as node `node`'s kubelet (see [`Self::node_config`]).
    ///
    /// # Errors
    /// When the certificate cannot be made, or the client not built from it.
    pub fn node_client(&self, node: &str) -> Result<kube::Client, NodeClientError> {
        let config = self.node_config(node)?;
        Ok(kube::Client::try_from(config)?)
    }
}

/// Failure to make a client with a node's credentials.
#[derive(Debug, thiserror::Error)]
pub enum NodeClientError {
    /// The certificate could not be made.
    #[error("minting the node's client certificate: {0}")]
    Certificate(#[from] CreatePkiError),
    /// The client could not be built from it (an unreadable key, say).
    #[error("building a client with the node's certificate: {0}")]
    Client(#[from] kube::Error),
}
