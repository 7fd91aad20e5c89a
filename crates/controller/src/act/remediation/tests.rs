//! Carrying a remediation forward against a recording writer: which writes each step makes.

use std::sync::Arc;

use gpu_remediation_api::{
    GpuRemediation, GpuRemediationPolicy, GpuRemediationSpec, Phase,
    constants::REMEDIATION_FINALIZER,
    policy::{Action, ConditionStatus, Mode},
    remediation::TriggerRecord,
};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::{api::core::v1::Node, apimachinery::pkg::apis::meta::v1::Time};
use serde_json::json;

use crate::write::recording::{Recording, context, node_path, remediation_path};

pub(crate) fn policy() -> GpuRemediationPolicy {
    serde_json::from_value(json!({
        "apiVersion": "gpuremediation.dev/v1alpha1", "kind": "GpuRemediationPolicy",
        "metadata": {"name": "p", "uid": "uid-p", "generation": 1},
        "spec": {
            "triggers": [{"conditionType": "GpuHealthy", "status": "False", "for": "0s"}],
            "action": "None",
            "safety": {"maxUnhealthy": "100%"},
        },
    }))
    .expect("a valid policy")
}

pub(crate) fn broken_node(since: Timestamp) -> Node {
    crate::test_fixtures::node("gpu-1", Some(since))
}

pub(crate) fn record(since: Timestamp) -> GpuRemediation {
    let mut record = GpuRemediation::new(
        "gpu-1-abcde",
        GpuRemediationSpec {
            node_name: "gpu-1".into(),
            policy_name: "p".into(),
            trigger: TriggerRecord {
                condition_type: "GpuHealthy".into(),
                status: ConditionStatus::False,
                reason: "XID79".into(),
                message: "GPU 1 fell off the bus".into(),
                since: Some(Time(since)),
            },
            action: Action::None,
            mode: Mode::Enforce,
            node_uid: Some("uid-gpu-1".into()),
            previous_incident: None,
            policy_snapshot: None,
            hardware: None,
        },
    );
    record.metadata.uid = Some("uid-r".into());
    record.metadata.resource_version = Some("1".into());
    record.metadata.finalizers = Some(vec![REMEDIATION_FINALIZER.into()]);
    record.metadata.creation_timestamp = Some(Time(since));
    record
}

fn pod(name: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "work", "uid": format!("uid-{name}"), "resourceVersion": "1",
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "uid-rs", "controller": true}]},
        "spec": {"nodeName": "gpu-1", "containers": [{"name": "c", "image": "i"}]},
        "status": {"phase": "Running"},
    })
}

#[tokio::test]
async fn a_new_remediation_is_cordoned_then_its_pod_evicted_each_write_through_the_writer() {
    let since = Timestamp::now() - SignedDuration::from_secs(60);
    let (ctx, recording) = context(vec![policy()], vec![record(since)], vec![broken_node(since)]);
    recording.put("/api/v1/namespaces/work/pods/train-0", pod("train-0"));

    drive_the_drain(&ctx, &recording, since).await;
    let writes = recording.writes();
    let status = format!("PATCH {}/status", remediation_path("gpu-1-abcde"));
    assert_eq!(
        writes.first(),
        Some(&format!("PATCH {}", node_path("gpu-1"))),
        "{writes:#?}"
    );
    assert!(writes.contains(&status), "{writes:#?}");
    assert!(
        writes.contains(&"POST /api/v1/namespaces/work/pods/train-0/eviction".to_owned()),
        "{writes:#?}"
    );
    let node = recording.object(&node_path("gpu-1")).expect("the node");
    assert_eq!(node["spec"]["unschedulable"], true, "cordoned");
    let eviction = recording
        .requests()
        .into_iter()
        .find(|r| r.path.ends_with("/eviction"))
        .expect("the eviction");
    assert_eq!(eviction.body["kind"], "Eviction");
    assert_eq!(
        eviction.body["deleteOptions"]["preconditions"]["uid"],
        "uid-train-0"
    );
    let stored = recording
        .object(&remediation_path("gpu-1-abcde"))
        .expect("the record");
    let phase: Phase = serde_json::from_value(stored["status"]["phase"].clone()).expect("a phase");
    assert!(
        matches!(phase, Phase::Draining | Phase::Verifying),
        "the record says where it got to: {phase:?}"
    );
    // Every status write went through the writer: none without its field manager.
    for request in recording
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/status"))
    {
        assert!(
            request.query.contains("fieldManager=gpu-remediator"),
            "{}",
            request.query
        );
    }
}

/// Advances the record (as the controller does, in its span) until its first status write: the
/// cordon is written at once and hands back; the record's `Cordoned` is held for the progress
/// interval and written by the advance due then, which goes on to drain.
async fn drive_the_drain(ctx: &crate::context::Context, recording: &Recording, since: Timestamp) {
    let first = super::advance_in_span(ctx, Arc::new(record(since)))
        .await
        .expect("the remediation advances");
    assert_eq!(
        recording.writes(),
        [format!("PATCH {}", node_path("gpu-1"))],
        "the cordon first"
    );
    let mut next = first;
    let status_written = |writes: &[String]| writes.iter().any(|w| w.ends_with("/status"));
    for _ in 0..6 {
        if status_written(&recording.writes()) {
            break;
        }
        if let super::Next::At(at) = next {
            let wait = std::time::Duration::try_from(at.duration_since(Timestamp::now())).unwrap_or_default();
            tokio::time::sleep(wait.min(std::time::Duration::from_secs(6))).await;
        }
        let stored: GpuRemediation = serde_json::from_value(
            recording
                .object(&remediation_path("gpu-1-abcde"))
                .expect("the record"),
        )
        .expect("a remediation");
        next = super::advance_in_span(ctx, Arc::new(stored))
            .await
            .expect("the remediation advances");
    }
}

/// A log sink shared with the test: what the JSON layer writes, line by line.
#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("the log buffer").extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn lines(&self) -> Vec<serde_json::Value> {
        let bytes = self.0.lock().expect("the log buffer").clone();
        String::from_utf8(bytes)
            .expect("UTF-8 logs")
            .lines()
            .map(|line| serde_json::from_str(line).expect("each log line is one JSON object"))
            .collect()
    }
}

/// Whether a JSON log line was written inside the span of remediation `name`.
fn belongs_to(line: &serde_json::Value, name: &str) -> bool {
    line["spans"]
        .as_array()
        .is_some_and(|spans| spans.iter().any(|span| span["remediation"] == name))
}

#[tokio::test(flavor = "current_thread")]
async fn a_drains_json_log_lines_filtered_by_its_remediation_show_the_whole_drain() {
    use tracing_subscriber::layer::SubscriberExt as _;
    let logs = Captured::default();
    let sink = logs.clone();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_subscriber::EnvFilter::new("info"))
        .with(crate::telemetry::logs::json_layer(move || sink.clone()));
    // This thread's subscriber: the current-thread runtime runs every task of the drain here.
    let _logging = tracing::subscriber::set_default(subscriber);
    // tracing-core caches each callsite's interest for the whole process, and while only one
    // dispatcher is registered it asks the *registering* thread's subscriber: a sibling test
    // reaching a drain's log line first, on a thread with none, would cache `never` and silence
    // it here (tokio-rs/tracing#3611; seen once in a loaded run). A second live dispatcher makes
    // every registration ask all of them.
    let _second = tracing::Dispatch::new(tracing_subscriber::registry());

    let since = Timestamp::now() - SignedDuration::from_secs(60);
    let (ctx, recording) = context(vec![policy()], vec![record(since)], vec![broken_node(since)]);
    recording.put("/api/v1/namespaces/work/pods/train-0", pod("train-0"));
    drive_the_drain(&ctx, &recording, since).await;

    let lines = logs.lines();
    let ours: Vec<_> = lines.iter().filter(|l| belongs_to(l, "gpu-1-abcde")).collect();
    let said = |what: &str| {
        ours.iter()
            .any(|l| l["message"].as_str().is_some_and(|m| m.contains(what)))
    };
    assert!(said("cordon"), "the cordon: {ours:#?}");
    assert!(
        ours.iter()
            .any(|l| l["message"] == "eviction" && l["pod"] == "work/train-0"),
        "the eviction of work/train-0: {ours:#?}"
    );
    assert!(said("phase Cordoned"), "the phase it entered: {ours:#?}");
    for line in &ours {
        let span = &line["span"];
        assert_eq!(span["node"], "gpu-1", "{line}");
        assert_eq!(span["policy"], "p", "{line}");
        assert!(span["phase"].is_string(), "{line}");
    }
    let strays: Vec<_> = lines.iter().filter(|l| !belongs_to(l, "gpu-1-abcde")).collect();
    assert!(
        strays.is_empty(),
        "every line of the drain names its remediation: {strays:#?}"
    );
}
