//! Slow start: how many remediations a policy may have in flight, earned by proven successes.
//! Pure.
//!
//! The allowance starts at 1, doubles after each proven success (a remediation that succeeded and
//! whose node, or its replacement, stayed Ready and healthy for `release.healthyFor` after it
//! ended), falls back to 1 after a `Failed` one (or a success whose node broke again within
//! `release.healthyFor`), and never exceeds `maxConcurrent`. It is folded from the outcomes of the
//! remediations kept in the API server, oldest first, so a restart or a new leader computes the
//! same allowance.

use jiff::Timestamp;

/// What one finished remediation says about the fleet's health.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// The remediation.
    pub remediation: String,
    /// Its node.
    pub node: String,
    /// When it was proven (the end plus `release.healthyFor`) or failed.
    pub at: Timestamp,
    /// Proven or failed.
    pub kind: OutcomeKind,
}

/// Whether a remediation proved the fix works.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutcomeKind {
    /// Succeeded, and the node or its replacement stayed healthy for `release.healthyFor`.
    Proven,
    /// `Failed`, or the node broke again within `release.healthyFor` of the end.
    Failed,
}

/// The allowance and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allowance {
    /// Remediations allowed in flight now.
    pub allowed: u32,
    /// A sentence for a person.
    pub why: String,
}

/// Folds `outcomes` (any order) into the allowance, capped at `max_concurrent` (at least 1).
#[must_use]
pub fn allowance(outcomes: &[Outcome], max_concurrent: u32) -> Allowance {
    let cap = max_concurrent.max(1);
    let mut ordered: Vec<&Outcome> = outcomes.iter().collect();
    ordered.sort_by(|a, b| a.at.cmp(&b.at).then_with(|| a.remediation.cmp(&b.remediation)));
    let mut allowed: u32 = 1;
    let mut why = format!(
        "slow start begins at 1 in flight; no remediation has proven itself yet (maxConcurrent {cap})"
    );
    for outcome in ordered {
        match outcome.kind {
            OutcomeKind::Proven => {
                allowed = allowed.saturating_mul(2).min(cap);
                why = format!(
                    "{allowed} in flight (maxConcurrent {cap}): doubled when remediation {} of node {} proved itself at {}",
                    outcome.remediation, outcome.node, outcome.at
                );
            }
            OutcomeKind::Failed => {
                allowed = 1;
                why = format!(
                    "back to 1 in flight: remediation {} of node {} failed at {}",
                    outcome.remediation, outcome.node, outcome.at
                );
            }
        }
    }
    Allowance { allowed, why }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_fixtures::at;

    fn outcome(name: &str, secs: i64, kind: OutcomeKind) -> Outcome {
        Outcome {
            remediation: name.into(),
            node: format!("node-of-{name}"),
            at: at(secs),
            kind,
        }
    }

    #[test]
    fn with_nothing_proven_one_remediation_may_be_in_flight() {
        let allowance = allowance(&[], 4);
        assert_eq!(allowance.allowed, 1);
        assert!(allowance.why.contains("begins at 1"), "{}", allowance.why);
    }

    #[test]
    fn each_proven_success_doubles_the_allowance_up_to_max_concurrent() {
        let mut outcomes = vec![outcome("r1", 10, OutcomeKind::Proven)];
        assert_eq!(allowance(&outcomes, 4).allowed, 2);
        outcomes.push(outcome("r2", 20, OutcomeKind::Proven));
        assert_eq!(allowance(&outcomes, 4).allowed, 4);
        outcomes.push(outcome("r3", 30, OutcomeKind::Proven));
        let capped = allowance(&outcomes, 4);
        assert_eq!(capped.allowed, 4, "never above maxConcurrent");
        assert!(capped.why.contains("r3"), "{}", capped.why);
        assert_eq!(allowance(&outcomes, 3).allowed, 3);
    }

    #[test]
    fn a_failure_brings_it_back_to_one_and_later_successes_double_again() {
        let outcomes = [
            outcome("r1", 10, OutcomeKind::Proven),
            outcome("r2", 20, OutcomeKind::Proven),
            outcome("r3", 30, OutcomeKind::Failed),
        ];
        let after_failure = allowance(&outcomes, 8);
        assert_eq!(after_failure.allowed, 1);
        assert!(after_failure.why.contains("r3") && after_failure.why.contains("failed"));
        let mut recovered = outcomes.to_vec();
        recovered.push(outcome("r4", 40, OutcomeKind::Proven));
        assert_eq!(allowance(&recovered, 8).allowed, 2);
    }

    #[test]
    fn outcomes_count_in_the_order_they_happened_not_the_order_given() {
        let outcomes = [
            outcome("late-success", 50, OutcomeKind::Proven),
            outcome("early-failure", 10, OutcomeKind::Failed),
        ];
        assert_eq!(allowance(&outcomes, 4).allowed, 2);
    }

    #[test]
    fn a_max_concurrent_of_zero_still_allows_one() {
        assert_eq!(allowance(&[outcome("r1", 1, OutcomeKind::Proven)], 0).allowed, 1);
    }
}
