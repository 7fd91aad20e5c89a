//! Validation before release on the real control plane: a node returns to service only with
//! proof. The policy names a validation Job (`spec.validation`); kube-controller-manager's job
//! controller runs it, and the sandbox's simulated kubelet finishes its pod from the node's
//! simulated GPU state (`gpu_sandbox::fleet::validation_pod`: a GPU still broken fails it). A
//! reboot that brings the node back reporting healthy with its GPU still broken fails validation:
//! the node stays cordoned and the ladder climbs to `Replace`; a reboot that heals passes it and
//! the node is released, the record naming the Job, its outcome and its duration. Without a
//! ladder, a template reporting done while the GPU is still broken releases nothing: the node must
//! be healthy for the dwell first, then pass validation. With `action: None`, a fault that clears
//! by itself is evidence too, not proof: the node is released only once the Job passes, and stays
//! cordoned (`Failed`, `ValidationFailed`) when its GPU is still broken.

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
use gpu_sandbox::repair::Behaviour;
use k8s_openapi::api::{batch::v1::Job, core::v1::Node};
use kube::Api;
use scenario::{
    Scenario, has_our_taint, is_unschedulable,
    ladder::{LadderRun, step, step_template, steps},
};
use serde_json::json;

/// The policy's validation Job: the sample's `dcgmi diag -r 2` (nothing runs it here: the
/// simulated kubelet decides its pod's outcome).
fn validation(s: &Scenario) -> serde_json::Value {
    json!({
        "job": scenario::dcgm_validation_job(&s.namespace),
        "timeout": "30s",
    })
}

/// One node under a policy with validation (a `Reboot` → `Replace` ladder, or a `Reboot` template),
/// the repair operator and the controller running; a watch that notes whether the node was ever
/// let back into service.
struct Run {
    ladder: LadderRun,
    released_early: Arc<AtomicBool>,
    watch: tokio::task::JoinHandle<()>,
}

impl std::ops::Deref for Run {
    type Target = LadderRun;

    fn deref(&self) -> &LadderRun {
        &self.ladder
    }
}

impl Run {
    /// A `Reboot` → `Replace` ladder.
    async fn start(behaviour: Behaviour) -> Self {
        Self::start_with(
            behaviour,
            |s| json!({"ladder": [step(s, "Reboot", Some("1m")), step(s, "Replace", Some("1m"))]}),
        )
        .await
    }

    /// No ladder: a `Reboot` through a template of the stand-in kind, within `timeout`.
    async fn start_template(behaviour: Behaviour, timeout: &str) -> Self {
        Self::start_with(behaviour, |s| {
            json!({
                "action": "Reboot",
                "replacement": {"strategy": "Template", "timeout": timeout, "template": step_template(s, "Reboot")},
            })
        })
        .await
    }

    /// The policy `spec(s)` merged over validation and a 2s dwell.
    async fn start_with(behaviour: Behaviour, spec: impl FnOnce(&Scenario) -> serde_json::Value) -> Self {
        let s = Scenario::new(1).await;
        let mut full = json!({
            "release": {"healthyFor": "2s"},
            "validation": validation(&s),
        });
        for (key, value) in spec(&s).as_object().into_iter().flatten() {
            full[key] = value.clone();
        }
        let released_early = Arc::new(AtomicBool::new(false));
        let watch = tokio::spawn(watch_release(
            s.client.clone(),
            s.nodes()[0].clone(),
            released_early.clone(),
        ));
        let ladder = LadderRun::start(s, full, behaviour).await;
        Self {
            ladder,
            released_early,
            watch,
        }
    }

    /// GPU 3 reports XID 79 (`RESTART_BM`).
    async fn fault(&self) {
        self.xid(79, "RESTART_BM").await;
    }

    async fn wait_phase(&self, phase: Phase) -> GpuRemediation {
        self.wait_phase_within(phase, Duration::from_secs(90)).await
    }

    fn assert_never_released(&self) {
        assert!(
            !self.released_early.load(Ordering::SeqCst),
            "the node was never let back into service"
        );
    }

    /// The node was never let back into service and is still cordoned and tainted.
    async fn assert_held(&self) {
        self.assert_never_released();
        let node = self.s.node(&self.node).await;
        assert!(
            is_unschedulable(&node) && has_our_taint(&node),
            "the cordon is kept"
        );
    }

    async fn stop(self) {
        self.watch.abort();
        self.ladder.controller.stop().await;
        drop(self.ladder.repairer);
    }
}

/// The validation run the record keeps.
fn recorded(
    status: &gpu_remediation_api::GpuRemediationStatus,
) -> &gpu_remediation_api::validation::ValidationRecord {
    status
        .validation
        .as_ref()
        .expect("the validation Job is recorded")
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

#[tokio::test]
async fn a_reboot_that_leaves_the_gpu_broken_fails_validation_keeps_the_cordon_and_climbs_to_replace() {
    let run = Run::start(Behaviour {
        heals_hardware: false,
        ..Behaviour::default()
    })
    .await;

    run.fault().await;
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
    run.assert_never_released();
    // Replace (DeleteNode): the node is gone.
    run.node_deleted().await;
    run.stop().await;
}

#[tokio::test]
async fn a_reboot_that_heals_passes_validation_and_releases_the_node_recording_the_job() {
    let run = Run::start(Behaviour::default()).await;

    run.fault().await;
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
    let run = Run::start_template(
        Behaviour {
            reboot_heals: false,
            ..Behaviour::default()
        },
        "15s",
    )
    .await;

    run.fault().await;
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
    run.assert_held().await;
    run.stop().await;
}

#[tokio::test]
async fn a_template_done_on_a_node_reporting_healthy_with_its_gpu_broken_fails_validation_and_keeps_the_cordon()
 {
    let run = Run::start_template(
        Behaviour {
            heals_hardware: false,
            ..Behaviour::default()
        },
        "1m",
    )
    .await;

    run.fault().await;
    let failed = run.wait_phase(Phase::Failed).await;

    let status = failed.status.as_ref().unwrap();
    let validation = recorded(status);
    assert_eq!(validation.outcome, Some(ValidationOutcome::Failed));
    let message = status.message.clone().unwrap_or_default();
    assert!(message.contains("failed after"), "{message}");
    run.assert_held().await;
    run.stop().await;
}

/// `action: None`: GPU 3's fault clears by itself (its condition `True` again) while the GPU is
/// `still_broken` or not, the sandbox's simulated kubelet deciding the Job from that.
async fn recovers_unaided(still_broken: bool) -> Run {
    let run = Run::start_with(Behaviour::default(), |_| json!({"action": "None"})).await;
    run.fault().await;
    run.wait_phase(Phase::Verifying).await;
    if !still_broken {
        let healed = json!({"metadata": {"annotations": {
            gpu_sandbox::fleet::validation_pod::SIM_GPU_FAULT_ANNOTATION: null,
        }}});
        Api::<Node>::all(run.s.client.clone())
            .patch(
                &run.node,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&healed),
            )
            .await
            .unwrap();
    }
    run.s.heal_gpu(&run.node).await;
    run
}

#[tokio::test]
async fn action_none_a_fault_that_clears_with_the_gpu_still_broken_fails_validation_and_keeps_the_cordon() {
    let run = recovers_unaided(true).await;
    let failed = run.wait_phase(Phase::Failed).await;
    let status = failed.status.as_ref().unwrap();
    let validation = recorded(status);
    assert_eq!(validation.outcome, Some(ValidationOutcome::Failed));
    assert!(validation.job.ends_with("-validate"), "{}", validation.job);
    let complete = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Complete")
        .expect("a Complete condition");
    assert_eq!(complete.reason, "ValidationFailed");
    run.assert_held().await;
    run.stop().await;
}

#[tokio::test]
async fn action_none_a_fault_that_clears_with_the_gpu_healed_passes_validation_and_releases_the_node() {
    let run = recovers_unaided(false).await;
    let done = run.wait_phase(Phase::Succeeded).await;
    let status = done.status.as_ref().unwrap();
    let validation = recorded(status);
    assert_eq!(validation.outcome, Some(ValidationOutcome::Passed));
    let message = status.message.clone().unwrap_or_default();
    assert!(message.contains("action None: the node recovered"), "{message}");
    let node = run.s.node(&run.node).await;
    assert!(!is_unschedulable(&node) && !has_our_taint(&node), "released");
    run.stop().await;
}
