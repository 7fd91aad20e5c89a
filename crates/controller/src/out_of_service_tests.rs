//! Which nodes get the out-of-service taint and which lose it.

use gpu_remediation_api::{GpuRemediationStatus, ladder::StepRecord, object_reference::ObjectReference};
use k8s_openapi::{api::core::v1::NodeCondition, apimachinery::pkg::apis::meta::v1::Time};

use super::*;
use crate::{
    cordon::tests::taint_keys,
    test_fixtures::{at, node, remediation},
};

/// Another actor's taints: the Node Readiness Controller's and the cloud provider's.
const READINESS: &str = "readiness.k8s.io/gpu-driver-ready";
const CLOUD_SHUTDOWN: &str = "node.cloudprovider.kubernetes.io/shutdown";

fn machine() -> ObjectReference {
    ObjectReference {
        api_version: "cluster.x-k8s.io/v1beta1".into(),
        kind: "Machine".into(),
        name: "gpu-1-abcde".into(),
        namespace: Some("capi".into()),
        uid: None,
    }
}

/// Sets the node's `Ready` condition to `status` since `since`.
pub(crate) fn set_ready(node: &mut Node, status: &str, since: Timestamp) {
    node.status
        .get_or_insert_with(Default::default)
        .conditions
        .get_or_insert_with(Vec::new)
        .push(NodeCondition {
            type_: "Ready".into(),
            status: status.into(),
            last_transition_time: Some(Time(since)),
            ..NodeCondition::default()
        });
}

/// Node gpu-1 with `Ready=<status>` since `since`, carrying the other actors' taints.
fn with_ready(status: &str, since: i64) -> Node {
    let mut n = node("gpu-1", Some(at(-600)));
    set_ready(&mut n, status, at(since));
    n.spec = crate::cordon::tests::node(false, &[READINESS, CLOUD_SHUTDOWN]).spec;
    n
}

const SHUT: Option<(&str, &str)> = Some(("r-1", "its Replace was triggered (Machine gpu-1-abcde)"));

#[test]
fn a_replaced_node_unreachable_and_its_lease_stale_past_the_bound_gets_the_taint() {
    let n = with_ready("Unknown", 0);
    let Verdict::Add { remediation, why } = decide(&n, SHUT, Some(at(-10)), at(60)) else {
        panic!("expected the taint");
    };
    assert_eq!(remediation, "r-1");
    assert!(
        why.contains("Machine gpu-1-abcde") && why.contains("Ready=Unknown"),
        "{why}"
    );
    assert!(
        matches!(decide(&n, SHUT, None, at(60)), Verdict::Add { .. }),
        "a Lease gone is not a renewal"
    );
}

#[test]
fn a_node_whose_kubelet_reports_or_that_was_not_shut_down_never_gets_it() {
    for status in ["True", "False"] {
        assert!(
            matches!(
                decide(&with_ready(status, 0), SHUT, None, at(600)),
                Verdict::Keep(_)
            ),
            "Ready={status}: its kubelet still runs"
        );
    }
    assert!(matches!(
        decide(&with_ready("Unknown", 0), None, None, at(600)),
        Verdict::Keep(_)
    ));
}

#[test]
fn it_waits_for_the_bound_on_both_the_ready_condition_and_the_lease() {
    let n = with_ready("Unknown", 0);
    assert_eq!(decide(&n, SHUT, None, at(59)), Verdict::Wait(at(60)));
    assert_eq!(
        decide(&n, SHUT, Some(at(30)), at(60)),
        Verdict::Wait(at(90)),
        "a Lease renewed 30s ago: the node may be partitioned from the node lifecycle controller only"
    );
}

#[test]
fn adding_and_lifting_touch_only_our_taint_and_lift_waits_for_the_node_to_report() {
    let mut n = with_ready("Unknown", 0);
    assert!(add(&mut n, "r-1"));
    assert!(!add(&mut n, "r-1"), "a second add changes nothing");
    assert_eq!(
        taint_keys(&n),
        [READINESS, CLOUD_SHUTDOWN, OUT_OF_SERVICE_TAINT_KEY]
    );
    let taint = n.spec.as_ref().unwrap().taints.as_ref().unwrap()[2].clone();
    assert_eq!(
        (taint.value.as_deref(), taint.effect.as_str()),
        (Some("nodeshutdown"), "NoExecute")
    );
    assert_eq!(
        decide(&n, SHUT, None, at(600)),
        Verdict::Keep("the node is still down".into())
    );

    // The node reports again (a reboot), and the readiness controller's taint changed meanwhile.
    let mut back = with_ready("True", 700);
    back.metadata.annotations = n.metadata.annotations.clone();
    back.spec.as_mut().unwrap().taints = n.spec.as_ref().unwrap().taints.clone();
    back.spec.as_mut().unwrap().taints.as_mut().unwrap()[0].effect = "NoExecute".into();
    assert_eq!(decide(&back, SHUT, None, at(701)), Verdict::Lift);
    let theirs = back.spec.as_ref().unwrap().taints.as_ref().unwrap()[..2].to_vec();
    assert!(lift(&mut back));
    assert_eq!(back.spec.as_ref().unwrap().taints.as_ref().unwrap(), &theirs);
    assert!(!back.annotations().contains_key(OUT_OF_SERVICE_BY_ANNOTATION));
}

#[test]
fn another_actors_out_of_service_taint_is_neither_claimed_nor_lifted() {
    let mut n = with_ready("True", 0);
    n.spec.as_mut().unwrap().taints.as_mut().unwrap().push(Taint {
        key: OUT_OF_SERVICE_TAINT_KEY.into(),
        value: Some("nodeshutdown".into()),
        effect: "NoExecute".into(),
        ..Taint::default()
    });
    let before = n.clone();
    assert!(matches!(decide(&n, SHUT, None, at(600)), Verdict::Keep(_)));
    assert!(!lift(&mut n));
    assert!(!add(&mut n, "r-1"));
    assert_eq!(n, before);
}

#[test]
fn a_triggered_replacement_reboot_or_ladder_step_shuts_the_node_down_a_drain_does_not() {
    let mut r = remediation("r-1", "gpu-1", "p", Some(at(0)), Action::Replace);
    assert_eq!(shut_down_by(&r), None, "no status yet");
    r.status = Some(GpuRemediationStatus::default());
    assert_eq!(shut_down_by(&r), None, "not triggered yet");
    r.status.as_mut().unwrap().replacement = Some(machine());
    assert!(shut_down_by(&r).is_some_and(|w| w.contains("Machine gpu-1-abcde")));

    let mut none = remediation("r-2", "gpu-1", "p", Some(at(0)), Action::None);
    none.status = Some(GpuRemediationStatus {
        replacement: Some(machine()),
        ..GpuRemediationStatus::default()
    });
    assert_eq!(shut_down_by(&none), None, "action None shuts nothing down");
    let step = |rung: Rung| StepRecord {
        step: rung,
        start: Time(at(0)),
        end: None,
        outcome: None,
        message: None,
        object: Some(machine()),
        evidence: gpu_remediation_api::ladder::StepEvidence::default(),
        evicted_pods: Vec::new(),
    };
    none.status.as_mut().unwrap().steps = vec![step(Rung::ResetGpu)];
    assert_eq!(shut_down_by(&none), None, "a GPU reset leaves the node up");
    none.status.as_mut().unwrap().steps.push(step(Rung::Reboot));
    assert!(shut_down_by(&none).is_some_and(|w| w.contains("Reboot step")));

    // Finished, it shut nothing down now: an outage of the node after it is not its doing.
    for phase in [
        gpu_remediation_api::Phase::Succeeded,
        gpu_remediation_api::Phase::Failed,
    ] {
        none.status.as_mut().unwrap().phase = phase;
        assert_eq!(shut_down_by(&none), None, "{phase:?}");
    }
}
