//! Governance: which policy governs a node. Pure.
//!
//! A node with the opt-out label governs itself (no policy touches it). Otherwise the policies
//! whose selector matches compete: the highest `priority` wins, ties go to the first name in
//! alphabetical order; every other matching policy reports `Overlap` naming the winner.

use gpu_remediation_api::{
    GpuRemediationPolicy,
    constants::OPT_OUT_LABEL,
    selector::{Labels, NodeSelector},
};

/// A policy as governance sees it.
#[derive(Clone, Copy, Debug)]
pub struct Claimant<'a> {
    /// The policy's name.
    pub name: &'a str,
    /// Its priority.
    pub priority: i32,
    /// Its node selector.
    pub selector: &'a NodeSelector,
}

impl<'a> Claimant<'a> {
    /// The claimant `policy` is.
    #[must_use]
    pub fn of(policy: &'a GpuRemediationPolicy) -> Self {
        Self {
            name: policy.metadata.name.as_deref().unwrap_or_default(),
            priority: policy.spec.priority,
            selector: &policy.spec.node_selector,
        }
    }
}

/// The claimants among `policies`: every policy not being deleted (one being deleted governs
/// nothing, so a node it selected goes to the next in line at once).
pub fn claimants<'a, P>(policies: impl IntoIterator<Item = &'a P>) -> Vec<Claimant<'a>>
where
    P: AsRef<GpuRemediationPolicy> + 'a,
{
    policies
        .into_iter()
        .map(AsRef::as_ref)
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(Claimant::of)
        .collect()
}

/// Who governs one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Governor {
    /// The node carries the opt-out label: nobody.
    OptedOut,
    /// No policy selects the node.
    Unselected,
    /// `policy` governs; `overlapping` also select the node and yield to it.
    Policy {
        /// The governing policy.
        policy: String,
        /// The other policies that select the node.
        overlapping: Vec<String>,
    },
}

/// Whether a node's labels opt it out of every policy.
#[must_use]
pub fn is_opted_out(labels: &(impl Labels + ?Sized)) -> bool {
    labels.label(OPT_OUT_LABEL) == Some("true")
}

/// Which of `policies` governs a node with `labels`.
#[must_use]
pub fn governor(labels: &(impl Labels + ?Sized), policies: &[Claimant<'_>]) -> Governor {
    if is_opted_out(labels) {
        return Governor::OptedOut;
    }
    let mut selecting: Vec<&Claimant<'_>> = policies.iter().filter(|p| p.selector.matches(labels)).collect();
    selecting.sort_by(|a, b| b.priority.cmp(&a.priority).then_with(|| a.name.cmp(b.name)));
    let mut names = selecting.into_iter().map(|p| p.name.to_owned());
    match names.next() {
        None => Governor::Unselected,
        Some(policy) => Governor::Policy {
            policy,
            overlapping: names.collect(),
        },
    }
}

/// The name of the policy that governs a node with `labels`, without naming those that yield to
/// it: what a pass over every node asks of each, so it allocates nothing (agrees with
/// [`governor`]).
#[must_use]
pub fn governing<'a>(labels: &(impl Labels + ?Sized), policies: &[Claimant<'a>]) -> Option<&'a str> {
    if is_opted_out(labels) {
        return None;
    }
    policies
        .iter()
        .filter(|p| p.selector.matches(labels))
        .min_by(|a, b| b.priority.cmp(&a.priority).then_with(|| a.name.cmp(b.name)))
        .map(|p| p.name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn selector(pairs: &[(&str, &str)]) -> NodeSelector {
        NodeSelector {
            match_labels: labels(pairs),
            match_expressions: vec![],
        }
    }

    #[test]
    fn a_node_with_the_opt_out_label_is_governed_by_nobody() {
        let all = NodeSelector::default();
        let policies = [Claimant {
            name: "gpu",
            priority: 0,
            selector: &all,
        }];
        assert_eq!(
            governor(&labels(&[(OPT_OUT_LABEL, "true")]), &policies),
            Governor::OptedOut
        );
    }

    #[test]
    fn an_opt_out_label_with_another_value_does_not_opt_out() {
        let all = NodeSelector::default();
        let policies = [Claimant {
            name: "gpu",
            priority: 0,
            selector: &all,
        }];
        assert!(matches!(
            governor(&labels(&[(OPT_OUT_LABEL, "false")]), &policies),
            Governor::Policy { .. }
        ));
    }

    #[test]
    fn a_node_no_policy_selects_is_left_alone() {
        let h100 = selector(&[("product", "H100")]);
        let policies = [Claimant {
            name: "h100",
            priority: 0,
            selector: &h100,
        }];
        assert_eq!(
            governor(&labels(&[("product", "A100")]), &policies),
            Governor::Unselected
        );
    }

    #[test]
    fn the_highest_priority_governs_and_the_others_overlap() {
        let all = NodeSelector::default();
        let policies = [
            Claimant {
                name: "a-low",
                priority: 0,
                selector: &all,
            },
            Claimant {
                name: "z-high",
                priority: 10,
                selector: &all,
            },
        ];
        assert_eq!(
            governor(&labels(&[]), &policies),
            Governor::Policy {
                policy: "z-high".into(),
                overlapping: vec!["a-low".into()]
            }
        );
    }

    #[test]
    fn equal_priorities_go_to_the_first_name() {
        let all = NodeSelector::default();
        let policies = [
            Claimant {
                name: "beta",
                priority: 5,
                selector: &all,
            },
            Claimant {
                name: "alpha",
                priority: 5,
                selector: &all,
            },
        ];
        assert_eq!(
            governor(&labels(&[]), &policies),
            Governor::Policy {
                policy: "alpha".into(),
                overlapping: vec!["beta".into()]
            }
        );
    }

    #[test]
    fn the_governing_name_agrees_with_the_governor_in_every_case() {
        let all = NodeSelector::default();
        let h100 = selector(&[("product", "H100")]);
        let claimant = |name, priority, selector| Claimant {
            name,
            priority,
            selector,
        };
        let policy_sets = [
            vec![],
            vec![claimant("h100", 0, &h100)],
            vec![claimant("a-low", 0, &all), claimant("z-high", 10, &all)],
            vec![
                claimant("beta", 5, &all),
                claimant("alpha", 5, &all),
                claimant("h100", 5, &h100),
            ],
            vec![claimant("h100", 9, &h100), claimant("all", 1, &all)],
        ];
        let nodes = [
            labels(&[]),
            labels(&[("product", "H100")]),
            labels(&[("product", "A100")]),
            labels(&[("product", "H100"), (OPT_OUT_LABEL, "true")]),
        ];
        for policies in &policy_sets {
            for node in &nodes {
                let expected = match governor(node, policies) {
                    Governor::Policy { policy, .. } => Some(policy),
                    Governor::OptedOut | Governor::Unselected => None,
                };
                assert_eq!(governing(node, policies).map(str::to_owned), expected, "{node:?}");
            }
        }
    }
}
