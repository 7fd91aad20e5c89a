//! A policy's safety limits (`spec.safety`): how much may happen at once (concurrency, the
//! unhealthy share, failure domains, the suspect cause), how often (the rate, attempts per node),
//! and what a repeat offender gets.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{
    correlated::{FailureDomain, SuspectCause, UnhealthyLimit},
    duration::Duration,
    selector::IntOrPercent,
};

/// Limits on how much may happen at once. Budgets are computed from `GpuRemediation` objects, so
/// restarts and leader changes neither reset nor repeat them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::safety)]
pub struct Safety {
    /// Remediations in flight at once: a count, or a share of selected nodes (rounded up).
    #[serde(default = "default_max_concurrent")]
    pub max_concurrent: IntOrPercent,
    /// Circuit breaker: when more than this many (or this share) of selected nodes are unhealthy,
    /// nothing new starts, since the fault is likely systemic (a driver roll-out, a bad rack).
    #[serde(default = "default_max_unhealthy")]
    pub max_unhealthy: IntOrPercent,
    /// A count of unhealthy selected nodes above which the breaker opens as well; with
    /// `maxUnhealthy` given as a share, the lower of the two wins at every fleet size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unhealthy_count: Option<u32>,
    /// Failure domains (racks, `NVLink` domains, zones), each with its own limits: a domain over
    /// its limit holds only its own nodes, the others go on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failure_domains: Vec<FailureDomain>,
    /// Slow start: at most 1 remediation in flight at first, doubled after each proven success
    /// (its node or replacement Ready and healthy for `release.healthyFor` after it ended), back to
    /// 1 after a failure, never above `maxConcurrent`. Each failure domain also has its own
    /// allowance, folded the same way from its own nodes' remediations (never above its
    /// `maxInFlight`). Derived from the remediations kept, so it survives restarts.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub slow_start: bool,
    /// Name the value of a node attribute most recent failures share, and optionally hold new
    /// remediations on nodes carrying it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspect: Option<SuspectCause>,
    /// A node that just turned unhealthy waits this long before it may start, so failures
    /// arriving together are judged together (the breaker and the domain limits see all of
    /// them). Unset or `0s`: no wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settle: Option<Duration>,
    /// At most `limit` remediations started in any rolling window of `per`.
    #[serde(default)]
    pub rate: Rate,
    /// After `count` remediations of one node within `per`, the next needs a person
    /// (`ManualRequired`).
    #[serde(default)]
    pub max_attempts_per_node: Attempts,
    /// Hardware that keeps failing: a GPU (by serial) or host with at least `failures` recorded
    /// failures within `window`, on any node, goes straight to `action` when it fails again, and a
    /// node carrying it is flagged when it joins. Unset: the ledger records, nothing more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeat_offender: Option<RepeatOffender>,
}

impl Default for Safety {
    fn default() -> Self {
        Self {
            max_concurrent: default_max_concurrent(),
            max_unhealthy: default_max_unhealthy(),
            max_unhealthy_count: None,
            failure_domains: Vec::new(),
            slow_start: false,
            suspect: None,
            settle: None,
            rate: Rate::default(),
            max_attempts_per_node: Attempts::default(),
            repeat_offender: None,
        }
    }
}

impl Safety {
    /// The policy-wide unhealthy limit (`maxUnhealthy`, and `maxUnhealthyCount` if given).
    #[must_use]
    pub fn unhealthy_limit(&self) -> UnhealthyLimit {
        UnhealthyLimit {
            limit: Some(self.max_unhealthy.clone()),
            count: self.max_unhealthy_count,
        }
    }
}

fn default_max_concurrent() -> IntOrPercent {
    IntOrPercent::Int(1)
}

fn default_max_unhealthy() -> IntOrPercent {
    IntOrPercent::Percent("30%".to_owned())
}

/// A rolling-window rate limit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::rate)]
pub struct Rate {
    /// Remediations allowed to start in any window.
    pub limit: u32,
    /// The window's length.
    pub per: Duration,
}

impl Default for Rate {
    fn default() -> Self {
        Self {
            limit: 4,
            per: Duration::from_hours(1),
        }
    }
}

/// A per-node attempts limit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::attempts)]
pub struct Attempts {
    /// Remediations of one node allowed in any window.
    pub count: u32,
    /// The window's length.
    pub per: Duration,
}

impl Default for Attempts {
    fn default() -> Self {
        Self {
            count: 2,
            per: Duration::from_hours(24),
        }
    }
}

/// The repeat-offender limit (see `Safety::repeat_offender`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::repeat_offender)]
pub struct RepeatOffender {
    /// Earlier failures within `window` that make a GPU or host a repeat offender (1 to 100).
    pub failures: u32,
    /// How far back failures count (at most `history` of the records: they keep the latest 16).
    pub window: Duration,
    /// The last rung: `Replace` (the policy's replacement, whatever the trigger's action) or
    /// `ManualRequired` (hand the node to a person; nothing is touched until one approves).
    #[serde(default)]
    pub action: OffenderAction,
    /// Also cordon a node that joins carrying a repeat offender (it is always labelled
    /// `gpuremediation.dev/repeat-offender`, given the condition `GpuRepeatOffender` and an Event).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cordon_on_join: bool,
    /// With `cordonOnJoin`: at most this many (or this share) of the policy's selected nodes
    /// cordoned at once for carrying a repeat offender; past it a joining node is flagged and
    /// reported but not cordoned. Unset: `safety.maxUnhealthy` (like `quarantine.max`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cordon_on_join_max: Option<IntOrPercent>,
}

/// The last rung a repeat offender goes to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum OffenderAction {
    /// Replace the node through `spec.replacement`.
    #[default]
    Replace,
    /// Hand the node to a person (`ManualRequired`).
    ManualRequired,
}
