//! The census: which policy governs each node of the fleet, counted over every node. Most of a
//! large fleet is healthy and untouched, and all a plan needs of such a node is to count it: in its
//! policy's selected nodes, in its failure domains, and among the nodes that policy yields. The
//! census holds those counts, so that a pass looks only at the few nodes that may need a decision
//! (`fleet::index` says which, and keeps the census until a node joins, leaves or is relabelled, or
//! a policy changes). Pure.

use std::{collections::BTreeMap, sync::Arc};

use gpu_remediation_api::GpuRemediationPolicy;
use kube::ResourceExt as _;

use super::Yielded;
use crate::{
    budget::domains::{self, Sizes},
    governance::{self, Governor},
    observe::NodeView,
};

/// What one policy governs, counted over the whole fleet.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Governed {
    /// How many nodes the policy governs.
    pub selected: u32,
    /// How many governed nodes each of its failure domains holds.
    pub domain_sizes: Sizes,
    /// The nodes it selects but yields to another policy: node name to that policy's name.
    pub yielded: Yielded,
}

/// Every policy's counts (policies being deleted govern nothing and are left out).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Census {
    policies: BTreeMap<String, Governed>,
}

/// Nothing governed: a policy the census has not seen yet.
static NOTHING: Governed = Governed {
    selected: 0,
    domain_sizes: BTreeMap::new(),
    yielded: BTreeMap::new(),
};

impl Census {
    /// Counts every node of `nodes` for the policy that governs it.
    #[must_use]
    pub fn take<N: NodeView>(policies: &[Arc<GpuRemediationPolicy>], nodes: &[Arc<N>]) -> Self {
        let live: Vec<&Arc<GpuRemediationPolicy>> = policies
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        let claimants = governance::claimants(live.iter().copied());
        let mut census = Self {
            policies: live.iter().map(|p| (p.name_any(), Governed::default())).collect(),
        };
        for node in nodes {
            // Asked of every node, so without allocating; the policies that yield are named only
            // for the nodes more than one selects.
            let Some(winner) = governance::governing(node.node_labels(), &claimants) else {
                continue;
            };
            let Some(policy) = live.iter().find(|p| p.metadata.name.as_deref() == Some(winner)) else {
                continue;
            };
            if let Some(governed) = census.policies.get_mut(winner) {
                governed.selected += 1;
                let specs = &policy.spec.safety.failure_domains;
                if !specs.is_empty() {
                    domains::size_in(&mut governed.domain_sizes, specs, node.node_labels());
                }
            }
            if claimants
                .iter()
                .filter(|c| c.selector.matches(node.node_labels()))
                .count()
                < 2
            {
                continue;
            }
            if let Governor::Policy { overlapping, .. } = governance::governor(node.node_labels(), &claimants)
            {
                for loser in overlapping {
                    if let Some(governed) = census.policies.get_mut(&loser) {
                        governed
                            .yielded
                            .insert(node.node_name().to_owned(), winner.to_owned());
                    }
                }
            }
        }
        census
    }

    /// What `policy` governs (nothing, for a policy the census did not count).
    #[must_use]
    pub fn of(&self, policy: &str) -> &Governed {
        self.policies.get(policy).unwrap_or(&NOTHING)
    }
}

#[cfg(test)]
mod tests {
    use gpu_remediation_api::GpuRemediationPolicySpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;
    use k8s_openapi::api::core::v1::Node;

    fn policy(name: &str, selector: &serde_json::Value, priority: i32) -> Arc<GpuRemediationPolicy> {
        let spec: GpuRemediationPolicySpec = serde_json::from_value(serde_json::json!({
            "nodeSelector": selector,
            "priority": priority,
            "triggers": [{"conditionType": "GpuHealthy", "status": "False", "for": "0s"}],
            "action": "None",
            "safety": {"failureDomains": [{"topologyKey": "rack", "maxUnhealthyCount": 1}]},
        }))
        .unwrap();
        Arc::new(GpuRemediationPolicy::new(name, spec))
    }

    fn node(name: &str, labels: &[(&str, &str)]) -> Arc<Node> {
        Arc::new(crate::test_fixtures::labelled(name, labels))
    }

    #[test]
    fn each_node_counts_for_the_policy_that_governs_it_in_its_domains_and_as_yielded_by_the_others() {
        let gpus = policy("gpus", &serde_json::json!({"matchLabels": {"gpu": "true"}}), 0);
        let h100 = policy("h100", &serde_json::json!({"matchLabels": {"model": "h100"}}), 10);
        let nodes = [
            node("a", &[("gpu", "true"), ("rack", "r1")]),
            node("b", &[("gpu", "true"), ("rack", "r1"), ("model", "h100")]),
            node("c", &[("gpu", "true"), ("rack", "r2")]),
            node("d", &[("cpu", "true")]),
        ];
        let census = Census::take(&[gpus, h100], &nodes);

        let gpus = census.of("gpus");
        assert_eq!(gpus.selected, 2);
        assert_eq!(
            gpus.domain_sizes,
            Sizes::from([((0, "r1".to_owned()), 1), ((0, "r2".to_owned()), 1)])
        );
        assert_eq!(gpus.yielded, Yielded::from([("b".to_owned(), "h100".to_owned())]));
        let h100 = census.of("h100");
        assert_eq!(h100.selected, 1);
        assert_eq!(h100.domain_sizes, Sizes::from([((0, "r1".to_owned()), 1)]));
        assert!(h100.yielded.is_empty());
        assert_eq!(census.of("gone"), &Governed::default());
    }

    #[test]
    fn a_policy_being_deleted_governs_nothing() {
        let mut leaving = (*policy("gpus", &serde_json::json!({"matchLabels": {"gpu": "true"}}), 0)).clone();
        leaving.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
        let census = Census::take(&[Arc::new(leaving)], &[node("a", &[("gpu", "true")])]);

        assert_eq!(census, Census::default());
    }
}
