//! The clock of a condition whose own clock cannot be trusted: a node writes its conditions, and
//! one that leaves `lastTransitionTime` out, or sets it in the future, would start its trigger's
//! clock anew at every pass (each pass's "now" a new episode, a new record under `for: 0s`). Such
//! a condition's clock is when this controller first saw it in that state (the same status and
//! the same stamp), kept for as long as it stays so. A controller that restarts sees it anew; the
//! episode floor (`fleet::episodes`) bounds what that costs.

use std::collections::HashMap;

use crate::observe::{NodeConditionRef, NodeView};
use jiff::Timestamp;

/// One condition seen without a trustworthy clock.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Untrusted {
    condition_type: String,
    status: String,
    /// Its `lastTransitionTime` as written (missing, or in the future when first seen).
    stamp: Option<Timestamp>,
    /// When this controller first saw it so.
    seen: Timestamp,
}

/// When this controller first saw each untrusted condition of the nodes it looks at, by node.
#[derive(Clone, Debug, Default)]
pub struct FirstSeen(HashMap<String, Vec<Untrusted>>);

impl FirstSeen {
    /// Notes the untrusted conditions of `nodes` at `now` (keeping when each was first seen while
    /// it stays the same), and forgets every node not among them: a node left out of a pass is
    /// healthy by its triggers, and a condition seen again is seen anew.
    pub fn observe<'n, N: NodeView + 'n>(&mut self, nodes: impl IntoIterator<Item = &'n N>, now: Timestamp) {
        let mut before = std::mem::take(&mut self.0);
        for node in nodes {
            let conditions = node.conditions();
            let name = node.node_name();
            let known = before.remove_entry(name);
            // Every condition's clock trusted and none remembered (most nodes): nothing to keep.
            if known.is_none() && !conditions.iter().any(|c| untrusted_stamp(c, now)) {
                continue;
            }
            let (name, before) = known.unwrap_or_else(|| (name.to_owned(), Vec::new()));
            let untrusted: Vec<Untrusted> = conditions
                .iter()
                .filter_map(|condition| {
                    let stamp = condition.last_transition_time;
                    let same = |u: &&Untrusted| {
                        u.condition_type == condition.type_
                            && u.status == condition.status
                            && u.stamp == stamp
                    };
                    if let Some(known) = before.iter().find(same) {
                        return Some(known.clone());
                    }
                    untrusted_stamp(condition, now).then(|| Untrusted {
                        condition_type: condition.type_.to_owned(),
                        status: condition.status.to_owned(),
                        stamp,
                        seen: now,
                    })
                })
                .collect();
            if !untrusted.is_empty() {
                self.0.insert(name, untrusted);
            }
        }
    }

    /// Since when `condition` of node `node` holds: its `lastTransitionTime` when that is
    /// trustworthy, else when this controller first saw it so (`now` if never).
    #[must_use]
    pub fn since(&self, node: &str, condition: NodeConditionRef<'_>, now: Timestamp) -> Timestamp {
        let stamp = condition.last_transition_time;
        let known = self.0.get(node).and_then(|seen| {
            seen.iter().find(|u| {
                u.condition_type == condition.type_ && u.status == condition.status && u.stamp == stamp
            })
        });
        match (known, stamp) {
            (Some(known), _) => known.seen,
            (None, Some(t)) => t.min(now),
            (None, None) => now,
        }
    }
}

/// Whether `condition`'s clock cannot be trusted at `now`: missing, or in the future.
fn untrusted_stamp(condition: NodeConditionRef<'_>, now: Timestamp) -> bool {
    condition.last_transition_time.is_none_or(|t| t > now)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;
    use crate::test_fixtures::{at, node};
    use k8s_openapi::api::core::v1::{Node, NodeCondition};

    impl FirstSeen {
        /// How many nodes it remembers a condition of.
        fn len(&self) -> usize {
            self.0.len()
        }

        /// Whether it remembers none.
        fn is_empty(&self) -> bool {
            self.0.is_empty()
        }
    }

    fn with_condition(stamp: Option<i64>, status: &str) -> Node {
        let mut n = node("gpu-1", None);
        let conditions = n
            .status
            .get_or_insert_with(Default::default)
            .conditions
            .get_or_insert_with(Vec::new);
        conditions.retain(|c| c.type_ != "GpuHealthy");
        conditions.push(NodeCondition {
            type_: "GpuHealthy".into(),
            status: status.into(),
            last_transition_time: stamp.map(|s| Time(at(s))),
            ..NodeCondition::default()
        });
        n
    }

    fn since(first: &FirstSeen, n: &Node, now: i64) -> Timestamp {
        let condition = n
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "GpuHealthy"))
            .unwrap();
        first.since("gpu-1", condition.into(), at(now))
    }

    #[test]
    fn a_missing_clock_is_when_first_seen_for_as_long_as_the_condition_stays() {
        let mut first = FirstSeen::default();
        let n = with_condition(None, "False");
        for now in [100, 101, 150, 500] {
            first.observe([&n], at(now));
            assert_eq!(since(&first, &n, now), at(100), "at {now}");
        }
        let healthy = with_condition(None, "True");
        first.observe([&healthy], at(600));
        first.observe([&n], at(601));
        assert_eq!(since(&first, &n, 601), at(601), "broken again: a new clock");
    }

    #[test]
    fn a_future_clock_is_when_first_seen_even_once_its_time_has_come() {
        let mut first = FirstSeen::default();
        let n = with_condition(Some(10_000), "False");
        first.observe([&n], at(100));
        assert_eq!(since(&first, &n, 100), at(100));
        first.observe([&n], at(20_000));
        assert_eq!(
            since(&first, &n, 20_000),
            at(100),
            "the stamp coming true starts no episode"
        );
    }

    #[test]
    fn a_past_clock_is_trusted_and_not_remembered() {
        let mut first = FirstSeen::default();
        let n = with_condition(Some(50), "False");
        first.observe([&n], at(100));
        assert_eq!(since(&first, &n, 100), at(50));
        assert!(first.is_empty());
    }

    #[test]
    fn a_node_left_out_of_a_pass_is_forgotten() {
        let mut first = FirstSeen::default();
        let n = with_condition(None, "False");
        first.observe([&n], at(100));
        assert_eq!(first.len(), 1);
        first.observe(std::iter::empty::<&Node>(), at(101));
        assert!(first.is_empty());
    }
}
