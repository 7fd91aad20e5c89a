//! Dead nodes released with the out-of-service taint (non-graceful node shutdown, KEP-2268, GA
//! since Kubernetes 1.28). Pure: which nodes get `node.kubernetes.io/out-of-service=nodeshutdown:
//! NoExecute` and which lose it; the acting layer (`act::out_of_service`) reads the nodes' Leases
//! and writes the edits through the one writer.
//!
//! A node whose kubelet stopped reporting keeps its pods `Terminating` for ever: the API server
//! cannot know their containers stopped, so a `StatefulSet` never recreates them and their volumes
//! stay attached. The taint tells the controller manager the node is down: its pod garbage
//! collector force-deletes those pods and the attach-detach controller detaches their volumes.
//! Applied to a node still running containers, it would run two copies of a `StatefulSet`'s pod, so
//! the taint is added only to a node **confirmed down**, all of:
//!
//! - its remediation, still in flight, shut it down: the action `Replace` or `Reboot` (or a
//!   ladder's `Replace` or `Reboot` step) was triggered, the server having accepted the trigger (the remediation's
//!   `status.replacement`, or the step's `object`: the Machine or `NodeClaim` deletion, the node's
//!   deletion, the reboot or power-off template);
//! - the node lifecycle controller marked it unreachable (`Ready=Unknown`, not `False`: a kubelet
//!   reporting `False` still runs) at least [`DOWN_FOR`] ago;
//! - its Lease (`kube-node-lease/<node>`) was last renewed at least [`DOWN_FOR`] ago, or is gone.
//!
//! The taint is lifted when the node reports again (`Ready=True`); a node deleted takes it along.
//! Only a taint the controller added (annotated [`OUT_OF_SERVICE_BY_ANNOTATION`]) is lifted; a
//! person's or another tool's is never touched, and no other taint is.

use crate::observe::NodeView;
use gpu_remediation_api::{
    GpuRemediation,
    constants::{OUT_OF_SERVICE_BY_ANNOTATION, OUT_OF_SERVICE_TAINT_KEY, OUT_OF_SERVICE_TAINT_VALUE},
    ladder::Rung,
    policy::Action,
};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::{Node, NodeSpec, Taint};
use kube::ResourceExt as _;

/// How long a node must have been unreachable, and its Lease unrenewed, before it counts as down.
pub const DOWN_FOR: SignedDuration = SignedDuration::from_secs(60);

/// What the remediation, while in flight, did that shut its node down, in words (`None`: nothing
/// yet, or it has finished).
#[must_use]
pub fn shut_down_by(remediation: &GpuRemediation) -> Option<String> {
    let status = remediation.status.as_ref()?;
    // A finished remediation shut nothing down now: an outage after it is not its doing.
    if status.phase.is_terminal() {
        return None;
    }
    if matches!(remediation.spec.action, Action::Replace | Action::Reboot)
        && let Some(object) = &status.replacement
    {
        return Some(format!(
            "its {:?} was triggered ({} {})",
            remediation.spec.action, object.kind, object.name
        ));
    }
    status
        .steps
        .iter()
        .filter(|s| matches!(s.step, Rung::Replace | Rung::Reboot))
        .find_map(|s| {
            let object = s.object.as_ref()?;
            Some(format!(
                "its ladder's {} step was triggered ({} {})",
                s.step, object.kind, object.name
            ))
        })
}

/// What to do with a node's out-of-service taint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Add it for this remediation, and why the node is confirmed down.
    Add {
        /// The remediation that shut the node down.
        remediation: String,
        /// Why the node counts as down, in words.
        why: String,
    },
    /// Lift ours: the node reports again.
    Lift,
    /// Not confirmed down yet: decide again at this time (when [`DOWN_FOR`] will have passed).
    Wait(Timestamp),
    /// Nothing to do, and why (for the logs).
    Keep(String),
}

/// The node's `Ready` condition: its status and since when.
fn ready(node: &(impl NodeView + ?Sized)) -> Option<(&str, Option<Timestamp>)> {
    let ready = crate::lifecycle::ladder_evidence::ready_condition(node)?;
    Some((ready.status, ready.last_transition_time))
}

/// Whether the node lifecycle controller marks the node unreachable (`Ready=Unknown`): only then
/// can it be confirmed down, so only then is its Lease worth reading.
#[must_use]
pub fn unreachable(node: &(impl NodeView + ?Sized)) -> bool {
    matches!(ready(node), Some(("Unknown", _)))
}

/// Whether the node carries the out-of-service taint the controller added.
#[must_use]
pub fn ours(node: &(impl NodeView + ?Sized)) -> bool {
    node.annotation(OUT_OF_SERVICE_BY_ANNOTATION).is_some() && has_taint(node)
}

/// Whether the node carries the out-of-service taint, whoever added it.
#[must_use]
pub fn has_taint(node: &(impl NodeView + ?Sized)) -> bool {
    node.taints().iter().any(|t| t.key == OUT_OF_SERVICE_TAINT_KEY)
}

/// Decides for `node`, whose remediation `shut_down` (its name and [`shut_down_by`]'s words, or
/// `None`), whose Lease was last renewed at `lease_renewed` (`None`: no Lease).
#[must_use]
pub fn decide(
    node: &(impl NodeView + ?Sized),
    shut_down: Option<(&str, &str)>,
    lease_renewed: Option<Timestamp>,
    now: Timestamp,
) -> Verdict {
    let ready = ready(node);
    if ours(node) {
        return match ready {
            Some(("True", _)) => Verdict::Lift,
            _ => Verdict::Keep("the node is still down".to_owned()),
        };
    }
    if has_taint(node) {
        return Verdict::Keep("another actor's out-of-service taint".to_owned());
    }
    let Some((remediation, how)) = shut_down else {
        return Verdict::Keep("no remediation shut the node down".to_owned());
    };
    let unreachable_since = match ready {
        Some(("Unknown", Some(since))) => since,
        Some(("Unknown", None)) => return Verdict::Keep("Ready=Unknown without a time".to_owned()),
        Some((status, _)) => return Verdict::Keep(format!("its kubelet reports (Ready={status})")),
        None => return Verdict::Keep("no Ready condition".to_owned()),
    };
    let latest = lease_renewed.map_or(unreachable_since, |renewed| renewed.max(unreachable_since));
    let due = crate::time::plus(latest, DOWN_FOR);
    if now < due {
        return Verdict::Wait(due);
    }
    let lease = lease_renewed.map_or_else(|| "no Lease".to_owned(), |at| format!("Lease last renewed {at}"));
    Verdict::Add {
        remediation: remediation.to_owned(),
        why: format!(
            "{how}, and the node is unreachable (Ready=Unknown since {unreachable_since}; {lease}) for at least \
             {}s",
            DOWN_FOR.as_secs()
        ),
    }
}

/// Adds the out-of-service taint for `remediation` to the node's others. Returns whether anything
/// changed.
pub fn add(node: &mut Node, remediation: &str) -> bool {
    if has_taint(node) {
        return false;
    }
    node.annotations_mut()
        .insert(OUT_OF_SERVICE_BY_ANNOTATION.to_owned(), remediation.to_owned());
    node.spec
        .get_or_insert_with(NodeSpec::default)
        .taints
        .get_or_insert_with(Vec::new)
        .push(Taint {
            key: OUT_OF_SERVICE_TAINT_KEY.to_owned(),
            value: Some(OUT_OF_SERVICE_TAINT_VALUE.to_owned()),
            effect: "NoExecute".to_owned(),
            time_added: None,
        });
    true
}

/// Lifts the out-of-service taint the controller added; every other taint stays. Returns whether
/// anything changed.
pub fn lift(node: &mut Node) -> bool {
    if !ours(node) {
        return false;
    }
    node.annotations_mut().remove(OUT_OF_SERVICE_BY_ANNOTATION);
    if let Some(taints) = node.spec.as_mut().and_then(|s| s.taints.as_mut()) {
        taints.retain(|t| t.key != OUT_OF_SERVICE_TAINT_KEY);
    }
    true
}

#[cfg(test)]
#[path = "out_of_service_tests.rs"]
pub(crate) mod tests;
