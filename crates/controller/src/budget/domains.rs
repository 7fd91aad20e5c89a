//! Failure domains: which domains (a rack, an `NVLink` domain, a zone) are over their unhealthy
//! limit and so hold their own nodes, and which are at their `maxInFlight` or, with slow start,
//! at their own allowance (folded from the outcomes of their own nodes' remediations, as the
//! policy's is from all of them: a rack earns its second slot from a fix proven in that rack).
//! Pure.
//!
//! Counted from the nodes and remediations that exist at each pass, never remembered: a held
//! domain resumes as soon as its counts fall (its nodes recover or are replaced, or the limit is
//! raised). A node without a domain's label belongs to no domain of that key.

use std::collections::BTreeMap;

use gpu_remediation_api::{
    correlated::{FailureDomain, HeldDomain},
    selector::Labels,
};

use super::slow_start::{Outcome, allowance};

/// One governed node, as the domains see it.
#[derive(Clone, Copy, Debug)]
pub struct Member<'a> {
    /// The node's name.
    pub node: &'a str,
    /// Its labels.
    pub labels: &'a dyn Labels,
    /// Whether its trigger holds now.
    pub unhealthy: bool,
    /// Whether a remediation of it is in flight.
    pub in_flight: bool,
}

/// The counts of one domain.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Governed nodes in the domain.
    pub selected: u32,
    /// Of them, unhealthy now.
    pub unhealthy: u32,
    /// Remediations in flight in the domain, this pass's admissions included.
    pub in_flight: u32,
}

/// A domain: the index of its `failureDomains` entry and its value of that key.
pub type Id = (usize, String);

/// How many governed nodes each domain holds: counted once over the whole fleet (`fleet::census`),
/// while the rest of a domain's counts come from the few nodes a pass looks at.
pub type Sizes = BTreeMap<Id, u32>;

/// Counts one governed node, with `labels`, into the `sizes` of the domains `specs` define.
pub fn size_in(sizes: &mut Sizes, specs: &[FailureDomain], labels: &(impl Labels + ?Sized)) {
    for (index, spec) in specs.iter().enumerate() {
        if let Some(value) = labels.label(&spec.topology_key) {
            *sizes.entry((index, value.to_owned())).or_default() += 1;
        }
    }
}

/// The domains of one policy, counted at one pass.
#[derive(Clone, Debug, Default)]
pub struct Domains {
    specs: Vec<FailureDomain>,
    /// Each node's domains.
    members: BTreeMap<String, Vec<Id>>,
    counts: BTreeMap<Id, Counts>,
    /// With slow start: each domain's allowance.
    allowed: BTreeMap<Id, u32>,
}

/// Why a node's domain keeps it from starting now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DomainWait {
    /// The domain is over its unhealthy limit.
    Held(HeldDomain),
    /// The domain has `maxInFlight` remediations in flight, or as many as its slow start allows.
    InFlight {
        /// `key=value`.
        domain: String,
        /// In flight in the domain.
        in_flight: u32,
        /// Its `maxInFlight`, or its slow-start allowance when lower.
        limit: u32,
        /// Whether the limit is the domain's slow-start allowance.
        slow_start: bool,
    },
}

impl Domains {
    /// Counts `members`, every node the policy governs, into the domains `specs` define.
    #[must_use]
    pub fn count<'a>(specs: &[FailureDomain], members: impl IntoIterator<Item = Member<'a>>) -> Self {
        let members: Vec<Member<'a>> = members.into_iter().collect();
        let mut sizes = Sizes::new();
        for member in &members {
            size_in(&mut sizes, specs, member.labels);
        }
        Self::count_within(specs, &sizes, members)
    }

    /// Counts `members` into the domains `specs` define, whose sizes (every governed node, members
    /// or not) are `sizes`. The nodes left out of `members` must be healthy with nothing in
    /// flight: they count in their domains' sizes only.
    #[must_use]
    pub fn count_within<'a>(
        specs: &[FailureDomain],
        sizes: &Sizes,
        members: impl IntoIterator<Item = Member<'a>>,
    ) -> Self {
        let mut domains = Self {
            specs: specs.to_vec(),
            ..Self::default()
        };
        if specs.is_empty() {
            return domains;
        }
        domains.counts = sizes
            .iter()
            .map(|(id, selected)| {
                let counts = Counts {
                    selected: *selected,
                    ..Counts::default()
                };
                (id.clone(), counts)
            })
            .collect();
        for member in members {
            let ids: Vec<Id> = specs
                .iter()
                .enumerate()
                .filter_map(|(i, spec)| member.labels.label(&spec.topology_key).map(|v| (i, v.to_owned())))
                .collect();
            for id in &ids {
                let counts = domains.counts.entry(id.clone()).or_default();
                counts.unhealthy += u32::from(member.unhealthy);
                counts.in_flight += u32::from(member.in_flight);
            }
            domains.members.insert(member.node.to_owned(), ids);
        }
        domains
    }

    /// Every domain over its unhealthy limit, by key order then value.
    #[must_use]
    pub fn held(&self) -> Vec<HeldDomain> {
        self.counts
            .iter()
            .filter_map(|(id, counts)| self.held_domain(id, *counts))
            .collect()
    }

    fn held_domain(&self, (index, value): &Id, counts: Counts) -> Option<HeldDomain> {
        let spec = &self.specs[*index];
        let limit = spec.unhealthy_limit();
        (limit.is_set() && !limit.allows(counts.unhealthy, counts.selected)).then(|| HeldDomain {
            topology_key: spec.topology_key.clone(),
            value: value.clone(),
            selected_nodes: counts.selected,
            unhealthy_nodes: counts.unhealthy,
            limit: limit.to_string(),
        })
    }

    /// Why `node`'s domains keep it from starting now (the first domain that does, over-limit
    /// domains before full ones), or `None`.
    #[must_use]
    pub fn wait_of(&self, node: &str) -> Option<DomainWait> {
        let ids = self.members.get(node)?;
        let held = ids
            .iter()
            .find_map(|id| self.held_domain(id, self.counts[id]).map(DomainWait::Held));
        held.or_else(|| {
            ids.iter().find_map(|id| {
                let spec = &self.specs[id.0];
                let (limit, slow_start) = match (spec.max_in_flight, self.allowed.get(id).copied()) {
                    (Some(max), Some(allowed)) if allowed < max => (allowed, true),
                    (Some(max), _) => (max, false),
                    (None, Some(allowed)) => (allowed, true),
                    (None, None) => return None,
                };
                let in_flight = self.counts[id].in_flight;
                (in_flight >= limit).then(|| DomainWait::InFlight {
                    domain: format!("{}={}", spec.topology_key, id.1),
                    in_flight,
                    limit,
                    slow_start,
                })
            })
        })
    }

    /// Slow start per domain: each domain's allowance, folded from the outcomes of its own nodes'
    /// remediations (a node no longer governed counts in no domain), capped at its `maxInFlight`
    /// and at `max_concurrent`.
    pub fn slow_start(&mut self, outcomes: &[Outcome], max_concurrent: u32) {
        for id in self.counts.keys() {
            let cap = self.specs[id.0]
                .max_in_flight
                .map_or(max_concurrent, |max| max.min(max_concurrent));
            let own: Vec<Outcome> = outcomes
                .iter()
                .filter(|o| self.members.get(&o.node).is_some_and(|ids| ids.contains(id)))
                .cloned()
                .collect();
            self.allowed.insert(id.clone(), allowance(&own, cap).allowed);
        }
    }

    /// Counts a remediation admitted for `node` in its domains' in-flight.
    pub fn admit(&mut self, node: &str) {
        for id in self.members.get(node).into_iter().flatten() {
            if let Some(counts) = self.counts.get_mut(id) {
                counts.in_flight += 1;
            }
        }
    }

    /// The counts of the domain `key=value`, if any governed node is in it.
    #[must_use]
    pub fn counts_of(&self, key: &str, value: &str) -> Option<Counts> {
        let index = self.specs.iter().position(|s| s.topology_key == key)?;
        self.counts.get(&(index, value.to_owned())).copied()
    }

    /// The domains of `node`, as `key=value`.
    #[must_use]
    pub fn of(&self, node: &str) -> Vec<String> {
        self.members
            .get(node)
            .into_iter()
            .flatten()
            .map(|(i, v)| format!("{}={v}", self.specs[*i].topology_key))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RACK: &str = "example.com/rack";

    fn rack_limit(count: Option<u32>, share: Option<&str>, in_flight: Option<u32>) -> Vec<FailureDomain> {
        vec![FailureDomain {
            topology_key: RACK.into(),
            max_unhealthy_share: share.map(Into::into),
            max_unhealthy_count: count,
            max_in_flight: in_flight,
        }]
    }

    /// Racks A, B, C of six nodes each; `unhealthy` and `in_flight` name nodes like `b3`.
    fn racks(specs: &[FailureDomain], unhealthy: &[&str], in_flight: &[&str]) -> Domains {
        let nodes: Vec<(String, BTreeMap<String, String>)> = ["a", "b", "c"]
            .iter()
            .flat_map(|rack| {
                (0..6).map(move |i| {
                    (
                        format!("{rack}{i}"),
                        BTreeMap::from([(RACK.to_owned(), rack.to_uppercase())]),
                    )
                })
            })
            .collect();
        Domains::count(
            specs,
            nodes.iter().map(|(node, labels)| Member {
                node,
                labels,
                unhealthy: unhealthy.contains(&node.as_str()),
                in_flight: in_flight.contains(&node.as_str()),
            }),
        )
    }

    #[test]
    fn a_rack_over_its_count_is_held_and_names_its_counts_while_the_others_go_on() {
        let domains = racks(
            &rack_limit(Some(2), None, None),
            &["b0", "b1", "b2", "b3", "a0"],
            &[],
        );
        let held = domains.held();
        assert_eq!(held.len(), 1);
        assert_eq!(held[0].name(), "example.com/rack=B");
        assert_eq!((held[0].unhealthy_nodes, held[0].selected_nodes), (4, 6));
        assert!(
            held[0]
                .message()
                .contains("4 of 6 nodes unhealthy, above maxUnhealthyCount 2")
        );
        assert!(matches!(domains.wait_of("b2"), Some(DomainWait::Held(h)) if h.value == "B"));
        assert_eq!(domains.wait_of("a0"), None);
    }

    #[test]
    fn a_rack_exactly_at_its_limit_is_not_held() {
        let domains = racks(&rack_limit(Some(2), None, None), &["b0", "b1"], &[]);
        assert!(domains.held().is_empty());
        assert_eq!(domains.wait_of("b0"), None);
    }

    #[test]
    fn with_a_count_and_a_share_the_lower_holds_the_rack() {
        // 50% of 6 is 3; the count 4 is higher, so the share decides.
        let specs = rack_limit(Some(4), Some("50%"), None);
        assert!(racks(&specs, &["b0", "b1", "b2"], &[]).held().is_empty());
        assert_eq!(racks(&specs, &["b0", "b1", "b2", "b3"], &[]).held().len(), 1);
        // The count 1 is lower than 50%.
        let specs = rack_limit(Some(1), Some("50%"), None);
        assert_eq!(racks(&specs, &["b0", "b1"], &[]).held().len(), 1);
    }

    #[test]
    fn a_held_rack_resumes_when_its_counts_fall_or_its_limit_is_raised() {
        let tight = rack_limit(Some(2), None, None);
        assert_eq!(racks(&tight, &["b0", "b1", "b2"], &[]).held().len(), 1);
        assert!(
            racks(&tight, &["b0", "b1"], &[]).held().is_empty(),
            "one recovered"
        );
        let raised = rack_limit(Some(3), None, None);
        assert!(racks(&raised, &["b0", "b1", "b2"], &[]).held().is_empty());
    }

    #[test]
    fn a_rack_at_max_in_flight_defers_its_nodes_and_counts_this_pass_s_admissions() {
        let specs = rack_limit(None, None, Some(1));
        let mut domains = racks(&specs, &["a0", "a1", "b0"], &[]);
        assert_eq!(domains.wait_of("a0"), None);
        domains.admit("a0");
        assert_eq!(
            domains.wait_of("a1"),
            Some(DomainWait::InFlight {
                domain: "example.com/rack=A".into(),
                in_flight: 1,
                limit: 1,
                slow_start: false,
            })
        );
        assert_eq!(domains.wait_of("b0"), None, "another rack is not affected");
        let running = racks(&specs, &["a0", "a1"], &["a0"]);
        assert!(matches!(
            running.wait_of("a1"),
            Some(DomainWait::InFlight { in_flight: 1, .. })
        ));
    }

    #[test]
    fn a_node_without_the_label_belongs_to_no_domain() {
        let specs = rack_limit(Some(1), None, Some(1));
        let labels = BTreeMap::new();
        let domains = Domains::count(
            &specs,
            [
                Member {
                    node: "loose",
                    labels: &labels,
                    unhealthy: true,
                    in_flight: true,
                },
                Member {
                    node: "loose2",
                    labels: &labels,
                    unhealthy: true,
                    in_flight: false,
                },
            ],
        );
        assert!(domains.held().is_empty());
        assert_eq!(domains.wait_of("loose2"), None);
        assert!(domains.of("loose").is_empty());
    }

    #[test]
    fn without_failure_domains_nothing_is_held() {
        let domains = racks(&[], &["b0", "b1", "b2", "b3", "b4", "b5"], &[]);
        assert!(domains.held().is_empty());
        assert_eq!(domains.wait_of("b0"), None);
    }

    #[test]
    fn a_node_in_two_domains_waits_for_the_held_one_first() {
        let specs = vec![
            FailureDomain {
                topology_key: "zone".into(),
                max_unhealthy_share: None,
                max_unhealthy_count: None,
                max_in_flight: Some(1),
            },
            rack_limit(Some(1), None, None).remove(0),
        ];
        let zone = BTreeMap::from([
            ("zone".to_owned(), "z1".to_owned()),
            (RACK.to_owned(), "B".to_owned()),
        ]);
        let domains = Domains::count(
            &specs,
            ["n1", "n2", "n3"].map(|node| Member {
                node,
                labels: &zone,
                unhealthy: node != "n3",
                in_flight: node == "n3",
            }),
        );
        assert!(matches!(domains.wait_of("n1"), Some(DomainWait::Held(h)) if h.topology_key == RACK));
        assert_eq!(domains.of("n1"), ["zone=z1", "example.com/rack=B"]);
    }

    fn outcome(node: &str, secs: i64, kind: super::super::slow_start::OutcomeKind) -> Outcome {
        Outcome {
            remediation: format!("r-{node}-{secs}"),
            node: node.into(),
            at: jiff::Timestamp::from_second(1_800_000_000 + secs).unwrap(),
            kind,
        }
    }

    #[test]
    fn with_slow_start_each_rack_earns_its_own_second_slot_from_a_fix_proven_in_it() {
        use super::super::slow_start::OutcomeKind::Proven;
        let mut domains = racks(
            &rack_limit(Some(6), None, None),
            &["a1", "a2", "b1", "b2"],
            &["a1", "b1"],
        );
        domains.slow_start(&[outcome("a0", 10, Proven)], 8);
        // Rack A proved a fix: 2 allowed, 1 in flight, a2 may start.
        assert_eq!(domains.wait_of("a2"), None);
        // Rack B has proven nothing: 1 allowed, 1 in flight, b2 waits, and says it is slow start.
        assert_eq!(
            domains.wait_of("b2"),
            Some(DomainWait::InFlight {
                domain: format!("{RACK}=B"),
                in_flight: 1,
                limit: 1,
                slow_start: true,
            })
        );
        domains.admit("a2");
        assert!(matches!(
            domains.wait_of("a3"),
            Some(DomainWait::InFlight {
                limit: 2,
                slow_start: true,
                ..
            })
        ));
    }

    #[test]
    fn a_failure_in_a_rack_brings_its_allowance_back_to_one_and_a_lower_max_in_flight_still_wins() {
        use super::super::slow_start::OutcomeKind::{Failed, Proven};
        let outcomes = [
            outcome("a0", 10, Proven),
            outcome("a3", 20, Failed),
            outcome("b0", 10, Proven),
            outcome("b3", 20, Proven),
        ];
        let mut domains = racks(
            &rack_limit(None, None, Some(2)),
            &["a1", "a2", "b1", "b2", "b4"],
            &["a1", "b1"],
        );
        domains.slow_start(&outcomes, 8);
        assert!(matches!(
            domains.wait_of("a2"),
            Some(DomainWait::InFlight {
                limit: 1,
                slow_start: true,
                ..
            })
        ));
        // Rack B doubled twice (4), above its maxInFlight 2: the maxInFlight holds.
        assert_eq!(domains.wait_of("b2"), None);
        domains.admit("b2");
        assert!(matches!(
            domains.wait_of("b4"),
            Some(DomainWait::InFlight {
                limit: 2,
                slow_start: false,
                ..
            })
        ));
    }
}
