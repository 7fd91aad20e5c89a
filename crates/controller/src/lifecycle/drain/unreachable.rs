//! Pods on an unreachable node that the drain stops waiting for. While the node's `Ready`
//! condition is `Unknown` (its kubelet stopped reporting), no kubelet will ever report a
//! terminating pod gone, so it would stay `Terminating` for good: a pod already terminating
//! (its eviction accepted, or deleted by anyone) whose `deletionTimestamp` is more than
//! `drain.unreachableAfter` in the past counts as gone for the drain (Cluster API's
//! `SkipWaitForDeleteTimeoutSeconds`). Never a pod not yet terminating (it is still evicted under
//! its budget), never on a node whose `Ready` is `True` or `False`.

use gpu_remediation_api::{constants::reasons, remediation::PolicySnapshot};
use jiff::Timestamp;
use kube::runtime::events::EventType;

use super::super::{Facts, Identity, Note, diagnostics};
use crate::{
    drain::{Leaving, Plan},
    time::{plus, signed},
};

/// The pods counted gone now, and when the next one will be (`None`: none is waiting for it).
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Skipped {
    /// Terminating pods past the bound on an unreachable node.
    pub count: u32,
    /// Just after the next terminating pod passes the bound (if the node stays unreachable).
    pub next: Option<Timestamp>,
}

/// Which of the plan's pods count as gone because the node is unreachable.
pub(super) fn skipped(rules: &PolicySnapshot, plan: &Plan, facts: &Facts<'_>) -> Skipped {
    let Identity::Same(node) = facts.identity else {
        return Skipped::default();
    };
    if !diagnostics::unreachable(node) {
        return Skipped::default();
    }
    let after = signed(rules.drain.unreachable_after.as_std());
    let mut out = Skipped::default();
    for past in plan.leaving.iter().filter_map(|pod| skip_at(pod, after)) {
        if past < facts.now {
            out.count += 1;
        } else {
            // Looked at again just after it passes the bound.
            let due = plus(past, jiff::SignedDuration::from_secs(1));
            out.next = Some(out.next.map_or(due, |n: Timestamp| n.min(due)));
        }
    }
    out
}

/// When a terminating pod stops being waited for on an unreachable node: `after` past its
/// `deletionTimestamp`. `None` for a pod not terminating.
fn skip_at(pod: &Leaving, after: jiff::SignedDuration) -> Option<Timestamp> {
    pod.terminating
        .then_some(pod.gone_by)
        .flatten()
        .map(|deleted| plus(deleted, after))
}

/// "; N counted gone: …" for a status message, or nothing.
pub(super) fn said(skipped: &Skipped, rules: &PolicySnapshot) -> String {
    if skipped.count == 0 {
        return String::new();
    }
    format!(
        "; {} counted gone: the node is unreachable (Ready=Unknown) and they were terminating more than \
         drain.unreachableAfter ({}) past their deletionTimestamp, so no kubelet will report them gone",
        skipped.count, rules.drain.unreachable_after
    )
}

/// The Event of a drain that ended with pods counted gone (`UnreachablePodsSkipped`), said once:
/// the drain ends with it.
pub(super) fn note(skipped: &Skipped, message: &str) -> Option<Note> {
    (skipped.count > 0).then(|| Note::new(reasons::UNREACHABLE_PODS_SKIPPED, EventType::Warning, message))
}
