//! A pod as the holders' answer names it (namespace, name, UID), and whether it still holds
//! anything: shared by both ways of finding a GPU's holders ([`super::holders`] and
//! [`super::device_plugin`]).

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

/// A pod, by namespace and name (and UID, to evict only the pod that was seen).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodKey {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its UID.
    pub uid: Option<String>,
}

impl std::fmt::Display for PodKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Whether the pod has finished (it holds nothing any more).
#[must_use]
pub fn finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// The pod's key.
#[must_use]
pub fn key(pod: &Pod) -> PodKey {
    PodKey {
        namespace: pod.namespace().unwrap_or_default(),
        name: pod.name_any(),
        uid: pod.metadata.uid.clone(),
    }
}
