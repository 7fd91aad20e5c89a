use super::*;
use k8s_openapi::api::core::v1::Node;

fn at(seconds: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + seconds).expect("valid timestamp")
}

fn observed(target: Presence, node: Presence) -> Observation {
    Observation {
        target,
        node,
        reported: Reported::Nothing,
        replacement: ReplacementNode::NotExpected,
    }
}

fn judge_at(strategy: Strategy, observation: &Observation, node_healthy: bool, now: i64) -> Progress {
    judge(&Verification {
        strategy,
        observation,
        node_healthy,
        triggered_at: at(0),
        timeout: Duration::from_secs(600),
        now: at(now),
    })
}

fn is_waiting(progress: &Progress) -> bool {
    matches!(progress, Progress::Waiting { .. })
}

#[test]
fn a_deleted_node_that_is_gone_succeeds_only_once_a_replacement_joined_ready() {
    let mut gone = observed(Presence::Gone, Presence::Gone);
    // Nothing seen yet.
    gone.replacement = ReplacementNode::Awaited;
    assert_eq!(
        judge_at(Strategy::DeleteNode, &gone, false, 5),
        Progress::Waiting {
            message: "the node is gone; waiting for a replacement to join".to_owned()
        }
    );
    gone.replacement = ReplacementNode::Joined {
        node: "gpu-new".into(),
        ready: false,
    };
    assert!(is_waiting(&judge_at(Strategy::DeleteNode, &gone, false, 5)));
    gone.replacement = ReplacementNode::Joined {
        node: "gpu-new".into(),
        ready: true,
    };
    assert_eq!(
        judge_at(Strategy::DeleteNode, &gone, false, 5),
        Progress::Succeeded {
            message: "the node is gone and its replacement gpu-new is Ready".to_owned()
        }
    );
}

#[test]
fn a_deleted_node_gone_with_no_replacement_by_the_timeout_ends_gone_unseen_not_failed() {
    let gone = Observation {
        replacement: ReplacementNode::Awaited,
        ..observed(Presence::Gone, Presence::Gone)
    };
    let Progress::GoneUnseen { message } = judge_at(Strategy::DeleteNode, &gone, false, 600) else {
        panic!("gone, unseen expected");
    };
    assert_eq!(
        message,
        "gone, replacement not seen: the node was deleted but no new Ready node the policy selects joined \
         within 600s (the node is gone; waiting for a replacement to join)"
    );
    // Still there at the timeout: that is a failure, as before.
    let lingering = observed(Presence::Deleting, Presence::Deleting);
    assert!(matches!(
        judge_at(Strategy::DeleteNode, &lingering, false, 600),
        Progress::Failed {
            reason: REPLACEMENT_TIMEOUT,
            ..
        }
    ));
}

fn joining(name: &str, uid: &str, created: i64, ready: bool, group: &str) -> Node {
    Node {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            uid: Some(uid.into()),
            creation_timestamp: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at(created))),
            labels: Some([("group".to_owned(), group.to_owned())].into()),
            ..kube::api::ObjectMeta::default()
        },
        spec: None,
        status: Some(k8s_openapi::api::core::v1::NodeStatus {
            conditions: Some(vec![k8s_openapi::api::core::v1::NodeCondition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
    }
}

#[test]
fn a_replacement_is_a_selected_node_of_another_uid_created_at_or_after_the_delete() {
    let selects = |n: &Node| {
        n.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("group"))
            .is_some_and(|g| g == "a")
    };
    let seen = |nodes: &[Node]| replacement_seen(nodes, selects, Some("old"), at(100));
    // Older nodes, other groups and the deleted machine itself are no replacement.
    let none = [
        joining("gpu-1", "uid-1", 50, true, "a"),
        joining("gpu-2", "uid-2", 150, true, "b"),
        joining("gpu-9", "old", 150, true, "a"),
    ];
    assert_eq!(seen(&none), ReplacementNode::Awaited);
    // Re-registered under the deleted node's name, not Ready yet; then another one Ready.
    let mut joined = vec![joining("gpu-9", "new", 100, false, "a")];
    assert_eq!(
        seen(&joined),
        ReplacementNode::Joined {
            node: "gpu-9".into(),
            ready: false
        }
    );
    joined.push(joining("gpu-10", "uid-10", 160, true, "a"));
    assert_eq!(
        seen(&joined),
        ReplacementNode::Joined {
            node: "gpu-10".into(),
            ready: true
        }
    );
}

#[test]
fn a_node_still_terminating_is_not_yet_replaced() {
    let deleting = observed(Presence::Deleting, Presence::Deleting);
    assert!(is_waiting(&judge_at(Strategy::DeleteNode, &deleting, false, 5)));
}

#[test]
fn a_deleted_machine_whose_node_lingers_is_not_yet_replaced() {
    let machine_gone = observed(Presence::Gone, Presence::Present);
    assert_eq!(
        judge_at(Strategy::DeleteMachine, &machine_gone, false, 5),
        Progress::Waiting {
            message: "waiting for the node to be deleted".to_owned()
        }
    );
}

/// Whether a `DeleteMachine` replacement observed as `observation` still waits at `now`.
fn machine_waits(observation: &Observation, now: i64) -> bool {
    is_waiting(&judge_at(Strategy::DeleteMachine, observation, false, now))
}

#[test]
fn a_machine_set_replacement_must_be_ready_before_success() {
    let mut observation = observed(Presence::Gone, Presence::Gone);
    observation.replacement = ReplacementNode::Awaited;
    assert!(machine_waits(&observation, 5));
    let joined = |ready| ReplacementNode::Joined {
        node: "gpu-9".to_owned(),
        ready,
    };
    observation.replacement = joined(false);
    assert!(machine_waits(&observation, 5));
    observation.replacement = joined(true);
    assert_eq!(
        judge_at(Strategy::DeleteMachine, &observation, false, 5),
        Progress::Succeeded {
            message: "the node is gone and its replacement gpu-9 is Ready".to_owned()
        }
    );
}

#[test]
fn a_replacement_that_never_finishes_fails_at_the_timeout_naming_what_it_waited_for() {
    let mut observation = observed(Presence::Gone, Presence::Gone);
    observation.replacement = ReplacementNode::Awaited;
    assert!(machine_waits(&observation, 599));
    assert_eq!(
        judge_at(Strategy::DeleteMachine, &observation, false, 600),
        Progress::Failed {
            reason: REPLACEMENT_TIMEOUT,
            message: "the replacement did not finish within 600s: the node is gone; waiting for a replacement to join"
                .to_owned()
        }
    );
}

#[test]
fn a_finished_replacement_is_not_failed_by_a_late_look() {
    let gone = observed(Presence::Gone, Presence::Gone);
    assert!(matches!(
        judge_at(Strategy::DeleteNodeClaim, &gone, false, 10_000),
        Progress::Succeeded { .. }
    ));
}

#[test]
fn a_template_object_reporting_done_succeeds() {
    let mut observation = observed(Presence::Present, Presence::Present);
    observation.reported = Reported::Done("condition Succeeded=True".to_owned());
    assert_eq!(
        judge_at(Strategy::Template, &observation, false, 5),
        Progress::Succeeded {
            message: "the template's object reported condition Succeeded=True".to_owned()
        }
    );
}

#[test]
fn a_template_object_reporting_failure_fails() {
    let mut observation = observed(Presence::Present, Presence::Present);
    observation.reported = Reported::Failed("phase Failed".to_owned());
    assert!(matches!(
        judge_at(Strategy::Template, &observation, false, 5),
        Progress::Failed {
            reason: REPLACEMENT_FAILED,
            ..
        }
    ));
}

#[test]
fn a_template_succeeds_when_the_node_is_healthy_again() {
    let mut observation = observed(Presence::Present, Presence::Present);
    observation.reported = Reported::InProgress;
    assert!(is_waiting(&judge_at(Strategy::Template, &observation, false, 5)));
    assert!(matches!(
        judge_at(Strategy::Template, &observation, true, 5),
        Progress::Succeeded { .. }
    ));
}

#[test]
fn a_template_object_deleted_before_reporting_done_fails() {
    let observation = observed(Presence::Gone, Presence::Present);
    assert!(matches!(
        judge_at(Strategy::Template, &observation, false, 5),
        Progress::Failed {
            reason: REPLACEMENT_FAILED,
            ..
        }
    ));
}

#[test]
fn a_template_that_never_reports_times_out() {
    let mut observation = observed(Presence::Present, Presence::Present);
    observation.reported = Reported::InProgress;
    assert!(matches!(
        judge_at(Strategy::Template, &observation, false, 600),
        Progress::Failed {
            reason: REPLACEMENT_TIMEOUT,
            ..
        }
    ));
}

#[test]
fn the_trigger_time_is_the_last_entry_into_replacing() {
    use gpu_remediation_api::remediation::PhaseTransition;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    let entered = |phase, seconds| PhaseTransition {
        phase,
        at: Time(at(seconds)),
        message: None,
    };
    let mut status = GpuRemediationStatus {
        phase_history: vec![entered(Phase::Cordoned, 1), entered(Phase::Draining, 2)],
        ..GpuRemediationStatus::default()
    };
    assert_eq!(replacing_since(&status), None);
    status.phase_history.push(entered(Phase::Replacing, 30));
    status.phase_history.push(entered(Phase::Verifying, 31));
    assert_eq!(replacing_since(&status), Some(at(30)));
}

#[test]
fn a_node_is_ready_only_with_a_true_ready_condition() {
    use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};
    let with = |status: &str| Node {
        status: Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".to_owned(),
                status: status.to_owned(),
                ..NodeCondition::default()
            }]),
            ..NodeStatus::default()
        }),
        ..Node::default()
    };
    assert!(node_is_ready(&with("True")));
    assert!(!node_is_ready(&with("Unknown")));
    assert!(!node_is_ready(&Node::default()));
}
