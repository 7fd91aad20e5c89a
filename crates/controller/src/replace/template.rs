//! The `Template` strategy's pure parts: render the policy's template into the object to create
//! for one remediation, and read what that object reports about itself.
//!
//! Rendering replaces `{{nodeName}}` and `{{remediationName}}` in every string of the template,
//! names the object after the remediation unless the template names it (so a retried create finds
//! the same object instead of making a second), and makes the `GpuRemediation` its controlling
//! owner (so removing the record removes the object).
//!
//! Reboot through Self Node Remediation (medik8s), for a policy with `action: Reboot`:
//!
//! ```yaml
//! replacement:
//!   strategy: Template
//!   timeout: 20m
//!   template:
//!     apiVersion: self-node-remediation.medik8s.io/v1alpha1
//!     kind: SelfNodeRemediation
//!     metadata:
//!       name: "{{nodeName}}"          # SNR finds its node by the object's name
//!       namespace: openshift-workload-availability
//!     spec:
//!       remediationStrategy: Automatic
//! ```
//!
//! SNR reboots the node and reports condition `Succeeded=True` when done; the remediation also
//! succeeds as soon as the GPU condition clears for good (the node came back healthy).

use gpu_remediation_api::GpuRemediation;
use kube::Resource as _;
use serde_json::{Map, Value, json};

use super::verify::Reported;

/// Placeholder replaced by the node's name.
pub const NODE_NAME_PLACEHOLDER: &str = "{{nodeName}}";
/// Placeholder replaced by the remediation's name.
pub const REMEDIATION_NAME_PLACEHOLDER: &str = "{{remediationName}}";

/// Why a template cannot be rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderTemplateError {
    /// The policy has strategy `Template` but no template.
    #[error("the policy's replacement strategy is Template but it has no template")]
    Missing,
    /// The template is not a JSON object.
    #[error("the replacement template must be an object")]
    NotAnObject,
    /// `apiVersion` or `kind` is missing.
    #[error("the replacement template needs a string `{0}`")]
    MissingField(&'static str),
    /// The remediation has no name or UID yet (it was not read from the API server).
    #[error("the remediation has no name or UID: an owner reference needs both")]
    OwnerUnidentified,
}

/// The rendered object, ready to create.
#[derive(Debug, Clone, PartialEq)]
pub struct Rendered {
    /// `apiVersion`.
    pub api_version: String,
    /// `kind`.
    pub kind: String,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace`, if the template sets one.
    pub namespace: Option<String>,
    /// The whole object.
    pub object: Value,
}

/// Renders `template` for `remediation`. See the module docs.
pub fn render(
    template: Option<&Value>,
    remediation: &GpuRemediation,
) -> Result<Rendered, RenderTemplateError> {
    let template = template.ok_or(RenderTemplateError::Missing)?;
    let (Some(remediation_name), Some(uid)) = (
        remediation.metadata.name.as_deref(),
        remediation.metadata.uid.as_deref(),
    ) else {
        return Err(RenderTemplateError::OwnerUnidentified);
    };
    let mut object = substitute(template, &remediation.spec.node_name, remediation_name);
    let Value::Object(fields) = &mut object else {
        return Err(RenderTemplateError::NotAnObject);
    };
    let api_version = string_field(fields, "apiVersion")?;
    let kind = string_field(fields, "kind")?;
    let metadata = fields
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if !metadata.is_object() {
        *metadata = Value::Object(Map::new());
    }
    let metadata = metadata
        .as_object_mut()
        .expect("metadata was just made an object");
    // A generated name would give every retried create a new object.
    metadata.remove("generateName");
    let name = match metadata.get("name").and_then(Value::as_str) {
        Some(name) if !name.is_empty() => name.to_owned(),
        _ => remediation_name.to_owned(),
    };
    metadata.insert("name".to_owned(), Value::String(name.clone()));
    let namespace = metadata
        .get("namespace")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let owner = json!({
        "apiVersion": GpuRemediation::api_version(&()),
        "kind": GpuRemediation::kind(&()),
        "name": remediation_name,
        "uid": uid,
        "controller": true,
    });
    metadata.insert("ownerReferences".to_owned(), Value::Array(vec![owner]));
    // Server-managed fields in a template (copied from a live object) would make the create fail.
    for field in [
        "uid",
        "resourceVersion",
        "creationTimestamp",
        "managedFields",
        "selfLink",
        "generation",
    ] {
        metadata.remove(field);
    }
    fields.remove("status");
    Ok(Rendered {
        api_version,
        kind,
        name,
        namespace,
        object,
    })
}

fn string_field(fields: &Map<String, Value>, field: &'static str) -> Result<String, RenderTemplateError> {
    match fields.get(field) {
        Some(Value::String(value)) if !value.is_empty() => Ok(value.clone()),
        _ => Err(RenderTemplateError::MissingField(field)),
    }
}

/// `value` with `{{nodeName}}` and `{{remediationName}}` replaced in every string.
#[must_use]
pub fn substitute(value: &Value, node_name: &str, remediation_name: &str) -> Value {
    match value {
        Value::String(text) => Value::String(
            text.replace(NODE_NAME_PLACEHOLDER, node_name)
                .replace(REMEDIATION_NAME_PLACEHOLDER, remediation_name),
        ),
        Value::Array(items) => Value::Array(
            items
                .iter()
                .map(|item| substitute(item, node_name, remediation_name))
                .collect(),
        ),
        Value::Object(fields) => Value::Object(
            fields
                .iter()
                .map(|(key, item)| (key.clone(), substitute(item, node_name, remediation_name)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Condition types that mean "done" when `True`.
const DONE_CONDITIONS: [&str; 5] = ["Succeeded", "Ready", "Complete", "Completed", "Done"];
/// Condition types that mean "failed" when `True`.
const FAILED_CONDITIONS: [&str; 2] = ["Failed", "Failure"];
/// `status.phase` values that mean done.
const DONE_PHASES: [&str; 4] = ["succeeded", "completed", "complete", "done"];
/// `status.phase` values that mean failed.
const FAILED_PHASES: [&str; 2] = ["failed", "error"];

/// Reads what an object says about itself from its `status`: failure conditions or phases first,
/// then success ones; anything else is in progress.
#[must_use]
pub fn report(status: Option<&Value>) -> Reported {
    let Some(status) = status else {
        return Reported::InProgress;
    };
    let conditions = status
        .get("conditions")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let true_condition = |types: &[&str]| {
        conditions.iter().find(|condition| {
            condition.get("status").and_then(Value::as_str) == Some("True")
                && condition
                    .get("type")
                    .and_then(Value::as_str)
                    .is_some_and(|t| types.contains(&t))
        })
    };
    let describe = |condition: &Value| {
        let kind = condition.get("type").and_then(Value::as_str).unwrap_or_default();
        match condition
            .get("message")
            .and_then(Value::as_str)
            .filter(|message| !message.is_empty())
        {
            Some(message) => format!("condition {kind}=True: {message}"),
            None => format!("condition {kind}=True"),
        }
    };
    let phase = status.get("phase").and_then(Value::as_str).unwrap_or_default();
    let phase_is = |phases: &[&str]| phases.contains(&phase.to_ascii_lowercase().as_str());
    if let Some(condition) = true_condition(&FAILED_CONDITIONS) {
        return Reported::Failed(describe(condition));
    }
    if phase_is(&FAILED_PHASES) {
        return Reported::Failed(format!("phase {phase}"));
    }
    if let Some(condition) = true_condition(&DONE_CONDITIONS) {
        return Reported::Done(describe(condition));
    }
    if phase_is(&DONE_PHASES) {
        return Reported::Done(format!("phase {phase}"));
    }
    Reported::InProgress
}

#[cfg(test)]
mod tests {
    use gpu_remediation_api::{
        GpuRemediationSpec,
        policy::{Action, ConditionStatus, Mode},
        remediation::TriggerRecord,
    };

    use super::*;

    fn remediation() -> GpuRemediation {
        let mut remediation = GpuRemediation::new(
            "gpu-3-1a2b3c",
            GpuRemediationSpec {
                node_name: "gpu-3".to_owned(),
                policy_name: "gpus".to_owned(),
                trigger: TriggerRecord {
                    condition_type: "GpuHealthy".to_owned(),
                    status: ConditionStatus::False,
                    reason: "XID79".to_owned(),
                    message: String::new(),
                    since: None,
                },
                action: Action::Reboot,
                mode: Mode::Enforce,
                node_uid: None,
                previous_incident: None,
                policy_snapshot: None,
                hardware: None,
            },
        );
        remediation.metadata.uid = Some("uid-1".to_owned());
        remediation
    }

    #[test]
    fn placeholders_are_filled_in_everywhere() {
        let template = json!({
            "apiVersion": "example.com/v1", "kind": "Repair",
            "metadata": {"name": "repair-{{nodeName}}", "namespace": "ops", "labels": {"for": "{{remediationName}}"}},
            "spec": {"nodes": ["{{nodeName}}"], "count": 1}
        });
        let rendered = render(Some(&template), &remediation()).expect("renders");
        assert_eq!(rendered.name, "repair-gpu-3");
        assert_eq!(rendered.namespace.as_deref(), Some("ops"));
        assert_eq!(rendered.object["metadata"]["labels"]["for"], "gpu-3-1a2b3c");
        assert_eq!(rendered.object["spec"], json!({"nodes": ["gpu-3"], "count": 1}));
    }

    #[test]
    fn an_unnamed_template_object_is_named_after_the_remediation_so_retries_find_it() {
        let template = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "x-"}});
        let rendered = render(Some(&template), &remediation()).expect("renders");
        assert_eq!(rendered.name, "gpu-3-1a2b3c");
        assert!(rendered.object["metadata"].get("generateName").is_none());
    }

    #[test]
    fn the_rendered_object_is_controlled_by_the_remediation() {
        let template = json!({"apiVersion": "v1", "kind": "ConfigMap"});
        let rendered = render(Some(&template), &remediation()).expect("renders");
        assert_eq!(
            rendered.object["metadata"]["ownerReferences"],
            json!([{"apiVersion": "gpuremediation.dev/v1alpha1", "kind": "GpuRemediation",
                    "name": "gpu-3-1a2b3c", "uid": "uid-1", "controller": true}])
        );
    }

    #[test]
    fn server_managed_fields_copied_into_a_template_are_dropped() {
        let template = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "a", "resourceVersion": "9", "uid": "old"}, "status": {"phase": "Done"}});
        let rendered = render(Some(&template), &remediation()).expect("renders");
        assert!(rendered.object["metadata"].get("resourceVersion").is_none());
        assert!(rendered.object["metadata"].get("uid").is_none());
        assert!(rendered.object.get("status").is_none());
    }

    #[test]
    fn a_template_without_kind_or_without_template_is_refused() {
        assert_eq!(render(None, &remediation()), Err(RenderTemplateError::Missing));
        assert_eq!(
            render(Some(&json!({"apiVersion": "v1"})), &remediation()),
            Err(RenderTemplateError::MissingField("kind"))
        );
        assert_eq!(
            render(Some(&json!("text")), &remediation()),
            Err(RenderTemplateError::NotAnObject)
        );
    }

    #[test]
    fn a_remediation_not_read_from_the_server_cannot_own_anything() {
        let mut unsaved = remediation();
        unsaved.metadata.uid = None;
        let template = json!({"apiVersion": "v1", "kind": "ConfigMap"});
        assert_eq!(
            render(Some(&template), &unsaved),
            Err(RenderTemplateError::OwnerUnidentified)
        );
    }

    #[test]
    fn a_succeeded_condition_means_done() {
        let status = json!({"conditions": [{"type": "Processing", "status": "False"},
                                           {"type": "Succeeded", "status": "True", "message": "rebooted"}]});
        assert_eq!(
            report(Some(&status)),
            Reported::Done("condition Succeeded=True: rebooted".to_owned())
        );
    }

    #[test]
    fn a_done_phase_means_done_whatever_its_case() {
        assert_eq!(
            report(Some(&json!({"phase": "Completed"}))),
            Reported::Done("phase Completed".to_owned())
        );
    }

    #[test]
    fn failure_wins_over_success() {
        let status = json!({"phase": "Succeeded", "conditions": [{"type": "Failed", "status": "True"}]});
        assert_eq!(
            report(Some(&status)),
            Reported::Failed("condition Failed=True".to_owned())
        );
        assert_eq!(
            report(Some(&json!({"phase": "Failed"}))),
            Reported::Failed("phase Failed".to_owned())
        );
    }

    #[test]
    fn no_status_or_a_false_condition_is_in_progress() {
        assert_eq!(report(None), Reported::InProgress);
        let status = json!({"conditions": [{"type": "Succeeded", "status": "False"}]});
        assert_eq!(report(Some(&status)), Reported::InProgress);
    }
}
