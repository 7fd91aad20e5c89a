//! `GpuRemediationPolicy`: which nodes, what counts as broken, what to do about it, and how much
//! may happen at once.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{
    correlated::{HeldDomain, SuspectStatus},
    duration::Duration,
    safety::Safety,
    selector::{IntOrPercent, NodeSelector},
};

/// Which nodes a policy governs, which node conditions mean a GPU is broken, and how the
/// controller may recycle those nodes: action, replacement strategy, drain behaviour and the
/// safety limits (concurrency, unhealthy share, rate, attempts per node).
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "gpuremediation.dev",
    version = "v1alpha1",
    kind = "GpuRemediationPolicy",
    plural = "gpuremediationpolicies",
    shortname = "gpupolicy",
    category = "gpu",
    status = "GpuRemediationPolicyStatus",
    doc = "A GpuRemediationPolicy says which GPU nodes the controller governs, which node conditions mean a GPU is broken, and how such nodes are cordoned, drained and replaced, within limits on concurrency, rate and the unhealthy share of the fleet.",
    validation = crate::schema::policy_name_rule(),
    printcolumn = r#"{"name":"SELECTED","type":"integer","jsonPath":".status.selectedNodes"}"#,
    printcolumn = r#"{"name":"YIELDED","type":"integer","jsonPath":".status.yieldedNodes"}"#,
    printcolumn = r#"{"name":"UNHEALTHY","type":"integer","jsonPath":".status.unhealthyNodes"}"#,
    printcolumn = r#"{"name":"IN-FLIGHT","type":"integer","jsonPath":".status.inFlight"}"#,
    printcolumn = r#"{"name":"MODE","type":"string","jsonPath":".spec.mode"}"#,
    printcolumn = r#"{"name":"AGE","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"DEVICE-TAINTS","type":"string","priority":1,"jsonPath":".status.deviceTaints"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(
    transform = crate::schema::policy_spec,
    transform = crate::ladder_schema::policy_ladder,
    transform = crate::bounds::spec
)]
pub struct GpuRemediationPolicySpec {
    /// Nodes this policy governs. Nodes labelled `gpuremediation.dev/exclude=true` are never
    /// touched, whatever the selector says.
    #[serde(default)]
    pub node_selector: NodeSelector,
    /// When several policies select one node, the highest priority governs it (ties go to the
    /// first name in alphabetical order); the others report `Overlap`.
    #[serde(default)]
    pub priority: i32,
    /// Node conditions that mark a node as broken; any one suffices.
    pub triggers: Vec<Trigger>,
    /// What to do with a broken node, unless its trigger overrides it.
    #[serde(default)]
    pub action: Action,
    /// How `Replace` is carried out.
    #[serde(default)]
    pub replacement: Replacement,
    /// The escalation ladder: steps tried in order, cheapest first (`ResetGpu`, `Reboot`,
    /// `Replace`, `HandOff`), each judged by evidence and bounded by its own timeout. A recycle
    /// starts where its trigger's reason says (the XID catalog's recommended action) or at its
    /// trigger's `startAt`; a step that fails, times out or whose fault comes back within
    /// `release.healthyFor` hands over to the next. Empty: the one step `action`, as always.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ladder: Vec<crate::ladder::LadderStep>,
    /// Limits on how much the controller may do at once.
    #[serde(default)]
    pub safety: Safety,
    /// `Enforce` acts; `DryRun` records what would happen and changes nothing; `Manual` waits for
    /// a person to approve each remediation.
    #[serde(default)]
    pub mode: Mode,
    /// While true, no new remediation starts; those in flight continue.
    #[serde(default)]
    pub paused: bool,
    /// How pods leave the node.
    #[serde(default)]
    pub drain: Drain,
    /// When a node counts as recovered.
    #[serde(default)]
    pub release: Release,
    /// A Job run on a repaired node before it is released: the node returns to service only when
    /// the Job succeeds; a Job that fails or times out is evidence against the repair (the ladder
    /// climbs). Unset: the repair's evidence and `release.healthyFor` alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validation: Option<crate::validation::Validation>,
    /// A Job run on the node once it is drained, before the first step that destroys its state (a
    /// GPU reset, a reboot, a replacement), once per remediation: the step waits for it at most
    /// `timeout`, then goes on whatever it did. Unset: no diagnostics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diagnostics: Option<crate::diagnostics::Diagnostics>,
    /// How long finished remediations are kept (the audit trail, and the memory of rate windows).
    #[serde(default)]
    pub history: History,
    /// Whether a node is taken out of scheduling at a trigger's first signal, before its `for`.
    #[serde(default)]
    pub quarantine: Quarantine,
}

/// A node condition that marks a GPU node as broken once it has held for `for`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::trigger)]
pub struct Trigger {
    /// The node condition type, e.g. `GpuHealthy`. Any writer works: this project's agent,
    /// node-problem-detector, a DCGM exporter, the EKS node monitoring agent.
    pub condition_type: String,
    /// The status that means broken.
    pub status: ConditionStatus,
    /// If set, only these reasons count (e.g. `XID79`, `GpuMissing`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<String>,
    /// How long the condition must hold continuously before the node counts as broken. A change of
    /// reason within the same status does not restart the clock; a return to healthy does.
    #[serde(rename = "for", default = "default_trigger_for")]
    pub for_: Duration,
    /// Overrides `spec.action` for nodes broken by this trigger.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<Action>,
    /// Overrides `spec.quarantine.enabled` for this trigger (`false` for a reason known to flap).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quarantine: Option<bool>,
    /// With a ladder: the step a recycle by this trigger starts at, whatever its reason recommends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_at: Option<crate::ladder::Rung>,
}

fn default_trigger_for() -> Duration {
    Duration::from_mins(2)
}

/// A node condition status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ConditionStatus {
    /// The condition holds.
    True,
    /// The condition does not hold.
    False,
    /// The condition's writer cannot tell.
    Unknown,
}

impl ConditionStatus {
    /// The string Kubernetes uses.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::True => "True",
            Self::False => "False",
            Self::Unknown => "Unknown",
        }
    }
}

/// What happens to a broken node after it is cordoned and drained.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Action {
    /// Replace the node using `spec.replacement`.
    #[default]
    Replace,
    /// Reboot the node through `spec.replacement.template` (e.g. a Self Node Remediation object).
    Reboot,
    /// Stop after the drain: the node stays cordoned until a person acts or it recovers.
    None,
}

/// How a replacement is triggered.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::replacement)]
pub struct Replacement {
    /// The mechanism.
    #[serde(default)]
    pub strategy: Strategy,
    /// For `Template`: an object created once per remediation (any kind, e.g. a Self Node
    /// Remediation or a provider's machine-repair request), with `{{nodeName}}` and
    /// `{{remediationName}}` substituted. Required exactly when the strategy is `Template`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "embedded_object_schema")]
    pub template: Option<serde_json::Value>,
    /// How long to wait for the node (or its `Machine` or `NodeClaim`) to go and a replacement to be
    /// Ready before the remediation fails.
    #[serde(default = "default_replacement_timeout")]
    pub timeout: Duration,
}

impl Default for Replacement {
    fn default() -> Self {
        Self {
            strategy: Strategy::default(),
            template: None,
            timeout: default_replacement_timeout(),
        }
    }
}

fn default_replacement_timeout() -> Duration {
    Duration::from_mins(30)
}

fn embedded_object_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
        "x-kubernetes-embedded-resource": true,
    })
}

/// The replacement mechanism.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Strategy {
    /// Delete the Node object; the cloud provider or node group brings a new one.
    #[default]
    DeleteNode,
    /// Delete the node's Cluster API `Machine`; its `MachineSet` brings a new one.
    DeleteMachine,
    /// Delete the Karpenter `NodeClaim` whose status names the node.
    DeleteNodeClaim,
    /// Create `template` and follow it until it reports done.
    Template,
}

/// The policy's mode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Mode {
    /// Remediate.
    #[default]
    Enforce,
    /// Record what would happen (pods, refusing PDBs, from server-side dry-run evictions) and
    /// change nothing.
    DryRun,
    /// Create each remediation in `AwaitingApproval`; it proceeds once a person annotates it
    /// `gpuremediation.dev/approved=true`.
    Manual,
}

/// How pods leave a node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::drain)]
pub struct Drain {
    /// How long evictions may keep being refused before `onTimeout` applies.
    #[serde(default = "default_drain_timeout")]
    pub timeout: Duration,
    /// What happens when the drain times out.
    #[serde(default)]
    pub on_timeout: OnDrainTimeout,
    /// Grace period for evicted pods; unset means each pod's own. `0` (delete at once, so a
    /// `StatefulSet` pod may run twice) needs `allowZeroGracePeriod`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_period_seconds: Option<i64>,
    /// Allows `gracePeriodSeconds: 0`, and lets `onTimeout: ForceDelete` remove pods stuck
    /// terminating past their grace period with a grace-0 delete. Off by default.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_zero_grace_period: bool,
    /// While the node is unreachable (its `Ready` condition `Unknown`: the kubelet stopped
    /// reporting), a pod already terminating (evicted, or deleted by anyone) whose
    /// `deletionTimestamp` is more than this far in the past counts as gone for the drain: no
    /// kubelet will ever report it gone. A pod not yet terminating is still evicted under its
    /// budget; a reachable node's pods are always waited for. 0s to 1h; default 5m (Cluster API's
    /// bound for an unreachable node, `kubectl drain --skip-wait-for-delete-timeout`).
    #[serde(default = "default_unreachable_after")]
    pub unreachable_after: Duration,
    /// A checkpoint notice before eviction: a gang's members (see `gangs`) and every pod annotated
    /// `gpuremediation.dev/checkpoint-notice: "true"` are first annotated
    /// `gpuremediation.dev/evict-at` with the time their eviction comes (readable in the container
    /// through a downward API volume; an Event says it too), and are evicted at that time, or as
    /// soon as the pod writes `gpuremediation.dev/checkpointed` (any value) or exits. It never
    /// delays the quarantine or the cordon, and counts within `timeout`. 0s to 1h; default 0s (no
    /// notice).
    #[serde(default = "default_notice")]
    pub notice: Duration,
    /// How the members of a gang (the pods of one distributed job: a `JobSet`, a Kubeflow
    /// training job, a `LeaderWorkerSet` group, a `PodGroup`, a Kueue pod group, an indexed `Job`)
    /// on other nodes are treated when a node holding one of them is drained.
    #[serde(default)]
    pub gangs: GangDrain,
    /// Label keys that also name a gang, besides the well-known ones: pods of one namespace with
    /// the same value under one of these keys are one gang. At most 16 label keys.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gang_labels: Vec<String>,
}

/// What a drain does with the members of a gang on other nodes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum GangDrain {
    /// Only the drained node's pods leave; the gang's other members stay where they are.
    #[default]
    Members,
    /// The gang's members on other nodes are evicted too (through the Eviction API, under their
    /// budgets), so its job controller restarts the job at once instead of after its collective
    /// timeout. Those nodes are never cordoned and count against no budget of ours.
    Together,
}

impl Default for Drain {
    fn default() -> Self {
        Self {
            timeout: default_drain_timeout(),
            on_timeout: OnDrainTimeout::default(),
            grace_period_seconds: None,
            allow_zero_grace_period: false,
            unreachable_after: default_unreachable_after(),
            notice: default_notice(),
            gangs: GangDrain::default(),
            gang_labels: Vec::new(),
        }
    }
}

fn default_drain_timeout() -> Duration {
    Duration::from_mins(30)
}

fn default_unreachable_after() -> Duration {
    Duration::from_mins(5)
}

fn default_notice() -> Duration {
    Duration::from_secs(0)
}

/// What happens when a drain passes its timeout.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum OnDrainTimeout {
    /// Phase `Blocked`: the node stays cordoned, evictions keep being retried, a person decides.
    #[default]
    Block,
    /// Delete the remaining pods directly, bypassing their `PodDisruptionBudgets`.
    ForceDelete,
    /// Go on to replacement with the remaining pods still there.
    Proceed,
}

/// When a node that recovered is released.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::release)]
pub struct Release {
    /// A node whose trigger clears and stays clear this long before replacement is uncordoned
    /// (if we cordoned it) and its remediation cancelled.
    #[serde(default = "default_healthy_for")]
    pub healthy_for: Duration,
}

impl Default for Release {
    fn default() -> Self {
        Self {
            healthy_for: default_healthy_for(),
        }
    }
}

fn default_healthy_for() -> Duration {
    Duration::from_mins(5)
}

/// How long finished remediations are kept.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::history)]
pub struct History {
    /// Finished remediations older than this are deleted. Must be longer than `rate.per` and
    /// `maxAttemptsPerNode.per`, or the limits would forget what they count.
    #[serde(default = "default_history_ttl")]
    pub ttl: Duration,
}

impl Default for History {
    fn default() -> Self {
        Self {
            ttl: default_history_ttl(),
        }
    }
}

fn default_history_ttl() -> Duration {
    Duration::from_hours(7 * 24)
}

/// Quarantine: at a trigger's first signal the node gets the controller's own `NoSchedule` taint
/// (`gpuremediation.dev/quarantined`), so no new pod lands on it while `for` runs. No pod is
/// touched and no cordon is made; if the signal clears, the taint is lifted after `hysteresis`; if
/// `for` elapses, the remediation takes the taint over and lifts it when it releases the node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::quarantine)]
pub struct Quarantine {
    /// Whether triggers quarantine (each trigger may override it). Never in mode `DryRun`.
    #[serde(default = "default_quarantine_enabled")]
    pub enabled: bool,
    /// At most this many (or this share) of the selected nodes quarantined at once; past it no
    /// further node is quarantined and the policy says so. Unset: `safety.maxUnhealthy`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<IntOrPercent>,
    /// How long a cleared signal must stay clear before the taint is lifted (1s to 1h).
    #[serde(default = "default_quarantine_hysteresis")]
    pub hysteresis: Duration,
}

impl Default for Quarantine {
    fn default() -> Self {
        Self {
            enabled: default_quarantine_enabled(),
            max: None,
            hysteresis: default_quarantine_hysteresis(),
        }
    }
}

const fn default_quarantine_enabled() -> bool {
    true
}

fn default_quarantine_hysteresis() -> Duration {
    Duration::from_secs(30)
}

/// What the controller observed and decided for this policy.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::bounds::status)]
pub struct GpuRemediationPolicyStatus {
    /// The generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`, `CircuitOpen`, `Paused`, `Overlap`, `Invalid`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Nodes this policy governs (selected, not opted out, not claimed by a higher priority).
    #[serde(default)]
    pub selected_nodes: u32,
    /// Nodes this policy selects that another policy governs (a higher priority, or the same
    /// priority and an earlier name): they count in neither `selectedNodes` nor any limit here.
    #[serde(default)]
    pub yielded_nodes: u32,
    /// The first of those nodes by name (at most [`YIELDED_LISTED_MAX`]), each with the policy
    /// that governs it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("maxItems" = YIELDED_LISTED_MAX))]
    pub yielded: Vec<YieldedNode>,
    /// Governed nodes whose trigger currently holds.
    #[serde(default)]
    pub unhealthy_nodes: u32,
    /// Remediations started and not finished.
    #[serde(default)]
    pub in_flight: u32,
    /// What the budget allows now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetStatus>,
    /// Unhealthy nodes held back, longest-unhealthy first, each with the limit that holds it: the
    /// first 100 of them ([`WAITING_LISTED_MAX`]) (`waitingTotal` counts them all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("maxItems" = WAITING_LISTED_MAX))]
    pub waiting: Vec<WaitingNode>,
    /// How many unhealthy nodes are held back, listed in `waiting` or not.
    #[serde(default)]
    pub waiting_total: u32,
    /// The latest records the API server refused to create (at most 10, [`REFUSALS_LISTED_MAX`]),
    /// newest first: each node is asked again after five minutes ([`REFUSAL_BACKOFF_SECONDS`]), and meanwhile
    /// neither holds a slot nor keeps the policy's other nodes waiting.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("maxItems" = REFUSALS_LISTED_MAX))]
    pub record_refusals: Vec<RecordRefusal>,
    /// Failure domains over their unhealthy limit, whose nodes wait (the suspects).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held_domains: Vec<HeldDomain>,
    /// Governed nodes carrying this policy's quarantine taint.
    #[serde(default)]
    pub quarantined_nodes: u32,
    /// Pods the scheduler placed on a node after its fault began, summed over this policy's
    /// remediations on record (each one's `status.leakedPods`).
    #[serde(default)]
    pub leaked_pods: u32,
    /// The GPU-seconds this policy's drains cost, summed over its remediations on record (each
    /// one's `status.drain.gpuSeconds`).
    #[serde(default)]
    pub drain_gpu_seconds: u64,
    /// With `safety.slowStart`: the remediations allowed in flight now, and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slow_start: Option<SlowStartStatus>,
    /// With `safety.suspect`: the attribute value most recent failures share, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspect: Option<SuspectStatus>,
    /// How this policy's quarantines take a failed GPU out of allocation: the `DeviceTaintRule`
    /// version the server serves and the controller speaks (`resource.k8s.io/v1`, `.../v1beta2`,
    /// `.../v1alpha3`, the most stable first), or `None: node taint used` where it serves none.
    /// Absent when no trigger quarantines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_taints: Option<String>,
    /// The leader claim (`<holder>/<leaseTransitions>` of the controller's Lease) under which this
    /// status was last written; the fence admission policy refuses a status write by the controller
    /// whose claim is not the Lease's current one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<String>,
}

/// The most yielded nodes a policy's status names (it counts them all).
pub const YIELDED_LISTED_MAX: u32 = 10;

/// The most waiting nodes a policy's status lists (`waitingTotal` counts them all). Each entry is
/// 150 to 250 bytes (the node's name, the limit's sentence): listing every waiting node made the
/// status outgrow the API server's request limit (1.5 MiB by default) from 6,000 to 10,000 of
/// them, and then every status write failed. A hundred, the longest waiting first, is what a
/// person reads; the rest is a count.
pub const WAITING_LISTED_MAX: u32 = 100;

/// The most refused record creations a policy's status lists (the latest first).
pub const REFUSALS_LISTED_MAX: u32 = 10;

/// How long a node whose record the API server refused waits before its record is asked again: a
/// refusal (422: a value the schema does not take) repeats until the node's data changes, and
/// asking it every pass would keep the node in the policy's only slot for ever.
pub const REFUSAL_BACKOFF_SECONDS: i64 = 300;

/// A record the API server refused to create.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecordRefusal {
    /// The node the record was for.
    pub node: String,
    /// When it was refused.
    pub at: Time,
    /// The HTTP status, when the server answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<u16>,
    /// The server's words.
    pub message: String,
}

/// A node a policy selects and yields to another.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct YieldedNode {
    /// The node.
    pub node: String,
    /// The policy that governs it.
    pub governed_by: String,
}

/// The slow-start allowance of a policy.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SlowStartStatus {
    /// Remediations allowed in flight now.
    pub allowed: u32,
    /// Why: the outcome that last changed it.
    pub message: String,
}

/// The state of a policy's budget.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BudgetStatus {
    /// How many more remediations may start now (the smallest of the limits).
    pub remaining: u32,
    /// Remediations started within the current rate window.
    #[serde(default)]
    pub started_in_window: u32,
    /// When the rate window next frees a slot, if it is full.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_slot_at: Option<Time>,
}

/// An unhealthy node the budget holds back.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WaitingNode {
    /// The node.
    pub node: String,
    /// Since when its trigger has held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unhealthy_since: Option<Time>,
    /// The limit holding it: a reason from `gpuremediation.dev`'s reasons, e.g.
    /// `DeferredByConcurrency`.
    pub reason: String,
    /// The limit with its numbers, for a person.
    pub message: String,
}
