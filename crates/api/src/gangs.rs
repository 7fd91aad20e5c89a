//! What a remediation records of the gangs its drain touched (`status.drain.gangs`): each gang
//! (the pods of one distributed job across nodes), the nodes its members ran on, and, under
//! `drain.gangs: Together`, the members on other nodes evicted with the node's own pods. Recorded
//! once, when the drain first acts: a gang its job controller has restarted since has new members,
//! which are never evicted.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The most gangs one drain records.
pub const GANGS_MAX: usize = 8;
/// The most members on other nodes one drain records (and so evicts), over all its gangs.
pub const MEMBERS_MAX: usize = 64;
/// The most member nodes one gang's record lists.
pub const NODES_MAX: usize = 64;

/// One gang a drain touched.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GangRecord {
    /// The gang, as `<kind> <namespace>/<name>` (e.g. `JobSet ml/train-llm`).
    #[schemars(length(max = 600))]
    pub gang: String,
    /// Its members' namespace.
    #[schemars(length(max = 63))]
    pub namespace: String,
    /// The label selector its members are listed by (unset: the namespace's pods are read, as
    /// for a Volcano group named by annotation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 600))]
    pub selector: Option<String>,
    /// The nodes its members ran on when the drain first acted (the first 64), sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub nodes: Vec<String>,
    /// Under `Together`: its members on other nodes, evicted with the node's own pods.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub evicted: Vec<GangMember>,
    /// Members on other nodes left out of `evicted` because the drain's record was full.
    #[serde(default, skip_serializing_if = "crate::is_default")]
    pub left_out: u32,
}

/// A gang's member on another node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GangMember {
    /// The pod, as `namespace/name`.
    #[schemars(length(max = 317))]
    pub pod: String,
    /// Its UID: only this pod is evicted, never a successor of the same name.
    #[schemars(length(max = 64))]
    pub uid: String,
    /// The node it ran on.
    #[schemars(length(max = 253))]
    pub node: String,
}
