//! The node label selector of a policy, with its matching logic, and `IntOrPercent` for limits that
//! scale with the fleet.
//!
//! The selector is our own type rather than `metav1.LabelSelector` so the CRD schema can carry the
//! operator enum and the CEL rules that make a malformed selector a refusal at apply time.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Which nodes a policy governs: all of `matchLabels` and all of `matchExpressions` must hold. An
/// empty selector selects every node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::node_selector)]
pub struct NodeSelector {
    /// Labels a node must carry with exactly these values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    /// Set-based requirements on node labels.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<SelectorRequirement>,
}

/// One set-based requirement, as in a Kubernetes label selector.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::selector_requirement)]
pub struct SelectorRequirement {
    /// The label key.
    pub key: String,
    /// How the key relates to `values`.
    pub operator: SelectorOperator,
    /// Values for `In` and `NotIn` (at least one); empty for `Exists` and `DoesNotExist`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

/// A label selector operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum SelectorOperator {
    /// The label's value is one of `values`.
    In,
    /// The label is absent or its value is none of `values`.
    NotIn,
    /// The label is present.
    Exists,
    /// The label is absent.
    DoesNotExist,
}

/// A node's labels as a selector reads them: one value a key. A label map is one; the controller's
/// cache keeps nodes' labels in a more compact shape of its own that is another.
pub trait Labels: std::fmt::Debug {
    /// The value of label `key`, if the node carries it.
    fn label(&self, key: &str) -> Option<&str>;
}

impl Labels for BTreeMap<String, String> {
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key).map(String::as_str)
    }
}

impl NodeSelector {
    /// Whether a node with these labels is selected.
    #[must_use]
    pub fn matches(&self, labels: &(impl Labels + ?Sized)) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.label(k) == Some(v.as_str()))
            && self.match_expressions.iter().all(|req| req.matches(labels))
    }
}

impl SelectorRequirement {
    /// Whether labels satisfy this requirement.
    #[must_use]
    pub fn matches(&self, labels: &(impl Labels + ?Sized)) -> bool {
        let value = labels.label(&self.key);
        let listed = |v: &str| self.values.iter().any(|listed| listed == v);
        match self.operator {
            SelectorOperator::In => value.is_some_and(listed),
            SelectorOperator::NotIn => value.is_none_or(|v| !listed(v)),
            SelectorOperator::Exists => value.is_some(),
            SelectorOperator::DoesNotExist => value.is_none(),
        }
    }
}

/// A count (`3`) or a share of the selected nodes (`"10%"`), as `maxConcurrent` and `maxUnhealthy`
/// take it. Serialised like Kubernetes' int-or-string.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum IntOrPercent {
    /// An absolute count.
    Int(u32),
    /// A percentage written `"N%"`.
    Percent(String),
}

impl IntOrPercent {
    /// Resolves against `total` nodes, rounding a percentage up (so `10%` of 5 nodes is 1, never 0).
    /// A malformed percentage resolves to `None`; the CRD schema refuses those before they get here.
    #[must_use]
    pub fn resolve(&self, total: u32) -> Option<u32> {
        match self {
            Self::Int(n) => Some(*n),
            Self::Percent(p) => {
                let pct: u64 = p.strip_suffix('%')?.parse().ok()?;
                let scaled = (u64::from(total) * pct).div_ceil(100);
                u32::try_from(scaled).ok()
            }
        }
    }

    /// The share of `total` this allows, as a fraction, for comparing unhealthy shares.
    #[must_use]
    pub fn allows(&self, count: u32, total: u32) -> bool {
        match self {
            Self::Int(n) => count <= *n,
            Self::Percent(p) => match p.strip_suffix('%').and_then(|s| s.parse::<u64>().ok()) {
                // count/total <= pct/100, in integers.
                Some(pct) => u64::from(count) * 100 <= pct * u64::from(total),
                None => false,
            },
        }
    }
}

impl std::fmt::Display for IntOrPercent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Int(n) => write!(f, "{n}"),
            Self::Percent(p) => f.write_str(p),
        }
    }
}

impl JsonSchema for IntOrPercent {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "IntOrPercent".into()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        crate::schema::int_or_percent(generator)
    }

    fn inline_schema() -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn an_empty_selector_selects_every_node() {
        assert!(NodeSelector::default().matches(&labels(&[])));
    }

    #[test]
    fn match_labels_and_expressions_must_all_hold() {
        let selector = NodeSelector {
            match_labels: labels(&[("nvidia.com/gpu.present", "true")]),
            match_expressions: vec![SelectorRequirement {
                key: "nvidia.com/gpu.product".into(),
                operator: SelectorOperator::In,
                values: vec!["H100".into()],
            }],
        };
        assert!(selector.matches(&labels(&[
            ("nvidia.com/gpu.present", "true"),
            ("nvidia.com/gpu.product", "H100")
        ])));
        assert!(!selector.matches(&labels(&[
            ("nvidia.com/gpu.present", "true"),
            ("nvidia.com/gpu.product", "A100")
        ])));
        assert!(!selector.matches(&labels(&[("nvidia.com/gpu.product", "H100")])));
    }

    #[test]
    fn not_in_and_does_not_exist_accept_a_missing_label() {
        let req = |operator| SelectorRequirement {
            key: "k".into(),
            operator,
            values: vec!["v".into()],
        };
        assert!(req(SelectorOperator::NotIn).matches(&labels(&[])));
        assert!(req(SelectorOperator::DoesNotExist).matches(&labels(&[])));
        assert!(!req(SelectorOperator::Exists).matches(&labels(&[])));
    }

    #[test]
    fn percentages_round_up_so_a_small_fleet_still_gets_one() {
        assert_eq!(IntOrPercent::Percent("10%".into()).resolve(5), Some(1));
        assert_eq!(IntOrPercent::Percent("10%".into()).resolve(20), Some(2));
        assert_eq!(IntOrPercent::Int(3).resolve(1000), Some(3));
    }

    #[test]
    fn an_unhealthy_share_at_the_limit_is_allowed_and_above_it_is_not() {
        let limit = IntOrPercent::Percent("30%".into());
        assert!(limit.allows(3, 10));
        assert!(!limit.allows(4, 10));
    }
}
