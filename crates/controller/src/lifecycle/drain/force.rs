//! `onTimeout: ForceDelete`, and which terminating pods count as stuck: the drain's last resort,
//! bounded by the policy's grace period and its opt-in to grace 0.

use std::{collections::BTreeSet, fmt::Write as _};

use gpu_remediation_api::{GpuRemediationStatus, constants::reasons, remediation::PolicySnapshot};
use jiff::Timestamp;
use kube::runtime::events::EventType;

use super::{
    super::{Ask, Decision, Next, Note, Seen, Settlement},
    block, grace_period,
};
use crate::{
    drain::{Leaving, Plan},
    time::plus,
};

/// How long past its `deletionTimestamp` a terminating pod may take to disappear before it counts
/// as stuck: a live kubelet reports the pod gone shortly after the grace period, later under load.
const KUBELET_SLACK: jiff::SignedDuration = jiff::SignedDuration::from_secs(10);

/// Whether a pod is terminating and still there `KUBELET_SLACK` past its deadline (a terminating pod
/// without a deadline is stuck at once).
pub(super) fn stuck_terminating(pod: &Leaving, now: Timestamp) -> bool {
    pod.terminating && pod.gone_by.is_none_or(|by| by + KUBELET_SLACK <= now)
}

/// `onTimeout: ForceDelete`: delete the pods still running with the policy's grace period, and
/// pods stuck terminating with grace 0 only where the policy allows it. What cannot be removed
/// (a refused delete, a pod stuck terminating without the opt-in) leaves the drain `Blocked`
/// with the reason.
pub(super) fn force_delete(
    rules: &PolicySnapshot,
    plan: &Plan,
    seen: &Seen<'_>,
    status: GpuRemediationStatus,
    notes: Vec<Note>,
    next: Next,
    now: Timestamp,
) -> Decision {
    let asked: BTreeSet<&str> = seen
        .answers
        .deletions
        .iter()
        .map(|(p, _)| p.uid.as_str())
        .collect();
    let running: Vec<Leaving> = plan
        .to_evict()
        .filter(|p| !asked.contains(p.uid.as_str()))
        .cloned()
        .collect();
    if !running.is_empty() {
        return Decision::Ask(Ask::Delete {
            pods: running,
            grace: grace_period(rules),
        });
    }
    // A pod still terminating well past its own deadline is stuck (its kubelet is gone or hung);
    // just past it, a live kubelet may still be reporting the pod gone.
    let stuck: Vec<&Leaving> = plan
        .leaving
        .iter()
        .filter(|p| stuck_terminating(p, now))
        .collect();
    if rules.drain.allow_zero_grace_period {
        let unasked: Vec<Leaving> = stuck
            .iter()
            .filter(|p| !asked.contains(p.uid.as_str()))
            .map(|p| (*p).clone())
            .collect();
        if !unasked.is_empty() {
            return Decision::Ask(Ask::Delete {
                pods: unasked,
                grace: Some(0),
            });
        }
    }
    let refused: Vec<String> = seen
        .answers
        .deletions
        .iter()
        .filter_map(|(pod, answer)| {
            answer
                .as_ref()
                .err()
                .map(|w| format!("{}: {}", pod.key(), w.message))
        })
        .collect();
    let deleted: Vec<String> = seen
        .answers
        .deletions
        .iter()
        .filter(|(_, answer)| answer.is_ok())
        .map(|(pod, _)| pod.key())
        .collect();
    let mut message = format!(
        "drain timed out after {} (onTimeout: ForceDelete)",
        rules.drain.timeout
    );
    if !deleted.is_empty() {
        let _ = write!(message, "; deleted directly: {}", deleted.join(", "));
    }
    if !refused.is_empty() {
        let _ = write!(
            message,
            "; the server refused to delete {} (does the controller have the optional force-delete role?)",
            refused.join("; ")
        );
    }
    let stuck_without_help = !stuck.is_empty() && !rules.drain.allow_zero_grace_period;
    if stuck_without_help {
        let names: Vec<String> = stuck.iter().map(|p| p.key()).collect();
        let _ = write!(
            message,
            "; pods stuck terminating past their grace period: {} (drain.allowZeroGracePeriod lets \
             ForceDelete remove them with grace 0; or remove them by hand)",
            names.join(", ")
        );
    }
    let mut notes = notes;
    if !deleted.is_empty() {
        notes.push(Note::new(reasons::DRAIN_TIMEOUT, EventType::Warning, &message));
    }
    if refused.is_empty() && !stuck_without_help {
        // Everything asked was granted: the pods are on their way out; look again soon.
        let mut status = status;
        status.message = Some(message);
        return Decision::Settle(Settlement {
            release: None,
            status,
            notes,
            drop_finalizer: false,
            next: Next::At(plus(now, seen.pace.pod_poll)),
        });
    }
    Decision::Settle(block(status, notes, &message, next, now))
}
