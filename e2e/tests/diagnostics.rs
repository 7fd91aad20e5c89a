//! Diagnostics before destruction on the real control plane: the policy names a diagnostics Job
//! (`spec.diagnostics`); once the node is drained and before its `DeleteNode` replacement, the
//! controller runs the Job pinned to the node (kube-controller-manager's job controller creates
//! its pod; the sandbox's simulated kubelet finishes it as a bug report collected, or keeps it
//! running when its template says `gpuremediation.dev/sim-hang`), and the node is deleted only
//! once the Job ended or its timeout passed. The record names the Job and how it ended, and the
//! Job outlives the node it ran on, and the hardware ledger keeps the outcome with the board's
//! failure (its `GpuHardwareRecord`). Without diagnostics nothing changes: no Job, no wait. The
//! shipped Job samples (the bug report, and the NCCL validation that shares its service account)
//! run as shipped, in the controller's namespace with the optional component applied.

mod common;
mod scenario;

use std::time::Duration;

use common::eventually;
use gpu_remediation_api::{
    GpuHardwareRecord, GpuRemediation, Phase,
    diagnostics::{DiagnosticsOutcome, DiagnosticsRecord},
    hardware::{HardwareKind, record_name},
    ladder::{Rung, StepOutcome},
    validation::ValidationOutcome,
};
use gpu_sandbox::{demo::install, repair::Behaviour};
use k8s_openapi::api::batch::v1::Job;
use kube::{Api, api::ListParams};
use scenario::{
    Scenario, event_notes,
    ladder::{LadderRun, step, steps},
    phase_at,
};
use serde_json::json;

/// The policy's diagnostics: the sample's bug report (nothing runs it here), hanging when `hang`.
fn diagnostics(s: &Scenario, timeout: &str, hang: bool) -> serde_json::Value {
    let annotations = if hang {
        json!({"gpuremediation.dev/sim-hang": "true"})
    } else {
        json!({})
    };
    json!({
        "job": {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"namespace": s.namespace},
            "spec": {"template": {
                "metadata": {"annotations": annotations},
                "spec": {"containers": [{
                    "name": "nvidia-bug-report",
                    "image": "ubuntu:24.04",
                    "command": ["/bin/sh", "-c", "nvidia-bug-report.sh --output-file /bundle/report.log"],
                }]},
            }},
        },
        "timeout": timeout,
    })
}

/// One node under `action: Replace` with `DeleteNode`, diagnostics as `with` says, the controller
/// running.
async fn start(with: impl FnOnce(&Scenario) -> Option<serde_json::Value>) -> LadderRun {
    let s = Scenario::new(1).await;
    let mut spec = json!({
        "action": "Replace",
        "replacement": {"strategy": "DeleteNode", "timeout": "20s"},
    });
    if let Some(diagnostics) = with(&s) {
        spec["diagnostics"] = diagnostics;
    }
    LadderRun::start(s, spec, Behaviour::default()).await
}

/// The controller's namespace and the optional component the samples run under, as shipped.
async fn install_optional_component(run: &LadderRun) {
    let mut objects = install::parse_documents(&common::repo_file("manifests/namespace.yaml")).unwrap();
    objects.extend(
        install::parse_documents(&common::repo_file(
            "manifests/optional/diagnostics/diagnostics.yaml",
        ))
        .unwrap(),
    );
    install::apply(&run.s.client, &objects).await.unwrap();
}

/// The record of the node's remediation once its node was deleted.
async fn after_the_delete(run: &LadderRun) -> GpuRemediation {
    run.xid(79, "RESTART_BM").await;
    run.wait_for("the replacement triggered", |r| {
        phase_at(&r, Phase::Verifying).map(|_| ())
    })
    .await;
    run.node_deleted().await;
    run.s.remediation_of(&run.node).await.expect("the record stays")
}

fn record(r: &GpuRemediation) -> DiagnosticsRecord {
    r.status
        .as_ref()
        .and_then(|s| s.diagnostics.clone())
        .expect("the diagnostics are recorded")
}

/// The diagnostics the hardware ledger keeps for the faulty GPU's failure (its
/// `GpuHardwareRecord`, by serial), once they are there: the evidence outlives node and record.
async fn in_the_ledger(run: &LadderRun) -> DiagnosticsRecord {
    let name = record_name(HardwareKind::Gpu, &run.gpu.serial);
    let records = Api::<GpuHardwareRecord>::all(run.s.client.clone());
    eventually(
        "the ledger keeps the diagnostics",
        Duration::from_secs(30),
        || async {
            let record = records.get_opt(&name).await.ok()??;
            record.spec.failures.first()?.diagnostics.clone()
        },
    )
    .await
}

/// When the node was handed over to its destruction (the entry into `Replacing`).
fn handed_over(r: &GpuRemediation) -> k8s_openapi::jiff::Timestamp {
    phase_at(r, Phase::Replacing).expect("the remediation entered Replacing")
}

#[tokio::test]
async fn a_delete_node_recycle_runs_the_diagnostics_job_on_the_node_before_deleting_it() {
    let run = start(|s| Some(diagnostics(s, "30s", false))).await;
    // The board is known to the node before its fault, so its failure is the ledger's.
    run.s.stamped_serial(&run.node, &run.gpu.serial).await;

    let done = after_the_delete(&run).await;

    let diagnostics = record(&done);
    eprintln!("diagnostics: {diagnostics:?}");
    assert_eq!(diagnostics.outcome, Some(DiagnosticsOutcome::Collected));
    assert!(diagnostics.job.ends_with("-diagnostics"), "{}", diagnostics.job);
    assert!(diagnostics.duration_seconds.is_some_and(|s| s <= 30));
    let ended = diagnostics.end.as_ref().expect("its end").0;
    assert!(
        ended <= handed_over(&done),
        "the Job ended ({ended}) before the node was handed to its deletion ({})",
        handed_over(&done)
    );
    // The Job outlives the node it ran on, named by the record.
    let job = Api::<Job>::namespaced(run.s.client.clone(), &diagnostics.namespace)
        .get(&diagnostics.job)
        .await
        .expect("the Job stays after the node is gone");
    let pod = job
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("a pod template");
    assert_eq!(
        pod.node_name.as_deref(),
        Some(run.node.as_str()),
        "pinned to the node"
    );
    assert_eq!(
        job.spec.as_ref().and_then(|s| s.ttl_seconds_after_finished),
        Some(86_400)
    );
    let status = job.status.expect("the Job's status");
    assert_eq!(status.succeeded, Some(1), "its pod ran to completion on the node");
    let completed = status.completion_time.expect("a completion time").0;
    assert!(completed <= handed_over(&done), "completed at {completed}");
    let name = done.metadata.name.clone().unwrap();
    let notes = event_notes(&run.s.client, &name, "DiagnosticsCollected").await;
    assert!(
        notes.iter().any(|n| n.contains(&diagnostics.job)),
        "an Event says so: {notes:?}"
    );
    // The hardware ledger keeps them with the board's failure.
    let kept = in_the_ledger(&run).await;
    assert_eq!(kept.outcome, Some(DiagnosticsOutcome::Collected));
    assert_eq!(
        (kept.namespace.as_str(), kept.job.as_str()),
        (diagnostics.namespace.as_str(), diagnostics.job.as_str())
    );
    run.controller.stop().await;
}

#[tokio::test]
async fn a_diagnostics_job_that_hangs_delays_the_deletion_only_until_its_timeout() {
    let run = start(|s| Some(diagnostics(s, "6s", true))).await;
    run.s.stamped_serial(&run.node, &run.gpu.serial).await;

    let done = after_the_delete(&run).await;

    let diagnostics = record(&done);
    eprintln!("diagnostics: {diagnostics:?}");
    assert_eq!(diagnostics.outcome, Some(DiagnosticsOutcome::TimedOut));
    assert!(
        diagnostics
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("diagnostics.timeout"),
        "{:?}",
        diagnostics.message
    );
    let waited = handed_over(&done).duration_since(diagnostics.start.0);
    assert!(
        waited.as_secs() >= 6,
        "the deletion waited for the timeout ({waited})"
    );
    assert!(waited.as_secs() < 40, "and not much longer ({waited})");
    let job = Api::<Job>::namespaced(run.s.client.clone(), &diagnostics.namespace)
        .get(&diagnostics.job)
        .await
        .unwrap();
    assert_eq!(
        job.status.and_then(|s| s.succeeded).unwrap_or(0),
        0,
        "the Job never completed"
    );
    let name = done.metadata.name.clone().unwrap();
    let notes = event_notes(&run.s.client, &name, "DiagnosticsNotCollected").await;
    assert!(notes.iter().any(|n| n.contains("TimedOut")), "{notes:?}");
    assert_eq!(
        in_the_ledger(&run).await.outcome,
        Some(DiagnosticsOutcome::TimedOut),
        "the ledger says the bug report timed out"
    );
    run.controller.stop().await;
}

#[tokio::test]
async fn without_diagnostics_the_node_is_deleted_with_no_job_and_no_record() {
    let run = start(|_| None).await;

    let done = after_the_delete(&run).await;

    assert_eq!(done.status.as_ref().and_then(|s| s.diagnostics.clone()), None);
    let jobs = Api::<Job>::namespaced(run.s.client.clone(), &run.s.namespace)
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(
        jobs.items.is_empty(),
        "no Job was created: {:?}",
        jobs.items.len()
    );
    let waited = handed_over(&done).duration_since(
        phase_at(&done, Phase::Draining)
            .or(phase_at(&done, Phase::Cordoned))
            .unwrap(),
    );
    assert!(waited.as_secs() < 10, "no wait before the hand-over ({waited})");
    run.controller.stop().await;
}

#[tokio::test]
async fn the_shipped_bug_report_sample_runs_as_shipped_under_its_service_account_and_is_collected() {
    // The sample as shipped, in the controller's namespace, with the optional component's
    // ServiceAccount and claim (the simulated kubelet stands in for the host's driver).
    let sample: serde_json::Value =
        serde_yaml::from_str(&common::repo_file("config/diagnostics/nvidia-bug-report.yaml")).unwrap();
    let run = start(|_| Some(sample.clone())).await;
    let mut objects = install::parse_documents(&common::repo_file("manifests/namespace.yaml")).unwrap();
    objects.extend(
        install::parse_documents(&common::repo_file(
            "manifests/optional/diagnostics/diagnostics.yaml",
        ))
        .unwrap(),
    );
    install::apply(&run.s.client, &objects).await.unwrap();

    let done = after_the_delete(&run).await;

    let diagnostics = record(&done);
    eprintln!("diagnostics: {diagnostics:?}");
    assert_eq!(diagnostics.namespace, "gpu-remediation");
    assert_eq!(diagnostics.outcome, Some(DiagnosticsOutcome::Collected));
    let job = Api::<Job>::namespaced(run.s.client.clone(), "gpu-remediation")
        .get(&diagnostics.job)
        .await
        .unwrap();
    let pod = job.spec.as_ref().and_then(|s| s.template.spec.as_ref()).unwrap();
    assert_eq!(pod.service_account_name.as_deref(), Some("gpu-diagnostics"));
    let env = &pod.containers[0].env.clone().unwrap_or_default();
    let node = env
        .iter()
        .find(|e| e.name == "NODE")
        .and_then(|e| e.value.clone());
    assert_eq!(node.as_deref(), Some(run.node.as_str()), "{{nodeName}} rendered");
    assert_eq!(job.status.and_then(|s| s.succeeded), Some(1));
    run.controller.stop().await;
}

#[tokio::test]
async fn the_shipped_nccl_validation_sample_runs_as_shipped_and_passes_a_healed_reboot() {
    let sample: serde_json::Value =
        serde_yaml::from_str(&common::repo_file("config/validation/nccl-all-reduce.yaml")).unwrap();
    let s = Scenario::new(1).await;
    let spec = json!({
        "release": {"healthyFor": "2s"},
        "ladder": [step(&s, "Reboot", Some("1m"))],
        "validation": sample,
    });
    let run = LadderRun::start(s, spec, Behaviour::default()).await;
    install_optional_component(&run).await;

    run.xid(79, "RESTART_BM").await;
    let done = run
        .wait_phase_within(Phase::Succeeded, std::time::Duration::from_secs(90))
        .await;

    assert_eq!(steps(&done), [(Rung::Reboot, Some(StepOutcome::Succeeded))]);
    let validation = done.status.as_ref().unwrap().steps[0]
        .evidence
        .validation
        .clone()
        .expect("the validation is recorded");
    assert_eq!(validation.namespace, "gpu-remediation");
    assert_eq!(validation.outcome, Some(ValidationOutcome::Passed));
    let job = Api::<Job>::namespaced(run.s.client.clone(), "gpu-remediation")
        .get(&validation.job)
        .await
        .unwrap();
    let pod = job.spec.as_ref().and_then(|s| s.template.spec.as_ref()).unwrap();
    assert_eq!(pod.service_account_name.as_deref(), Some("gpu-diagnostics"));
    let script = pod.containers[0].args.clone().unwrap_or_default().join("\n");
    assert!(script.contains("all_reduce_perf"), "{script}");
    run.controller.stop().await;
}
