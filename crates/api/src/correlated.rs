//! Correlated failures in the policy: failure domains (a rack, an `NVLink` domain, a zone) with
//! their own limits, and the unhealthy limit that takes a count and a share together.
//!
//! When six nodes of one rack fail within a minute, the cause is the rack, not six GPUs: a
//! failure domain over its limit holds only its own nodes, the others go on.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{duration::Duration, selector::IntOrPercent};

/// A failure domain: every distinct value of `topologyKey` on the policy's nodes is one domain,
/// with its own limits. Nodes without the label belong to no domain of this key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::failure_domain)]
pub struct FailureDomain {
    /// The node label whose value names the domain, e.g. `topology.kubernetes.io/zone`,
    /// `nvidia.com/gpu.clique` (an `NVLink` domain) or a rack label.
    pub topology_key: String,
    /// The share of the domain's governed nodes that may be unhealthy before it is held, e.g.
    /// `"50%"`. With `maxUnhealthyCount` too, the lower wins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unhealthy_share: Option<String>,
    /// Unhealthy nodes one domain may have, as a count; with `maxUnhealthyShare`, the lower wins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unhealthy_count: Option<u32>,
    /// Remediations in flight at once within one domain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<u32>,
}

impl FailureDomain {
    /// The domain's unhealthy limit.
    #[must_use]
    pub fn unhealthy_limit(&self) -> UnhealthyLimit {
        UnhealthyLimit {
            limit: self.max_unhealthy_share.clone().map(IntOrPercent::Percent),
            count: self.max_unhealthy_count,
        }
    }
}

/// An unhealthy limit given as a count or share (`maxUnhealthy`, `maxUnhealthyShare`), a count
/// (`maxUnhealthyCount`), or both: the lower wins. Neither: no limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnhealthyLimit {
    /// `maxUnhealthy` (a count or a share) or `maxUnhealthyShare`.
    pub limit: Option<IntOrPercent>,
    /// `maxUnhealthyCount`.
    pub count: Option<u32>,
}

impl UnhealthyLimit {
    /// Whether `unhealthy` of `total` nodes is within the limit (at the limit is within).
    #[must_use]
    pub fn allows(&self, unhealthy: u32, total: u32) -> bool {
        self.limit.as_ref().is_none_or(|l| l.allows(unhealthy, total))
            && self.count.is_none_or(|c| unhealthy <= c)
    }

    /// Whether any limit is set.
    #[must_use]
    pub const fn is_set(&self) -> bool {
        self.limit.is_some() || self.count.is_some()
    }
}

impl std::fmt::Display for UnhealthyLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.limit, self.count) {
            (Some(l), Some(c)) => write!(f, "maxUnhealthy {l} and maxUnhealthyCount {c} (the lower wins)"),
            (Some(l), None) => write!(f, "maxUnhealthy {l}"),
            (None, Some(c)) => write!(f, "maxUnhealthyCount {c}"),
            (None, None) => f.write_str("no unhealthy limit"),
        }
    }
}

/// Looking for the shared cause of recent failures: a value of a node attribute (a driver-version
/// label, the kernel, the kubelet, the OS image, a zone, a rack) that most of them share.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::suspect)]
pub struct SuspectCause {
    /// How far back failures count (by when their trigger began to hold).
    #[serde(default = "default_suspect_window")]
    pub window: Duration,
    /// The share of those failures that must carry one value for it to be named, e.g. `"60%"`.
    #[serde(default = "default_suspect_share")]
    pub share: String,
    /// Fewer failures than this name nothing.
    #[serde(default = "default_suspect_min_failures")]
    pub min_failures: u32,
    /// The attributes compared: node label keys, or `nodeInfo.kernelVersion`,
    /// `nodeInfo.kubeletVersion`, `nodeInfo.osImage`, `nodeInfo.containerRuntimeVersion`. Empty:
    /// the NVIDIA driver labels, those four and the zone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attributes: Vec<String>,
    /// Whether new remediations of nodes carrying the named value wait (reason `SuspectHeld`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hold: bool,
}

/// The attributes compared when `attributes` is empty.
pub const DEFAULT_SUSPECT_ATTRIBUTES: [&str; 8] = [
    "nvidia.com/cuda.driver.major",
    "nvidia.com/cuda.driver-version.full",
    "nvidia.com/gpu.clique",
    "topology.kubernetes.io/zone",
    "nodeInfo.kernelVersion",
    "nodeInfo.kubeletVersion",
    "nodeInfo.osImage",
    "nodeInfo.containerRuntimeVersion",
];

impl SuspectCause {
    /// The attributes compared.
    #[must_use]
    pub fn attributes(&self) -> Vec<String> {
        if self.attributes.is_empty() {
            DEFAULT_SUSPECT_ATTRIBUTES
                .iter()
                .map(|a| (*a).to_owned())
                .collect()
        } else {
            self.attributes.clone()
        }
    }
}

fn default_suspect_window() -> Duration {
    Duration::from_hours(1)
}

fn default_suspect_share() -> String {
    "60%".to_owned()
}

const fn default_suspect_min_failures() -> u32 {
    3
}

/// The suspect cause a policy's status names.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SuspectStatus {
    /// The attribute.
    pub attribute: String,
    /// Its value most failures share.
    pub value: String,
    /// Failures carrying it.
    pub failures: u32,
    /// Failures in the window.
    pub of: u32,
    /// Whether new remediations of nodes carrying it wait.
    #[serde(default)]
    pub holding: bool,
    /// The sentence, e.g. `7 of 9 failures in the last 1h are on nvidia.com/cuda.driver.major=570`.
    pub message: String,
}

/// A failure domain the policy holds, as its status reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HeldDomain {
    /// The domain's topology key.
    pub topology_key: String,
    /// The domain's value of that key.
    pub value: String,
    /// Governed nodes in the domain.
    pub selected_nodes: u32,
    /// Unhealthy governed nodes in the domain.
    pub unhealthy_nodes: u32,
    /// The limit it is over, as written.
    pub limit: String,
}

impl HeldDomain {
    /// `key=value`.
    #[must_use]
    pub fn name(&self) -> String {
        format!("{}={}", self.topology_key, self.value)
    }

    /// A sentence with the counts.
    #[must_use]
    pub fn message(&self) -> String {
        format!(
            "failure domain {}: {} of {} nodes unhealthy, above {}: its nodes wait, the cause looks \
             shared (power, a switch, a roll-out), other domains go on",
            self.name(),
            self.unhealthy_nodes,
            self.selected_nodes,
            self.limit
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_a_count_and_a_share_the_lower_wins() {
        let both = UnhealthyLimit {
            limit: Some(IntOrPercent::Percent("50%".into())),
            count: Some(2),
        };
        // 50% of 10 is 5, the count 2 is lower.
        assert!(both.allows(2, 10));
        assert!(!both.allows(3, 10));
        // 50% of 4 is 2, the count 2 is no lower: the share decides at 3.
        assert!(both.allows(2, 4));
        assert!(!both.allows(3, 4));
        // 50% of 2 is 1, lower than the count.
        assert!(!both.allows(2, 2));
    }

    #[test]
    fn no_limit_allows_everything_and_one_limit_alone_applies() {
        let none = UnhealthyLimit {
            limit: None,
            count: None,
        };
        assert!(none.allows(100, 100) && !none.is_set());
        let count = UnhealthyLimit {
            limit: None,
            count: Some(3),
        };
        assert!(count.allows(3, 6) && !count.allows(4, 6));
    }
}
