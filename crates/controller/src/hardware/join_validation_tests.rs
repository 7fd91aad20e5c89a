//! Unit tests of `join_validation`.
use k8s_openapi::api::core::v1::{NodeSpec, Taint};

use super::*;

const KEY: &str = "gpuremediation.dev/unvalidated";
const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).unwrap()
}

fn candidate(node: &str, joined: i64, job: JobSeen) -> Candidate {
    Candidate {
        node: node.to_owned(),
        joined: at(joined),
        job,
    }
}

fn names(steps: &[Step], start: bool) -> Vec<String> {
    steps
        .iter()
        .filter_map(|s| match s {
            Step::Start { node } if start => Some(node.clone()),
            Step::Queued { node, .. } if !start => Some(node.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn at_most_limit_validations_run_at_once_oldest_nodes_first() {
    let candidates = [
        candidate("late", 30, JobSeen::None),
        candidate("early", 10, JobSeen::None),
        candidate("busy", 0, JobSeen::Running { since: at(5) }),
        candidate("middle", 20, JobSeen::None),
    ];
    let steps = steps(&candidates, 3, TIMEOUT, at(60));
    assert_eq!(names(&steps, true), ["early", "middle"]);
    assert_eq!(names(&steps, false), ["late"]);
    let Some(Step::Queued { message, .. }) = steps.iter().find(|s| matches!(s, Step::Queued { .. })) else {
        panic!("{steps:?}");
    };
    assert!(
        message.contains("3 validation(s)") && message.contains("limit 3"),
        "{message}"
    );
}

#[test]
fn a_limit_of_zero_starts_nothing_and_says_so() {
    let steps = steps(&[candidate("n", 0, JobSeen::None)], 0, TIMEOUT, at(1));
    assert!(
        matches!(&steps[..], [Step::Queued { node, .. }] if node == "n"),
        "{steps:?}"
    );
}

#[test]
fn a_passed_job_lifts_the_taint_and_frees_its_room() {
    let candidates = [
        candidate("done", 0, JobSeen::Complete),
        candidate("next", 1, JobSeen::None),
    ];
    let steps = steps(&candidates, 1, TIMEOUT, at(60));
    assert_eq!(
        steps,
        [
            Step::Lift { node: "done".into() },
            Step::Start { node: "next".into() }
        ]
    );
}

#[test]
fn a_running_job_waits_until_its_deadline_then_times_out() {
    let running = [candidate("n", 0, JobSeen::Running { since: at(100) })];
    assert_eq!(
        steps(&running, 1, TIMEOUT, at(699)),
        [Step::Wait {
            node: "n".into(),
            deadline: at(700)
        }]
    );
    let late = steps(&running, 1, TIMEOUT, at(700));
    assert!(
        matches!(&late[..], [Step::Hold { outcome: ValidationOutcome::TimedOut, message, .. }] if message.contains("600s")),
        "{late:?}"
    );
}

#[test]
fn a_failed_or_lost_job_holds_the_node_and_takes_no_room() {
    let candidates = [
        candidate("broken", 0, JobSeen::Failed),
        candidate("gone", 1, JobSeen::Lost),
        candidate("next", 2, JobSeen::None),
    ];
    let steps = steps(&candidates, 1, TIMEOUT, at(60));
    assert!(
        matches!(&steps[0], Step::Hold { node, outcome: ValidationOutcome::Failed, .. } if node == "broken")
    );
    assert!(
        matches!(&steps[1], Step::Hold { node, outcome: ValidationOutcome::Failed, message } if node == "gone" && message.contains("deleted"))
    );
    assert_eq!(steps[2], Step::Start { node: "next".into() });
}

#[test]
fn a_jobs_status_reads_as_running_complete_failed_or_lost() {
    let created = at(3);
    let complete = serde_json::json!({"conditions": [{"type": "Complete", "status": "True"}]});
    let failed = serde_json::json!({"conditions": [{"type": "Failed", "status": "True", "message": "BackoffLimitExceeded"}]});
    let active = serde_json::json!({"active": 1});
    assert_eq!(seen(Some((Some(&complete), created)), true), JobSeen::Complete);
    assert_eq!(seen(Some((Some(&failed), created)), true), JobSeen::Failed);
    assert_eq!(
        seen(Some((Some(&active), created)), true),
        JobSeen::Running { since: created }
    );
    assert_eq!(
        seen(Some((None, created)), false),
        JobSeen::Running { since: created }
    );
    assert_eq!(seen(None, true), JobSeen::Lost);
    assert_eq!(seen(None, false), JobSeen::None);
}

fn taint(key: &str) -> Taint {
    Taint {
        key: key.to_owned(),
        effect: "NoSchedule".to_owned(),
        ..Taint::default()
    }
}

#[test]
fn lifting_removes_only_the_startup_taint() {
    let mut node = Node {
        spec: Some(NodeSpec {
            taints: Some(vec![
                taint("other.example/keep"),
                taint(KEY),
                taint("karpenter.sh/disrupted"),
            ]),
            ..NodeSpec::default()
        }),
        ..Node::default()
    };
    assert!(has_taint(&node, KEY));
    assert!(lift(&mut node, KEY));
    assert!(!has_taint(&node, KEY));
    let kept: Vec<_> = node
        .spec
        .unwrap()
        .taints
        .unwrap()
        .into_iter()
        .map(|t| t.key)
        .collect();
    assert_eq!(kept, ["other.example/keep", "karpenter.sh/disrupted"]);
    let mut bare = Node::default();
    assert!(!lift(&mut bare, KEY));
    assert!(!has_taint(&bare, KEY));
}

mod wiring {
    use std::sync::Arc;

    use gpu_remediation_api::{
        GpuRemediationPolicy, GpuRemediationPolicySpec,
        constants::{UNVALIDATED_TAINT_KEY, node_conditions::GPU_VALIDATED, validated_reasons},
    };
    use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeSpec, NodeStatus, Taint};
    use serde_json::json;

    use super::super::*;

    fn policy(
        name: &str,
        priority: i32,
        selector: &str,
        new_nodes: bool,
        mode: &str,
    ) -> Arc<GpuRemediationPolicy> {
        let mut validation = json!({
            "job": {"apiVersion": "batch/v1", "kind": "Job",
                    "metadata": {"name": "fixed", "namespace": "ops", "labels": {"team": "gpu"}},
                    "spec": {"template": {"spec": {"containers": [{"name": "diag", "image": "dcgm",
                        "args": ["dcgmi diag -r 2 # {{nodeName}} {{remediationName}}"]}]}}}},
            "timeout": "10m",
        });
        if new_nodes {
            validation["newNodes"] = json!({"max": 2});
        }
        let spec: GpuRemediationPolicySpec = serde_json::from_value(json!({
            "priority": priority,
            "mode": mode,
            "nodeSelector": {"matchLabels": {"pool": selector}},
            "triggers": [{"conditionType": "GpuHealthy", "status": "False"}],
            "validation": validation,
        }))
        .unwrap();
        let mut policy = GpuRemediationPolicy::new(name, spec);
        policy.metadata.uid = Some(format!("uid-{name}"));
        Arc::new(policy)
    }

    fn node(name: &str, pool: &str, tainted: bool, reason: Option<&str>) -> Arc<Node> {
        let mut node = Node::default();
        node.metadata.name = Some(name.to_owned());
        node.metadata.uid = Some(format!("uid-{name}"));
        node.metadata.labels = Some([("pool".to_owned(), pool.to_owned())].into());
        if tainted {
            node.spec = Some(NodeSpec {
                taints: Some(vec![Taint {
                    key: UNVALIDATED_TAINT_KEY.to_owned(),
                    effect: "NoSchedule".to_owned(),
                    ..Taint::default()
                }]),
                ..NodeSpec::default()
            });
        }
        if let Some(reason) = reason {
            node.status = Some(NodeStatus {
                conditions: Some(vec![NodeCondition {
                    type_: GPU_VALIDATED.to_owned(),
                    status: "Unknown".to_owned(),
                    reason: Some(reason.to_owned()),
                    ..NodeCondition::default()
                }]),
                ..NodeStatus::default()
            });
        }
        Arc::new(node)
    }

    fn names(governed: &[Governed<'_, Node>]) -> Vec<(String, Vec<String>)> {
        governed
            .iter()
            .map(|g| {
                (
                    g.policy.name_any(),
                    g.nodes.iter().map(|n| n.name_any()).collect(),
                )
            })
            .collect()
    }

    #[test]
    fn only_tainted_nodes_governed_by_an_enforcing_policy_with_new_nodes_are_validated() {
        let policies = vec![
            policy("gpus", 0, "a", true, "Enforce"),
            policy("plain", 0, "b", false, "Enforce"),
            policy("trial", 0, "c", true, "DryRun"),
            // Governs pool x and does not validate new nodes: x-new is nobody's to validate.
            policy("urgent", 10, "x", false, "Enforce"),
        ];
        let nodes = vec![
            node("a-new", "a", true, None),
            node("a-old", "a", false, None),
            node("b-new", "b", true, None),
            node("c-new", "c", true, None),
            node("x-new", "x", true, None),
        ];
        assert!(any_policy(&policies));
        assert_eq!(
            names(&governed(&policies, &nodes)),
            [("gpus".to_owned(), vec!["a-new".to_owned()])]
        );
        assert!(!any_policy(&policies[1..2]));
        assert!(governed(&policies[1..], &nodes).is_empty());
    }

    #[test]
    fn a_higher_priority_policy_takes_the_node_even_when_another_validates() {
        let policies = vec![policy("low", 0, "a", true, "Enforce"), {
            let mut p = GpuRemediationPolicy::clone(&policy("high", 5, "a", false, "Enforce"));
            p.metadata.name = Some("high".to_owned());
            Arc::new(p)
        }];
        let nodes = vec![node("n", "a", true, None)];
        assert!(governed(&policies, &nodes).is_empty());
    }

    #[test]
    fn the_condition_remembers_a_started_job_and_a_held_node_and_nothing_else() {
        assert_eq!(recorded(&node("n", "a", true, None)), Recorded::Nothing);
        assert_eq!(
            recorded(&node("n", "a", true, Some(validated_reasons::RUNNING))),
            Recorded::Started
        );
        for held in [validated_reasons::FAILED, validated_reasons::TIMED_OUT] {
            assert_eq!(recorded(&node("n", "a", true, Some(held))), Recorded::Held);
        }
        for other in [validated_reasons::QUEUED, validated_reasons::PASSED, "Forged"] {
            assert_eq!(recorded(&node("n", "a", true, Some(other))), Recorded::Nothing);
        }
    }

    #[test]
    fn a_held_node_takes_no_step_and_no_room() {
        let candidates = [
            Candidate {
                node: "held".into(),
                joined: super::at(0),
                job: JobSeen::Held,
            },
            Candidate {
                node: "next".into(),
                joined: super::at(1),
                job: JobSeen::None,
            },
        ];
        assert_eq!(
            steps(&candidates, 1, super::TIMEOUT, super::at(5)),
            [Step::Start { node: "next".into() }]
        );
    }

    #[test]
    fn the_job_is_named_after_the_node_s_uid_and_fits_a_job_name() {
        let short = job_name("gpu-1", "uid-1");
        assert!(short.starts_with("gpu-1-validate-new-"), "{short}");
        assert_ne!(
            short,
            job_name("gpu-1", "uid-2"),
            "a node registered again is validated again"
        );
        assert_eq!(
            short,
            job_name("gpu-1", "uid-1"),
            "stable across passes and restarts"
        );
        let long = job_name(&"n".repeat(253), "uid");
        assert_eq!(long.len(), crate::lifecycle::node_job::JOB_NAME_MAX, "{long}");
        assert!(!job_name(&format!("{}-.x", "a".repeat(34)), "u").contains("-.-"));
    }

    #[test]
    fn the_job_is_the_policy_s_pinned_to_the_node_named_for_it_and_owned_by_the_policy() {
        let policy = policy("gpus", 0, "a", true, "Enforce");
        let validation = policy.spec.validation.as_ref().unwrap();
        let job = job_object(validation, &policy, "gpu-1", "uid-1").unwrap();
        let name = job_name("gpu-1", "uid-1");
        assert_eq!(
            job["metadata"]["name"],
            json!(name),
            "the template's fixed name is not kept"
        );
        assert_eq!(job["metadata"]["namespace"], json!("ops"));
        assert_eq!(job["metadata"]["labels"]["team"], json!("gpu"));
        let pod = &job["spec"]["template"];
        assert_eq!(pod["spec"]["nodeName"], json!("gpu-1"));
        assert_eq!(pod["metadata"]["labels"][POD_LABEL], json!("true"));
        assert_eq!(pod["spec"]["tolerations"], json!([{"operator": "Exists"}]));
        assert_eq!(job["spec"]["activeDeadlineSeconds"], json!(600));
        assert_eq!(
            pod["spec"]["containers"][0]["args"][0],
            json!(format!("dcgmi diag -r 2 # gpu-1 {name}"))
        );
        assert_eq!(
            job["metadata"]["ownerReferences"],
            json!([{"apiVersion": "gpuremediation.dev/v1alpha1", "kind": "GpuRemediationPolicy",
                    "name": "gpus", "uid": "uid-gpus", "controller": true}])
        );
        let mut unknown = GpuRemediationPolicy::clone(&policy);
        unknown.metadata.uid = None;
        assert_eq!(job_object(validation, &unknown, "gpu-1", "uid-1"), None);
    }
}
