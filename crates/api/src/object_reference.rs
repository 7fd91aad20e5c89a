//! A reference to an object the controller creates or deletes to carry out a step: the replacement's
//! `Machine` or `NodeClaim`, a template's object. The remediation's status and its ladder records hold one.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A reference to the object carrying out a replacement.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObjectReference {
    /// API version, e.g. `cluster.x-k8s.io/v1beta1`.
    pub api_version: String,
    /// Kind, e.g. `Machine`.
    pub kind: String,
    /// Name.
    pub name: String,
    /// Namespace, for namespaced kinds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// UID, so a recreated object of the same name is not mistaken for ours.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}
