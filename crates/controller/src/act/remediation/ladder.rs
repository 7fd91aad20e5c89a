//! Carries out the ladder's asks (see `lifecycle::ladder`): creates a step's template object
//! through the `Template` strategy, named after the remediation and the step unless the template
//! names it, creates validation and diagnostics Jobs, and labels a node handed off to a person. Thin: every decision is in `lifecycle`.

use gpu_remediation_api::{
    GpuRemediation,
    ladder::Rung,
    object_reference::ObjectReference,
    policy::{Replacement, Strategy},
    remediation::PolicySnapshot,
};
use kube::ResourceExt;
use serde_json::Value;

use super::AdvanceRemediationError;
use crate::{
    context::Context,
    lifecycle::{NodeRef, Words, ladder_evidence::step_of},
    replace::TriggerReplacementError,
    write::{EditNodeError, NodeEdit},
};

/// Placeholder in a step's template replaced by the UUID of the (first) GPU the fault named.
pub const GPU_UUID_PLACEHOLDER: &str = "{{gpuUUID}}";
/// Placeholder replaced by the UUIDs of every GPU the fault named, separated by spaces.
pub const GPU_UUIDS_PLACEHOLDER: &str = "{{gpuUUIDs}}";

/// The step's template with `metadata.name` set to `<remediation>-<step>` unless it names itself,
/// so each step of one remediation creates its own object, and [`GPU_UUID_PLACEHOLDER`] and
/// [`GPU_UUIDS_PLACEHOLDER`] replaced by `gpus` (the failed GPUs' UUIDs, of NVML's form:
/// `ladder_evidence::resettable_gpus`) where any is known.
#[must_use]
pub fn step_template(template: &Value, remediation: &str, rung: Rung, gpus: &[&str]) -> Value {
    let mut object = template.clone();
    if let Some(first) = gpus.first() {
        substitute_gpus(&mut object, first, &gpus.join(" "));
    }
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

fn substitute_gpus(value: &mut Value, first: &str, all: &str) {
    match value {
        Value::String(text) if text.contains("{{gpuUUID") => {
            *text = text
                .replace(GPU_UUIDS_PLACEHOLDER, all)
                .replace(GPU_UUID_PLACEHOLDER, first);
        }
        Value::Array(items) => items
            .iter_mut()
            .for_each(|item| substitute_gpus(item, first, all)),
        Value::Object(fields) => fields
            .values_mut()
            .for_each(|field| substitute_gpus(field, first, all)),
        _ => {}
    }
}

/// Creates the step's object; a refusal is the lifecycle's to weigh.
pub(crate) async fn trigger_step(
    ctx: &Context,
    remediation: &GpuRemediation,
    rules: &PolicySnapshot,
    rung: Rung,
) -> Result<Result<ObjectReference, Words>, AdvanceRemediationError> {
    let action = format!("creating the {rung} step's object");
    let Some(template) = step_of(rules, rung).and_then(|s| s.template.as_ref()) else {
        return Ok(Err(Words::invalid(
            action,
            format!("the ladder's {rung} step has no template"),
        )));
    };
    let object = step_template(
        template,
        &remediation.name_any(),
        rung,
        &crate::lifecycle::ladder_evidence::resettable_gpus(remediation),
    );
    create(ctx, remediation, rules, object, action).await
}

/// Creates the policy's validation Job on the node for the step `rung` (see
/// `lifecycle::validation`); a refusal is the lifecycle's to weigh.
pub(crate) async fn validate(
    ctx: &Context,
    remediation: &GpuRemediation,
    rules: &PolicySnapshot,
    rung: Option<Rung>,
) -> Result<Result<ObjectReference, Words>, AdvanceRemediationError> {
    let action = match rung {
        Some(rung) => format!("creating the {rung} step's validation Job"),
        None => "creating the validation Job".to_owned(),
    };
    let Some(job) = crate::lifecycle::validation::job_object(rules, &remediation.name_any(), rung) else {
        return Ok(Err(Words::invalid(
            action,
            "the policy has no validation".to_owned(),
        )));
    };
    create(ctx, remediation, rules, job, action).await
}

/// Creates the policy's diagnostics Job on the node (see `lifecycle::diagnostics`); a refusal is
/// the lifecycle's to weigh.
pub(crate) async fn diagnose(
    ctx: &Context,
    remediation: &GpuRemediation,
    rules: &PolicySnapshot,
) -> Result<Result<ObjectReference, Words>, AdvanceRemediationError> {
    let action = "creating the diagnostics Job".to_owned();
    let Some(job) = crate::lifecycle::diagnostics::job_object(rules, &remediation.name_any()) else {
        return Ok(Err(Words::invalid(
            action,
            "the policy has no diagnostics".to_owned(),
        )));
    };
    create(ctx, remediation, rules, job, action).await
}

/// Creates `object` for the remediation through the `Template` strategy (rendered, owned by the
/// remediation, idempotent).
async fn create(
    ctx: &Context,
    remediation: &GpuRemediation,
    rules: &PolicySnapshot,
    object: Value,
    action: String,
) -> Result<Result<ObjectReference, Words>, AdvanceRemediationError> {
    let replacement = Replacement {
        strategy: Strategy::Template,
        template: Some(object),
        timeout: rules.replacement.timeout,
    };
    match crate::act::replace::Replacers::new(ctx.writer.clone())
        .for_strategy(Strategy::Template)
        .trigger(remediation, &replacement)
        .await
    {
        // A template's trigger creates its object and never writes the remediation.
        Ok(triggered) => Ok(Ok(triggered.reference)),
        Err(TriggerReplacementError::Fenced(fenced)) => Err(fenced.into()),
        Err(error) => Ok(Err(Words::of(action, &error))),
    }
}

/// How a reset's drain scope starts when the GPU-to-pod mapping is unknown.
pub const MAPPING_UNKNOWN: &str = "GPU-to-pod mapping unknown";

/// What a pass of a reset's drain does with the scope an earlier pass decided (`previous`): a
/// drain of the whole node stays whole (its pods leaving must not narrow it: a node whose last
/// device-plugin pod left would look mapped, and its other pods would stay); a GPU-scoped one looks
/// again (its holders leave, a mapping may turn unknown) and keeps its first words while it stays
/// scoped; none yet: decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScopePass {
    /// Drain the whole node, as decided before.
    KeepWhole,
    /// Map again; keep the earlier words if it stays GPU-scoped.
    MapAgain,
    /// Map for the first time.
    Decide,
}

/// The pass for a drain whose earlier scope is `previous`.
#[must_use]
pub fn scope_pass(previous: Option<&str>) -> ScopePass {
    match previous {
        Some(scope) if scope.starts_with(MAPPING_UNKNOWN) => ScopePass::KeepWhole,
        Some(_) => ScopePass::MapAgain,
        None => ScopePass::Decide,
    }
}

/// Narrows a reset's drain to the pods holding the failed GPUs, as DRA's claims and slices and the
/// agent's device-plugin assignment say; where that is unknown the whole node is drained, and the
/// scope says why. `previous`: the scope an earlier pass of this drain decided (see [`scope_pass`]).
/// A failed read is an error (the pass is retried), never a guess.
pub(crate) async fn scope_drain(
    ctx: &Context,
    node: &str,
    gpus: &[String],
    plan: crate::drain::Plan,
    pods: &[k8s_openapi::api::core::v1::Pod],
    previous: Option<&str>,
) -> Result<(crate::drain::Plan, Option<String>), AdvanceRemediationError> {
    use crate::dra::{Holders, pods_holding_on};
    use gpu_remediation_api::ladder::STEP_MESSAGE_MAX;
    let pass = scope_pass(previous);
    if pass == ScopePass::KeepWhole {
        return Ok((plan, None));
    }
    let scope = match pods_holding_on(&ctx.reader, node, gpus, pods).await? {
        Holders::Known(holders) => {
            let names: std::collections::BTreeSet<String> = holders
                .iter()
                .map(|p| format!("{}/{}", p.namespace, p.name))
                .collect();
            let listed = names.iter().cloned().collect::<Vec<_>>().join(", ");
            let scope = format!(
                "{}: only the {} pods holding {} leave ({listed}); the node's other pods keep running",
                crate::lifecycle::ladder::GPU_SCOPED,
                names.len(),
                gpus.join(", ")
            );
            let narrowed = crate::drain::scoped_to(plan, &names);
            let words = (pass == ScopePass::Decide)
                .then(|| gpu_remediation_api::text::truncate(&scope, STEP_MESSAGE_MAX));
            return Ok((narrowed, words));
        }
        Holders::Unknown(reason) => format!("{MAPPING_UNKNOWN} ({reason}): whole node drained"),
    };
    Ok((
        plan,
        Some(gpu_remediation_api::text::truncate(&scope, STEP_MESSAGE_MAX)),
    ))
}

/// Labels the node for a person; a refusal is the lifecycle's to weigh.
pub(crate) async fn hand_off(
    ctx: &Context,
    node: &NodeRef,
    remediation: &str,
) -> Result<Result<(), Words>, AdvanceRemediationError> {
    match ctx
        .writer
        .edit_node(node, ctx.caches.node(&node.name).as_deref(), |n| {
            crate::cordon::hand_off(n, remediation)
        })
        .await
    {
        Ok(NodeEdit::Written(_) | NodeEdit::Gone | NodeEdit::Replaced) => Ok(Ok(())),
        Err(EditNodeError::Write { node: n, source }) if source.is_refusal() => Ok(Err(Words::of(
            format!("labelling node {n} for a person"),
            &source,
        ))),
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
        let named = step_template(&template, "gpu-1-abc123", Rung::ResetGpu, &[]);
        assert_eq!(named["metadata"]["name"], "gpu-1-abc123-resetgpu");
        assert_eq!(named["metadata"]["namespace"], "ops");
    }

    #[test]
    fn the_failed_gpus_uuid_is_substituted_wherever_the_template_names_it() {
        let template = json!({"apiVersion": "janitor.dgxc.nvidia.com/v1alpha1", "kind": "GPUReset",
            "spec": {"nodeName": "{{nodeName}}", "selector": {"uuids": ["{{gpuUUID}}"]}}});
        let rendered = step_template(&template, "r", Rung::ResetGpu, &["GPU-3"]);
        assert_eq!(rendered["spec"]["selector"]["uuids"], json!(["GPU-3"]));
        assert_eq!(
            rendered["spec"]["nodeName"], "{{nodeName}}",
            "the node is the renderer's"
        );
    }

    #[test]
    fn every_failed_gpu_is_substituted_where_the_template_names_them_all() {
        let template = json!({"apiVersion": "batch/v1", "kind": "Job",
            "spec": {"args": ["for uuid in {{gpuUUIDs}}; do reset $uuid; done", "first {{gpuUUID}}"]}});
        let rendered = step_template(&template, "r", Rung::ResetGpu, &["GPU-3", "GPU-5"]);
        assert_eq!(
            rendered["spec"]["args"],
            json!(["for uuid in GPU-3 GPU-5; do reset $uuid; done", "first GPU-3"])
        );
    }

    #[test]
    fn every_ladder_step_sample_is_a_valid_step_with_its_template() {
        for (file, text) in [
            (
                "reset-job.yaml",
                include_str!("../../../../../config/ladder-steps/reset-job.yaml"),
            ),
            (
                "nvsentinel-gpu-reset.yaml",
                include_str!("../../../../../config/ladder-steps/nvsentinel-gpu-reset.yaml"),
            ),
            (
                "self-node-remediation.yaml",
                include_str!("../../../../../config/ladder-steps/self-node-remediation.yaml"),
            ),
        ] {
            let step: gpu_remediation_api::ladder::LadderStep =
                serde_yaml::from_str(text).unwrap_or_else(|e| panic!("{file}: {e}"));
            let template = step
                .template
                .as_ref()
                .unwrap_or_else(|| panic!("{file}: no template"));
            assert!(step.step.has_template(), "{file}");
            assert!(
                template["apiVersion"].is_string() && template["kind"].is_string(),
                "{file}"
            );
        }
    }

    #[test]
    fn a_whole_node_drain_stays_whole_and_a_gpu_scoped_one_maps_again() {
        assert_eq!(
            scope_pass(Some(
                "GPU-to-pod mapping unknown (pod a/b asks for nvidia.com/gpu ...): whole node drained"
            )),
            ScopePass::KeepWhole
        );
        assert_eq!(
            scope_pass(Some(
                "GPU-scoped drain: only the 1 pods holding GPU-3 leave (a/b)"
            )),
            ScopePass::MapAgain
        );
        assert_eq!(scope_pass(None), ScopePass::Decide);
        assert!(
            crate::lifecycle::ladder::WHOLE_NODE_DRAINED.starts_with(MAPPING_UNKNOWN),
            "the lifecycle's own words for a whole-node reset drain keep it whole too"
        );
    }

    #[test]
    fn a_step_object_that_names_itself_keeps_its_name() {
        let template = json!({"apiVersion": "v1", "kind": "X", "metadata": {"name": "{{nodeName}}"}});
        assert_eq!(
            step_template(&template, "r", Rung::Reboot, &[])["metadata"]["name"],
            "{{nodeName}}"
        );
    }
}
