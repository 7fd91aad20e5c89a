//! A person's own writes from the command line (`kubectl gpu approve`): made under that person's
//! credentials and RBAC, never under the controller's claim, so they bypass the fenced path on
//! purpose. They live here so that no other module holds a mutating client.

use kube::{
    Api, Client, Resource,
    api::{Patch, PatchParams},
};
use serde::de::DeserializeOwned;
use serde_json::Value;

/// Merge-patches cluster-scoped object `name` of kind `K` as the person `client` authenticates,
/// under `field_manager`.
pub async fn patch<K>(
    client: Client,
    name: &str,
    field_manager: &str,
    patch: &Value,
) -> Result<K, kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + DeserializeOwned,
{
    Api::<K>::all(client)
        .patch(
            name,
            &PatchParams {
                field_manager: Some(field_manager.to_owned()),
                ..PatchParams::default()
            },
            &Patch::Merge(patch),
        )
        .await
}

/// Asks the API server who `client` authenticates as (a `SelfSubjectReview`: a create that stores
/// nothing).
pub async fn review_self(
    client: Client,
) -> Result<k8s_openapi::api::authentication::v1::SelfSubjectReview, kube::Error> {
    Api::<k8s_openapi::api::authentication::v1::SelfSubjectReview>::all(client)
        .create(
            &kube::api::PostParams::default(),
            &k8s_openapi::api::authentication::v1::SelfSubjectReview::default(),
        )
        .await
}
