//! The elector's writes to the leader Lease: the one write the controller makes without a claim,
//! because it is how a claim is made (see `election::elector`). The Lease's own `resourceVersion`
//! fences these writes: a replace over a stale read conflicts.

use k8s_openapi::api::coordination::v1::Lease;
use kube::{
    Api, Client,
    api::{PostParams, Resource},
};

/// The Lease writes of one elector, in one namespace.
#[derive(Clone, Debug)]
pub struct Leases {
    api: Api<Lease>,
}

impl Leases {
    /// The Leases of `namespace`, through `client`.
    #[must_use]
    pub fn new(client: Client, namespace: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
        }
    }

    /// The Lease `name` (`None`: there is none).
    pub async fn get_opt(&self, name: &str) -> Result<Option<Lease>, kube::Error> {
        self.api.get_opt(name).await
    }

    /// Creates `lease` (a campaign for a Lease nobody holds).
    pub async fn create_lease(&self, params: &PostParams, lease: &Lease) -> Result<Lease, kube::Error> {
        self.api.create(params, lease).await
    }

    /// Replaces Lease `name` with `lease`, over the version `lease` carries (a renewal, a take-over
    /// of an expired Lease, a release).
    pub async fn replace_lease(
        &self,
        name: &str,
        params: &PostParams,
        lease: &Lease,
    ) -> Result<Lease, kube::Error> {
        debug_assert!(
            lease.meta().resource_version.is_some(),
            "a Lease is replaced over a read"
        );
        self.api.replace(name, params, lease).await
    }
}
