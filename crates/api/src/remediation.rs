//! `GpuRemediation`: one recycle of one node, the audit record operators follow with
//! `kubectl get gpuremediations`.

use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::object_reference::ObjectReference;
use crate::policy::{Action, ConditionStatus, Drain, Mode, Release, Replacement, Trigger};

/// One recycle of one node under one policy. Named `<node>-<short hash>`; created by the
/// controller when the policy's budget admits the node.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "gpuremediation.dev",
    version = "v1alpha1",
    kind = "GpuRemediation",
    plural = "gpuremediations",
    shortname = "gpur",
    category = "gpu",
    status = "GpuRemediationStatus",
    doc = "A GpuRemediation records one recycle of one GPU node under one policy: the condition that triggered it, the phase it is in, the drain's progress and blockers, and the object that replaces the node. `kubectl get gpuremediations` is the audit trail.",
    printcolumn = r#"{"name":"NODE","type":"string","jsonPath":".spec.nodeName"}"#,
    printcolumn = r#"{"name":"POLICY","type":"string","jsonPath":".spec.policyName"}"#,
    printcolumn = r#"{"name":"PHASE","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"REASON","type":"string","jsonPath":".spec.trigger.reason"}"#,
    printcolumn = r#"{"name":"ACTION","type":"string","jsonPath":".spec.action"}"#,
    printcolumn = r#"{"name":"STEP","type":"string","jsonPath":".status.currentStep"}"#,
    printcolumn = r#"{"name":"AGE","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::remediation_spec, transform = crate::bounds::spec)]
pub struct GpuRemediationSpec {
    /// The node being remediated.
    pub node_name: String,
    /// The policy that governs the node.
    pub policy_name: String,
    /// The condition that triggered this remediation, as observed when it was admitted.
    pub trigger: TriggerRecord,
    /// What is done after the drain.
    pub action: Action,
    /// The policy's mode when the remediation was created.
    #[serde(default)]
    pub mode: Mode,
    /// The node's UID at admission: every edit of the node is preconditioned on it, and a node
    /// of the same name with another UID is a different machine, never touched by this record.
    #[serde(default, rename = "nodeUID", skip_serializing_if = "Option::is_none")]
    pub node_uid: Option<String>,
    /// When this node's previous incident started (the trigger of its latest earlier remediation
    /// still on record), for the time between incidents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_incident: Option<Time>,
    /// The policy's rules as they were at admission: the recycle follows them to its end, whatever
    /// happens to the policy meanwhile (edited or deleted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_snapshot: Option<PolicySnapshot>,
    /// The node's GPUs at admission, the failed ones (serial and UUID) and the host, from the
    /// agent's annotations; and, when the hardware was past `safety.repeatOffender`, its earlier
    /// failures. Absent when the node carries no inventory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hardware: Option<crate::hardware::HardwareLedger>,
}

/// The parts of a policy that govern one recycle once it is admitted.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::policy_snapshot)]
pub struct PolicySnapshot {
    /// The policy's `metadata.generation` when the snapshot was taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// What counts as broken (for recovery and release).
    pub triggers: Vec<Trigger>,
    /// How pods leave the node.
    #[serde(default)]
    pub drain: Drain,
    /// How the node is replaced or rebooted.
    #[serde(default)]
    pub replacement: Replacement,
    /// When a recovered node is released.
    #[serde(default)]
    pub release: Release,
    /// The escalation ladder (empty: the one step `spec.action`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ladder: Vec<crate::ladder::LadderStep>,
    /// The validation Job run before release (unset: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validation: Option<crate::validation::Validation>,
    /// The diagnostics Job run before the first destructive step (unset: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diagnostics: Option<crate::diagnostics::Diagnostics>,
}

/// The node condition that triggered a remediation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TriggerRecord {
    /// Condition type, e.g. `GpuHealthy`.
    pub condition_type: String,
    /// Condition status.
    pub status: ConditionStatus,
    /// Condition reason, e.g. `XID79`.
    #[serde(default)]
    pub reason: String,
    /// Condition message, e.g. which GPU.
    #[serde(default)]
    pub message: String,
    /// Since when the condition has held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Time>,
}

/// Where a remediation stands.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
pub enum Phase {
    /// Admitted, nothing done yet.
    #[default]
    Pending,
    /// Waiting for a person to annotate `gpuremediation.dev/approved=true` (mode `Manual`).
    AwaitingApproval,
    /// Mode `DryRun`: the record says what would have happened; nothing changed.
    DryRun,
    /// The node is unschedulable and tainted.
    Cordoned,
    /// Pods are leaving through the Eviction API.
    Draining,
    /// The drain passed its timeout with `onTimeout: Block`; evictions keep being retried.
    Blocked,
    /// The replacement has been triggered.
    Replacing,
    /// Waiting for the node to go and a replacement to be Ready.
    Verifying,
    /// Done: replaced, or released after recovering.
    Succeeded,
    /// The replacement failed or timed out.
    Failed,
    /// The node used up its attempts; a person must act.
    ManualRequired,
    /// Stopped: the node recovered, a person uncordoned it, the node vanished, or the record was
    /// deleted.
    Cancelled,
}

impl Phase {
    /// Whether the remediation is finished: nothing more will happen to the node.
    #[must_use]
    pub const fn is_terminal(self) -> bool {
        matches!(
            self,
            Self::Succeeded | Self::Failed | Self::Cancelled | Self::DryRun | Self::ManualRequired
        )
    }

    /// The phase's name as it appears in the API.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::AwaitingApproval => "AwaitingApproval",
            Self::DryRun => "DryRun",
            Self::Cordoned => "Cordoned",
            Self::Draining => "Draining",
            Self::Blocked => "Blocked",
            Self::Replacing => "Replacing",
            Self::Verifying => "Verifying",
            Self::Succeeded => "Succeeded",
            Self::Failed => "Failed",
            Self::ManualRequired => "ManualRequired",
            Self::Cancelled => "Cancelled",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What happened so far.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::bounds::status)]
pub struct GpuRemediationStatus {
    /// The current phase.
    #[serde(default)]
    pub phase: Phase,
    /// `Cordoned`, `Drained`, `ReplacementTriggered`, `Complete`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Each phase entered, with when, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub phase_history: Vec<PhaseTransition>,
    /// Drain progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<DrainStatus>,
    /// The object that carries out the replacement (`Node`, `Machine`, `NodeClaim` or the template's
    /// object).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replacement: Option<ObjectReference>,
    /// A sentence for a person: what is happening or why it stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// With a ladder: the step being taken (or the last one taken).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_step: Option<crate::ladder::Rung>,
    /// With a ladder: each step taken, in order, with its outcome and evidence (the latest 16).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub steps: Vec<crate::ladder::StepRecord>,
    /// Without a ladder: the validation Job run before a standing node is released (with a ladder
    /// each step's evidence holds its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validation: Option<crate::validation::ValidationRecord>,
    /// The diagnostics Job run before the first step that destroys the node's state, and how it
    /// ended (see `spec.diagnostics` of the policy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diagnostics: Option<crate::diagnostics::DiagnosticsRecord>,
    /// From the start of the trigger to the node (or its replacement) back in service, in whole
    /// seconds; set when the remediation succeeds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_to_recovery_seconds: Option<u64>,
    /// The policy generation this recycle follows (its snapshot's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_generation: Option<i64>,
    /// A step the server keeps refusing (a cordon, the replacement's trigger or look): what was
    /// asked, the server's words and since when. It counts against the step's timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal: Option<Refusal>,
    /// Who approved the remediation (mode `Manual`, or past `maxAttemptsPerNode`): the
    /// `gpuremediation.dev/approved-by` annotation the API server checked against the approver's
    /// own user name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved_by: Option<String>,
    /// When the controller first saw the approval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved_at: Option<Time>,
    /// The leak: pods found on the node when its pods were first listed (at the cordon, or a dry
    /// run's record) that the scheduler placed there after the fault began (their `PodScheduled`
    /// time at or after `spec.trigger.since`). `DaemonSet` and mirror pods are not counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leaked_pods: Option<u32>,
    /// The leader claim (`<holder>/<leaseTransitions>` of the controller's Lease) under which this
    /// status was last written. The fence admission policy refuses a status write by the controller
    /// whose claim is not the Lease's current one, so a deposed leader's late write cannot land.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<String>,
}

/// A request the server refused, in its own words.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Refusal {
    /// What was asked, e.g. `creating SelfNodeRemediation ns/node-1`.
    pub action: String,
    /// The HTTP status, when the server answered at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<u16>,
    /// The server's message (or the transport error).
    pub message: String,
    /// Since when this step has been refused.
    pub since: Time,
}

/// A phase entered at a time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PhaseTransition {
    /// The phase entered.
    pub phase: Phase,
    /// When.
    pub at: Time,
    /// Why, for a person.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// How the drain is going.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DrainStatus {
    /// Pods that must leave (excludes mirror, DaemonSet-owned and finished pods).
    #[serde(default)]
    pub pods_total: u32,
    /// Pods whose eviction the server accepted.
    #[serde(default)]
    pub pods_evicted: u32,
    /// Pods still on the node among those that must leave.
    #[serde(default)]
    pub pods_remaining: u32,
    /// Pods whose eviction is refused right now, with who refuses and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blockers: Vec<Blocker>,
    /// `DryRun` only: the pods that would be evicted, as `namespace/name`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub would_evict: Vec<String>,
    /// With a ladder: the pods whose eviction the server accepted, as `namespace/name` (the first
    /// 64); the step the drain was for records them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub evicted: Vec<String>,
    /// With a ladder: which pods this drain takes and why (only those holding the failed GPU, for
    /// a reset; else the whole node, and why the mapping is unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub scope: Option<String>,
    /// The gangs (pods of one distributed job across nodes) this drain touched, recorded when it
    /// first acted: their members' nodes, and under `drain.gangs: Together` the members on other
    /// nodes evicted with the node's own pods (the first 8 gangs, 64 members in all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub gangs: Vec<crate::gangs::GangRecord>,
    /// When the checkpoint notice (`drain.notice`) went out: the pods given it are evicted at
    /// this time plus the notice, or once they write `gpuremediation.dev/checkpointed` or exit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notice_since: Option<Time>,
    /// The GPU-seconds this drain cost: for each pod it evicted (the node's own and, under
    /// `Together`, a gang's members elsewhere), the GPUs the pod asks for (`nvidia.com/gpu`) times
    /// the time from the fault's start (the trigger's `since`, taken no later than the record's
    /// admission and no earlier than 15 minutes before it) until the server accepted its
    /// eviction, summed. GPUs from DRA claims and members a drain leaves in place are not counted.
    #[serde(default, skip_serializing_if = "crate::is_default")]
    pub gpu_seconds: u64,
}

/// A pod whose eviction is refused.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Blocker {
    /// The pod, as `namespace/name`.
    pub pod: String,
    /// The `PodDisruptionBudget` that refuses, as `namespace/name`, when the server names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pdb: Option<String>,
    /// The HTTP status the server answered (429: budget exhausted; 500: several PDBs).
    pub code: u16,
    /// The server's message.
    pub message: String,
    /// Since when this pod has been refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Time>,
}
