//! The `GpuHealthy` condition as it lives on the Node: reading what the agent needs from its node
//! (the condition it published before, a latch to keep, a person's clear, the expected GPU count)
//! and building the server-side apply body that writes only this one condition and the agent's
//! annotations (the hardware `inventory` and `failed-gpus`, and the device plugin's `gpu-pods`
//! assignment). Pure.

use gpu_remediation_api::constants::{
    CLEAR_ANNOTATION, FAILED_GPUS_ANNOTATION, GPU_COUNT_LABEL, GPU_INVENTORY_ANNOTATION, GPU_PODS_ANNOTATION,
    gpu_reasons, node_conditions,
};
use gpu_remediation_api::text::truncate;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use serde_json::{Value, json};

use crate::{
    health::{ConditionStatus, DesiredCondition, Latch},
    inventory::FailedGpu,
};

/// The most bytes of a `GpuHealthy` message the agent's admission policy accepts
/// (`manifests/agent/admission-policy.yaml`); a longer message (NVML failing on every GPU of a
/// large node, say) is cut to it, so the condition is still published.
pub const MESSAGE_LIMIT: usize = 4096;

/// The agent's annotations on its node, as JSON texts (`None`: not written, so absent).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeAnnotations {
    /// `gpuremediation.dev/gpu-inventory`.
    pub inventory: Option<String>,
    /// `gpuremediation.dev/failed-gpus`.
    pub failed_gpus: Option<String>,
    /// `gpuremediation.dev/gpu-pods`: which pod holds which GPU through the device plugin.
    pub gpu_pods: Option<String>,
}

/// The condition as last written (or found on the node at start-up).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedCondition {
    /// `True`, `False` or `Unknown`, as the API spells it.
    pub status: String,
    /// The reason.
    pub reason: String,
    /// The message.
    pub message: String,
    /// When the status last changed.
    pub last_transition: Timestamp,
    /// The hardware annotations written with it.
    pub annotations: NodeAnnotations,
}

impl PublishedCondition {
    /// The condition to write for `desired`: the transition time moves only when the status does.
    /// A fatal latch carries its own start, so a restored latch keeps its original time.
    #[must_use]
    pub fn next(
        desired: &DesiredCondition,
        previous: Option<&Self>,
        latch: Option<&Latch>,
        now: Timestamp,
        annotations: NodeAnnotations,
    ) -> Self {
        let status = desired.status.as_str();
        let last_transition = match (previous, latch) {
            (Some(previous), _) if previous.status == status => previous.last_transition,
            (_, Some(latch)) if desired.status == ConditionStatus::False => latch.since,
            _ => now,
        };
        Self {
            status: status.to_owned(),
            reason: desired.reason.clone(),
            message: truncate(&desired.message, MESSAGE_LIMIT),
            last_transition,
            annotations,
        }
    }

    /// Whether writing `self` over `previous` changes anything a reader would see.
    #[must_use]
    pub fn differs_from(&self, previous: Option<&Self>) -> bool {
        previous != Some(self)
    }

    /// The server-side apply body for `nodes/status`: only this condition, so the conditions list
    /// (a map keyed by `type`) keeps every other writer's entries, and the agent's annotations
    /// (the status subresource resets only `spec`, so metadata annotations go through it). An
    /// annotation left out is removed, as server-side apply drops what its manager stops applying.
    #[must_use]
    pub fn apply_body(&self, node_name: &str, now: Timestamp) -> Value {
        let mut annotations = serde_json::Map::new();
        if let Some(inventory) = &self.annotations.inventory {
            annotations.insert(GPU_INVENTORY_ANNOTATION.to_owned(), inventory.clone().into());
        }
        if let Some(failed) = &self.annotations.failed_gpus {
            annotations.insert(FAILED_GPUS_ANNOTATION.to_owned(), failed.clone().into());
        }
        if let Some(pods) = &self.annotations.gpu_pods {
            annotations.insert(GPU_PODS_ANNOTATION.to_owned(), pods.clone().into());
        }
        json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": node_name, "annotations": annotations},
            "status": {"conditions": [{
                "type": node_conditions::GPU_HEALTHY,
                "status": self.status,
                "reason": self.reason,
                "message": self.message,
                "lastTransitionTime": self.last_transition.to_string(),
                "lastHeartbeatTime": now.to_string(),
            }]},
        })
    }
}

/// What the agent needs to know about its Node.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeView {
    /// The `GpuHealthy` condition already on the node.
    pub condition: Option<PublishedCondition>,
    /// The GPU count the node's label promises.
    pub expected_gpus: Option<u32>,
    /// The time in the clear annotation: latches that began at or before it are released.
    pub cleared_at: Option<Timestamp>,
    /// The failed GPUs an earlier agent recorded, to describe a restored latch's GPUs.
    pub recorded_failed: Vec<FailedGpu>,
    /// Problems reading the node (an unparsable label or annotation), for the log.
    pub problems: Vec<String>,
}

impl NodeView {
    /// Reads the fields the agent uses.
    #[must_use]
    pub fn of(node: &Node) -> Self {
        let mut view = Self::default();
        if let Some(count) = node
            .metadata
            .labels
            .as_ref()
            .and_then(|labels| labels.get(GPU_COUNT_LABEL))
        {
            match count.parse() {
                Ok(count) => view.expected_gpus = Some(count),
                Err(_) => view
                    .problems
                    .push(format!("label {GPU_COUNT_LABEL}={count:?} is not a count")),
            }
        }
        if let Some(cleared) = node
            .metadata
            .annotations
            .as_ref()
            .and_then(|notes| notes.get(CLEAR_ANNOTATION))
        {
            match cleared.parse::<Timestamp>() {
                Ok(at) => view.cleared_at = Some(at),
                Err(_) => view.problems.push(format!(
                    "annotation {CLEAR_ANNOTATION}={cleared:?} is not an RFC 3339 time; ignored \
                     (write the current time, e.g. $(date -u +%FT%TZ))"
                )),
            }
        }
        let annotation = |key: &str| {
            node.metadata
                .annotations
                .as_ref()
                .and_then(|notes| notes.get(key))
                .cloned()
        };
        let annotations = NodeAnnotations {
            inventory: annotation(GPU_INVENTORY_ANNOTATION),
            failed_gpus: annotation(FAILED_GPUS_ANNOTATION),
            gpu_pods: annotation(GPU_PODS_ANNOTATION),
        };
        if let Some(text) = &annotations.failed_gpus {
            match serde_json::from_str(text) {
                Ok(failed) => view.recorded_failed = failed,
                Err(err) => view.problems.push(format!(
                    "annotation {FAILED_GPUS_ANNOTATION} is not a list of GPUs: {err}"
                )),
            }
        }
        let conditions = node.status.as_ref().and_then(|status| status.conditions.as_ref());
        view.condition = conditions
            .into_iter()
            .flatten()
            .find(|condition| condition.type_ == node_conditions::GPU_HEALTHY)
            .map(|condition| PublishedCondition {
                status: condition.status.clone(),
                reason: condition.reason.clone().unwrap_or_default(),
                message: condition.message.clone().unwrap_or_default(),
                last_transition: condition
                    .last_transition_time
                    .as_ref()
                    .map_or(Timestamp::UNIX_EPOCH, |time| time.0),
                annotations,
            });
        view
    }

    /// The latch to adopt at start-up: a `False` condition is a fatal fault the agent (or an agent
    /// before it) latched. It lapses when the host booted after it (the node was recycled by a
    /// reboot), and when a person cleared it.
    #[must_use]
    pub fn latch_to_restore(&self, booted_at: Option<Timestamp>) -> Option<Latch> {
        let condition = self
            .condition
            .as_ref()
            .filter(|condition| condition.status == "False")?;
        if condition.reason == gpu_reasons::NVML_UNAVAILABLE || condition.reason == gpu_reasons::HEALTHY {
            return None;
        }
        if booted_at.is_some_and(|booted| condition.last_transition < booted) {
            return None;
        }
        if self
            .cleared_at
            .is_some_and(|cleared| condition.last_transition <= cleared)
        {
            return None;
        }
        Some(Latch {
            reason: condition.reason.clone(),
            message: condition.message.clone(),
            since: condition.last_transition,
            failed_gpus: self
                .recorded_failed
                .iter()
                .map(|failed| failed.uuid.clone())
                .collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::core::v1::{NodeCondition, NodeStatus},
        apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
    };

    use super::*;

    /// The agent's admission policy bounds the message at [`MESSAGE_LIMIT`], the size the agent
    /// cuts it to, and says so: the two cannot drift apart.
    #[test]
    fn the_admission_policy_bounds_the_message_at_the_limit_the_agent_cuts_to() {
        let policy = include_str!("../../../manifests/agent/admission-policy.yaml");
        assert_eq!(
            policy.matches("size(c.message)").count(),
            1,
            "one bound on the message"
        );
        assert!(
            policy.contains(&format!("size(c.message) <= {MESSAGE_LIMIT})")),
            "the policy's rule bounds the message at {MESSAGE_LIMIT}"
        );
        assert!(
            policy.contains(&format!("a message of at most {MESSAGE_LIMIT} bytes")),
            "the policy's refusal names {MESSAGE_LIMIT}"
        );
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).unwrap()
    }

    fn node(labels: &[(&str, &str)], annotations: &[(&str, &str)], conditions: Vec<NodeCondition>) -> Node {
        let map = |pairs: &[(&str, &str)]| {
            Some(
                pairs
                    .iter()
                    .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
                    .collect(),
            )
        };
        Node {
            metadata: ObjectMeta {
                name: Some("gpu-node-1".to_owned()),
                labels: map(labels),
                annotations: map(annotations),
                ..ObjectMeta::default()
            },
            status: Some(NodeStatus {
                conditions: Some(conditions),
                ..NodeStatus::default()
            }),
            ..Node::default()
        }
    }

    fn condition(type_: &str, status: &str, reason: &str, since: Timestamp) -> NodeCondition {
        NodeCondition {
            type_: type_.to_owned(),
            status: status.to_owned(),
            reason: Some(reason.to_owned()),
            message: Some(format!("{reason} message")),
            last_transition_time: Some(Time(since)),
            ..NodeCondition::default()
        }
    }

    fn desired(status: ConditionStatus, reason: &str) -> DesiredCondition {
        DesiredCondition {
            status,
            reason: reason.to_owned(),
            message: "m".to_owned(),
        }
    }

    #[test]
    fn the_view_reads_the_expected_count_the_clear_time_and_only_our_condition() {
        let view = NodeView::of(&node(
            &[("nvidia.com/gpu.count", "8")],
            &[("gpuremediation.dev/clear", "2027-01-15T10:00:00Z")],
            vec![
                condition("Ready", "True", "KubeletReady", at(0)),
                condition("GpuHealthy", "False", "XID79", at(5)),
            ],
        ));
        assert_eq!(view.expected_gpus, Some(8));
        assert_eq!(view.cleared_at, Some("2027-01-15T10:00:00Z".parse().unwrap()));
        assert_eq!(view.condition.as_ref().unwrap().reason, "XID79");
        assert_eq!(view.condition.unwrap().last_transition, at(5));
        assert!(view.problems.is_empty());
    }

    #[test]
    fn a_clear_annotation_that_is_not_a_time_is_reported_and_ignored() {
        let view = NodeView::of(&node(
            &[("nvidia.com/gpu.count", "eight")],
            &[("gpuremediation.dev/clear", "true")],
            vec![],
        ));
        assert_eq!(view.cleared_at, None);
        assert_eq!(view.expected_gpus, None);
        assert_eq!(view.problems.len(), 2);
    }

    #[test]
    fn a_false_condition_from_this_boot_is_restored_as_a_latch() {
        let view = NodeView::of(&node(
            &[],
            &[],
            vec![condition("GpuHealthy", "False", "GpuMissing", at(100))],
        ));
        let latch = view.latch_to_restore(Some(at(0))).unwrap();
        assert_eq!(latch.reason, "GpuMissing");
        assert_eq!(latch.since, at(100));
    }

    #[test]
    fn a_latch_from_before_the_last_boot_lapses_because_the_node_was_recycled() {
        let view = NodeView::of(&node(
            &[],
            &[],
            vec![condition("GpuHealthy", "False", "XID79", at(100))],
        ));
        assert_eq!(view.latch_to_restore(Some(at(200))), None);
    }

    #[test]
    fn a_latch_a_person_cleared_is_not_restored() {
        let view = NodeView::of(&node(
            &[],
            &[("gpuremediation.dev/clear", &at(150).to_string())],
            vec![condition("GpuHealthy", "False", "XID79", at(100))],
        ));
        assert_eq!(view.latch_to_restore(None), None);
    }

    #[test]
    fn unknown_and_true_conditions_are_never_restored_as_latches() {
        for (status, reason) in [("Unknown", "NvmlUnavailable"), ("True", "GpusHealthy")] {
            let view = NodeView::of(&node(
                &[],
                &[],
                vec![condition("GpuHealthy", status, reason, at(100))],
            ));
            assert_eq!(view.latch_to_restore(None), None, "{status}");
        }
    }

    #[test]
    fn the_transition_time_moves_only_when_the_status_changes() {
        let previous = PublishedCondition {
            status: "True".to_owned(),
            reason: "GpusHealthy".to_owned(),
            message: "old".to_owned(),
            last_transition: at(0),
            annotations: NodeAnnotations::default(),
        };
        let same = PublishedCondition::next(
            &desired(ConditionStatus::True, "GpusHealthy"),
            Some(&previous),
            None,
            at(50),
            NodeAnnotations::default(),
        );
        assert_eq!(same.last_transition, at(0));
        assert!(same.differs_from(Some(&previous)), "the message changed");
        let flipped = PublishedCondition::next(
            &desired(ConditionStatus::Unknown, "NvmlUnavailable"),
            Some(&previous),
            None,
            at(60),
            NodeAnnotations::default(),
        );
        assert_eq!(flipped.last_transition, at(60));
        assert!(!flipped.differs_from(Some(&flipped.clone())));
    }

    #[test]
    fn a_latched_fault_is_dated_from_when_it_latched() {
        let latch = Latch {
            failed_gpus: Vec::new(),
            reason: "XID79".to_owned(),
            message: "m".to_owned(),
            since: at(7),
        };
        let written = PublishedCondition::next(
            &desired(ConditionStatus::False, "XID79"),
            None,
            Some(&latch),
            at(60),
            NodeAnnotations::default(),
        );
        assert_eq!(written.last_transition, at(7));
    }

    #[test]
    fn a_message_past_the_policys_bound_is_cut_to_it() {
        let mut long = desired(ConditionStatus::False, "NvmlUnavailable");
        long.message =
            "NVML calls failed: ".to_owned() + &"nvmlDeviceGetHandleByIndex: GPU_IS_LOST; ".repeat(200);
        let written = PublishedCondition::next(&long, None, None, at(1), NodeAnnotations::default());
        assert_eq!(written.message.len(), MESSAGE_LIMIT);
        assert!(long.message.starts_with(&written.message));
    }

    #[test]
    fn the_apply_body_carries_only_the_gpu_healthy_condition_and_the_agents_annotations() {
        let mut written = PublishedCondition {
            status: "False".to_owned(),
            reason: "GpuMissing".to_owned(),
            message: "GPU 1 gone".to_owned(),
            last_transition: at(0),
            annotations: NodeAnnotations::default(),
        };
        let body = written.apply_body("gpu-node-1", at(9));
        let conditions = body["status"]["conditions"].as_array().unwrap();
        assert_eq!(conditions.len(), 1);
        assert_eq!(conditions[0]["type"], "GpuHealthy");
        assert_eq!(conditions[0]["status"], "False");
        assert_eq!(conditions[0]["reason"], "GpuMissing");
        assert_eq!(conditions[0]["lastTransitionTime"], at(0).to_string());
        assert_eq!(conditions[0]["lastHeartbeatTime"], at(9).to_string());
        assert_eq!(body["metadata"], json!({"name": "gpu-node-1", "annotations": {}}));
        assert!(
            body.get("spec").is_none(),
            "never touches spec (taints are the controller's)"
        );
        written.annotations = NodeAnnotations {
            inventory: Some("[]".to_owned()),
            failed_gpus: Some(r#"[{"uuid":"GPU-1","reason":"GpuMissing"}]"#.to_owned()),
            gpu_pods: Some(r#"{"readAt":"2027-01-15T08:00:00Z"}"#.to_owned()),
        };
        let body = written.apply_body("gpu-node-1", at(9));
        assert_eq!(
            body["metadata"]["annotations"],
            json!({
                "gpuremediation.dev/gpu-inventory": "[]",
                "gpuremediation.dev/failed-gpus": r#"[{"uuid":"GPU-1","reason":"GpuMissing"}]"#,
                "gpuremediation.dev/gpu-pods": r#"{"readAt":"2027-01-15T08:00:00Z"}"#,
            })
        );
    }

    #[test]
    fn the_view_reads_our_annotations_and_a_restored_latch_names_the_recorded_gpus() {
        let failed = r#"[{"uuid":"GPU-1","serial":"S1","reason":"XID79"}]"#;
        let view = NodeView::of(&node(
            &[],
            &[
                ("gpuremediation.dev/failed-gpus", failed),
                ("gpuremediation.dev/gpu-inventory", "[]"),
            ],
            vec![condition("GpuHealthy", "False", "XID79", at(100))],
        ));
        assert_eq!(view.recorded_failed[0].serial.as_deref(), Some("S1"));
        let annotations = &view.condition.as_ref().unwrap().annotations;
        assert_eq!(annotations.failed_gpus.as_deref(), Some(failed));
        assert_eq!(annotations.inventory.as_deref(), Some("[]"));
        assert_eq!(view.latch_to_restore(None).unwrap().failed_gpus, ["GPU-1"]);
        let garbled = NodeView::of(&node(&[], &[("gpuremediation.dev/failed-gpus", "GPU-1")], vec![]));
        assert!(garbled.recorded_failed.is_empty());
        assert_eq!(garbled.problems.len(), 1);
    }
}
