//! Cordon and release as edits of a Node object, and who owns a node's cordon. Pure; the write
//! around these edits (a preconditioned patch or a read-modify-replace) lives in `write`.
//!
//! Ownership is recorded on the node itself, so it survives restarts: `cordoned-by` names the
//! remediation that made the node unschedulable (ours to lift), `pre-cordoned` names the one that
//! found it already unschedulable (the cordon stays theirs; only our taint and note are ours).

use crate::observe::NodeView;
use gpu_remediation_api::constants::{
    CANCELLED_ANNOTATION, CORDONED_BY_ANNOTATION, PRE_CORDONED_ANNOTATION, REMEDIATION_TAINT_KEY,
    field_managers,
};
use gpu_remediation_api::ladder::{HAND_OFF_LABEL, HANDED_OFF_BY_ANNOTATION};
use k8s_openapi::api::core::v1::{Node, NodeSpec, Taint};
use kube::ResourceExt;

/// Who holds the node's cordon, as its annotations and spec say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cordon {
    /// The node is schedulable.
    None,
    /// Unschedulable, and our annotation names this remediation: ours to lift.
    Ours,
    /// Unschedulable, but it was before we came (or someone else's): never ours to lift.
    Theirs,
}

/// The node a node effect is meant for: its name and, when known, the UID admitted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeRef {
    /// The node's name.
    pub name: String,
    /// The UID recorded at admission; an edit carries it as a precondition.
    pub uid: Option<String>,
}

impl NodeRef {
    /// The node as an Event's `regarding`.
    #[must_use]
    pub fn object_reference(&self) -> k8s_openapi::api::core::v1::ObjectReference {
        k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some("Node".to_owned()),
            name: Some(self.name.clone()),
            uid: self.uid.clone(),
            ..Default::default()
        }
    }
}

/// Who holds the node's cordon, from the point of view of the remediation `remediation`.
#[must_use]
pub fn cordon_of(node: &(impl NodeView + ?Sized), remediation: &str) -> Cordon {
    if !is_unschedulable(node) {
        return Cordon::None;
    }
    if node
        .annotation(CORDONED_BY_ANNOTATION)
        .is_some_and(|by| by == remediation)
    {
        Cordon::Ours
    } else {
        Cordon::Theirs
    }
}

/// Whether the node is cordoned.
#[must_use]
pub fn is_unschedulable(node: &(impl NodeView + ?Sized)) -> bool {
    node.unschedulable()
}

/// Who else laid the node's cordon, by the server's record of each field's manager: another party
/// than us holds `spec.unschedulable` and we do not. That is a person who lifted our cordon and
/// laid their own while our `cordoned-by` note stayed (`kubectl cordon` writes as
/// `kubectl-cordon`), or another controller; an Update moves a field to its writer only when it
/// changes the value, so a cordon laid again over ours leaves it ours.
///
/// `None` when our manager holds the field, when none does, and when the node carries no
/// managedFields: the watch's cache prunes them, so only a fresh read can answer (a release that
/// would lift a cordon reads the node afresh, see `Writer::release_node`).
#[must_use]
pub fn cordon_laid_by_another(node: &Node) -> Option<String> {
    let holders: Vec<_> = node
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|entry| {
            entry
                .fields_v1
                .as_ref()
                .and_then(|fields| fields.0.get("f:spec"))
                .and_then(|spec| spec.get("f:unschedulable"))
                .is_some()
        })
        .collect();
    if holders
        .iter()
        .any(|entry| entry.manager.as_deref() == Some(field_managers::CONTROLLER))
    {
        return None;
    }
    holders.first().map(|entry| {
        entry
            .manager
            .clone()
            .unwrap_or_else(|| "an unnamed manager".to_owned())
    })
}

/// The managedFields entry the server keeps for `manager`'s hold on `spec.unschedulable` (for
/// tests that lay a cordon as a person or another controller would).
#[cfg(test)]
#[must_use]
pub(crate) fn managing_the_cordon(
    manager: &str,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry {
        manager: Some(manager.to_owned()),
        operation: Some("Update".to_owned()),
        fields_v1: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::FieldsV1(
            serde_json::json!({"f:spec": {"f:unschedulable": {}}}),
        )),
        ..Default::default()
    }
}

/// Whether [`release`] for `remediation` would lift a cordon from `node` as it stands, before the
/// managers of its fields are known: our `cordoned-by` note names it and the node is cordoned.
#[must_use]
pub fn would_lift_cordon(node: &(impl NodeView + ?Sized), remediation: &str) -> bool {
    holds(node, remediation).cordoned && is_unschedulable(node)
}

/// Whether the node carries our taint.
#[must_use]
pub fn has_taint(node: &(impl NodeView + ?Sized)) -> bool {
    node.taints().iter().any(|t| t.key == REMEDIATION_TAINT_KEY)
}

/// Cordons `node` for `remediation`: unschedulable, our `NoSchedule` taint added to the others,
/// ownership recorded. Returns whether anything changed (the edit is idempotent).
///
/// `NoSchedule`, never `NoExecute`: an execute taint would make the kubelet kill pods without
/// asking their disruption budgets; pods leave through evictions only.
pub fn cordon(node: &mut Node, remediation: &str) -> bool {
    let annotations = node.annotations();
    let already_recorded = annotations
        .get(CORDONED_BY_ANNOTATION)
        .is_some_and(|by| by == remediation)
        || annotations
            .get(PRE_CORDONED_ANNOTATION)
            .is_some_and(|by| by == remediation);
    let mut changed = false;
    if !already_recorded {
        let key = if is_unschedulable(node) {
            PRE_CORDONED_ANNOTATION
        } else {
            CORDONED_BY_ANNOTATION
        };
        node.annotations_mut()
            .insert(key.to_owned(), remediation.to_owned());
        changed = true;
    }
    let spec = node.spec.get_or_insert_with(NodeSpec::default);
    if spec.unschedulable != Some(true) {
        spec.unschedulable = Some(true);
        changed = true;
    }
    let taints = spec.taints.get_or_insert_with(Vec::new);
    if !taints.iter().any(|t| t.key == REMEDIATION_TAINT_KEY) {
        taints.push(Taint {
            key: REMEDIATION_TAINT_KEY.to_owned(),
            effect: "NoSchedule".to_owned(),
            ..Taint::default()
        });
        changed = true;
    }
    changed
}

/// What our annotations on a node say `remediation` holds there: what [`release`] gives back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Holds {
    /// `cordoned-by` names it: the cordon and our taint are its.
    pub cordoned: bool,
    /// `pre-cordoned` names it: our taint is its (the cordon was there before).
    pub pre_cordoned: bool,
    /// `handed-off-by` names it: the hand-off label is its.
    pub handed_off: bool,
}

impl Holds {
    /// Whether it holds our cordon note (`cordoned-by` or `pre-cordoned`), and so our taint.
    #[must_use]
    pub fn cordon(self) -> bool {
        self.cordoned || self.pre_cordoned
    }
}

/// What `remediation` holds on `node`, by our annotations naming it.
#[must_use]
pub fn holds(node: &(impl NodeView + ?Sized), remediation: &str) -> Holds {
    let names = |key: &str| node.annotation(key).is_some_and(|by| by == remediation);
    Holds {
        cordoned: names(CORDONED_BY_ANNOTATION),
        pre_cordoned: names(PRE_CORDONED_ANNOTATION),
        handed_off: names(HANDED_OFF_BY_ANNOTATION),
    }
}

/// Releases what `remediation` owns on `node` (see [`holds`]): the cordon only if we made it and
/// no other party has laid it since (see [`cordon_laid_by_another`]), our taint and our annotations
/// always; another party's cordon and every other taint stay. Returns whether anything changed.
pub fn release(node: &mut Node, remediation: &str) -> bool {
    let held = holds(node, remediation);
    let (handed_off, laid_by_another) = (held.handed_off, cordon_laid_by_another(node).is_some());
    let cordoned_by_us = held.cordoned && !laid_by_another;
    if handed_off {
        node.labels_mut().remove(HAND_OFF_LABEL);
        node.annotations_mut().remove(HANDED_OFF_BY_ANNOTATION);
    }
    if !held.cordon() {
        // Not ours at all (another remediation's, or released already): leave it exactly as is.
        return handed_off;
    }
    node.annotations_mut().remove(CORDONED_BY_ANNOTATION);
    node.annotations_mut().remove(PRE_CORDONED_ANNOTATION);
    let spec = node.spec.get_or_insert_with(NodeSpec::default);
    if cordoned_by_us {
        spec.unschedulable = None;
    }
    if let Some(taints) = spec.taints.as_mut() {
        taints.retain(|t| t.key != REMEDIATION_TAINT_KEY);
    }
    true
}

/// Notes on the node that a person cancelled `remediation` (deleted its record), so its episode
/// is not admitted again. Returns whether anything changed.
pub fn remember_cancelled(node: &mut Node, remediation: &str) -> bool {
    if node
        .annotation(CANCELLED_ANNOTATION)
        .is_some_and(|by| by == remediation)
    {
        return false;
    }
    node.annotations_mut()
        .insert(CANCELLED_ANNOTATION.to_owned(), remediation.to_owned());
    true
}

/// Labels the node `gpuremediation.dev/hand-off=true`, annotated with the remediation that handed
/// it off (the ladder's last rung hands it to a person or an RMA process); [`release`] takes both
/// back. Returns whether it changed.
pub fn hand_off(node: &mut Node, remediation: &str) -> bool {
    let labelled = node.label(HAND_OFF_LABEL).is_some_and(|v| v == "true");
    let noted = node
        .annotation(HANDED_OFF_BY_ANNOTATION)
        .is_some_and(|by| by == remediation);
    if labelled && noted {
        return false;
    }
    node.labels_mut()
        .insert(HAND_OFF_LABEL.to_owned(), "true".to_owned());
    node.annotations_mut()
        .insert(HANDED_OFF_BY_ANNOTATION.to_owned(), remediation.to_owned());
    true
}

#[cfg(test)]
pub(crate) mod tests {
    use kube::api::ObjectMeta;

    use super::*;

    /// A node named gpu-1, cordoned or not, carrying `NoSchedule` taints with these keys.
    pub(crate) fn node(unschedulable: bool, taints: &[&str]) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("gpu-1".into()),
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec {
                unschedulable: unschedulable.then_some(true),
                taints: Some(
                    taints
                        .iter()
                        .map(|k| Taint {
                            key: (*k).to_owned(),
                            effect: "NoSchedule".into(),
                            ..Taint::default()
                        })
                        .collect(),
                ),
                ..NodeSpec::default()
            }),
            status: None,
        }
    }

    /// Other actors' taints a node carries beside a person's: the Node Readiness Controller's
    /// (`readiness.k8s.io/...`) and a cloud provider's shutdown taint. Ours never touch them.
    pub(crate) const FOREIGN: [&str; 3] = [
        "team/reserved",
        "readiness.k8s.io/gpu-driver-ready",
        "node.cloudprovider.kubernetes.io/shutdown",
    ];

    /// The foreign keys followed by `ours`.
    pub(crate) fn foreign_then(ours: &[&str]) -> Vec<String> {
        FOREIGN.iter().chain(ours).map(|k| (*k).to_owned()).collect()
    }

    /// The keys of the node's taints, in order.
    pub(crate) fn taint_keys(node: &Node) -> Vec<String> {
        node.spec
            .as_ref()
            .unwrap()
            .taints
            .as_ref()
            .unwrap()
            .iter()
            .map(|t| t.key.clone())
            .collect()
    }

    #[test]
    fn cordoning_a_schedulable_node_makes_the_cordon_ours_and_keeps_other_taints() {
        let mut n = node(false, &FOREIGN);
        assert!(cordon(&mut n, "gpu-1-abc"));
        assert_eq!(cordon_of(&n, "gpu-1-abc"), Cordon::Ours);
        assert_eq!(taint_keys(&n), foreign_then(&[REMEDIATION_TAINT_KEY]));
        assert!(!cordon(&mut n, "gpu-1-abc"), "a second cordon changes nothing");
    }

    #[test]
    fn a_node_someone_else_cordoned_stays_theirs() {
        let mut n = node(true, &[]);
        assert!(cordon(&mut n, "gpu-1-abc"));
        assert_eq!(cordon_of(&n, "gpu-1-abc"), Cordon::Theirs);
        assert_eq!(n.annotation(PRE_CORDONED_ANNOTATION), Some("gpu-1-abc"));
    }

    #[test]
    fn a_node_cordoned_by_a_person_stays_cordoned_after_release() {
        let mut n = node(true, &FOREIGN);
        cordon(&mut n, "gpu-1-abc");
        assert!(release(&mut n, "gpu-1-abc"));
        assert!(is_unschedulable(&n));
        assert_eq!(taint_keys(&n), foreign_then(&[]));
        assert!(n.annotations().is_empty());
    }

    #[test]
    fn releasing_our_cordon_makes_the_node_schedulable_and_removes_only_our_taint() {
        let mut n = node(false, &FOREIGN);
        cordon(&mut n, "gpu-1-abc");
        // The readiness controller adds a taint while we hold ours: it survives our release.
        n.spec.as_mut().unwrap().taints.as_mut().unwrap().push(Taint {
            key: "readiness.k8s.io/network-ready".into(),
            effect: "NoSchedule".into(),
            ..Taint::default()
        });
        assert!(release(&mut n, "gpu-1-abc"));
        assert!(!is_unschedulable(&n));
        assert_eq!(taint_keys(&n), foreign_then(&["readiness.k8s.io/network-ready"]));
    }

    #[test]
    fn a_cordon_a_person_laid_again_over_our_note_stays_theirs_on_release() {
        let mut n = node(false, &FOREIGN);
        cordon(&mut n, "gpu-1-abc");
        assert!(would_lift_cordon(&n, "gpu-1-abc"));
        // A person lifted ours and laid their own before a pass dropped our note.
        n.metadata.managed_fields = Some(vec![managing_the_cordon("kubectl-cordon")]);
        assert_eq!(cordon_laid_by_another(&n).as_deref(), Some("kubectl-cordon"));
        assert!(release(&mut n, "gpu-1-abc"));
        assert!(is_unschedulable(&n), "the person's cordon stays");
        assert_eq!(taint_keys(&n), foreign_then(&[]), "our taint goes");
        assert!(n.annotations().is_empty(), "our note goes");
    }

    #[test]
    fn a_cordon_our_manager_holds_is_lifted_whoever_else_wrote_the_node() {
        let mut n = node(false, &FOREIGN);
        cordon(&mut n, "gpu-1-abc");
        let mut kubelet = managing_the_cordon("kubelet");
        kubelet.fields_v1 = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::FieldsV1(
            serde_json::json!({"f:status": {"f:conditions": {}}}),
        ));
        n.metadata.managed_fields = Some(vec![
            kubelet,
            managing_the_cordon(field_managers::CONTROLLER),
            managing_the_cordon("kubectl-cordon"),
        ]);
        assert_eq!(cordon_laid_by_another(&n), None, "ours holds it (a shared hold)");
        assert!(release(&mut n, "gpu-1-abc"));
        assert!(!is_unschedulable(&n));
        // Without managedFields (a cached node) nothing names another: ours, by our note.
        let mut cached = node(false, &[]);
        cordon(&mut cached, "gpu-1-abc");
        assert_eq!(cordon_laid_by_another(&cached), None);
    }

    #[test]
    fn another_remediations_cordon_is_never_released() {
        let mut n = node(false, &[]);
        cordon(&mut n, "gpu-1-old");
        let before = n.clone();
        assert!(!release(&mut n, "gpu-1-new"));
        assert_eq!(n, before);
    }

    #[test]
    fn a_person_uncordoning_our_node_reads_as_no_cordon() {
        let mut n = node(false, &[]);
        cordon(&mut n, "gpu-1-abc");
        n.spec.as_mut().unwrap().unschedulable = Some(false);
        assert_eq!(cordon_of(&n, "gpu-1-abc"), Cordon::None);
    }

    #[test]
    fn our_taint_is_no_schedule_never_no_execute() {
        let mut n = node(false, &[]);
        cordon(&mut n, "gpu-1-abc");
        let taints = n.spec.as_ref().unwrap().taints.as_ref().unwrap();
        assert_eq!(taints.len(), 1);
        assert_eq!(taints[0].key, REMEDIATION_TAINT_KEY);
        assert_eq!(
            taints[0].effect, "NoSchedule",
            "an execute taint would kill pods past their budgets"
        );
        assert_eq!(taints[0].value, None);
    }

    #[test]
    fn a_second_cordon_of_a_node_cordoned_before_us_changes_nothing() {
        let mut n = node(true, &[]);
        assert!(cordon(&mut n, "gpu-1-abc"));
        let once = n.clone();
        assert!(!cordon(&mut n, "gpu-1-abc"));
        assert_eq!(n, once);
        assert!(n.annotation(CORDONED_BY_ANNOTATION).is_none());
    }

    #[test]
    fn a_cordon_puts_back_each_part_a_person_undid_and_only_that() {
        let mut n = node(false, &FOREIGN);
        cordon(&mut n, "gpu-1-abc");
        n.spec.as_mut().unwrap().unschedulable = Some(false);
        assert!(cordon(&mut n, "gpu-1-abc"), "the cordon undone is put back");
        assert!(is_unschedulable(&n));
        n.spec
            .as_mut()
            .unwrap()
            .taints
            .as_mut()
            .unwrap()
            .retain(|t| t.key != REMEDIATION_TAINT_KEY);
        assert!(cordon(&mut n, "gpu-1-abc"), "the taint removed is put back");
        assert_eq!(
            taint_keys(&n),
            foreign_then(&[REMEDIATION_TAINT_KEY]),
            "once, beside the others"
        );
        assert_eq!(
            n.annotation(CORDONED_BY_ANNOTATION),
            Some("gpu-1-abc"),
            "still recorded as ours"
        );
    }

    #[test]
    fn a_cancel_is_remembered_once_under_the_remediation_that_was_cancelled() {
        let mut n = node(false, &[]);
        assert!(remember_cancelled(&mut n, "gpu-1-abc"));
        assert_eq!(n.annotation(CANCELLED_ANNOTATION), Some("gpu-1-abc"));
        assert!(!remember_cancelled(&mut n, "gpu-1-abc"), "remembered already");
        assert!(
            remember_cancelled(&mut n, "gpu-1-def"),
            "a later cancel replaces it"
        );
        assert_eq!(n.annotation(CANCELLED_ANNOTATION), Some("gpu-1-def"));
    }

    #[test]
    fn a_hand_off_is_labelled_and_noted_once_and_its_release_takes_back_only_its_own() {
        let mut n = node(false, &[]);
        assert!(hand_off(&mut n, "gpu-1-abc"));
        assert_eq!(n.label(HAND_OFF_LABEL), Some("true"));
        assert_eq!(n.annotation(HANDED_OFF_BY_ANNOTATION), Some("gpu-1-abc"));
        assert!(!hand_off(&mut n, "gpu-1-abc"), "handed off already");
        assert!(holds(&n, "gpu-1-abc").handed_off);
        assert!(!holds(&n, "gpu-1-abc").cordon());

        // The label there but noted by another remediation, or set to something else: ours now.
        let mut other = n.clone();
        assert!(hand_off(&mut other, "gpu-1-def"));
        assert!(holds(&other, "gpu-1-def").handed_off && !holds(&other, "gpu-1-abc").handed_off);
        let mut relabelled = n.clone();
        relabelled
            .labels_mut()
            .insert(HAND_OFF_LABEL.to_owned(), "false".to_owned());
        assert!(hand_off(&mut relabelled, "gpu-1-abc"));
        assert_eq!(
            relabelled.labels().get(HAND_OFF_LABEL).map(String::as_str),
            Some("true")
        );

        // Another remediation's release leaves the hand-off; its own takes label and note.
        let before = n.clone();
        assert!(!release(&mut n, "gpu-1-def"));
        assert_eq!(n, before);
        assert!(
            release(&mut n, "gpu-1-abc"),
            "a hand-off alone is something to release"
        );
        assert!(n.label(HAND_OFF_LABEL).is_none());
        assert!(n.annotations().is_empty());
    }

    #[test]
    fn what_a_remediation_holds_is_read_from_the_annotations_naming_it() {
        let mut ours = node(false, &[]);
        cordon(&mut ours, "gpu-1-abc");
        let held = holds(&ours, "gpu-1-abc");
        assert!(held.cordoned && !held.pre_cordoned && held.cordon());
        let mut before_us = node(true, &[]);
        cordon(&mut before_us, "gpu-1-abc");
        let held = holds(&before_us, "gpu-1-abc");
        assert!(!held.cordoned && held.pre_cordoned && held.cordon());
        assert_eq!(holds(&ours, "gpu-1-def"), Holds::default());
    }

    #[test]
    fn a_node_is_named_in_events_as_a_v1_node_with_its_admitted_uid() {
        let node = NodeRef {
            name: "gpu-1".into(),
            uid: Some("uid-1".into()),
        };
        let reference = node.object_reference();
        assert_eq!(reference.api_version.as_deref(), Some("v1"));
        assert_eq!(reference.kind.as_deref(), Some("Node"));
        assert_eq!(reference.name.as_deref(), Some("gpu-1"));
        assert_eq!(reference.uid.as_deref(), Some("uid-1"));
        assert_eq!(reference.namespace, None, "nodes are cluster-scoped");
    }
}
