//! The peer comparison's results and what is read from the cluster to make them, pure: why a pod
//! left (its `DisruptionTarget`), the evictions and deletes an identity made (the audit log),
//! whether a repairer has acted on a node, and the Markdown table.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod};

/// What one fleet's repairer did, in seconds from the fault (`None`: not within the deadline).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct PeerFleetResult {
    /// `Karpenter node repair` or `gpu-remediator (DeleteNodeClaim)`.
    pub peer: String,
    /// The fleet.
    pub fleet: String,
    /// The broken node.
    pub broken_node: String,
    /// The repairer's first act on the broken node: cordoned, tainted by a repairer, or its
    /// `NodeClaim` deleted.
    pub first_action_s: Option<f64>,
    /// The broken node's `NodeClaim` marked for deletion.
    pub claim_deleted_s: Option<f64>,
    /// The first node launched after the fault reported `Ready`.
    pub replacement_ready_s: Option<f64>,
    /// The broken node deleted.
    pub broken_node_gone_s: Option<f64>,
    /// Both training pods Ready again, none on the broken node.
    pub workload_restored_s: Option<f64>,
    /// `NodeClaim`s created after the fault.
    pub new_node_claims: usize,
    /// Pods of the fleet's namespace the audit log shows evicted (`create pods/eviction`
    /// answered 201) by the repairer's identity.
    pub audited_evictions: u64,
    /// Pods of the fleet's namespace the audit log shows deleted (`delete pods`) by the
    /// repairer's identity.
    pub audited_deletes: u64,
    /// Departed pods by their `DisruptionTarget` reason (`EvictionByEvictionAPI`,
    /// `DeletionByTaintManager`, ...; `none` for a plain delete).
    pub departures: BTreeMap<String, usize>,
    /// PDB floor breaches the sampler saw.
    pub pdb_violations: usize,
    /// The smallest healthy-minus-floor seen.
    pub least_margin: i64,
    /// Training pods that had to start again (each departed pod is recreated by its Deployment).
    pub pods_restarted: usize,
    /// Whether the pod on the healthy node ran throughout.
    pub healthy_pod_untouched: bool,
}

/// Both fleets, side by side.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct PeerComparison {
    /// The fault, as written.
    pub fault: String,
    /// The policy trigger's `for`.
    pub trigger_for: String,
    /// Karpenter's toleration (hard-coded by its KWOK provider).
    pub karpenter_toleration_s: u64,
    /// The Karpenter fleet.
    pub karpenter: PeerFleetResult,
    /// The policy fleet.
    pub policy: PeerFleetResult,
    /// `/proc/loadavg` when the fault was set and when the run ended.
    pub load: Vec<String>,
    /// Karpenter's log lines about the broken nodes (repair, termination).
    pub karpenter_log: Vec<String>,
}

/// Why a departed pod left, from its `DisruptionTarget` condition: the API server sets
/// `EvictionByEvictionAPI` on an eviction, kube-controller-manager `DeletionByTaintManager` or
/// `DeletionByPodGC`; a plain `DELETE` sets none.
#[must_use]
pub fn departure_reason(pod: &Pod) -> String {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| {
            cs.iter()
                .find(|c| c.type_ == "DisruptionTarget" && c.status == "True")
        })
        .and_then(|c| c.reason.clone())
        .unwrap_or_else(|| "none".to_owned())
}

/// Pod evictions (answered 201) and pod deletes `username` made in `namespace`, from a slice of
/// the audit log.
#[must_use]
pub fn pod_removals(log: &str, username: &str, namespace: &str) -> (u64, u64) {
    let (mut evictions, mut deletes) = (0, 0);
    for line in log.lines() {
        let Ok(event) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let text = |pointer: &str| event.pointer(pointer).and_then(serde_json::Value::as_str);
        if text("/user/username") != Some(username)
            || text("/stage") != Some("ResponseComplete")
            || text("/objectRef/namespace") != Some(namespace)
            || text("/objectRef/resource") != Some("pods")
        {
            continue;
        }
        let code = event
            .pointer("/responseStatus/code")
            .and_then(serde_json::Value::as_u64);
        match (text("/verb"), text("/objectRef/subresource"), code) {
            (Some("create"), Some("eviction"), Some(201)) => evictions += 1,
            (Some("delete"), None, Some(200 | 202)) => deletes += 1,
            _ => {}
        }
    }
    (evictions, deletes)
}

/// Whether a repairer has acted on `node`: cordoned, or tainted with a taint that neither the
/// node-lifecycle controller (`node.kubernetes.io/...`) nor the fault put there.
#[must_use]
pub fn repairer_acted(node: &Node) -> bool {
    let spec = node.spec.as_ref();
    spec.and_then(|s| s.unschedulable).unwrap_or(false)
        || spec
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|ts| ts.iter().any(|t| !t.key.starts_with("node.kubernetes.io/")))
}

fn seconds(value: Option<f64>) -> String {
    value.map_or_else(|| "not within the deadline".to_owned(), |s| format!("{s:.0} s"))
}

/// The peer table, in Markdown.
#[must_use]
pub fn markdown(c: &PeerComparison) -> String {
    use std::fmt::Write as _;
    let mut out = format!(
        "### Karpenter's node repair against the policy (fault: {}; Karpenter tolerates {} s, the policy's `for` is {})\n\n",
        c.fault, c.karpenter_toleration_s, c.trigger_for
    );
    let _ = write!(
        out,
        "| | {} | {} |\n|---|---|---|\n",
        c.karpenter.peer, c.policy.peer
    );
    let row = |out: &mut String, name: &str, f: &dyn Fn(&PeerFleetResult) -> String| {
        let _ = writeln!(out, "| {name} | {} | {} |", f(&c.karpenter), f(&c.policy));
    };
    row(&mut out, "fault → first act on the node", &|r| {
        seconds(r.first_action_s)
    });
    row(&mut out, "fault → NodeClaim deleted", &|r| {
        seconds(r.claim_deleted_s)
    });
    row(&mut out, "fault → replacement node Ready", &|r| {
        seconds(r.replacement_ready_s)
    });
    row(&mut out, "fault → broken node gone", &|r| {
        seconds(r.broken_node_gone_s)
    });
    row(&mut out, "fault → both pods Ready again", &|r| {
        seconds(r.workload_restored_s)
    });
    row(&mut out, "NodeClaims created", &|r| r.new_node_claims.to_string());
    row(&mut out, "pods evicted (Eviction API, audit log)", &|r| {
        r.audited_evictions.to_string()
    });
    row(&mut out, "pods deleted (DELETE, audit log)", &|r| {
        r.audited_deletes.to_string()
    });
    row(&mut out, "departed pods by DisruptionTarget reason", &|r| {
        if r.departures.is_empty() {
            "none".to_owned()
        } else {
            r.departures
                .iter()
                .map(|(k, v)| format!("{k}: {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        }
    });
    row(&mut out, "PDB floor breaches (sampler)", &|r| {
        format!("{} (least margin {})", r.pdb_violations, r.least_margin)
    });
    row(&mut out, "training pods restarted", &|r| {
        r.pods_restarted.to_string()
    });
    row(&mut out, "pod on the healthy node untouched", &|r| {
        r.healthy_pod_untouched.to_string()
    });
    let _ = writeln!(out, "\nLoad average (fault, end): {}", c.load.join(" / "));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod_with_condition(reason: Option<&str>) -> Pod {
        let conditions = reason.map_or_else(Vec::new, |r| {
            vec![serde_json::json!({"type": "DisruptionTarget", "status": "True", "reason": r})]
        });
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "status": {"conditions": conditions},
        }))
        .expect("a pod")
    }

    #[test]
    fn a_pod_without_a_disruption_target_was_deleted_plainly() {
        assert_eq!(departure_reason(&pod_with_condition(None)), "none");
        assert_eq!(
            departure_reason(&pod_with_condition(Some("EvictionByEvictionAPI"))),
            "EvictionByEvictionAPI"
        );
    }

    fn event(user: &str, verb: &str, namespace: &str, subresource: Option<&str>, code: u64) -> String {
        let mut object = serde_json::json!({"resource": "pods", "namespace": namespace, "name": "p"});
        if let Some(sub) = subresource {
            object["subresource"] = serde_json::json!(sub);
        }
        serde_json::json!({
            "stage": "ResponseComplete", "verb": verb, "user": {"username": user},
            "objectRef": object, "responseStatus": {"code": code},
        })
        .to_string()
    }

    #[test]
    fn removals_count_granted_evictions_and_deletes_of_one_user_in_one_namespace() {
        let log = [
            event("k", "create", "a", Some("eviction"), 201),
            event("k", "create", "a", Some("eviction"), 429),
            event("k", "delete", "a", None, 200),
            event("k", "delete", "b", None, 200),
            event("other", "delete", "a", None, 200),
            event("k", "get", "a", None, 200),
        ]
        .join("\n");
        assert_eq!(pod_removals(&log, "k", "a"), (1, 1));
        assert_eq!(pod_removals(&log, "k", "b"), (0, 1));
    }

    #[test]
    fn lifecycle_taints_are_not_a_repairers_act_but_a_cordon_or_karpenters_taint_is() {
        let node = |spec: serde_json::Value| -> Node {
            serde_json::from_value(serde_json::json!({"metadata": {"name": "n"}, "spec": spec}))
                .expect("a node")
        };
        assert!(!repairer_acted(&node(serde_json::json!({
            "taints": [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]
        }))));
        assert!(repairer_acted(&node(serde_json::json!({"unschedulable": true}))));
        assert!(repairer_acted(&node(serde_json::json!({
            "taints": [{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]
        }))));
    }

    #[test]
    fn the_table_says_what_did_not_happen_within_the_deadline() {
        let comparison = PeerComparison {
            trigger_for: "1m".to_owned(),
            karpenter: PeerFleetResult {
                peer: "Karpenter node repair".to_owned(),
                ..PeerFleetResult::default()
            },
            policy: PeerFleetResult {
                peer: "gpu-remediator (DeleteNodeClaim)".to_owned(),
                replacement_ready_s: Some(62.2),
                audited_evictions: 1,
                departures: BTreeMap::from([("EvictionByEvictionAPI".to_owned(), 1)]),
                ..PeerFleetResult::default()
            },
            ..PeerComparison::default()
        };
        let table = markdown(&comparison);
        assert!(
            table.contains("| fault → replacement node Ready | not within the deadline | 62 s |"),
            "{table}"
        );
        assert!(
            table.contains("| departed pods by DisruptionTarget reason | none | EvictionByEvictionAPI: 1 |"),
            "{table}"
        );
    }
}
