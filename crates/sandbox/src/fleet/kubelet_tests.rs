//! Unit tests of the simulated kubelet's decisions (`next_step`, the status it reports).
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::*;

fn pod(json: Value) -> Pod {
    serde_json::from_value(json).unwrap()
}

fn terminating(annotation: Option<&str>) -> Pod {
    let mut pod = pod(json!({
        "metadata": { "name": "p", "uid": "u" },
        "spec": { "nodeName": "n", "containers": [{ "name": "c" }] },
        "status": { "phase": "Running" },
    }));
    pod.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
    if let Some(value) = annotation {
        pod.metadata.annotations = Some(BTreeMap::from([(
            SIM_TERMINATION_ANNOTATION.to_owned(),
            value.to_owned(),
        )]));
    }
    pod
}

#[test]
fn only_a_running_pod_held_by_a_finalizer_is_reported_failed_before_it_goes() {
    let mut job_pod = pod(
        json!({"metadata": {"name": "w", "finalizers": ["batch.kubernetes.io/job-tracking"]},
                                 "status": {"phase": "Running"}}),
    );
    assert!(reported_terminal_first(&job_pod));
    job_pod.status.as_mut().unwrap().phase = Some("Succeeded".into());
    assert!(
        !reported_terminal_first(&job_pod),
        "a finished pod keeps its phase"
    );
    let plain = pod(json!({"metadata": {"name": "p"}, "status": {"phase": "Running"}}));
    assert!(!reported_terminal_first(&plain));
}

#[test]
fn a_pending_pod_is_made_running() {
    let pending = pod(json!({
        "metadata": { "name": "p" },
        "spec": { "nodeName": "n", "containers": [{ "name": "c" }] },
        "status": { "phase": "Pending" },
    }));
    assert_eq!(next_step(&pending).0, KubeletStep::MakeRunning);
}

#[test]
fn a_running_pod_that_is_not_ready_is_made_ready() {
    let unready = pod(json!({
        "metadata": { "name": "p" },
        "spec": { "containers": [{ "name": "c" }] },
        "status": { "phase": "Running", "conditions": [{ "type": "Ready", "status": "False" }] },
    }));
    assert_eq!(next_step(&unready).0, KubeletStep::MakeRunning);
}

#[test]
fn a_running_ready_pod_is_left_alone() {
    let running = pod(json!({
        "metadata": { "name": "p" },
        "spec": { "containers": [{ "name": "c" }] },
        "status": { "phase": "Running", "conditions": [{ "type": "Ready", "status": "True" }] },
    }));
    assert_eq!(next_step(&running).0, KubeletStep::Nothing);
}

#[test]
fn a_finished_pod_is_left_alone() {
    let done = pod(json!({
        "metadata": { "name": "p" },
        "spec": { "containers": [{ "name": "c" }] },
        "status": { "phase": "Succeeded" },
    }));
    assert_eq!(next_step(&done).0, KubeletStep::Nothing);
}

#[test]
fn a_terminating_pod_is_finalised_at_once_by_default() {
    assert_eq!(
        next_step(&terminating(None)),
        (
            KubeletStep::Finalise {
                after: Duration::ZERO
            },
            None
        )
    );
}

#[test]
fn the_termination_annotation_delays_finalisation() {
    assert_eq!(
        next_step(&terminating(Some("1m30s"))).0,
        KubeletStep::Finalise {
            after: Duration::from_secs(90)
        }
    );
}

#[test]
fn the_termination_annotation_can_stall_a_pod_forever() {
    assert_eq!(next_step(&terminating(Some("stall"))).0, KubeletStep::Stall);
}

#[test]
fn an_unreadable_termination_annotation_finalises_at_once_and_says_why() {
    let (step, problem) = next_step(&terminating(Some("soon")));
    assert_eq!(
        step,
        KubeletStep::Finalise {
            after: Duration::ZERO
        }
    );
    assert!(problem.unwrap().contains("soon"));
}

#[test]
fn the_running_status_covers_every_container_and_completes_init_containers() {
    let two = pod(json!({
        "metadata": { "name": "p" },
        "spec": {
            "initContainers": [{ "name": "init" }],
            "containers": [{ "name": "a" }, { "name": "b" }],
        },
    }));
    let patch = running_status_patch(&two, "10.128.0.1", "10.64.0.1", Timestamp::UNIX_EPOCH);
    let status = &patch["status"];
    assert_eq!(status["phase"], "Running");
    assert_eq!(status["containerStatuses"].as_array().unwrap().len(), 2);
    assert_eq!(status["containerStatuses"][1]["ready"], true);
    assert_eq!(
        status["initContainerStatuses"][0]["state"]["terminated"]["exitCode"],
        0
    );
    assert!(
        status["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    );
}
