//! The budget: which unhealthy nodes may start a remediation now, and why the others wait. Pure.
//!
//! Everything is computed from the remediations that exist (their creation times and whether they
//! are finished), never from counters in memory, so a restart or a new leader sees the same
//! budget. Limits, in the order they are applied to each waiting node (longest unhealthy first):
//! attempts per node, pause, the circuit breaker (`maxUnhealthy`, `maxUnhealthyCount`), the
//! node's failure domains (`domains`: over their unhealthy limit, or at their `maxInFlight`), then
//! the shared slots: `maxConcurrent` in flight and `rate.limit` started in any rolling `rate.per`.

pub mod domains;
pub mod slow_start;
pub mod suspect;

use std::collections::{BTreeMap, BTreeSet};

use gpu_remediation_api::{
    Duration,
    correlated::{HeldDomain, SuspectStatus},
    safety::Safety,
};
use jiff::Timestamp;

use self::domains::DomainWait;
pub use self::domains::Domains;
use crate::time::{minus, plus, signed};

/// A remediation that counts against the budget (one not in mode `DryRun`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Started {
    /// Its node.
    pub node: String,
    /// When it was created.
    pub at: Timestamp,
    /// Whether it is still in flight (not in a terminal phase).
    pub in_flight: bool,
}

/// An unhealthy node with no remediation for its current episode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// The node.
    pub node: String,
    /// Since when its trigger has held.
    pub since: Timestamp,
    /// Whether a person approved going past `maxAttemptsPerNode` (its `ManualRequired` record
    /// carries `gpuremediation.dev/approved=true`): the attempts limit no longer holds it back,
    /// every other limit still does.
    pub approved_past_attempts: bool,
}

/// What the budget is computed from.
#[derive(Clone, Debug)]
pub struct Inputs<'a> {
    /// The policy's limits.
    pub safety: &'a Safety,
    /// `spec.paused`.
    pub paused: bool,
    /// Nodes the policy governs.
    pub selected: u32,
    /// Governed nodes that are unhealthy now (remediated or not).
    pub unhealthy: u32,
    /// Remediations of the policy's nodes that count (any age; old ones are ignored here).
    pub started: &'a [Started],
    /// Unhealthy nodes that could start a remediation, in any order.
    pub candidates: Vec<Candidate>,
    /// The policy's failure domains, counted at this pass.
    pub domains: Domains,
    /// With `slowStart`, the remediations the allowance lets be in flight (at most
    /// `maxConcurrent` applies either way).
    pub slow_start: Option<u32>,
    /// With `safety.suspect.hold` and a suspect named: the suspect, and the nodes carrying it.
    pub suspect_hold: Option<(SuspectStatus, BTreeSet<String>)>,
    /// With `safety.settle`: when each candidate that turned unhealthy within it may start.
    pub settling: BTreeMap<String, Timestamp>,
    /// The time of the decision.
    pub now: Timestamp,
}

/// Why a node waits, with the numbers a person needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Deferral {
    /// The node used up `maxAttemptsPerNode`.
    AttemptsExhausted {
        /// Remediations of the node in the window.
        attempts: u32,
        /// The limit.
        limit: u32,
        /// The window.
        per: Duration,
    },
    /// The policy is paused.
    Paused,
    /// Too many governed nodes are unhealthy: the fault looks systemic.
    CircuitOpen {
        /// Unhealthy governed nodes.
        unhealthy: u32,
        /// Governed nodes.
        selected: u32,
        /// `maxUnhealthy` (and `maxUnhealthyCount`) as written.
        limit: String,
    },
    /// A failure domain of the node is over its unhealthy limit.
    DomainHeld(HeldDomain),
    /// The node turned unhealthy within `safety.settle`: failures arriving together are judged
    /// together.
    Settling {
        /// When it may start.
        until: Timestamp,
    },
    /// The node carries the value most recent failures share, and the policy holds those.
    SuspectHeld(SuspectStatus),
    /// A failure domain of the node has `maxInFlight` remediations in flight, or as many as its
    /// slow start allows.
    DomainInFlight {
        /// `key=value`.
        domain: String,
        /// In flight in the domain.
        in_flight: u32,
        /// The domain's `maxInFlight`, or its slow-start allowance when lower.
        limit: u32,
        /// Whether the limit is the domain's slow-start allowance.
        slow_start: bool,
    },
    /// `maxConcurrent` remediations are in flight.
    Concurrency {
        /// In flight now.
        in_flight: u32,
        /// The resolved limit.
        limit: u32,
    },
    /// Slow start allows fewer in flight than `maxConcurrent` until remediations prove
    /// themselves.
    SlowStart {
        /// In flight now.
        in_flight: u32,
        /// The slow-start allowance.
        allowed: u32,
        /// The resolved `maxConcurrent`.
        max_concurrent: u32,
    },
    /// `rate.limit` remediations started within the last `rate.per`.
    Rate {
        /// Started in the window.
        started: u32,
        /// The limit.
        limit: u32,
        /// The window.
        per: Duration,
        /// When a slot frees.
        next_slot_at: Option<Timestamp>,
    },
}

impl Deferral {
    /// The reason, as the policy status and Events spell it.
    #[must_use]
    pub const fn reason(&self) -> &'static str {
        use gpu_remediation_api::constants::reasons;
        match self {
            Self::AttemptsExhausted { .. } => reasons::ATTEMPTS_EXHAUSTED,
            Self::Paused => reasons::PAUSED,
            Self::CircuitOpen { .. } => reasons::CIRCUIT_OPEN,
            Self::DomainHeld(_) => reasons::DOMAIN_HELD,
            Self::SuspectHeld(_) => reasons::SUSPECT_HELD,
            Self::Settling { .. } => reasons::SETTLING,
            Self::DomainInFlight { .. } => reasons::DEFERRED_DOMAIN_IN_FLIGHT,
            Self::Concurrency { .. } => reasons::DEFERRED_CONCURRENCY,
            Self::SlowStart { .. } => reasons::DEFERRED_SLOW_START,
            Self::Rate { .. } => reasons::DEFERRED_RATE,
        }
    }

    /// A sentence with the numbers.
    #[must_use]
    pub fn message(&self) -> String {
        match self {
            Self::AttemptsExhausted { attempts, limit, per } => format!(
                "{attempts} remediations of this node within {per} reach maxAttemptsPerNode {limit}; a person must act"
            ),
            Self::Paused => "the policy is paused; no new remediation starts".to_owned(),
            Self::CircuitOpen {
                unhealthy,
                selected,
                limit,
            } => format!(
                "{unhealthy} of {selected} nodes are unhealthy, above {limit}: \
                 the fault looks systemic, so nothing new starts (in-flight work continues)"
            ),
            Self::DomainHeld(held) => held.message(),
            Self::Settling { until } => format!(
                "turned unhealthy within safety.settle: waits until {until} so failures arriving \
                 together are judged together"
            ),
            Self::SuspectHeld(suspect) => format!(
                "{}: this node carries it too, and safety.suspect.hold keeps new remediations of such \
                 nodes waiting",
                suspect.message
            ),
            Self::DomainInFlight {
                domain,
                in_flight,
                limit,
                slow_start: false,
            } => format!(
                "{in_flight} remediations in flight in failure domain {domain}, its maxInFlight is {limit}"
            ),
            Self::DomainInFlight {
                domain,
                in_flight,
                limit,
                slow_start: true,
            } => format!(
                "{in_flight} remediations in flight in failure domain {domain}, its slow start allows {limit} \
                 until more of its remediations prove themselves"
            ),
            Self::Concurrency { in_flight, limit } => {
                format!("{in_flight} remediations in flight, maxConcurrent is {limit}")
            }
            Self::SlowStart {
                in_flight,
                allowed,
                max_concurrent,
            } => format!(
                "{in_flight} remediations in flight, slow start allows {allowed} until more prove \
                 themselves (maxConcurrent {max_concurrent})"
            ),
            Self::Rate {
                started,
                limit,
                per,
                next_slot_at,
            } => {
                let next = next_slot_at.map_or_else(String::new, |t| format!("; next slot at {t}"));
                format!("{started} remediations started within {per}, rate limit is {limit}{next}")
            }
        }
    }
}

impl From<DomainWait> for Deferral {
    fn from(wait: DomainWait) -> Self {
        match wait {
            DomainWait::Held(held) => Self::DomainHeld(held),
            DomainWait::InFlight {
                domain,
                in_flight,
                limit,
                slow_start,
            } => Self::DomainInFlight {
                domain,
                in_flight,
                limit,
                slow_start,
            },
        }
    }
}

/// A node held back, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Deferred {
    /// The node.
    pub candidate: Candidate,
    /// The limit that holds it.
    pub deferral: Deferral,
}

/// The budget's decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Nodes to start now, longest unhealthy first.
    pub admitted: Vec<Candidate>,
    /// Nodes held back, longest unhealthy first.
    pub waiting: Vec<Deferred>,
    /// How many could start now (the smallest of the limits; zero when paused or the circuit is
    /// open), before this decision's admissions.
    pub remaining: u32,
    /// Remediations in flight.
    pub in_flight: u32,
    /// Remediations started within the rate window.
    pub started_in_window: u32,
    /// When the rate window frees a slot, if it is full.
    pub next_slot_at: Option<Timestamp>,
    /// Whether the circuit breaker is open.
    pub circuit_open: bool,
    /// Failure domains over their unhealthy limit.
    pub held_domains: Vec<HeldDomain>,
}

/// Decides which candidates start now.
#[must_use]
pub fn admit(inputs: Inputs<'_>) -> Decision {
    let Inputs {
        safety,
        paused,
        selected,
        unhealthy,
        started,
        mut candidates,
        mut domains,
        slow_start,
        suspect_hold,
        settling,
        now,
    } = inputs;
    candidates.sort_by(|a, b| a.since.cmp(&b.since).then_with(|| a.node.cmp(&b.node)));

    let in_flight = count(started.iter().filter(|s| s.in_flight));
    let concurrency_limit = safety.max_concurrent.resolve(selected).unwrap_or(0);
    let window_start = minus(now, signed(safety.rate.per.as_std()));
    let mut window: Vec<Timestamp> = started
        .iter()
        .filter(|s| s.at > window_start)
        .map(|s| s.at)
        .collect();
    window.sort();
    let started_in_window = count(window.iter());
    let rate_limit = safety.rate.limit;
    let next_slot_at = if started_in_window >= rate_limit && rate_limit > 0 {
        let oldest_blocking = window[(started_in_window - rate_limit) as usize];
        Some(plus(oldest_blocking, signed(safety.rate.per.as_std())))
    } else {
        None
    };
    let circuit_open = !safety.unhealthy_limit().allows(unhealthy, selected);
    let held_domains = domains.held();
    let allowed = slow_start.map_or(concurrency_limit, |a| a.min(concurrency_limit));
    let concurrency_left = allowed.saturating_sub(in_flight);
    let rate_left = rate_limit.saturating_sub(started_in_window);
    let remaining = if paused || circuit_open {
        0
    } else {
        concurrency_left.min(rate_left)
    };

    let attempts_window = minus(now, signed(safety.max_attempts_per_node.per.as_std()));
    let mut slots = remaining;
    let mut admitted = Vec::new();
    let mut waiting = Vec::new();
    for candidate in candidates {
        let attempts = count(
            started
                .iter()
                .filter(|s| s.node == candidate.node && s.at > attempts_window),
        );
        let deferral = if attempts >= safety.max_attempts_per_node.count && !candidate.approved_past_attempts
        {
            Some(Deferral::AttemptsExhausted {
                attempts,
                limit: safety.max_attempts_per_node.count,
                per: safety.max_attempts_per_node.per,
            })
        } else if paused {
            Some(Deferral::Paused)
        } else if circuit_open {
            Some(Deferral::CircuitOpen {
                unhealthy,
                selected,
                limit: safety.unhealthy_limit().to_string(),
            })
        } else if let Some(until) = settling.get(&candidate.node).filter(|until| **until > now) {
            Some(Deferral::Settling { until: *until })
        } else if let Some((suspect, _)) = suspect_hold
            .as_ref()
            .filter(|(_, nodes)| nodes.contains(&candidate.node))
        {
            Some(Deferral::SuspectHeld(suspect.clone()))
        } else if let Some(wait) = domains.wait_of(&candidate.node) {
            Some(wait.into())
        } else if slots > 0 {
            slots -= 1;
            domains.admit(&candidate.node);
            None
        } else if concurrency_left <= rate_left && allowed < concurrency_limit {
            Some(Deferral::SlowStart {
                in_flight,
                allowed,
                max_concurrent: concurrency_limit,
            })
        } else if concurrency_left <= rate_left {
            Some(Deferral::Concurrency {
                in_flight,
                limit: concurrency_limit,
            })
        } else {
            Some(Deferral::Rate {
                started: started_in_window,
                limit: rate_limit,
                per: safety.rate.per,
                next_slot_at,
            })
        };
        match deferral {
            None => admitted.push(candidate),
            Some(deferral) => waiting.push(Deferred { candidate, deferral }),
        }
    }
    Decision {
        admitted,
        waiting,
        remaining,
        in_flight,
        started_in_window,
        next_slot_at,
        circuit_open,
        held_domains,
    }
}

fn count<I: Iterator>(items: I) -> u32 {
    u32::try_from(items.count()).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use gpu_remediation_api::{
        safety::{Attempts, Rate},
        selector::IntOrPercent,
    };

    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn safety(max_concurrent: u32, max_unhealthy: &str, rate: (u32, u64)) -> Safety {
        Safety {
            max_concurrent: IntOrPercent::Int(max_concurrent),
            max_unhealthy: IntOrPercent::Percent(max_unhealthy.into()),
            max_unhealthy_count: None,
            failure_domains: Vec::new(),
            slow_start: false,
            suspect: None,
            settle: None,
            rate: Rate {
                limit: rate.0,
                per: Duration::from_secs(rate.1),
            },
            max_attempts_per_node: Attempts {
                count: 2,
                per: Duration::from_hours(24),
            },
            repeat_offender: None,
        }
    }

    fn candidate(node: &str, since: i64) -> Candidate {
        Candidate {
            node: node.into(),
            since: at(since),
            approved_past_attempts: false,
        }
    }

    fn started(node: &str, secs: i64, in_flight: bool) -> Started {
        Started {
            node: node.into(),
            at: at(secs),
            in_flight,
        }
    }

    fn inputs<'a>(safety: &'a Safety, started: &'a [Started], candidates: Vec<Candidate>) -> Inputs<'a> {
        Inputs {
            safety,
            paused: false,
            selected: 10,
            unhealthy: u32::try_from(candidates.len()).unwrap(),
            started,
            candidates,
            domains: Domains::default(),
            slow_start: None,
            suspect_hold: None,
            settling: BTreeMap::new(),
            now: at(1000),
        }
    }

    #[test]
    fn the_longest_unhealthy_node_is_admitted_first() {
        let safety = safety(1, "50%", (4, 3600));
        let decision = admit(inputs(
            &safety,
            &[],
            vec![candidate("young", 900), candidate("old", 100)],
        ));
        assert_eq!(decision.admitted, vec![candidate("old", 100)]);
        assert_eq!(decision.waiting[0].candidate.node, "young");
        assert_eq!(
            decision.waiting[0].deferral,
            Deferral::Concurrency {
                in_flight: 0,
                limit: 1
            }
        );
    }

    #[test]
    fn nothing_new_starts_while_max_concurrent_remediations_are_in_flight() {
        let safety = safety(1, "50%", (4, 3600));
        let running = [started("a", 500, true)];
        let decision = admit(inputs(&safety, &running, vec![candidate("b", 100)]));
        assert!(decision.admitted.is_empty());
        assert_eq!(decision.remaining, 0);
        assert_eq!(
            decision.waiting[0].deferral,
            Deferral::Concurrency {
                in_flight: 1,
                limit: 1
            }
        );
    }

    #[test]
    fn an_unhealthy_share_above_max_unhealthy_opens_the_circuit_for_every_node() {
        let safety = safety(5, "30%", (10, 3600));
        let mut inputs = inputs(&safety, &[], vec![candidate("a", 1), candidate("b", 2)]);
        inputs.unhealthy = 4;
        let decision = admit(inputs);
        assert!(decision.circuit_open);
        assert!(decision.admitted.is_empty());
        assert_eq!(decision.remaining, 0);
        assert!(decision.waiting.iter().all(|w| matches!(
            &w.deferral,
            Deferral::CircuitOpen { unhealthy: 4, selected: 10, limit } if limit == "maxUnhealthy 30%"
        )));
    }

    #[test]
    fn an_unhealthy_share_exactly_at_max_unhealthy_keeps_the_circuit_closed() {
        let safety = safety(5, "30%", (10, 3600));
        let mut inputs = inputs(&safety, &[], vec![candidate("a", 1)]);
        inputs.unhealthy = 3;
        assert!(!admit(inputs).circuit_open);
    }

    #[test]
    fn a_full_rate_window_defers_with_the_time_the_next_slot_frees() {
        let safety = safety(5, "100%", (2, 3600));
        let history = [started("a", 100, false), started("b", 400, false)];
        let decision = admit(inputs(&safety, &history, vec![candidate("c", 0)]));
        assert!(decision.admitted.is_empty());
        assert_eq!(decision.started_in_window, 2);
        assert_eq!(decision.next_slot_at, Some(at(3700)));
        assert!(matches!(
            decision.waiting[0].deferral,
            Deferral::Rate { started: 2, limit: 2, next_slot_at: Some(t), .. } if t == at(3700)
        ));
    }

    #[test]
    fn remediations_older_than_the_rate_window_no_longer_count() {
        let safety = safety(5, "100%", (1, 600));
        let decide = |start: i64| {
            admit(inputs(
                &safety,
                &[started("a", start, false)],
                vec![candidate("c", 0)],
            ))
        };
        let inside = decide(401);
        assert_eq!(inside.started_in_window, 1);
        assert!(inside.admitted.is_empty());
        let aged_out = decide(400);
        assert_eq!(
            aged_out.started_in_window, 0,
            "a start exactly one window ago has aged out"
        );
        assert_eq!(aged_out.admitted.len(), 1);
    }

    #[test]
    fn one_concurrent_slot_and_two_per_hour_admit_one_node_at_a_time() {
        let safety = safety(1, "100%", (2, 3600));
        let candidates = vec![candidate("a", 1), candidate("b", 2), candidate("c", 3)];
        let decision = admit(inputs(&safety, &[], candidates));
        assert_eq!(decision.admitted, vec![candidate("a", 1)]);

        let history = [started("a", 900, false)];
        let decision = admit(inputs(
            &safety,
            &history,
            vec![candidate("b", 2), candidate("c", 3)],
        ));
        assert_eq!(decision.admitted, vec![candidate("b", 2)]);

        let history = [started("a", 900, false), started("b", 950, false)];
        let decision = admit(inputs(&safety, &history, vec![candidate("c", 3)]));
        assert!(decision.admitted.is_empty());
        assert_eq!(decision.next_slot_at, Some(at(4500)));
    }

    #[test]
    fn a_paused_policy_starts_nothing() {
        let safety = safety(5, "100%", (5, 3600));
        let mut inputs = inputs(&safety, &[], vec![candidate("a", 1)]);
        inputs.paused = true;
        let decision = admit(inputs);
        assert!(decision.admitted.is_empty());
        assert_eq!(decision.waiting[0].deferral, Deferral::Paused);
    }

    #[test]
    fn a_node_that_used_up_its_attempts_waits_for_a_person_and_frees_its_slot() {
        let safety = safety(1, "100%", (10, 3600));
        let history = [started("a", 10, false), started("a", 20, false)];
        let decision = admit(inputs(
            &safety,
            &history,
            vec![candidate("a", 1), candidate("b", 2)],
        ));
        assert_eq!(decision.admitted, vec![candidate("b", 2)]);
        assert!(matches!(
            decision.waiting[0].deferral,
            Deferral::AttemptsExhausted {
                attempts: 2,
                limit: 2,
                ..
            }
        ));
    }

    #[test]
    fn a_person_approving_past_the_attempts_limit_still_waits_for_a_slot() {
        let safety = safety(1, "100%", (10, 3600));
        let history = [
            started("a", 10, false),
            started("a", 20, false),
            started("b", 30, true),
        ];
        let approved = Candidate {
            approved_past_attempts: true,
            ..candidate("a", 1)
        };
        let decision = admit(inputs(&safety, &history, vec![approved.clone()]));
        assert!(decision.admitted.is_empty());
        assert!(
            matches!(decision.waiting[0].deferral, Deferral::Concurrency { .. }),
            "{:?}",
            decision.waiting
        );
        let decision = admit(inputs(&safety, &history[..2], vec![approved.clone()]));
        assert_eq!(decision.admitted, vec![approved]);
    }

    #[test]
    fn a_percentage_of_max_concurrent_rounds_up() {
        let mut safety = safety(1, "100%", (10, 3600));
        safety.max_concurrent = IntOrPercent::Percent("10%".into());
        let mut inputs = inputs(&safety, &[], vec![candidate("a", 1), candidate("b", 2)]);
        inputs.selected = 15;
        assert_eq!(admit(inputs).admitted.len(), 2);
    }

    #[test]
    fn max_unhealthy_given_as_a_count_and_a_share_opens_at_the_lower() {
        // 30% of 20 is 6; the count 3 is lower and opens the circuit at 4.
        let mut safety = safety(5, "30%", (10, 3600));
        safety.max_unhealthy_count = Some(3);
        let decide = |unhealthy: u32, selected: u32| {
            let mut inputs = inputs(&safety, &[], vec![candidate("a", 1)]);
            inputs.unhealthy = unhealthy;
            inputs.selected = selected;
            admit(inputs)
        };
        assert!(!decide(3, 20).circuit_open);
        let open = decide(4, 20);
        assert!(open.circuit_open);
        assert!(matches!(
            &open.waiting[0].deferral,
            Deferral::CircuitOpen { limit, .. } if limit == "maxUnhealthy 30% and maxUnhealthyCount 3 (the lower wins)"
        ));
        // 30% of 5 is 1.5: the share is lower than the count and opens the circuit at 2.
        assert!(!decide(1, 5).circuit_open);
        assert!(decide(2, 5).circuit_open);
    }

    fn rack_domain(max_unhealthy_count: Option<u32>) -> gpu_remediation_api::correlated::FailureDomain {
        gpu_remediation_api::correlated::FailureDomain {
            topology_key: "rack".into(),
            max_unhealthy_share: None,
            max_unhealthy_count,
            max_in_flight: Some(1),
        }
    }

    /// Racks `a` and `b` of three nodes each (`a0`..`b2`).
    fn racks_of_three(
        specs: &[gpu_remediation_api::correlated::FailureDomain],
        unhealthy: &[&str],
        in_flight: &[&str],
    ) -> Domains {
        let nodes: Vec<(String, std::collections::BTreeMap<String, String>)> =
            ["a0", "a1", "a2", "b0", "b1", "b2"]
                .map(|n| (n.to_owned(), [("rack".to_owned(), n[..1].to_owned())].into()))
                .to_vec();
        Domains::count(
            specs,
            nodes.iter().map(|(node, labels)| domains::Member {
                node,
                labels,
                unhealthy: unhealthy.contains(&node.as_str()),
                in_flight: in_flight.contains(&node.as_str()),
            }),
        )
    }

    #[test]
    fn a_held_rack_waits_without_taking_a_slot_and_another_rack_s_node_is_admitted() {
        let safety = safety(1, "100%", (10, 3600));
        let mut inputs = inputs(
            &safety,
            &[],
            vec![candidate("b0", 1), candidate("b1", 2), candidate("a2", 3)],
        );
        inputs.domains = racks_of_three(&[rack_domain(Some(1))], &["b0", "b1", "a2"], &[]);
        let decision = admit(inputs);
        assert_eq!(decision.admitted, vec![candidate("a2", 3)]);
        assert_eq!(decision.held_domains.len(), 1);
        assert_eq!(decision.held_domains[0].name(), "rack=b");
        assert!(
            decision
                .waiting
                .iter()
                .all(|w| w.deferral.reason() == "DomainHeld"
                    && w.deferral.message().contains("rack=b: 2 of 3 nodes unhealthy"))
        );
    }

    #[test]
    fn a_rack_at_max_in_flight_admits_one_per_pass_and_others_use_the_free_slots() {
        let safety = safety(5, "100%", (10, 3600));
        let mut inputs = inputs(
            &safety,
            &[],
            vec![candidate("a0", 1), candidate("a1", 2), candidate("b0", 3)],
        );
        inputs.domains = racks_of_three(&[rack_domain(None)], &["a0", "a1", "b0"], &[]);
        let decision = admit(inputs);
        assert_eq!(decision.admitted, vec![candidate("a0", 1), candidate("b0", 3)]);
        assert_eq!(
            decision.waiting[0].deferral,
            Deferral::DomainInFlight {
                domain: "rack=a".into(),
                in_flight: 1,
                limit: 1,
                slow_start: false,
            }
        );
        assert!(decision.held_domains.is_empty());
    }

    #[test]
    fn slow_start_admits_up_to_its_allowance_and_says_so() {
        let safety = safety(4, "100%", (10, 3600));
        let candidates = || vec![candidate("a", 1), candidate("b", 2), candidate("c", 3)];
        let mut first = inputs(&safety, &[], candidates());
        first.slow_start = Some(1);
        let decision = admit(first);
        assert_eq!(decision.admitted, vec![candidate("a", 1)]);
        assert_eq!(
            decision.waiting[0].deferral,
            Deferral::SlowStart {
                in_flight: 0,
                allowed: 1,
                max_concurrent: 4
            }
        );
        assert_eq!(decision.waiting[0].deferral.reason(), "DeferredBySlowStart");
        let running = [started("a", 900, true)];
        let mut doubled = inputs(&safety, &running, candidates()[1..].to_vec());
        doubled.slow_start = Some(2);
        assert_eq!(admit(doubled).admitted, vec![candidate("b", 2)]);
    }

    #[test]
    fn an_allowance_above_max_concurrent_is_held_to_max_concurrent() {
        let safety = safety(1, "100%", (10, 3600));
        let mut inputs = inputs(&safety, &[], vec![candidate("a", 1), candidate("b", 2)]);
        inputs.slow_start = Some(8);
        let decision = admit(inputs);
        assert_eq!(decision.admitted.len(), 1);
        assert!(matches!(
            decision.waiting[0].deferral,
            Deferral::Concurrency { .. }
        ));
    }

    #[test]
    fn a_node_carrying_the_held_suspect_waits_and_one_without_it_starts() {
        let safety = safety(5, "100%", (10, 3600));
        let suspect = SuspectStatus {
            attribute: "nvidia.com/cuda.driver.major".into(),
            value: "570".into(),
            failures: 5,
            of: 6,
            holding: true,
            message: "5 of 6 failures in the last 1h are on nvidia.com/cuda.driver.major=570".into(),
        };
        let mut inputs = inputs(&safety, &[], vec![candidate("on-570", 1), candidate("on-550", 2)]);
        inputs.suspect_hold = Some((suspect, ["on-570".to_owned()].into()));
        let decision = admit(inputs);
        assert_eq!(decision.admitted, vec![candidate("on-550", 2)]);
        assert_eq!(decision.waiting[0].deferral.reason(), "SuspectHeld");
        assert!(
            decision.waiting[0]
                .deferral
                .message()
                .starts_with("5 of 6 failures in the last 1h are on nvidia.com/cuda.driver.major=570")
        );
    }

    #[test]
    fn a_node_still_settling_waits_without_a_slot_and_one_settled_starts() {
        let safety = safety(5, "100%", (10, 3600));
        let mut inputs = inputs(
            &safety,
            &[],
            vec![candidate("fresh", 990), candidate("settled", 900)],
        );
        inputs.settling = [("fresh".to_owned(), at(1002)), ("settled".to_owned(), at(1000))].into();
        let decision = admit(inputs);
        assert_eq!(decision.admitted, vec![candidate("settled", 900)]);
        assert_eq!(
            decision.waiting[0].deferral,
            Deferral::Settling { until: at(1002) }
        );
        assert_eq!(decision.remaining, 5, "settling takes no slot");
    }
}
