//! Drain for gangs on the real control plane: a 3-pod indexed `Job` (kube-controller-manager's
//! job controller), one member per node. One node's GPU fails. Under `drain.gangs: Together` the
//! members on the two healthy nodes are evicted through the Eviction API within seconds of the
//! record's admission (so the job restarts at once instead of after its collective timeout), the
//! two nodes are never cordoned, and the record names the gang, its nodes and the members it
//! evicted. Under `Members` (the default) only the failing node's member leaves. The same with
//! upstream `JobSet` is `real_jobset.rs` (`make e2e-real`).

mod common;
mod scenario;

use std::time::Duration;

use common::eventually;
use gpu_remediation_api::GpuRemediation;
use gpu_sandbox::fleet::gang;
use k8s_openapi::api::{batch::v1::Job, core::v1::Pod};
use kube::{
    Api, ResourceExt,
    api::{ListParams, PostParams},
};
use scenario::{RunningController, Scenario, evicted_through_the_api, gangs_of, is_unschedulable};
use serde_json::json;

/// An indexed `Job` of 3 pods, one per node of the fleet (required anti-affinity), never ending,
/// its pods annotated with `annotations` (the simulated kubelet's gang behaviour,
/// `gpu_sandbox::fleet::gang`).
async fn gang(s: &Scenario, annotations: &serde_json::Value) -> Vec<Pod> {
    let job: Job = serde_json::from_value(gang::indexed_job(
        &s.namespace,
        "train",
        (3, 0),
        s.fleet.name(),
        10,
        annotations,
    ))
    .unwrap();
    Api::<Job>::namespaced(s.client.clone(), &s.namespace)
        .create(&PostParams::default(), &job)
        .await
        .unwrap();
    let pods = Api::<Pod>::namespaced(s.client.clone(), &s.namespace);
    eventually(
        "the gang's 3 members running",
        Duration::from_secs(60),
        || async {
            let listed = pods
                .list(&ListParams::default().labels("app=train"))
                .await
                .unwrap()
                .items;
            let running: Vec<Pod> = listed
                .into_iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .collect();
            (running.len() == 3).then_some(running)
        },
    )
    .await
}

fn node_of(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default()
}

/// The gang's pods as they are now, by UID.
async fn members_now(s: &Scenario, members: &[Pod]) -> Vec<Option<Pod>> {
    let listed = Api::<Pod>::namespaced(s.client.clone(), &s.namespace)
        .list(&ListParams::default().labels("app=train"))
        .await
        .unwrap()
        .items;
    members
        .iter()
        .map(|m| listed.iter().find(|p| p.uid() == m.uid()).cloned())
        .collect()
}

/// Runs the gang, breaks the GPU of the node holding its member of index 0 under a policy with
/// `drain` merged in, and waits for the record to name the gang. The broken node, the other
/// members, the record.
async fn break_under(
    s: &Scenario,
    drain: serde_json::Value,
    annotations: &serde_json::Value,
) -> (RunningController, String, Vec<Pod>, GpuRemediation) {
    let members = gang(s, annotations).await;
    let first = members
        .iter()
        .find(|p| {
            p.annotations()
                .get(gpu_remediation_api::constants::gang_labels::COMPLETION_INDEX)
                .map(String::as_str)
                == Some("0")
        })
        .expect("index 0");
    let broken = node_of(first);
    let others: Vec<Pod> = members.iter().filter(|p| node_of(p) != broken).cloned().collect();
    assert_eq!(others.len(), 2);
    s.policy(json!({"drain": drain, "safety": {"maxUnhealthy": "100%"}}))
        .await;
    let controller = RunningController::start(&s.scope).await;
    s.break_gpu(&broken).await;
    let record = eventually("the record names the gang", Duration::from_secs(60), || async {
        let record = s.remediation_of(&broken).await?;
        (!gangs_of(&record).is_empty()).then_some(record)
    })
    .await;
    (controller, broken, others, record)
}

#[tokio::test]
async fn together_evicts_the_gangs_members_on_healthy_nodes_within_seconds_and_never_cordons_them() {
    let s = Scenario::new(3).await;
    let (controller, broken, others, record) =
        break_under(&s, json!({"gangs": "Together"}), &json!({})).await;
    let gangs = gangs_of(&record);
    assert_eq!(gangs.len(), 1, "{gangs:?}");
    assert_eq!(gangs[0].gang, format!("IndexedJob {}/train", s.namespace));
    assert_eq!(gangs[0].nodes.len(), 3, "{gangs:?}");
    let mut recorded: Vec<String> = gangs[0].evicted.iter().map(|m| m.uid.clone()).collect();
    let mut expected: Vec<String> = others.iter().filter_map(ResourceExt::uid).collect();
    recorded.sort();
    expected.sort();
    assert_eq!(recorded, expected, "the members on the other nodes, by UID");

    let admitted = record.creation_timestamp().unwrap().0;
    let evicted = eventually(
        "both members elsewhere evicted",
        Duration::from_secs(30),
        || async {
            let now = members_now(&s, &others).await;
            now.iter()
                .all(|p| p.as_ref().is_none_or(evicted_through_the_api))
                .then_some(k8s_openapi::jiff::Timestamp::now())
        },
    )
    .await;
    assert!(
        evicted.duration_since(admitted).as_secs() < 20,
        "evicted {evicted}, admitted {admitted}: within seconds of admission"
    );
    for pod in &others {
        let node = s.node(&node_of(pod)).await;
        assert!(!is_unschedulable(&node), "{} was cordoned", node.name_any());
    }
    assert!(
        is_unschedulable(&s.node(&broken).await),
        "the broken node is cordoned"
    );
    controller.stop().await;
}

#[tokio::test]
async fn members_by_default_evicts_only_the_failing_nodes_member() {
    let s = Scenario::new(3).await;
    let (controller, broken, others, record) = break_under(&s, json!({}), &json!({})).await;
    let gangs = gangs_of(&record);
    assert_eq!(gangs[0].gang, format!("IndexedJob {}/train", s.namespace));
    assert!(
        gangs[0].evicted.is_empty(),
        "Members evicts nobody elsewhere: {gangs:?}"
    );
    // The failing node's member leaves; the drain ends with the others untouched.
    eventually("the broken node drained", Duration::from_secs(60), || async {
        s.pods_on(&broken)
            .await
            .iter()
            .all(|p| p.labels().get("app").map(String::as_str) != Some("train"))
            .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    for pod in members_now(&s, &others).await {
        let pod = pod.expect("the member elsewhere is still there");
        assert!(
            pod.metadata.deletion_timestamp.is_none() && !evicted_through_the_api(&pod),
            "{} was evicted",
            pod.name_any()
        );
    }
    controller.stop().await;
}

/// When `pod` was evicted (its `DisruptionTarget` condition), if it was.
fn evicted_at(pod: &Pod) -> Option<k8s_openapi::jiff::Timestamp> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "DisruptionTarget" && c.reason.as_deref() == Some("EvictionByEvictionAPI"))?
        .last_transition_time
        .as_ref()
        .map(|t| t.0)
}

/// Breaks the gang's node under `Together` with a `notice`, the workers (the simulated kubelet,
/// as a training loop would) acknowledging after checkpointing for `checkpoint` (never: `None`);
/// the seconds from the notice to each eviction elsewhere.
async fn notice_run(notice: &str, checkpoint: Option<&str>) -> Vec<i64> {
    let s = Scenario::new(3).await;
    // Evicted members take 5 s to terminate, so each eviction is seen before the pod is gone.
    let mut annotations = json!({gpu_remediation_api::constants::SIM_TERMINATION_ANNOTATION: "5s"});
    if let Some(checkpoint) = checkpoint {
        annotations[gang::CHECKPOINT_ANNOTATION] = json!(checkpoint);
    }
    let (controller, _broken, others, _) = break_under(
        &s,
        json!({"gangs": "Together", "notice": notice, "timeout": "5m"}),
        &annotations,
    )
    .await;
    // Each member's eviction time as first seen: an evicted pod may be gone by a later look.
    let seen = std::sync::Mutex::new(vec![None; others.len()]);
    let evicted = eventually(
        "both members elsewhere evicted",
        Duration::from_secs(90),
        || async {
            let now = members_now(&s, &others).await;
            let mut seen = seen.lock().unwrap();
            for (first, pod) in seen.iter_mut().zip(&now) {
                if first.is_none() {
                    *first = pod.as_ref().and_then(evicted_at);
                }
                assert!(
                    first.is_some() || pod.is_some(),
                    "a member left without an eviction seen"
                );
            }
            seen.iter().copied().collect::<Option<Vec<_>>>()
        },
    )
    .await;
    let record = s.remediation_of(&node_of(&others[0])).await;
    assert!(record.is_none(), "the healthy nodes have no remediation");
    let broken_record = s.remediations().await.into_iter().next().unwrap();
    let since = broken_record
        .status
        .as_ref()
        .and_then(|st| st.drain.as_ref())
        .and_then(|d| d.notice_since.as_ref())
        .expect("the record says when the notice went out")
        .0;
    for pod in &others {
        let notes = scenario::event_notes_in(
            &s.client,
            &s.namespace,
            &pod.name_any(),
            gpu_remediation_api::constants::reasons::CHECKPOINT_NOTICE,
        )
        .await;
        assert_eq!(
            notes.len(),
            1,
            "one CheckpointNotice Event on {}: {notes:?}",
            pod.name_any()
        );
    }
    controller.stop().await;
    evicted
        .iter()
        .map(|at| at.duration_since(since).as_secs())
        .collect()
}

#[tokio::test]
async fn a_notice_acknowledged_after_3s_brings_the_evictions_at_about_3s_not_at_its_end() {
    let waited = notice_run("40s", Some("3s")).await;
    assert!(
        waited.iter().all(|s| (2..20).contains(s)),
        "evicted {waited:?} s after the notice: after the checkpoint, well before 40 s"
    );
}

#[tokio::test]
async fn a_notice_never_acknowledged_brings_the_evictions_at_its_end() {
    let waited = notice_run("12s", None).await;
    assert!(
        waited.iter().all(|s| (11..30).contains(s)),
        "evicted {waited:?} s after the notice: at its end (12 s)"
    );
}

/// When `pod` failed in its collective (the simulated kubelet's `Ready=False` at its failure).
fn timed_out_at(pod: &Pod) -> Option<k8s_openapi::jiff::Timestamp> {
    let status = pod.status.as_ref()?;
    if status.reason.as_deref() != Some(gang::COLLECTIVE_TIMEOUT_REASON) {
        return None;
    }
    status
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == "False")?
        .last_transition_time
        .as_ref()
        .map(|t| t.0)
}

#[tokio::test]
async fn under_members_the_healthy_members_stall_until_their_collective_timeout_then_fail() {
    let s = Scenario::new(3).await;
    let (controller, broken, others, record) = break_under(
        &s,
        json!({}),
        &json!({gang::COLLECTIVE_TIMEOUT_ANNOTATION: "15s"}),
    )
    .await;
    assert!(
        gangs_of(&record)[0].evicted.is_empty(),
        "Members evicts nobody elsewhere"
    );
    let admitted = record.creation_timestamp().unwrap().0;
    let failed = eventually(
        "both members elsewhere failed in their collective",
        Duration::from_secs(90),
        || async {
            let now = members_now(&s, &others).await;
            now.iter()
                .map(|p| p.as_ref().and_then(timed_out_at))
                .collect::<Option<Vec<_>>>()
        },
    )
    .await;
    for (pod, at) in members_now(&s, &others).await.iter().flatten().zip(&failed) {
        assert!(
            !evicted_through_the_api(pod),
            "{} was evicted, not timed out",
            pod.name_any()
        );
        // The broken node's member left within seconds of the admission; the others stalled for
        // the 15 s collective timeout after that, then failed.
        let after = at.duration_since(admitted).as_secs();
        assert!(
            (14..40).contains(&after),
            "{} failed {after} s after the admission",
            pod.name_any()
        );
    }
    assert!(is_unschedulable(&s.node(&broken).await));
    controller.stop().await;
}
