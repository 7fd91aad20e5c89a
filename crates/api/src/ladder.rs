//! The escalation ladder: an ordered list of steps a recycle climbs (`ResetGpu` → `Reboot` →
//! `Replace` → `HandOff`), each with its own timeout and how it is carried out, and where a
//! recycle starts on it from the trigger's reason. Also the record each step leaves in a
//! remediation's status (`status.steps[]`).
//!
//! A policy without a ladder has one step, its `action`, and behaves as it always did.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{constants::gpu_reasons, duration::Duration, object_reference::ObjectReference};

/// The longest a step may take before the next one is tried: a day.
pub const STEP_TIMEOUT_MAX: Duration = Duration::from_hours(24);
/// The most step records a remediation keeps (the latest ones; a person's approval may climb the
/// ladder again).
pub const STEP_RECORDS_MAX: usize = 16;
/// The most pods a step record names.
pub const STEP_PODS_MAX: usize = 64;
/// The most GPUs a step's evidence names.
pub const STEP_GPUS_MAX: usize = 64;
/// The longest message a step record keeps.
pub const STEP_MESSAGE_MAX: usize = 1024;
/// Node label (`true`) a hand-off sets, for a person or an RMA process that selects on it.
pub const HAND_OFF_LABEL: &str = "gpuremediation.dev/hand-off";
/// Node annotation naming the remediation that handed the node off (a label value is too short
/// for every remediation name).
pub const HANDED_OFF_BY_ANNOTATION: &str = "gpuremediation.dev/handed-off-by";

/// One rung of the ladder, from the cheapest to the last resort.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema)]
pub enum Rung {
    /// Reset the failed GPU (its pods leave; the node's other GPUs keep running), through the
    /// step's template (a reset Job on the node, `NVSentinel`'s GPU reset resource).
    ResetGpu,
    /// Reboot the node through the step's template (a Self Node Remediation object).
    Reboot,
    /// Replace the node through `spec.replacement`.
    Replace,
    /// Hand the node to a person: it stays cordoned, labelled `gpuremediation.dev/hand-off`, and
    /// the remediation ends `ManualRequired` naming the GPUs.
    HandOff,
}

impl Rung {
    /// The rung's name as it appears in the API.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::ResetGpu => "ResetGpu",
            Self::Reboot => "Reboot",
            Self::Replace => "Replace",
            Self::HandOff => "HandOff",
        }
    }

    /// Whether the step is carried out by creating its template.
    #[must_use]
    pub const fn has_template(self) -> bool {
        matches!(self, Self::ResetGpu | Self::Reboot)
    }
}

impl std::fmt::Display for Rung {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One step of the ladder.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::ladder_schema::ladder_step)]
pub struct LadderStep {
    /// The rung.
    pub step: Rung,
    /// How long the step may take to prove itself (including the dwell of `release.healthyFor`)
    /// before the next step is tried (1s to 24h).
    #[serde(default = "default_step_timeout")]
    pub timeout: Duration,
    /// For `ResetGpu` and `Reboot` (required there, refused elsewhere): the object created for the
    /// step and judged done or failed by its conditions, as the `Template` strategy's. `{{nodeName}}`
    /// and `{{remediationName}}` are substituted; unnamed, it is named `<remediation>-<step>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::ladder_schema::embedded_object")]
    pub template: Option<serde_json::Value>,
}

fn default_step_timeout() -> Duration {
    Duration::from_mins(15)
}

/// How a step ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum StepOutcome {
    /// The evidence proved it worked.
    Succeeded,
    /// The server kept refusing the step's requests (5xx, conflicts, no answer) until its timeout.
    Transient,
    /// It cannot work: its object reported failure, the fault came back within the dwell, or the
    /// server refused its request for good.
    Permanent,
    /// No proof before its timeout.
    TimedOut,
    /// The remediation stopped while it ran (the node recovered, was uncordoned or went, the
    /// record was deleted).
    Superseded,
}

/// What was seen of a step.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StepEvidence {
    /// `status.nodeInfo.bootID` when the step began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub boot_id_before: Option<String>,
    /// `status.nodeInfo.bootID` when the step was judged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub boot_id_after: Option<String>,
    /// The failed GPUs' UUIDs the agent's inventory lists again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub gpus_answering: Vec<String>,
    /// Since when the node has been healthy during the step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthy_since: Option<Time>,
    /// The dwell the step's success waited for (`release.healthyFor`), in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 86_400))]
    pub dwell_seconds: Option<u32>,
    /// The validation Job run once the step showed its evidence (`spec.validation`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validation: Option<crate::validation::ValidationRecord>,
}

/// One step a remediation took.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StepRecord {
    /// The rung.
    pub step: Rung,
    /// When it began.
    pub start: Time,
    /// When it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<Time>,
    /// How it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<StepOutcome>,
    /// Why, for a person.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub message: Option<String>,
    /// The object that carries it out (a template's object, or the replacement's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object: Option<ObjectReference>,
    /// What was seen.
    #[serde(default)]
    pub evidence: StepEvidence,
    /// Pods evicted for it, as `namespace/name` (the first ones, at most 64).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub evicted_pods: Vec<String>,
}

/// The rung NVIDIA's XID catalog (as the agent words it in the condition's message: "recommended
/// action `RESET_GPU`") or the reason recommends, if any: `RESET_GPU` and memory faults a reset
/// repairs → `ResetGpu`; `RESTART_BM`/`RESTART_VM` and a missing GPU → `Reboot`; what needs the
/// hardware looked at → `Replace`.
#[must_use]
pub fn recommended_rung(reason: &str, message: &str) -> Option<Rung> {
    let action = message.split("recommended action ").nth(1).map(|rest| {
        rest.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .next()
            .unwrap_or("")
    });
    match action {
        Some("RESET_GPU") => return Some(Rung::ResetGpu),
        Some("RESTART_BM" | "RESTART_VM") => return Some(Rung::Reboot),
        Some("CONTACT_SUPPORT" | "CHECK_MECHANICALS" | "REPLACE" | "RMA") => return Some(Rung::Replace),
        _ => {}
    }
    match reason {
        gpu_reasons::GPU_MISSING => Some(Rung::Reboot),
        gpu_reasons::DOUBLE_BIT_ECC | gpu_reasons::ROW_REMAP_PENDING | gpu_reasons::RETIRED_PAGES_PENDING => {
            Some(Rung::ResetGpu)
        }
        gpu_reasons::ROW_REMAP_FAILURE => Some(Rung::Replace),
        _ => None,
    }
}

/// The index of the step a recycle starts at: the first step at or above `wanted` (a ladder
/// without that rung starts at the next one it has, or its last), or the first step when nothing
/// is wanted.
#[must_use]
pub fn start_index(ladder: &[LadderStep], wanted: Option<Rung>) -> usize {
    let Some(wanted) = wanted else {
        return 0;
    };
    ladder
        .iter()
        .position(|step| step.step >= wanted)
        .unwrap_or_else(|| ladder.len().saturating_sub(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ladder(rungs: &[Rung]) -> Vec<LadderStep> {
        rungs
            .iter()
            .map(|&step| LadderStep {
                step,
                timeout: Duration::from_mins(1),
                template: None,
            })
            .collect()
    }

    #[test]
    fn the_catalogs_recommended_action_picks_the_rung() {
        let message = |action: &str| {
            format!("GPU 3 (GPU-3, 0000:3b:00.0): XID 79 (fell off); recommended action {action}")
        };
        assert_eq!(
            recommended_rung("XID48", &message("RESET_GPU")),
            Some(Rung::ResetGpu)
        );
        assert_eq!(
            recommended_rung("XID79", &message("RESTART_BM")),
            Some(Rung::Reboot)
        );
        assert_eq!(
            recommended_rung("XID79", &message("RESTART_VM")),
            Some(Rung::Reboot)
        );
        assert_eq!(
            recommended_rung("XID95", &message("CONTACT_SUPPORT")),
            Some(Rung::Replace)
        );
        assert_eq!(recommended_rung("XID13", &message("RESTART_APP")), None);
    }

    #[test]
    fn a_missing_gpu_reboots_and_memory_faults_reset() {
        assert_eq!(
            recommended_rung("GpuMissing", "GPU 2 is gone"),
            Some(Rung::Reboot)
        );
        assert_eq!(recommended_rung("RowRemapPending", ""), Some(Rung::ResetGpu));
        assert_eq!(recommended_rung("RowRemapFailure", ""), Some(Rung::Replace));
        assert_eq!(recommended_rung("SomethingElse", "no action named"), None);
    }

    #[test]
    fn a_ladder_without_the_wanted_rung_starts_at_the_next_it_has() {
        let full = ladder(&[Rung::ResetGpu, Rung::Reboot, Rung::Replace, Rung::HandOff]);
        assert_eq!(start_index(&full, Some(Rung::Reboot)), 1);
        assert_eq!(start_index(&full, None), 0);
        let short = ladder(&[Rung::ResetGpu, Rung::Replace]);
        assert_eq!(start_index(&short, Some(Rung::Reboot)), 1);
        assert_eq!(
            start_index(&short, Some(Rung::HandOff)),
            1,
            "past the top: its last step"
        );
    }
}
