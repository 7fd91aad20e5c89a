//! Every label, annotation, taint key, finalizer, condition type, reason and field manager the
//! project owns, in one place, so a key is never spelled twice. All keys start with
//! `gpuremediation.dev/`.

/// Label a person puts on a node (`"true"`) to exclude it from every policy.
pub const OPT_OUT_LABEL: &str = "gpuremediation.dev/exclude";

/// Node annotation recording that this controller cordoned the node, naming the `GpuRemediation`.
/// Only a node carrying it is ever uncordoned by the controller.
pub const CORDONED_BY_ANNOTATION: &str = "gpuremediation.dev/cordoned-by";
/// Node annotation set when the node was already unschedulable before we acted: the cordon stays
/// the person's (or other tool's), and we never lift it.
pub const PRE_CORDONED_ANNOTATION: &str = "gpuremediation.dev/pre-cordoned";
/// Annotation a person sets to `"true"` on a `GpuRemediation` waiting in `AwaitingApproval`.
pub const APPROVED_ANNOTATION: &str = "gpuremediation.dev/approved";
/// Annotation naming who approved a `GpuRemediation`: the user name the API server authenticated
/// them as (the admission policy in `manifests/approval/` refuses any other name, and an approval by
/// anyone without the verb `approve` on `gpuremediations`).
pub const APPROVED_BY_ANNOTATION: &str = "gpuremediation.dev/approved-by";
/// Annotation on each write of a leader-elected controller: its claim on the leader Lease,
/// `<holderIdentity>/<leaseTransitions>`. The admission policy `manifests/controller/fence-policy.yaml`
/// refuses a write whose claim is not the Lease's current one (a deposed leader's late write).
pub const CLAIM_ANNOTATION: &str = "gpuremediation.dev/claim";
/// Label on each object a leader-elected controller writes under a claim, beside
/// `CLAIM_ANNOTATION`, naming the namespace of its Lease: the fence policy's second binding
/// selects these objects before it looks that Lease up, so that a write to them is refused while
/// the Lease is missing (fail closed).
pub const FENCED_LABEL: &str = "gpuremediation.dev/fenced";
/// Annotation the controller sets on a `GpuRemediation` it creates for a node that used up
/// `maxAttemptsPerNode`: the record enters `ManualRequired` and touches nothing until a person
/// sets `APPROVED_ANNOTATION`. Its value says how many attempts in which window.
pub const ATTEMPTS_EXHAUSTED_ANNOTATION: &str = "gpuremediation.dev/attempts-exhausted";
/// Annotation a person sets on a `ManualRequired` node's remediation, or on a node, to clear a
/// latched fatal signal or the attempts limit. Its value is the time of the clear (RFC 3339, e.g.
/// `$(date -u +%FT%TZ)`): what began at or before that time is cleared, a later fault is not (the
/// agent ignores any other value, so a leftover annotation never silences new faults).
pub const CLEAR_ANNOTATION: &str = "gpuremediation.dev/clear";
/// Node annotation the agent writes: the node's GPUs as a JSON list of `{index, uuid, serial,
/// pciBusId, boardPartNumber, vbiosVersion, name}` (absent fields: the board does not report them),
/// from its last successful read; rewritten only when that list changes.
pub const GPU_INVENTORY_ANNOTATION: &str = "gpuremediation.dev/gpu-inventory";
/// Node annotation the agent writes next to a `GpuHealthy=False` condition: the GPUs the fault
/// names, as a JSON list of `{uuid, serial, index, pciBusId, reason}`; absent when none failed.
pub const FAILED_GPUS_ANNOTATION: &str = "gpuremediation.dev/failed-gpus";
/// Node annotation, written by the controller alone (the agent's admission policy refuses it): a
/// JSON object from each GPU serial of the node's inventory to when the controller first saw it
/// listed there. A serial counts as failed on a node only if it was listed before the fault.
pub const GPU_FIRST_SEEN_ANNOTATION: &str = "gpuremediation.dev/gpu-first-seen";
/// Node annotation the agent writes: which pod holds which GPU through the device plugin, read
/// from the kubelet's pod-resources API, and when (see `gpu_pods`); absent where the agent cannot
/// read that API.
pub const GPU_PODS_ANNOTATION: &str = "gpuremediation.dev/gpu-pods";
/// Labels and annotations job controllers put on their pods, which name a gang (the controller's
/// `drain::gangs` recognises them; the sandbox builds and simulates gangs with them).
pub mod gang_labels {
    /// `JobSet`'s label on every pod of a `JobSet`: its name.
    pub const JOBSET_NAME: &str = "jobset.sigs.k8s.io/jobset-name";
    /// The `Job` controller's label on its pods: the `Job`'s name.
    pub const JOB_NAME: &str = "batch.kubernetes.io/job-name";
    /// The `Job` controller's annotation on the pods of an indexed `Job`: the completion index.
    pub const COMPLETION_INDEX: &str = "batch.kubernetes.io/job-completion-index";
}

/// Pod annotation read by the sandbox's simulated kubelet: how long a terminating pod takes to go
/// (a duration such as `30s`), or `stall` to never finish.
pub const SIM_TERMINATION_ANNOTATION: &str = "gpuremediation.dev/sim-termination";

/// Annotation on a `GpuRemediation` of strategy `DeleteMachine`: the label selector of the
/// deleted Machine's `MachineSet`, so verification can recognise the replacement Machine.
pub const REPLACEMENT_SELECTOR_ANNOTATION: &str = "gpuremediation.dev/replacement-selector";

/// Node annotation naming the remediation a person cancelled by deleting its record: the same
/// episode (same node, policy and trigger time, so the same record name) is not admitted again.
pub const CANCELLED_ANNOTATION: &str = "gpuremediation.dev/cancelled";

/// Label on a `GpuRemediation` naming the serial of the first GPU its fault names (as
/// `hardware::label_value` spells it: the serial itself when it is a valid label value, else a
/// hash); the second and later failed GPUs get `failed-serial-2`, `failed-serial-3`, ... (at most
/// [`FAILED_SERIAL_LABELS_MAX`]). `kubectl get gpur -l gpuremediation.dev/failed-serial=SERIAL`.
pub const FAILED_SERIAL_LABEL: &str = "gpuremediation.dev/failed-serial";
/// The most failed-serial labels one remediation carries (every failed GPU stays in its spec).
pub const FAILED_SERIAL_LABELS_MAX: usize = 8;
/// Label on a `GpuRemediation` naming its node's host (system UUID, else provider ID), spelt by
/// `hardware::label_value`.
pub const HOST_LABEL: &str = "gpuremediation.dev/host";
/// Label on a `GpuRemediation` that went straight to the last rung (`"true"`), and on a node
/// carrying a repeat offender (`"true"`).
pub const REPEAT_OFFENDER_LABEL: &str = "gpuremediation.dev/repeat-offender";
/// Taint a GPU node may register with (`--register-with-taints
/// gpuremediation.dev/hardware-unchecked=:NoSchedule`) so it takes no work before the controller
/// has checked its GPUs against the hardware records: the controller lifts it once the agent has
/// published the inventory, unless the node carries a repeat offender and its policy says
/// `cordonOnJoin` (then the node is also cordoned).
pub const HARDWARE_UNCHECKED_TAINT_KEY: &str = "gpuremediation.dev/hardware-unchecked";

/// Taint a new GPU node registers with (`--register-with-taints=gpuremediation.dev/unvalidated=:NoSchedule`,
/// Karpenter `startupTaints`) so it takes no work before its policy's validation Job passed on it
/// (`spec.validation.newNodes`): the controller lifts it only then. The key is fixed, so that no
/// policy can make the controller lift another actor's taint.
pub const UNVALIDATED_TAINT_KEY: &str = "gpuremediation.dev/unvalidated";

/// Pod annotation the controller writes with a drain's checkpoint notice (`spec.drain.notice`):
/// the RFC 3339 time the pod's eviction comes. Readable in the container through a downward API
/// volume (`fieldRef: metadata.annotations['gpuremediation.dev/evict-at']`).
pub const EVICT_AT_ANNOTATION: &str = "gpuremediation.dev/evict-at";

/// Pod annotation (`"true"`) asking for the checkpoint notice before eviction, for a pod of no
/// gang.
pub const CHECKPOINT_NOTICE_ANNOTATION: &str = "gpuremediation.dev/checkpoint-notice";

/// Pod annotation a workload writes (any value) once it checkpointed after the notice: its
/// eviction comes at once instead of at `evict-at`.
pub const CHECKPOINTED_ANNOTATION: &str = "gpuremediation.dev/checkpointed";

/// Taint the controller adds while it remediates a node, on top of `unschedulable`.
pub const REMEDIATION_TAINT_KEY: &str = "gpuremediation.dev/remediating";

/// Taint the controller adds at a trigger's first signal, before its `for` elapses (`NoSchedule`
/// only: no pod is touched). Distinct from `REMEDIATION_TAINT_KEY`: it never cordons, and it is
/// lifted when the signal clears or when the remediation that took it over releases the node.
pub const QUARANTINE_TAINT_KEY: &str = "gpuremediation.dev/quarantined";
/// Node annotation naming the policy whose quarantine taint the node carries: only that policy
/// (or its remediation of the node) lifts it, and a controller that restarts finds it again here.
pub const QUARANTINED_BY_ANNOTATION: &str = "gpuremediation.dev/quarantined-by";
/// The non-graceful node shutdown taint (Kubernetes, GA since 1.28): on a node carrying it, the
/// controller manager's pod garbage collector force-deletes the pods stuck terminating and the
/// attach-detach controller detaches their volumes, so a `StatefulSet`'s pod moves.
pub const OUT_OF_SERVICE_TAINT_KEY: &str = "node.kubernetes.io/out-of-service";
/// The value the controller writes with [`OUT_OF_SERVICE_TAINT_KEY`] (effect `NoExecute`).
pub const OUT_OF_SERVICE_TAINT_VALUE: &str = "nodeshutdown";
/// Node annotation naming the remediation that added [`OUT_OF_SERVICE_TAINT_KEY`]: only a taint
/// so annotated is the controller's to lift (a person's or another tool's is left alone).
pub const OUT_OF_SERVICE_BY_ANNOTATION: &str = "gpuremediation.dev/out-of-service-by";
/// Node annotation of a device-level quarantine: the failed GPUs' DRA devices, as a JSON list of
/// `{uuid, driver, pool, device}`, each taken out of allocation by a `DeviceTaintRule` (taint key
/// `QUARANTINE_TAINT_KEY`, `NoSchedule`) while the node itself stays schedulable. Lifted with the
/// quarantine (the rules follow the annotation).
pub const QUARANTINED_DEVICES_ANNOTATION: &str = "gpuremediation.dev/quarantined-devices";
/// Label on every `DeviceTaintRule` the controller creates (value `true`); the rule's annotations
/// name its node (`NODE_LABEL` as key) and policy (`QUARANTINED_BY_ANNOTATION`).
pub const DEVICE_QUARANTINE_LABEL: &str = "gpuremediation.dev/device-quarantine";

/// Finalizer on a `GpuRemediation`: releases our cordon if the record is deleted early.
pub const REMEDIATION_FINALIZER: &str = "gpuremediation.dev/release-node";

/// Label on a `GpuRemediation` naming its node, for selecting a node's history.
pub const NODE_LABEL: &str = "gpuremediation.dev/node";
/// Label on a `GpuRemediation` naming its policy.
pub const POLICY_LABEL: &str = "gpuremediation.dev/policy";

/// Node label a GPU operator (or the sandbox) sets with the expected number of GPUs.
pub const GPU_COUNT_LABEL: &str = "nvidia.com/gpu.count";
/// Node label naming the GPU product, e.g. `NVIDIA-H100-80GB-HBM3`.
pub const GPU_PRODUCT_LABEL: &str = "nvidia.com/gpu.product";
/// Node label present on GPU nodes.
pub const GPU_PRESENT_LABEL: &str = "nvidia.com/gpu.present";
/// Extended resource name of a GPU.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// Placeholders the controller substitutes in `spec.replacement.template` before creating it.
/// They may appear in any string of the template except label keys and values, which the API
/// server validates as labels even inside a template.
pub mod template_placeholders {
    /// Replaced by the node's name.
    pub const NODE_NAME: &str = "{{nodeName}}";
    /// Replaced by the `GpuRemediation`'s name (unique per recycle, a valid object name).
    pub const REMEDIATION_NAME: &str = "{{remediationName}}";
}

/// Field managers, one per writer, so server-side apply keeps each writer to its own fields.
pub mod field_managers {
    /// The remediation controller.
    pub const CONTROLLER: &str = "gpu-remediator";
    /// The controller's new-node validation, which applies the `GpuValidated` node condition
    /// under a manager of its own so that it never drops the controller's other conditions.
    pub const CONTROLLER_VALIDATION: &str = "gpu-remediator-validation";
    /// The node agent, which owns only its own node conditions.
    pub const AGENT: &str = "gpu-health-agent";
    /// The sandbox's simulated kubelets and fault injector.
    pub const SANDBOX: &str = "gpu-sandbox";
}

/// Node condition types the agent publishes.
pub mod node_conditions {
    /// `True` when every expected GPU is present and healthy; `False` on a fatal fault; `Unknown`
    /// when the detector itself cannot tell.
    pub const GPU_HEALTHY: &str = "GpuHealthy";
    /// `True` when the node carries a GPU (by serial) or is a host past its policy's
    /// `safety.repeatOffender` limit; written by the controller.
    pub const GPU_REPEAT_OFFENDER: &str = "GpuRepeatOffender";
    /// A new node's validation (`spec.validation.newNodes`): `True` passed (its startup taint
    /// lifted), `False` failed, lost or timed out (the taint stays for a person), `Unknown` while
    /// its Job runs or waits for room; written by the controller.
    pub const GPU_VALIDATED: &str = "GpuValidated";
}

/// Reasons on the `GpuValidated` node condition.
pub mod validated_reasons {
    /// The validation Job runs.
    pub const RUNNING: &str = "ValidationRunning";
    /// The validation waits: `newNodes.max` Jobs already run.
    pub const QUEUED: &str = "ValidationQueued";
    /// The validation Job completed: the startup taint is lifted.
    pub const PASSED: &str = "ValidationPassed";
    /// The validation Job failed, or was deleted before it reported.
    pub const FAILED: &str = "ValidationFailed";
    /// The validation Job reported nothing within `validation.timeout`.
    pub const TIMED_OUT: &str = "ValidationTimedOut";
}

/// Reasons on the `GpuHealthy` node condition.
pub mod gpu_reasons {
    /// All GPUs present and healthy.
    pub const HEALTHY: &str = "GpusHealthy";
    /// Fewer GPUs visible than expected: a GPU fell off the bus without an XID.
    pub const GPU_MISSING: &str = "GpuMissing";
    /// A volatile double-bit (uncorrectable) ECC error.
    pub const DOUBLE_BIT_ECC: &str = "DoubleBitEcc";
    /// Row remapping failed: the memory cannot repair itself.
    pub const ROW_REMAP_FAILURE: &str = "RowRemapFailure";
    /// A row remap is pending: the GPU needs a reset.
    pub const ROW_REMAP_PENDING: &str = "RowRemapPending";
    /// Retired pages pending (pre-Ampere): the GPU needs a reset.
    pub const RETIRED_PAGES_PENDING: &str = "RetiredPagesPending";
    /// NVML failed or hung: the detector cannot tell, so the condition is `Unknown`.
    pub const NVML_UNAVAILABLE: &str = "NvmlUnavailable";
    /// Prefix of XID reasons: `XID79`, `XID48`, ...
    pub const XID_PREFIX: &str = "XID";
    /// An NVLink link of a GPU is down (the node uses NVLink and this link was or should be up).
    pub const NVLINK_DOWN: &str = "NvlinkDown";
    /// NVLink error counters (CRC, replay, recovery) grew faster than the catalog's threshold.
    pub const NVLINK_ERRORS: &str = "NvlinkErrors";
    /// The GPU's NVLink fabric (NVSwitch / Fabric Manager) did not register within the grace.
    pub const FABRIC_NOT_READY: &str = "FabricNotReady";
}

/// Condition types on a `GpuRemediationPolicy`'s status.
pub mod policy_conditions {
    /// The policy is valid and being enforced (or dry-run).
    pub const READY: &str = "Ready";
    /// The unhealthy share is above `maxUnhealthy`: nothing new starts.
    pub const CIRCUIT_OPEN: &str = "CircuitOpen";
    /// `spec.paused` is set: nothing new starts.
    pub const PAUSED: &str = "Paused";
    /// Some selected nodes belong to a policy of higher priority.
    pub const OVERLAP: &str = "Overlap";
    /// A failure domain is over its unhealthy limit: its nodes wait, the others go on.
    pub const DOMAIN_HELD: &str = "DomainHeld";
    /// Most recent failures share one value of a node attribute.
    pub const SUSPECT_CAUSE: &str = "SuspectCause";
    /// The policy cannot be enforced (a check the schema cannot express failed).
    pub const INVALID: &str = "Invalid";
    /// Nodes show a quarantining signal but the quarantine limit holds them back.
    pub const QUARANTINE_LIMITED: &str = "QuarantineLimited";
    /// Whether a quarantine whose fault names GPUs allocated through DRA takes only those devices
    /// out of allocation (`DeviceTaintRule` served) or taints the whole node.
    pub const DEVICE_QUARANTINE: &str = "DeviceQuarantine";
}

/// Condition types on a `GpuRemediation`'s status.
pub mod remediation_conditions {
    /// The node is cordoned and tainted by us.
    pub const CORDONED: &str = "Cordoned";
    /// Every pod that must leave has left.
    pub const DRAINED: &str = "Drained";
    /// The replacement has been triggered.
    pub const REPLACEMENT_TRIGGERED: &str = "ReplacementTriggered";
    /// The remediation is finished (successfully or not).
    pub const COMPLETE: &str = "Complete";
    /// The status claims what nothing backs (written by someone other than the controller): the
    /// record is held and its node left alone.
    pub const TAMPERED: &str = "Tampered";
    /// `True`: the record is past `history.ttl` but still holds its node (cordon, hand-off label,
    /// or the quarantine of a `ManualRequired` node whose fault persists), so it is kept until a
    /// person acts (uncordons the node, approves, or deletes the record).
    pub const AWAITING_PERSON: &str = "AwaitingPerson";
}

/// Event and condition reasons the controller emits.
pub mod reasons {
    /// A remediation was created for a node.
    pub const STARTED: &str = "RemediationStarted";
    /// The budget deferred a node: `maxConcurrent` reached.
    pub const DEFERRED_CONCURRENCY: &str = "DeferredByConcurrency";
    /// The budget deferred a node: rolling rate window full.
    pub const DEFERRED_RATE: &str = "DeferredByRate";
    /// The circuit breaker is open.
    pub const CIRCUIT_OPEN: &str = "CircuitOpen";
    /// The policy is paused.
    pub const PAUSED: &str = "Paused";
    /// A failure domain of the node is over its unhealthy limit.
    pub const DOMAIN_HELD: &str = "DomainHeld";
    /// A failure domain held before is back within its unhealthy limit.
    pub const DOMAIN_RESUMED: &str = "DomainResumed";
    /// The node turned unhealthy within `safety.settle`: it waits so failures arriving together
    /// are judged together.
    pub const SETTLING: &str = "Settling";
    /// New remediations of nodes carrying the value most recent failures share wait.
    pub const SUSPECT_HELD: &str = "SuspectHeld";
    /// The budget deferred a node: slow start allows fewer in flight than `maxConcurrent` yet.
    pub const DEFERRED_SLOW_START: &str = "DeferredBySlowStart";
    /// The budget deferred a node: its failure domain's `maxInFlight` reached.
    pub const DEFERRED_DOMAIN_IN_FLIGHT: &str = "DeferredByDomainInFlight";
    /// The node used up `maxAttemptsPerNode`.
    pub const ATTEMPTS_EXHAUSTED: &str = "AttemptsExhausted";
    /// The node opened an episode less than its trigger's `for` (at least a minute) ago: a new one
    /// waits, whatever clock the node's condition carries.
    pub const EPISODE_HELD_OFF: &str = "EpisodeHeldOff";
    /// The API server refused to create the node's record: it is asked again after a backoff.
    pub const RECORD_REFUSED: &str = "RecordRefused";
    /// A phase changed.
    pub const PHASE_CHANGED: &str = "PhaseChanged";
    /// An eviction was refused by a `PodDisruptionBudget`.
    pub const EVICTION_BLOCKED: &str = "EvictionBlocked";
    /// The drain passed its timeout.
    pub const DRAIN_TIMEOUT: &str = "DrainTimeout";
    /// The drain counted pods gone that were terminating on an unreachable node past
    /// `drain.unreachableAfter`.
    pub const UNREACHABLE_PODS_SKIPPED: &str = "UnreachablePodsSkipped";
    /// The node recovered before replacement.
    pub const NODE_RECOVERED: &str = "NodeRecovered";
    /// `action: None`: the node recovered by itself, but the policy's validation Job failed, timed
    /// out or could not be created; the node stays cordoned for a person.
    pub const VALIDATION_FAILED: &str = "ValidationFailed";
    /// A finished record past `history.ttl` is kept: it still holds its node for a person.
    pub const HELD_PAST_TTL: &str = "HeldPastHistoryTtl";
    /// A person uncordoned the node.
    pub const UNCORDONED_BY_PERSON: &str = "UncordonedByPerson";
    /// A release left the node cordoned: another party (named in the note, by the server's record
    /// of the field's manager) laid the cordon again after ours, so it is theirs to lift.
    pub const CORDON_KEPT: &str = "CordonKept";
    /// A policy reads node labels the controller's cache did not keep: every node is listed afresh
    /// keeping them, and nothing is admitted or quarantined until that list completes.
    pub const NODE_LABELS_LISTING: &str = "NodeLabelsListing";
    /// The node disappeared.
    pub const NODE_GONE: &str = "NodeGone";
    /// The node is selected by a policy of higher priority.
    pub const OVERLAP: &str = "Overlap";
    /// The policy is valid.
    pub const VALID: &str = "Valid";
    /// The policy failed a semantic check.
    pub const INVALID: &str = "Invalid";
    /// A node was quarantined at a trigger's first signal.
    pub const QUARANTINED: &str = "Quarantined";
    /// A node confirmed down got the out-of-service taint (`node.kubernetes.io/out-of-service`).
    pub const OUT_OF_SERVICE: &str = "OutOfService";
    /// A node that reports again lost the controller's out-of-service taint.
    pub const BACK_IN_SERVICE: &str = "BackInService";
    /// A node's quarantine was lifted.
    pub const QUARANTINE_LIFTED: &str = "QuarantineLifted";
    /// The quarantine limit holds nodes with a signal back.
    pub const QUARANTINE_LIMIT_REACHED: &str = "QuarantineLimitReached";
    /// The quarantine is within its limit (or off).
    pub const QUARANTINE_WITHIN_LIMIT: &str = "QuarantineWithinLimit";
    /// The API server serves `resource.k8s.io/v1alpha3` `DeviceTaintRule`: device-level quarantine.
    pub const DEVICE_TAINT_RULES_SERVED: &str = "DeviceTaintRulesServed";
    /// It does not: quarantines taint the whole node.
    pub const DEVICE_TAINT_RULES_NOT_SERVED: &str = "DeviceTaintRulesNotServed";
    /// A GPU or host past `safety.repeatOffender`: the remediation skips to the last rung, or the
    /// joining node is flagged.
    pub const REPEAT_OFFENDER: &str = "RepeatOffender";
    /// A record's status claims what nothing backs: held, its node left alone.
    pub const STATUS_TAMPERED: &str = "StatusTampered";
    /// A GPU the node's agent named as failed is not counted: another live node lists its serial
    /// too (a conflict), or the node's own inventory did not list it before the fault.
    pub const HARDWARE_UNTRUSTED: &str = "HardwareUntrusted";
    /// The budget held a node: recoveries younger than a moment would keep the circuit breaker
    /// open if they were still unhealthy; they are let settle first.
    pub const RECOVERIES_SETTLING: &str = "RecoveriesSettling";
    /// A node carries a repeat offender and `cordonOnJoin` says cordon it, but the policy's
    /// `cordonOnJoinMax` is reached: flagged and reported, not cordoned.
    pub const JOIN_CORDON_LIMITED: &str = "JoinCordonLimited";
    /// A pod was given the checkpoint notice (`drain.notice`): when its eviction comes.
    pub const CHECKPOINT_NOTICE: &str = "CheckpointNotice";
    /// A new node's validation Job passed: its startup taint is lifted.
    pub const NEW_NODE_VALIDATED: &str = "NewNodeValidated";
    /// A new node's validation Job failed, was lost or timed out: the node keeps its startup taint.
    pub const NEW_NODE_VALIDATION_FAILED: &str = "NewNodeValidationFailed";
}
