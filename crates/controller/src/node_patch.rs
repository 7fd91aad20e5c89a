//! A node edit as one JSON merge patch, when it can be sent as one: the edit was made over the
//! node as the watch last delivered it, and it touches only the fields the controller's node
//! edits touch (labels, annotations, `spec.unschedulable`, `spec.taints`). The patch carries the
//! resourceVersion it was made over, so the server applies it only to that very version of the
//! node: `spec.taints` is an atomic list and the patch replaces it whole, which is safe exactly
//! because no other write can have come in between (one would have moved the resourceVersion,
//! and the server answers 409). That makes it the same write as a read-modify-replace, without
//! the read (`write::Writer::edit_node` uses it first and falls back to reading on a 409).
//!
//! Pure: no IO, no clock.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, NodeSpec, Taint};
use serde_json::{Map, Value, json};

/// The merge patch that turns `before` into `after`, preconditioned on `before`'s
/// resourceVersion; `None` when there is nothing to send (no change) or when it cannot be sent
/// this way: `before` has no resourceVersion, or `after` differs from it anywhere else than the
/// four fields above (the caller then reads and replaces the whole node instead).
#[must_use]
pub fn merge_patch(before: &Node, after: &Node) -> Option<Value> {
    let version = before.metadata.resource_version.as_deref()?;
    if !differs_only_in_edited_fields(before, after) {
        return None;
    }
    let mut metadata = Map::new();
    if let Some(labels) = map_patch(before.metadata.labels.as_ref(), after.metadata.labels.as_ref()) {
        metadata.insert("labels".to_owned(), labels);
    }
    if let Some(annotations) = map_patch(
        before.metadata.annotations.as_ref(),
        after.metadata.annotations.as_ref(),
    ) {
        metadata.insert("annotations".to_owned(), annotations);
    }
    let mut spec = Map::new();
    let unschedulable = |node: &Node| node.spec.as_ref().and_then(|spec| spec.unschedulable);
    if unschedulable(before) != unschedulable(after) {
        spec.insert("unschedulable".to_owned(), json!(unschedulable(after)));
    }
    if taints(before) != taints(after) {
        spec.insert("taints".to_owned(), json!(taints(after)));
    }
    if metadata.is_empty() && spec.is_empty() {
        return None;
    }
    metadata.insert("resourceVersion".to_owned(), json!(version));
    let mut patch = Map::new();
    patch.insert("metadata".to_owned(), Value::Object(metadata));
    if !spec.is_empty() {
        patch.insert("spec".to_owned(), Value::Object(spec));
    }
    Some(Value::Object(patch))
}

fn taints(node: &Node) -> Option<&Vec<Taint>> {
    node.spec.as_ref().and_then(|spec| spec.taints.as_ref())
}

/// Whether `after`, with its labels, annotations, `unschedulable` and taints put back as they
/// were in `before`, equals `before`.
fn differs_only_in_edited_fields(before: &Node, after: &Node) -> bool {
    let mut restored = after.clone();
    restored.metadata.labels.clone_from(&before.metadata.labels);
    restored
        .metadata
        .annotations
        .clone_from(&before.metadata.annotations);
    match (restored.spec.as_mut(), before.spec.as_ref()) {
        (Some(spec), Some(original)) => {
            spec.unschedulable = original.unschedulable;
            spec.taints.clone_from(&original.taints);
        }
        (Some(spec), None) => {
            spec.unschedulable = None;
            spec.taints = None;
            // An edit that only added these two to a node without a spec.
            if *spec == NodeSpec::default() {
                restored.spec = None;
            }
        }
        (None, _) => {}
    }
    restored == *before
}

/// The merge patch of a string map: each key added or changed with its new value, each removed
/// key as `null`; `None` when nothing changed.
fn map_patch(
    before: Option<&BTreeMap<String, String>>,
    after: Option<&BTreeMap<String, String>>,
) -> Option<Value> {
    let empty = BTreeMap::new();
    let (before, after) = (before.unwrap_or(&empty), after.unwrap_or(&empty));
    let mut patch = Map::new();
    for (key, value) in after {
        if before.get(key) != Some(value) {
            patch.insert(key.clone(), json!(value));
        }
    }
    for key in before.keys().filter(|key| !after.contains_key(*key)) {
        patch.insert(key.clone(), Value::Null);
    }
    (!patch.is_empty()).then_some(Value::Object(patch))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(yaml: &str) -> Node {
        serde_yaml::from_str(yaml).expect("a node")
    }

    const SEEN: &str = "
metadata:
  name: gpu-1
  uid: uid-1
  resourceVersion: '41'
  labels: {pool: a100}
  annotations: {keep: 'yes', drop: 'yes'}
spec:
  providerID: kwok://gpu-1
  taints: [{key: theirs, effect: NoSchedule}]
status:
  conditions: [{type: Ready, status: 'True'}]
";

    #[test]
    fn a_cordon_is_sent_as_the_changed_fields_over_the_version_it_was_made_on() {
        let before = node(SEEN);
        let mut after = before.clone();
        crate::cordon::cordon(&mut after, "gpu-1-abc");
        let patch = merge_patch(&before, &after).expect("a cordon is a patch");
        assert_eq!(patch["metadata"]["resourceVersion"], "41");
        assert_eq!(patch["spec"]["unschedulable"], true);
        // The whole taint list, theirs included: the precondition makes replacing it safe.
        let taints = patch["spec"]["taints"].as_array().expect("the whole list");
        assert_eq!(taints.len(), 2, "{patch}");
        assert_eq!(taints[0]["key"], "theirs");
        // Only what changed: labels untouched, status and providerID never sent.
        assert!(patch["metadata"].get("labels").is_none(), "{patch}");
        assert!(patch.get("status").is_none() && patch["spec"].get("providerID").is_none());
        assert!(
            patch["metadata"].get("annotations").is_some(),
            "the cordon's owner annotation"
        );
    }

    #[test]
    fn a_removed_annotation_or_label_is_sent_as_null_and_a_kept_one_not_at_all() {
        let before = node(SEEN);
        let mut after = before.clone();
        after.metadata.annotations.as_mut().unwrap().remove("drop");
        after
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("new".into(), "1".into());
        let patch = merge_patch(&before, &after).unwrap();
        assert_eq!(patch["metadata"]["annotations"], json!({"drop": null}));
        assert_eq!(patch["metadata"]["labels"], json!({"new": "1"}));
        assert!(patch.get("spec").is_none(), "{patch}");
    }

    #[test]
    fn lifting_the_last_taint_and_the_cordon_clears_both_fields() {
        let before = node(SEEN);
        let mut after = before.clone();
        let spec = after.spec.as_mut().unwrap();
        spec.taints = None;
        spec.unschedulable = None;
        let mut cordoned = before.clone();
        cordoned.spec.as_mut().unwrap().unschedulable = Some(true);
        let patch = merge_patch(&cordoned, &after).unwrap();
        assert_eq!(patch["spec"], json!({"unschedulable": null, "taints": null}));
    }

    #[test]
    fn an_edit_that_changes_nothing_sends_nothing() {
        let before = node(SEEN);
        assert_eq!(merge_patch(&before, &before.clone()), None);
    }

    #[test]
    fn an_edit_beyond_the_four_fields_is_left_to_a_full_replace() {
        let before = node(SEEN);
        let mut after = before.clone();
        after.spec.as_mut().unwrap().unschedulable = Some(true);
        after.metadata.finalizers = Some(vec!["x".into()]);
        assert_eq!(merge_patch(&before, &after), None);
        let mut status = before.clone();
        status.status = None;
        status.spec.as_mut().unwrap().unschedulable = Some(true);
        assert_eq!(merge_patch(&before, &status), None);
    }

    #[test]
    fn a_node_seen_without_a_version_is_never_patched() {
        let mut before = node(SEEN);
        before.metadata.resource_version = None;
        let mut after = before.clone();
        after.spec.as_mut().unwrap().unschedulable = Some(true);
        assert_eq!(merge_patch(&before, &after), None);
    }

    #[test]
    fn a_node_without_a_spec_can_be_cordoned_by_patch() {
        let mut before = node(SEEN);
        before.spec = None;
        let mut after = before.clone();
        crate::cordon::cordon(&mut after, "gpu-1-abc");
        let patch = merge_patch(&before, &after).expect("spec added with the two fields only");
        assert_eq!(patch["spec"]["unschedulable"], true);
    }
}
