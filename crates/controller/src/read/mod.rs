//! Reads that are not served from a watch cache: one object, one list, whether a kind is served.
//! [`Reader`] holds the client privately and offers reads only, so a module that is handed a
//! reader cannot write: every write goes through [`crate::write::Writer`].

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use kube::{
    Api, Client, Resource,
    api::{ApiResource, GetParams, ListParams, ObjectList},
    core::{ClusterResourceScope, DynamicResourceScope, NamespaceResourceScope, ResourceScope},
    discovery::{self, ApiGroup},
};
use serde::de::DeserializeOwned;

mod node_read;

pub use node_read::ReadNodeError;

/// Where an object lives: the whole cluster or one namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope<'a> {
    /// Cluster-scoped kinds, or every namespace of a namespaced kind.
    Cluster,
    /// One namespace.
    Namespace(&'a str),
}

impl<'a> Scope<'a> {
    /// The scope an object's namespace names (`None`: cluster).
    #[must_use]
    pub fn of(namespace: Option<&'a str>) -> Self {
        namespace.map_or(Self::Cluster, Self::Namespace)
    }
}

/// How an `Api` of a kind of this scope is built for a [`Scope`]: a cluster-scoped kind is
/// always reached cluster-wide, a namespaced (or dynamic) one in the namespace named.
pub trait Placement: ResourceScope {
    /// The `Api` of `K` in `scope`.
    fn api<K: Resource<Scope = Self>>(client: &Client, scope: Scope<'_>, kind: &K::DynamicType) -> Api<K>;
}

impl Placement for ClusterResourceScope {
    fn api<K: Resource<Scope = Self>>(client: &Client, _scope: Scope<'_>, kind: &K::DynamicType) -> Api<K> {
        Api::all_with(client.clone(), kind)
    }
}

impl Placement for NamespaceResourceScope {
    fn api<K: Resource<Scope = Self>>(client: &Client, scope: Scope<'_>, kind: &K::DynamicType) -> Api<K> {
        in_namespace(Api::all_with(client.clone(), kind), scope)
    }
}

impl Placement for DynamicResourceScope {
    fn api<K: Resource<Scope = Self>>(client: &Client, scope: Scope<'_>, kind: &K::DynamicType) -> Api<K> {
        in_namespace(Api::all_with(client.clone(), kind), scope)
    }
}

fn in_namespace<K>(all: Api<K>, scope: Scope<'_>) -> Api<K>
where
    K: Resource,
    K::Scope: kube::core::NamespaceScope,
{
    match scope {
        Scope::Cluster => all,
        Scope::Namespace(namespace) => all.constrain(namespace),
    }
}

/// Builds the `Api` of `K` in `scope`: the one place outside the writer that turns a client into
/// an `Api`, and it never leaves this module or the writer's.
pub(crate) fn api<K>(client: &Client, scope: Scope<'_>, kind: &K::DynamicType) -> Api<K>
where
    K: Resource,
    K::Scope: Placement,
{
    <K::Scope as Placement>::api::<K>(client, scope, kind)
}

/// The reads of one kind in one scope: an `Api` that cannot write.
pub struct ReadApi<K> {
    api: Api<K>,
}

impl<K> ReadApi<K>
where
    K: Resource + Clone + std::fmt::Debug + DeserializeOwned,
    K::Scope: Placement,
{
    /// Object `name` (`None`: not found).
    pub async fn get_opt(&self, name: &str) -> Result<Option<K>, kube::Error> {
        self.api.get_opt(name).await
    }

    /// Object `name`.
    pub async fn get(&self, name: &str) -> Result<K, kube::Error> {
        self.api.get(name).await
    }

    /// The objects `params` select.
    pub async fn list(&self, params: &ListParams) -> Result<ObjectList<K>, kube::Error> {
        self.api.list(params).await
    }

    /// The `Api` underneath, for the writer alone (`write::Writer::delete_stamped_in`).
    pub(crate) fn api(&self) -> &Api<K> {
        &self.api
    }
}

/// A read-only handle on the API server.
#[derive(Clone)]
pub struct Reader {
    client: Client,
    /// Which resources the server serves, by `group/version` and resource, and when it said so
    /// (shared by this reader's clones; see [`Reader::serves`]).
    served: Arc<Mutex<HashMap<(String, String), Served>>>,
}

/// Whether a resource is served, and when the server said so.
type Served = (Instant, bool);

/// How long an answer about a resource being served is trusted.
const SERVED_TTL: Duration = Duration::from_secs(60);

impl Reader {
    /// Reads through `client`.
    #[must_use]
    pub fn new(client: Client) -> Self {
        Self {
            client,
            served: Arc::default(),
        }
    }

    /// Whether the server serves `resource` in `group_version`, asked through discovery at most
    /// once per minute. A failed question answers `false` (the caller takes the safe side) and is
    /// asked again next time.
    pub async fn serves(&self, group_version: &str, resource: &str) -> bool {
        let key = (group_version.to_owned(), resource.to_owned());
        if let Some((at, served)) = self
            .served
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
            && at.elapsed() < SERVED_TTL
        {
            return *served;
        }
        let served = match self.api_group_resources(group_version).await {
            Ok(list) => list.resources.iter().any(|r| r.name == resource),
            Err(kube::Error::Api(status)) if status.is_not_found() => false,
            Err(error) => {
                tracing::debug!(%error, group_version, resource, "asking whether a resource is served failed");
                return false;
            }
        };
        self.served
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key, (Instant::now(), served));
        served
    }

    /// Forgets what the server said about `group_version` (a write to it answered 404: the server
    /// stopped serving it), so that the next [`Reader::serves`] asks again.
    pub fn forget_served(&self, group_version: &str) {
        self.served
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|(gv, _), _| gv != group_version);
    }

    /// The reads of kind `K` in `scope`.
    #[must_use]
    pub fn api<K>(&self, scope: Scope<'_>, kind: &K::DynamicType) -> ReadApi<K>
    where
        K: Resource,
        K::Scope: Placement,
    {
        ReadApi {
            api: api(&self.client, scope, kind),
        }
    }

    /// Object `name` of kind `K` (`None`: not found).
    pub async fn get_opt<K>(
        &self,
        scope: Scope<'_>,
        kind: &K::DynamicType,
        name: &str,
    ) -> Result<Option<K>, kube::Error>
    where
        K: Resource + Clone + std::fmt::Debug + DeserializeOwned,
        K::Scope: Placement,
    {
        api::<K>(&self.client, scope, kind).get_opt(name).await
    }

    /// Object `name` of kind `K`, answered by the API server's watch cache when it holds
    /// `resource_version` or newer.
    pub async fn get_at<K>(
        &self,
        scope: Scope<'_>,
        kind: &K::DynamicType,
        name: &str,
        params: &GetParams,
    ) -> Result<K, kube::Error>
    where
        K: Resource + Clone + std::fmt::Debug + DeserializeOwned,
        K::Scope: Placement,
    {
        api::<K>(&self.client, scope, kind).get_with(name, params).await
    }

    /// The objects of kind `K` in `scope` that `params` select.
    pub async fn list<K>(
        &self,
        scope: Scope<'_>,
        kind: &K::DynamicType,
        params: &ListParams,
    ) -> Result<ObjectList<K>, kube::Error>
    where
        K: Resource + Clone + std::fmt::Debug + DeserializeOwned,
        K::Scope: Placement,
    {
        api::<K>(&self.client, scope, kind).list(params).await
    }

    /// The resources the server serves in `group_version` (`resource.k8s.io/v1alpha3`).
    pub async fn api_group_resources(
        &self,
        group_version: &str,
    ) -> Result<k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResourceList, kube::Error> {
        self.client.list_api_group_resources(group_version).await
    }

    /// The API group `group` as the server serves it.
    pub async fn group(&self, group: &str) -> Result<ApiGroup, kube::Error> {
        discovery::group(&self.client, group).await
    }

    /// The resource and scope the server serves for `gvk`.
    pub async fn pinned_kind(
        &self,
        gvk: &kube::api::GroupVersionKind,
    ) -> Result<(ApiResource, discovery::ApiCapabilities), kube::Error> {
        discovery::pinned_kind(&self.client, gvk).await
    }

    /// The server's version (also keeps a connection open, see `write::keep_warm`).
    pub async fn version(&self) -> Result<k8s_openapi::apimachinery::pkg::version::Info, kube::Error> {
        self.client.apiserver_version().await
    }
}
