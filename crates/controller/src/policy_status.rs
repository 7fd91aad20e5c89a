//! When a policy's planned status reaches the API server. A change of its counts only (selected,
//! yielded, unhealthy and quarantined nodes, leaked pods, and the words of conditions and waiting
//! nodes that quote them) is held at most [`COUNTS_HOLD`] from when it was first planned, so that
//! changes close together share one write: a fault's quarantine at its first signal and its
//! admission when `for` elapses, a burst of faults. Anything else (a condition's status or reason,
//! the remediations in flight, the budget, a node newly waiting or yielded) is written at once,
//! with every count held before it. Pure: `admit` remembers since when counts are held and writes.

use gpu_remediation_api::GpuRemediationPolicyStatus;
use jiff::{SignedDuration, Timestamp};

/// The longest a change of counts only waits for a write to share.
pub const COUNTS_HOLD: SignedDuration = SignedDuration::from_secs(5);

/// What to do with a planned status.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The server has it.
    Unchanged,
    /// Counts only, first planned less than [`COUNTS_HOLD`] ago: hold it until this time.
    HoldUntil(Timestamp),
    /// Write it now.
    Write,
}

/// Decides for `planned` against the status the server has (`server`), where a change of counts
/// only has been held since `counts_since`.
#[must_use]
pub fn verdict(
    server: Option<&GpuRemediationPolicyStatus>,
    planned: &GpuRemediationPolicyStatus,
    counts_since: Option<Timestamp>,
    now: Timestamp,
) -> Verdict {
    match server {
        Some(server) if server == planned => Verdict::Unchanged,
        Some(server) if counts_only(server, planned) => {
            let due = crate::time::plus(counts_since.unwrap_or(now), COUNTS_HOLD);
            if now < due {
                Verdict::HoldUntil(due)
            } else {
                Verdict::Write
            }
        }
        _ => Verdict::Write,
    }
}

/// Whether `after` differs from `before` only in counts and in the words that quote them.
#[must_use]
pub fn counts_only(before: &GpuRemediationPolicyStatus, after: &GpuRemediationPolicyStatus) -> bool {
    bare(before) == bare(after)
}

fn bare(status: &GpuRemediationPolicyStatus) -> GpuRemediationPolicyStatus {
    let mut bare = status.clone();
    bare.selected_nodes = 0;
    bare.yielded_nodes = 0;
    bare.unhealthy_nodes = 0;
    bare.quarantined_nodes = 0;
    bare.leaked_pods = 0;
    bare.drain_gpu_seconds = 0;
    bare.waiting_total = 0;
    for condition in &mut bare.conditions {
        condition.message.clear();
    }
    for waiting in &mut bare.waiting {
        waiting.message.clear();
    }
    bare
}

#[cfg(test)]
mod tests {
    use gpu_remediation_api::policy::WaitingNode;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    use super::*;
    use crate::test_fixtures::at;

    fn status(unhealthy: u32, quarantined: u32, in_flight: u32, circuit: &str) -> GpuRemediationPolicyStatus {
        GpuRemediationPolicyStatus {
            selected_nodes: 10,
            unhealthy_nodes: unhealthy,
            quarantined_nodes: quarantined,
            in_flight,
            conditions: vec![Condition {
                type_: "CircuitOpen".into(),
                status: circuit.into(),
                reason: "WithinLimit".into(),
                message: format!("{unhealthy} of 10 nodes unhealthy"),
                last_transition_time: Time(at(0)),
                observed_generation: Some(1),
            }],
            ..GpuRemediationPolicyStatus::default()
        }
    }

    #[test]
    fn a_quarantine_counted_is_held_and_written_once_the_hold_has_passed() {
        let server = status(0, 0, 0, "False");
        let quarantined = status(1, 1, 0, "False");
        assert_eq!(
            verdict(Some(&server), &quarantined, None, at(0)),
            Verdict::HoldUntil(at(5))
        );
        assert_eq!(
            verdict(Some(&server), &quarantined, Some(at(0)), at(3)),
            Verdict::HoldUntil(at(5)),
            "held since it was first planned, not pushed back by each pass"
        );
        assert_eq!(
            verdict(Some(&server), &quarantined, Some(at(0)), at(5)),
            Verdict::Write
        );
    }

    #[test]
    fn an_admission_is_written_at_once_with_the_counts_held_before_it() {
        let server = status(0, 0, 0, "False");
        let admitted = status(1, 1, 1, "False");
        assert_eq!(
            verdict(Some(&server), &admitted, Some(at(0)), at(1)),
            Verdict::Write
        );
    }

    #[test]
    fn a_condition_turning_or_a_node_newly_waiting_is_written_at_once() {
        let server = status(0, 0, 0, "False");
        assert_eq!(
            verdict(Some(&server), &status(4, 0, 0, "True"), None, at(0)),
            Verdict::Write
        );
        let mut waiting = status(1, 0, 0, "False");
        waiting.waiting.push(WaitingNode {
            node: "gpu-1".into(),
            unhealthy_since: None,
            reason: "CircuitOpen".into(),
            message: "1 of 10".into(),
        });
        assert_eq!(verdict(Some(&server), &waiting, None, at(0)), Verdict::Write);
        let mut reworded = waiting.clone();
        reworded.waiting[0].message = "2 of 10".into();
        assert!(
            counts_only(&waiting, &reworded),
            "a waiting node's words quoting a count"
        );
    }

    #[test]
    fn the_first_status_and_one_the_server_has_are_told_apart() {
        let planned = status(1, 1, 0, "False");
        assert_eq!(verdict(None, &planned, None, at(0)), Verdict::Write);
        assert_eq!(
            verdict(Some(&planned), &planned, Some(at(0)), at(9)),
            Verdict::Unchanged
        );
    }
}
