//! The quarantine as an edit of a Node object, and who owns it. Pure; the write around
//! these edits (a preconditioned patch or a read-modify-replace) lives in `write`.
//!
//! A quarantine is one `NoSchedule` taint, `gpuremediation.dev/quarantined`, and one annotation,
//! `gpuremediation.dev/quarantined-by`, naming the policy that took it. It never sets
//! `unschedulable` and never touches another taint, so a person's cordon and taints stay exactly
//! as they are. Ownership lives on the node, so a restarted controller finds every quarantine
//! again.

use crate::observe::NodeView;
use gpu_remediation_api::constants::{QUARANTINE_TAINT_KEY, QUARANTINED_BY_ANNOTATION};
use k8s_openapi::api::core::v1::{Node, NodeSpec, Taint};
use kube::ResourceExt;

/// Whether the node carries the quarantine taint.
#[must_use]
pub fn has_taint(node: &(impl NodeView + ?Sized)) -> bool {
    node.taints().iter().any(|t| t.key == QUARANTINE_TAINT_KEY)
}

/// The policy named as the quarantine's owner, if any.
#[must_use]
pub fn owner(node: &(impl NodeView + ?Sized)) -> Option<&str> {
    node.annotation(QUARANTINED_BY_ANNOTATION)
}

/// Quarantines `node` for `policy`: the taint added to the others, the owner recorded (a
/// device-level quarantine found there becomes this node-level one). Returns whether anything
/// changed (the edit is idempotent).
///
/// `NoSchedule`, never `NoExecute`: the quarantine keeps new pods off, it never moves one.
pub fn quarantine(node: &mut Node, policy: &str) -> bool {
    let mut changed = super::device::unmark(node);
    if owner(node) != Some(policy) {
        node.annotations_mut()
            .insert(QUARANTINED_BY_ANNOTATION.to_owned(), policy.to_owned());
        changed = true;
    }
    let taints = node
        .spec
        .get_or_insert_with(NodeSpec::default)
        .taints
        .get_or_insert_with(Vec::new);
    if !taints.iter().any(|t| t.key == QUARANTINE_TAINT_KEY) {
        taints.push(Taint {
            key: QUARANTINE_TAINT_KEY.to_owned(),
            effect: "NoSchedule".to_owned(),
            ..Taint::default()
        });
        changed = true;
    }
    changed
}

/// Lifts `policy`'s quarantine from `node`: our taint and our annotations go (a device-level
/// quarantine's devices too: their rules follow), everything else stays.
/// A quarantine another policy owns is left exactly as it is. Returns whether anything changed.
pub fn lift(node: &mut Node, policy: &str) -> bool {
    if owner(node) != Some(policy) {
        return false;
    }
    node.annotations_mut().remove(QUARANTINED_BY_ANNOTATION);
    super::device::unmark(node);
    if let Some(taints) = node.spec.as_mut().and_then(|s| s.taints.as_mut()) {
        taints.retain(|t| t.key != QUARANTINE_TAINT_KEY);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cordon::tests::{FOREIGN, foreign_then, node, taint_keys};

    #[test]
    fn quarantining_adds_a_no_schedule_taint_and_the_owner_and_never_cordons() {
        let mut n = node(false, &FOREIGN);
        assert!(quarantine(&mut n, "gpus"));
        assert_eq!(taint_keys(&n), foreign_then(&[QUARANTINE_TAINT_KEY]));
        let taint = &n.spec.as_ref().unwrap().taints.as_ref().unwrap()[FOREIGN.len()];
        assert_eq!(taint.effect, "NoSchedule");
        assert_eq!(owner(&n), Some("gpus"));
        assert_eq!(n.spec.as_ref().unwrap().unschedulable, None);
        assert!(!quarantine(&mut n, "gpus"), "a second quarantine changes nothing");
    }

    #[test]
    fn lifting_removes_only_our_taint_and_leaves_a_persons_cordon() {
        let mut n = node(true, &FOREIGN);
        quarantine(&mut n, "gpus");
        assert!(lift(&mut n, "gpus"));
        assert_eq!(taint_keys(&n), foreign_then(&[]));
        assert_eq!(n.spec.as_ref().unwrap().unschedulable, Some(true));
        assert!(owner(&n).is_none());
        assert!(!lift(&mut n, "gpus"), "a second lift changes nothing");
    }

    #[test]
    fn another_policys_quarantine_is_never_lifted() {
        let mut n = node(false, &[]);
        quarantine(&mut n, "old");
        let before = n.clone();
        assert!(!lift(&mut n, "new"));
        assert_eq!(n, before);
    }

    #[test]
    fn a_quarantine_moving_to_another_policy_changes_only_its_owner() {
        let mut n = node(false, &[]);
        quarantine(&mut n, "old");
        assert!(quarantine(&mut n, "new"));
        assert_eq!(owner(&n), Some("new"));
        assert_eq!(taint_keys(&n), vec![QUARANTINE_TAINT_KEY]);
    }
}
