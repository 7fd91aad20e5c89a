//! Whether two node selectors can select the same node. Pure.
//!
//! Label keys are independent, so two selectors share a node exactly when, for every key, what
//! both of them require of that key can hold at once. Each requirement on a key narrows two
//! things: whether the key may be absent, and which values it may have (a finite set, or all
//! values but a finite set, since label values are unbounded).

use std::collections::{BTreeMap, BTreeSet};

use gpu_remediation_api::selector::{NodeSelector, SelectorOperator};

/// Which values a label may take.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Values {
    /// Only these.
    Only(BTreeSet<String>),
    /// Any value except these.
    AllBut(BTreeSet<String>),
}

/// What the requirements on one key allow.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Allowed {
    absent: bool,
    values: Values,
}

impl Allowed {
    const fn anything() -> Self {
        Self {
            absent: true,
            values: Values::AllBut(BTreeSet::new()),
        }
    }

    fn narrow(self, other: Self) -> Self {
        let values = match (self.values, other.values) {
            (Values::Only(a), Values::Only(b)) => Values::Only(a.intersection(&b).cloned().collect()),
            (Values::Only(a), Values::AllBut(b)) | (Values::AllBut(b), Values::Only(a)) => {
                Values::Only(a.difference(&b).cloned().collect())
            }
            (Values::AllBut(a), Values::AllBut(b)) => Values::AllBut(a.union(&b).cloned().collect()),
        };
        Self {
            absent: self.absent && other.absent,
            values,
        }
    }

    fn is_satisfiable(&self) -> bool {
        self.absent
            || match &self.values {
                Values::Only(values) => !values.is_empty(),
                Values::AllBut(_) => true,
            }
    }
}

fn set(values: &[String]) -> BTreeSet<String> {
    values.iter().cloned().collect()
}

/// Every key's requirements in `selector`, added to `keys`.
fn collect(selector: &NodeSelector, keys: &mut BTreeMap<String, Allowed>) {
    let mut add = |key: &str, allowed: Allowed| {
        let current = keys.remove(key).unwrap_or_else(Allowed::anything);
        keys.insert(key.to_owned(), current.narrow(allowed));
    };
    for (key, value) in &selector.match_labels {
        add(
            key,
            Allowed {
                absent: false,
                values: Values::Only(BTreeSet::from([value.clone()])),
            },
        );
    }
    for requirement in &selector.match_expressions {
        let allowed = match requirement.operator {
            SelectorOperator::In => Allowed {
                absent: false,
                values: Values::Only(set(&requirement.values)),
            },
            SelectorOperator::NotIn => Allowed {
                absent: true,
                values: Values::AllBut(set(&requirement.values)),
            },
            SelectorOperator::Exists => Allowed {
                absent: false,
                values: Values::AllBut(BTreeSet::new()),
            },
            SelectorOperator::DoesNotExist => Allowed {
                absent: true,
                values: Values::Only(BTreeSet::new()),
            },
        };
        add(&requirement.key, allowed);
    }
}

/// Whether some node's labels satisfy both `a` and `b`.
#[must_use]
pub fn can_select_the_same_node(a: &NodeSelector, b: &NodeSelector) -> bool {
    let mut keys = BTreeMap::new();
    collect(a, &mut keys);
    collect(b, &mut keys);
    keys.values().all(Allowed::is_satisfiable)
}

#[cfg(test)]
mod tests {
    use gpu_remediation_api::selector::SelectorRequirement;

    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> NodeSelector {
        NodeSelector {
            match_labels: pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            match_expressions: vec![],
        }
    }

    fn expression(key: &str, operator: SelectorOperator, values: &[&str]) -> NodeSelector {
        NodeSelector {
            match_labels: BTreeMap::new(),
            match_expressions: vec![SelectorRequirement {
                key: key.to_owned(),
                operator,
                values: values.iter().map(|v| (*v).to_owned()).collect(),
            }],
        }
    }

    #[test]
    fn an_empty_selector_overlaps_every_satisfiable_selector() {
        let all = NodeSelector::default();
        assert!(can_select_the_same_node(&all, &labels(&[("gpu", "true")])));
        assert!(can_select_the_same_node(&all, &all));
    }

    #[test]
    fn different_values_of_one_label_never_select_the_same_node() {
        assert!(!can_select_the_same_node(
            &labels(&[("product", "H100")]),
            &labels(&[("product", "A100")])
        ));
    }

    #[test]
    fn selectors_on_different_keys_overlap_on_a_node_carrying_both() {
        assert!(can_select_the_same_node(
            &labels(&[("product", "H100")]),
            &labels(&[("zone", "a")])
        ));
    }

    #[test]
    fn in_sets_overlap_exactly_when_they_share_a_value() {
        let h100 = expression("product", SelectorOperator::In, &["H100", "H200"]);
        assert!(can_select_the_same_node(
            &h100,
            &expression("product", SelectorOperator::In, &["H200", "B200"])
        ));
        assert!(!can_select_the_same_node(
            &h100,
            &expression("product", SelectorOperator::In, &["A100"])
        ));
    }

    #[test]
    fn not_in_excludes_the_values_it_names_but_still_matches_nodes_without_the_label() {
        let not_h100 = expression("product", SelectorOperator::NotIn, &["H100"]);
        assert!(!can_select_the_same_node(
            &not_h100,
            &labels(&[("product", "H100")])
        ));
        assert!(can_select_the_same_node(
            &not_h100,
            &labels(&[("product", "A100")])
        ));
        assert!(can_select_the_same_node(
            &not_h100,
            &expression("product", SelectorOperator::DoesNotExist, &[])
        ));
    }

    #[test]
    fn exists_and_does_not_exist_on_one_key_never_meet() {
        assert!(!can_select_the_same_node(
            &expression("gpu", SelectorOperator::Exists, &[]),
            &expression("gpu", SelectorOperator::DoesNotExist, &[])
        ));
        assert!(!can_select_the_same_node(
            &labels(&[("gpu", "true")]),
            &expression("gpu", SelectorOperator::DoesNotExist, &[])
        ));
    }

    #[test]
    fn a_selector_that_contradicts_itself_overlaps_nothing() {
        let contradiction = NodeSelector {
            match_labels: BTreeMap::from([("product".to_owned(), "H100".to_owned())]),
            match_expressions: vec![SelectorRequirement {
                key: "product".into(),
                operator: SelectorOperator::In,
                values: vec!["A100".into()],
            }],
        };
        assert!(!can_select_the_same_node(
            &contradiction,
            &NodeSelector::default()
        ));
    }
}
