//! Validation before release on the real control plane: a node returns to service only with
//! proof. The policy names a validation Job (`spec.validation`); kube-controller-manager's job
//! controller runs it, and the sandbox's simulated kubelet finishes its pod from the node's
//! simulated GPU state (`gpu_sandbox::fleet::validation_pod`: a GPU still broken fails it). A
//! reboot that brings the node back reporting healthy with its GPU still broken fails validation:
//! the node stays cordoned and the ladder climbs to `Replace`; a reboot that heals passes it and
//! the node is released, the record naming the Job, its outcome and its duration. Without a
//! ladder, a template reporting done while the GPU is still broken releases nothing: the node must
//! be healthy for the dwell first, then pass validation.

mod common;
mod scenario;

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use common::eventually;
use gpu_remediation_api::{
    GpuRemediation, Phase,
    ladder::{Rung, StepOutcome},
    validation::ValidationOutcome,
};
use gpu_sandbox::{
    hardware::{SimGpu, set_inventory},
    repair::{self, Behaviour, Repairer},
};
use k8s_openapi::api::{batch::v1::Job, core::v1::Node};
use kube::{Api, api::ApiResource, core::GroupVersionKind};
use scenario::{RunningController, Scenario, has_our_taint, is_unschedulable};
use serde_json::json;

/// The policy's validation Job: the sample's `dcgmi diag -r 2` (nothing runs it here: the
/// simulated kubelet decides its pod's outcome).
fn validation(s: &Scenario) -> serde_json::Value {
    json!({
        "job": {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"namespace": s.namespace},
            "spec": {"template": {"spec": {"containers": [{
                "name": "dcgm-diag",
                "image": "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04",
                "command": ["dcgmi", "diag", "-r", "2"],
            }]}}},
        },
        "timeout": "30s",
    })
}

/// One node under a `Reboot` → `Replace` ladder with validation, the repair operator and the
/// controller running; a watch that notes whether the node was ever let back into service.
struct Run {
    s: Scenario,
    node: String,
    gpu: SimGpu,
    repairer: Repairer,
    controller: RunningController,
    released_early: Arc<AtomicBool>,
    watch: tokio::task::JoinHandle<()>,
}

/// The stand-in reboot object the repair operator carries out.
fn reboot_object(s: &Scenario) -> serde_json::Value {
    json!({
        "apiVersion": "e2e.gpuremediation.dev/v1",
        "kind": "FakeReboot",
        "metadata": {"namespace": s.namespace},
        "spec": {"node": "{{nodeName}}", "action": "Reboot"},
    })
}

impl Run {
    /// A `Reboot` → `Replace` ladder.
    async fn start(behaviour: Behaviour) -> Self {
        Self::start_with(behaviour, |s| {
            json!({"ladder": [
                {"step": "Reboot", "timeout": "1m", "template": reboot_object(s)},
                {"step": "Replace", "timeout": "1m"},
            ]})
        })
        .await
    }

    /// The policy `spec(s)` merged over validation, a 2s dwell and no unhealthy limit.
    async fn start_with(behaviour: Behaviour, spec: impl FnOnce(&Scenario) -> serde_json::Value) -> Self {
        let s = Scenario::new(1).await;
        let node = s.nodes()[0].clone();
        common::install_crd(&s.client, common::REBOOT_CRD).await;
        let mut full = json!({
            "release": {"healthyFor": "2s"},
            "safety": {"maxUnhealthy": "100%"},
            "validation": validation(&s),
        });
        for (key, value) in spec(&s).as_object().into_iter().flatten() {
            full[key] = value.clone();
        }
        s.policy(full).await;
        let kind = ApiResource::from_gvk(&GroupVersionKind::gvk(
            "e2e.gpuremediation.dev",
            "v1",
            "FakeReboot",
        ));
        let repairer = Repairer::start(s.client.clone(), &kind, &s.namespace, behaviour);
        let gpus: Vec<SimGpu> = (0..8)
            .map(|i| SimGpu::new(i, &format!("{}-{i}", s.fleet.name())))
            .collect();
        set_inventory(&s.client, &node, &gpus).await.unwrap();
        let released_early = Arc::new(AtomicBool::new(false));
        let watch = tokio::spawn(watch_release(
            s.client.clone(),
            node.clone(),
            released_early.clone(),
        ));
        let controller = RunningController::start(&s.scope).await;
        Self {
            s,
            node,
            gpu: gpus[3].clone(),
            repairer,
            controller,
            released_early,
            watch,
        }
    }

    async fn wait_phase(&self, phase: Phase) -> GpuRemediation {
        self.s
            .wait_phase(&self.node, phase, Duration::from_secs(90))
            .await
    }

    async fn stop(self) {
        self.watch.abort();
        self.controller.stop().await;
        drop(self.repairer);
    }
}

/// Sets `released` once the node, after being cordoned by us, is schedulable again without our
/// taint (it never is while the node is held for its proof).
async fn watch_release(client: kube::Client, node: String, released: Arc<AtomicBool>) {
    let nodes: Api<Node> = Api::all(client);
    let mut held = false;
    loop {
        if let Ok(Some(n)) = nodes.get_opt(&node).await {
            let cordoned = is_unschedulable(&n) && has_our_taint(&n);
            if held && !cordoned {
                released.store(true, Ordering::SeqCst);
            }
            held |= cordoned;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn steps(r: &GpuRemediation) -> Vec<(Rung, Option<StepOutcome>)> {
    r.status
        .as_ref()
        .map(|s| s.steps.iter().map(|st| (st.step, st.outcome)).collect())
        .unwrap_or_default()
}

#[tokio::test]
async fn a_reboot_that_leaves_the_gpu_broken_fails_validation_keeps_the_cordon_and_climbs_to_replace() {
    let run = Run::start(Behaviour {
        heals_hardware: false,
        ..Behaviour::default()
    })
    .await;

    repair::xid(&run.s.client, &run.node, &run.gpu, 79, "RESTART_BM")
        .await
        .unwrap();
    let done = run.wait_phase(Phase::Succeeded).await;

    assert_eq!(
        steps(&done),
        [
            (Rung::Reboot, Some(StepOutcome::Permanent)),
            (Rung::Replace, Some(StepOutcome::Succeeded))
        ]
    );
    let reboot = &done.status.as_ref().unwrap().steps[0];
    assert_ne!(
        reboot.evidence.boot_id_before, reboot.evidence.boot_id_after,
        "the reboot happened: its evidence was in"
    );
    let validation = reboot
        .evidence
        .validation
        .as_ref()
        .expect("the validation Job is recorded");
    eprintln!("the reboot's validation: {validation:?}");
    assert_eq!(validation.outcome, Some(ValidationOutcome::Failed));
    assert!(validation.duration_seconds.is_some());
    let message = reboot.message.clone().unwrap_or_default();
    assert!(
        message.contains(&format!(
            "validation Job {}/{} failed",
            validation.namespace, validation.job
        )),
        "{message}"
    );
    let job = Api::<Job>::namespaced(run.s.client.clone(), &validation.namespace)
        .get(&validation.job)
        .await
        .unwrap();
    assert_eq!(job.status.and_then(|s| s.failed), Some(1), "its one pod failed");
    assert!(
        !run.released_early.load(Ordering::SeqCst),
        "the node was never let back into service"
    );
    // Replace (DeleteNode): the node is gone.
    eventually("the node deleted", Duration::from_secs(20), || async {
        Api::<Node>::all(run.s.client.clone())
            .get_opt(&run.node)
            .await
            .ok()
            .flatten()
            .is_none()
            .then_some(())
    })
    .await;
    run.stop().await;
}

#[tokio::test]
async fn a_reboot_that_heals_passes_validation_and_releases_the_node_recording_the_job() {
    let run = Run::start(Behaviour::default()).await;

    repair::xid(&run.s.client, &run.node, &run.gpu, 79, "RESTART_BM")
        .await
        .unwrap();
    let done = run.wait_phase(Phase::Succeeded).await;

    assert_eq!(steps(&done), [(Rung::Reboot, Some(StepOutcome::Succeeded))]);
    let reboot = &done.status.as_ref().unwrap().steps[0];
    let validation = reboot
        .evidence
        .validation
        .as_ref()
        .expect("the validation Job is recorded");
    eprintln!("the reboot's validation: {validation:?}");
    assert_eq!(validation.outcome, Some(ValidationOutcome::Passed));
    let seconds = validation.duration_seconds.expect("its duration");
    assert!(seconds <= 30, "{seconds}s");
    let message = reboot.message.clone().unwrap_or_default();
    assert!(message.contains("passed in"), "{message}");
    let job = Api::<Job>::namespaced(run.s.client.clone(), &validation.namespace)
        .get(&validation.job)
        .await
        .unwrap();
    let pinned = job
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.node_name.clone());
    assert_eq!(
        pinned.as_deref(),
        Some(run.node.as_str()),
        "the Job ran on the node"
    );
    assert_eq!(job.status.and_then(|s| s.succeeded), Some(1));
    eventually("the node released", Duration::from_secs(20), || async {
        let n = run.s.node(&run.node).await;
        (!is_unschedulable(&n) && !has_our_taint(&n)).then_some(())
    })
    .await;
    run.stop().await;
}

#[tokio::test]
async fn a_template_reporting_done_while_the_gpu_is_still_broken_does_not_release_the_node() {
    // A reboot object that reports done with the node booted but its GPU still failing.
    let run = Run::start_with(
        Behaviour {
            reboot_heals: false,
            ..Behaviour::default()
        },
        |s| {
            json!({
                "action": "Reboot",
                "replacement": {"strategy": "Template", "timeout": "15s", "template": reboot_object(s)},
            })
        },
    )
    .await;

    repair::xid(&run.s.client, &run.node, &run.gpu, 79, "RESTART_BM")
        .await
        .unwrap();
    let failed = run.wait_phase(Phase::Failed).await;

    assert_eq!(run.repairer.repaired().len(), 1, "the object reported done");
    let status = failed.status.as_ref().unwrap();
    let message = status.message.clone().unwrap_or_default();
    assert!(
        message.contains("reported condition Succeeded=True")
            && message.contains("no proof within replacement.timeout"),
        "{message}"
    );
    assert!(
        status.validation.is_none(),
        "no validation runs on a node still unhealthy"
    );
    assert!(
        !run.released_early.load(Ordering::SeqCst),
        "the node was never let back into service"
    );
    let node = run.s.node(&run.node).await;
    assert!(
        is_unschedulable(&node) && has_our_taint(&node),
        "the cordon is kept"
    );
    run.stop().await;
}

#[tokio::test]
async fn a_template_done_on_a_node_reporting_healthy_with_its_gpu_broken_fails_validation_and_keeps_the_cordon()
 {
    let run = Run::start_with(
        Behaviour {
            heals_hardware: false,
            ..Behaviour::default()
        },
        |s| {
            json!({
                "action": "Reboot",
                "replacement": {"strategy": "Template", "timeout": "1m", "template": reboot_object(s)},
            })
        },
    )
    .await;

    repair::xid(&run.s.client, &run.node, &run.gpu, 79, "RESTART_BM")
        .await
        .unwrap();
    let failed = run.wait_phase(Phase::Failed).await;

    let status = failed.status.as_ref().unwrap();
    let validation = status
        .validation
        .as_ref()
        .expect("the validation Job is recorded");
    assert_eq!(validation.outcome, Some(ValidationOutcome::Failed));
    let message = status.message.clone().unwrap_or_default();
    assert!(message.contains("failed after"), "{message}");
    assert!(
        !run.released_early.load(Ordering::SeqCst),
        "the node was never let back into service"
    );
    let node = run.s.node(&run.node).await;
    assert!(
        is_unschedulable(&node) && has_our_taint(&node),
        "the cordon is kept"
    );
    run.stop().await;
}
