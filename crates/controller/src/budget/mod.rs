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
    /// Governed nodes recovered within a moment (`fleet::recovering`), and when the last settles.
    pub recovering: Option<(u32, Timestamp)>,
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
    /// The circuit breaker closed only on recoveries younger than a moment: counted as still
    /// unhealthy they would keep it open, so admissions wait until they settle (a burst of
    /// recoveries is judged together, not by its first).
    RecoveriesSettling {
        /// Recovering governed nodes.
        recovering: u32,
        /// When the last of them settles.
        until: Timestamp,
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
            Self::RecoveriesSettling { .. } => reasons::RECOVERIES_SETTLING,
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
            Self::RecoveriesSettling { recovering, until } => format!(
                "{recovering} node(s) recovered a moment ago, and the circuit breaker would be open \
                 with them: waits until {until} so recoveries arriving together are judged together"
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

/// `maxConcurrent` as a count of the policy's `selected` nodes: the one reading of it (admission and
/// slow start). A value that cannot be resolved (validation marks the policy `Invalid`) allows none.
#[must_use]
pub fn max_concurrent(safety: &Safety, selected: u32) -> u32 {
    safety.max_concurrent.resolve(selected).unwrap_or(0)
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
        recovering,
        now,
    } = inputs;
    candidates.sort_by(|a, b| a.since.cmp(&b.since).then_with(|| a.node.cmp(&b.node)));

    let in_flight = count(started.iter().filter(|s| s.in_flight));
    let concurrency_limit = max_concurrent(safety, selected);
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
    let recoveries_settling = (!circuit_open)
        .then(|| unsettled(safety, recovering, unhealthy, selected, now))
        .flatten();
    let held_domains = domains.held();
    let allowed = slow_start.map_or(concurrency_limit, |a| a.min(concurrency_limit));
    let concurrency_left = allowed.saturating_sub(in_flight);
    let rate_left = rate_limit.saturating_sub(started_in_window);
    let remaining = if paused || circuit_open || recoveries_settling.is_some() {
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
        } else if let Some((recovering, until)) = recoveries_settling {
            Some(Deferral::RecoveriesSettling { recovering, until })
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

/// The recoveries that alone close the breaker and have not settled: held as if it were open
/// until they do (`fleet::recovering`).
fn unsettled(
    safety: &Safety,
    recovering: Option<(u32, Timestamp)>,
    unhealthy: u32,
    selected: u32,
    now: Timestamp,
) -> Option<(u32, Timestamp)> {
    recovering.filter(|(count, until)| {
        *until > now
            && !safety
                .unhealthy_limit()
                .allows(unhealthy.saturating_add(*count), selected)
    })
}

fn count<I: Iterator>(items: I) -> u32 {
    u32::try_from(items.count()).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests;
