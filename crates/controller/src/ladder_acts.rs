//! Carries out the ladder's asks (see `lifecycle::ladder`): creates a step's template object
//! through the `Template` strategy, named after the remediation and the step unless the template
//! names it, and labels a node handed off to a person. Thin: every decision is in `lifecycle`.

use gpu_remediation_api::{
    GpuRemediation,
    ladder::Rung,
    policy::{Replacement, Strategy},
    remediation::{ObjectReference, PolicySnapshot},
};
use kube::ResourceExt;
use serde_json::Value;

use crate::{
    context::Context,
    kubeops::{EditNodeError, NodeEdit},
    lifecycle::{NodeRef, Words, ladder_evidence::step_of},
    remediation::AdvanceRemediationError,
    replace::TriggerReplacementError,
};

/// The step's template with `metadata.name` set to `<remediation>-<step>` unless it names itself,
/// so each step of one remediation creates its own object.
#[must_use]
pub fn step_template(template: &Value, remediation: &str, rung: Rung) -> Value {
    let mut object = template.clone();
    if let Value::Object(fields) = &mut object {
        let metadata = fields
            .entry("metadata")
            .or_insert_with(|| Value::Object(serde_json::Map::new()));
        if let Value::Object(metadata) = metadata {
            let named = metadata
                .get("name")
                .and_then(Value::as_str)
                .is_some_and(|n| !n.is_empty());
            if !named {
                let name = format!("{remediation}-{}", rung.as_str().to_ascii_lowercase());
                metadata.insert("name".to_owned(), Value::String(name));
            }
        }
    }
    object
}

/// Creates the step's object; a refusal is the lifecycle's to weigh.
pub(crate) async fn trigger_step(
    ctx: &Context,
    remediation: &GpuRemediation,
    rules: &PolicySnapshot,
    rung: Rung,
) -> Result<Result<ObjectReference, Words>, AdvanceRemediationError> {
    let words = |error: &TriggerReplacementError| Words {
        action: format!("creating the {rung} step's object"),
        code: error.code(),
        message: error.to_string(),
    };
    let Some(template) = step_of(rules, rung).and_then(|s| s.template.as_ref()) else {
        return Ok(Err(Words {
            action: format!("creating the {rung} step's object"),
            code: Some(422),
            message: format!("the ladder's {rung} step has no template"),
        }));
    };
    let replacement = Replacement {
        strategy: Strategy::Template,
        template: Some(step_template(template, &remediation.name_any(), rung)),
        timeout: rules.replacement.timeout,
    };
    match ctx
        .replacers
        .for_strategy(Strategy::Template)
        .trigger(remediation, &replacement)
        .await
    {
        Ok(reference) => Ok(Ok(reference)),
        Err(TriggerReplacementError::Fenced(fenced)) => Err(fenced.into()),
        Err(error) => Ok(Err(words(&error))),
    }
}

/// Labels the node for a person; a refusal is the lifecycle's to weigh.
pub(crate) async fn hand_off(
    ctx: &Context,
    node: &NodeRef,
    remediation: &str,
) -> Result<Result<(), Words>, AdvanceRemediationError> {
    match ctx
        .ops
        .edit_node(node, |n| crate::cordon::hand_off(n, remediation))
        .await
    {
        Ok(NodeEdit::Written(_) | NodeEdit::Gone | NodeEdit::Replaced) => Ok(Ok(())),
        Err(EditNodeError::Write { node: n, source }) if source.is_refusal() => Ok(Err(Words {
            action: format!("labelling node {n} for a person"),
            code: source.code(),
            message: source.to_string(),
        })),
        Err(error) => Err(error.into()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn an_unnamed_step_object_is_named_after_the_remediation_and_the_step() {
        let template = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"namespace": "ops"}});
        let named = step_template(&template, "gpu-1-abc123", Rung::ResetGpu);
        assert_eq!(named["metadata"]["name"], "gpu-1-abc123-resetgpu");
        assert_eq!(named["metadata"]["namespace"], "ops");
    }

    #[test]
    fn a_step_object_that_names_itself_keeps_its_name() {
        let template = json!({"apiVersion": "v1", "kind": "X", "metadata": {"name": "{{nodeName}}"}});
        assert_eq!(
            step_template(&template, "r", Rung::Reboot)["metadata"]["name"],
            "{{nodeName}}"
        );
    }
}
