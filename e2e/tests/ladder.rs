//! The escalation ladder on the real control plane, each rung judged by its evidence: a GPU reset
//! that works succeeds after the dwell and releases the node; the fault back within the dwell
//! escalates to a reboot proven by a new boot ID; a reboot object that completes without a new boot
//! ID is no success and escalates to `Replace`; a node out of rungs is handed off, `ManualRequired`
//! with its GPUs named; on an 8-GPU node whose 8 pods hold one GPU each through DRA claims, a
//! reset of GPU 3 evicts only GPU 3's pod; a server error creating a step's object is retried within the
//! step, not escalated. The step objects are carried out by the sandbox's repair operator
//! (`gpu_sandbox::repair`); legacy one-action policies are the other test binaries, unchanged.

mod common;
mod scenario;

use std::time::Duration;

use common::eventually;
use gpu_remediation_api::{
    Phase,
    ladder::{HAND_OFF_LABEL, Rung, StepOutcome, StepRecord},
};
use gpu_remediator::dra::{Holders, pods_holding_on};
use gpu_sandbox::{
    ControlPlaneOptions, Dra, Fleet, FleetOptions, dra,
    repair::{self, Behaviour},
};
use k8s_openapi::api::{admissionregistration::v1::ValidatingWebhookConfiguration, core::v1::Pod};
use kube::{
    Api, ResourceExt,
    api::{ListParams, PostParams},
};
use scenario::{
    RunningController, Scenario, has_our_taint, is_unschedulable,
    ladder::{LadderRun, boot_id, setup, step, steps},
};
use serde_json::json;

impl LadderRun {
    /// `rungs`: each step and its timeout (the policy's default where `None`), its dwell
    /// `healthy_for`.
    async fn rungs(rungs: &[(&str, Option<&str>)], healthy_for: &str, behaviour: Behaviour) -> Self {
        let s = scenario(1, false).await;
        let ladder: Vec<_> = rungs
            .iter()
            .map(|(rung, timeout)| step(&s, rung, *timeout))
            .collect();
        let spec = json!({"ladder": ladder, "release": {"healthyFor": healthy_for}});
        Self::start(s, spec, behaviour).await
    }

    /// The whole ladder (`ResetGpu`, `Reboot`, each with 1m, then `Replace`), its dwell
    /// `healthy_for`, the repairer doing what it is asked.
    async fn reset_reboot_replace(healthy_for: &str) -> Self {
        Self::rungs(
            &[
                ("ResetGpu", Some("1m")),
                ("Reboot", Some("1m")),
                ("Replace", None),
            ],
            healthy_for,
            Behaviour::default(),
        )
        .await
    }
}

/// The step's message says `text`.
fn assert_says(step: &StepRecord, text: &str) {
    assert!(
        step.message.as_deref().unwrap_or_default().contains(text),
        "{:?}",
        step.message
    );
}

async fn released(s: &Scenario, node: &str) {
    eventually(&format!("{node} released"), Duration::from_secs(20), || async {
        let node = s.node(node).await;
        (!is_unschedulable(&node) && !has_our_taint(&node)).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_gpu_reset_that_works_succeeds_after_the_dwell_and_releases_the_node() {
    let run = LadderRun::reset_reboot_replace("3s").await;

    run.xid(48, "RESET_GPU").await;
    let done = run.wait_phase(Phase::Succeeded).await;

    assert_eq!(steps(&done), [(Rung::ResetGpu, Some(StepOutcome::Succeeded))]);
    let status = done.status.as_ref().unwrap();
    let reset = &status.steps[0];
    assert_eq!(
        reset.evidence.gpus_answering,
        std::slice::from_ref(&run.gpu.uuid),
        "the same UUID answers"
    );
    assert_eq!(reset.evidence.dwell_seconds, Some(3));
    let healthy_since = reset
        .evidence
        .healthy_since
        .as_ref()
        .expect("the dwell's start")
        .0;
    let ended = reset.end.as_ref().expect("an end").0;
    assert!(
        ended.duration_since(healthy_since) >= k8s_openapi::jiff::SignedDuration::from_secs(3),
        "success only after the dwell: healthy since {healthy_since}, ended {ended}"
    );
    assert_eq!(status.current_step, Some(Rung::ResetGpu));
    assert_says(reset, "reset proven");
    released(&run.s, &run.node).await;
    assert_eq!(
        boot_id(&run.s.node(&run.node).await),
        run.boot_before,
        "a reset is no reboot"
    );
    let repairs = run.repairer.repaired();
    assert_eq!(repairs.len(), 1, "{repairs:?}");
    assert_eq!(repairs[0].action, "ResetGpu");
    run.controller.stop().await;
}

#[tokio::test]
async fn the_fault_back_within_the_dwell_escalates_to_a_reboot_proven_by_a_new_boot_id() {
    let run = LadderRun::reset_reboot_replace("6s").await;
    let (s, node) = (&run.s, &run.node);

    run.xid(48, "RESET_GPU").await;
    // The reset worked and the node is healthy, its dwell running ...
    run.wait_for("the reset's dwell to start", |r| {
        r.status?
            .steps
            .first()
            .and_then(|st| st.evidence.healthy_since.clone())
            .map(|_| ())
    })
    .await;
    // ... when the fault comes back.
    run.xid(48, "RESET_GPU").await;
    let done = run.wait_phase(Phase::Succeeded).await;

    assert_eq!(
        steps(&done),
        [
            (Rung::ResetGpu, Some(StepOutcome::Permanent)),
            (Rung::Reboot, Some(StepOutcome::Succeeded))
        ]
    );
    let status = done.status.as_ref().unwrap();
    assert_says(&status.steps[0], "fault came back");
    let reboot = &status.steps[1].evidence;
    assert_eq!(reboot.boot_id_before.as_deref(), Some(run.boot_before.as_str()));
    let boot_after = boot_id(&s.node(node).await);
    assert_ne!(boot_after, run.boot_before, "the node booted");
    assert_eq!(reboot.boot_id_after.as_deref(), Some(boot_after.as_str()));
    released(s, node).await;
    run.controller.stop().await;
}

#[tokio::test]
async fn a_reboot_object_done_without_a_new_boot_id_is_no_success_and_escalates_to_replace() {
    let behaviour = Behaviour {
        reboot_boots: false,
        ..Behaviour::default()
    };
    let run = LadderRun::rungs(
        // No node group here: the Replace step (DeleteNode) ends at its timeout with the node gone
        // and no replacement seen.
        &[("Reboot", Some("8s")), ("Replace", Some("10s"))],
        "2s",
        behaviour,
    )
    .await;

    run.xid(79, "RESTART_BM").await;
    let done = run.wait_phase(Phase::Succeeded).await;
    let complete = done
        .status
        .as_ref()
        .and_then(|st| st.conditions.iter().find(|c| c.type_ == "Complete"))
        .expect("a Complete condition");
    assert_eq!(complete.reason, "ReplacementNotSeen", "{}", complete.message);

    assert_eq!(
        steps(&done),
        [
            (Rung::Reboot, Some(StepOutcome::TimedOut)),
            (Rung::Replace, Some(StepOutcome::Succeeded))
        ]
    );
    let status = done.status.as_ref().unwrap();
    let reboot = &status.steps[0];
    assert_says(reboot, "boot ID did not change");
    assert_eq!(reboot.evidence.boot_id_before, reboot.evidence.boot_id_after);
    assert_eq!(run.repairer.repaired().len(), 1, "the reboot object was done");
    // DeleteNode: the node is gone.
    run.node_deleted().await;
    run.controller.stop().await;
}

#[tokio::test]
async fn out_of_rungs_the_node_is_handed_off_manual_required_with_its_gpus_named() {
    let behaviour = Behaviour {
        fails: true,
        ..Behaviour::default()
    };
    let run = LadderRun::rungs(&[("Reboot", Some("1m")), ("HandOff", None)], "2s", behaviour).await;
    let gpu = &run.gpu;

    run.xid(79, "RESTART_BM").await;
    let ended = run.wait_phase(Phase::ManualRequired).await;

    assert_eq!(
        steps(&ended),
        [
            (Rung::Reboot, Some(StepOutcome::Permanent)),
            (Rung::HandOff, Some(StepOutcome::Succeeded))
        ]
    );
    let message = ended.status.as_ref().unwrap().message.clone().unwrap_or_default();
    let named = format!(
        "GPU 3 (UUID {}, serial {}, PCI 00000000:04:00.0)",
        gpu.uuid, gpu.serial
    );
    assert!(message.contains(&named), "{message}");
    let handed = run.s.node(&run.node).await;
    assert!(
        is_unschedulable(&handed) && has_our_taint(&handed),
        "the cordon is kept"
    );
    assert_eq!(
        handed.labels().get(HAND_OFF_LABEL).map(String::as_str),
        Some("true")
    );
    run.controller.stop().await;
}

#[tokio::test]
async fn a_server_error_creating_the_step_object_is_retried_within_the_step_not_escalated() {
    let run = LadderRun::reset_reboot_replace("2s").await;
    let (s, node) = (&run.s, &run.node);
    let webhook = UnreachableStepWebhook::install(&s.client, &s.namespace).await;

    run.xid(48, "RESET_GPU").await;
    // The server answers 500 (its webhook cannot be called): the step stays open and says why.
    let refused = run
        .wait_for("the reset's object refused with a 500", |r| {
            let status = r.status.clone()?;
            (status.refusal.as_ref()?.code == Some(500)).then_some(r)
        })
        .await;
    let since = refused
        .status
        .as_ref()
        .unwrap()
        .refusal
        .as_ref()
        .unwrap()
        .since
        .clone();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let still = s.remediation_of(node).await.expect("the remediation");
    let status = still.status.as_ref().unwrap();
    assert_eq!(status.phase, Phase::Replacing, "{:?}", status.message);
    assert_eq!(steps(&still), [(Rung::ResetGpu, None)], "no escalation on a 5xx");
    let refusal = status.refusal.as_ref().expect("still refused");
    assert_eq!(
        refusal.since, since,
        "one refusal, retried, since its first answer"
    );
    assert!(
        refusal.message.contains("failed calling webhook"),
        "{}",
        refusal.message
    );

    webhook.remove(&s.client).await;
    let done = run.wait_phase(Phase::Succeeded).await;
    assert_eq!(steps(&done), [(Rung::ResetGpu, Some(StepOutcome::Succeeded))]);
    assert!(
        done.status.as_ref().unwrap().refusal.is_none(),
        "the refusal is cleared"
    );
    assert_eq!(
        run.repairer.repaired().len(),
        1,
        "one reset object, once the server took it"
    );
    run.controller.stop().await;
}

/// A validating webhook on the creation of the stand-in step objects of one namespace whose
/// endpoint is a closed port: with `failurePolicy: Fail` the API server answers every such create
/// with a 500 (`failed calling webhook`), a server error the ladder must retry within the step.
struct UnreachableStepWebhook {
    name: String,
}

impl UnreachableStepWebhook {
    async fn install(client: &kube::Client, namespace: &str) -> Self {
        // A port bound and released: nothing listens there.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let name = format!("unreachable-steps-{namespace}");
        let config: ValidatingWebhookConfiguration = serde_json::from_value(json!({
            "metadata": {"name": name},
            "webhooks": [{
                "name": "unreachable-steps.e2e.gpuremediation.dev",
                "clientConfig": {"url": format!("https://127.0.0.1:{port}/validate")},
                "rules": [{
                    "operations": ["CREATE"],
                    "apiGroups": ["e2e.gpuremediation.dev"],
                    "apiVersions": ["v1"],
                    "resources": ["fakereboots"],
                }],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 2,
            }],
        }))
        .expect("a valid webhook configuration");
        Api::<ValidatingWebhookConfiguration>::all(client.clone())
            .create(&PostParams::default(), &config)
            .await
            .expect("creating the webhook configuration");
        Self { name }
    }

    async fn remove(self, client: &kube::Client) {
        Api::<ValidatingWebhookConfiguration>::all(client.clone())
            .delete(&self.name, &kube::api::DeleteParams::default())
            .await
            .expect("deleting the webhook configuration");
    }
}

/// The control plane of this binary: DRA on, so the GPU-scoped drain can be shown.
fn with_dra() -> ControlPlaneOptions {
    ControlPlaneOptions {
        dra: Dra::On,
        ..ControlPlaneOptions::default()
    }
}

/// A scenario on the DRA control plane, whose fleet publishes its GPUs through the simulated DRA
/// driver when `dra` is set.
async fn scenario(nodes: usize, dra: bool) -> Scenario {
    let client = common::cluster_with(with_dra).await.client();
    if !dra {
        return Scenario::new(nodes).await;
    }
    common::init_logs();
    scenario::install_crds(&client).await;
    let namespace = common::namespace().await;
    let fleet = Fleet::start(
        client.clone(),
        FleetOptions {
            nodes,
            name_prefix: common::unique_name("ladder-dra"),
            heartbeat_interval: Duration::from_secs(2),
            dra: true,
            ..FleetOptions::default()
        },
    )
    .await
    .expect("a fleet with DRA");
    let scope = fleet.name().to_owned();
    Scenario {
        client,
        namespace,
        fleet,
        scope,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_gpu_xid_on_gpu_3_evicts_only_its_dra_pod_and_the_other_seven_never_restart() {
    let s = scenario(1, true).await;
    let node = s.nodes()[0].clone();
    let ladder = json!([step(&s, "ResetGpu", Some("1m")), step(&s, "Reboot", Some("1m"))]);
    let spec = json!({"ladder": ladder, "release": {"healthyFor": "3s"}});
    let _repairer = setup(&s, spec, Behaviour::default()).await;
    let app = s.eight_pods_claiming_a_gpu_each(&node).await;
    s.run_workload(
        &app,
        8,
        Duration::from_secs(90),
        "8 pods running on their claimed GPUs",
    )
    .await;
    let gpu3 = dra::node_gpus(&node, 8)[3].clone();
    let pods_api = Api::<Pod>::namespaced(s.client.clone(), &s.namespace);
    let before = pods_api.list(&ListParams::default()).await.unwrap().items;
    let holders = eventually("GPU 3's pod known", Duration::from_secs(30), || async {
        match pods_holding_on(
            &gpu_remediator::read::Reader::new(s.client.clone()),
            &node,
            std::slice::from_ref(&gpu3.uuid),
            &before,
        )
        .await
        {
            Ok(Holders::Known(pods)) if pods.len() == 1 => Some(pods),
            _ => None,
        }
    })
    .await;
    let holder = holders[0].name.clone();
    let others: Vec<(String, Option<String>)> = before
        .iter()
        .filter(|p| p.name_any() != holder)
        .map(|p| (p.name_any(), p.uid()))
        .collect();
    assert_eq!(others.len(), 7);
    let controller = RunningController::start(&s.scope).await;

    repair::xid(&s.client, &node, &gpu3, 48, "RESET_GPU")
        .await
        .unwrap();
    let done = s
        .wait_phase(&node, Phase::Succeeded, Duration::from_secs(90))
        .await;

    assert_eq!(steps(&done), [(Rung::ResetGpu, Some(StepOutcome::Succeeded))]);
    let status = done.status.as_ref().unwrap();
    let reset = &status.steps[0];
    assert_eq!(
        reset.evicted_pods,
        [format!("{}/{holder}", s.namespace)],
        "only GPU 3's pod was evicted"
    );
    assert_says(reset, "reset proven");
    let scope = status
        .drain
        .as_ref()
        .and_then(|d| d.scope.clone())
        .unwrap_or_default();
    assert!(scope.starts_with("GPU-scoped drain"), "{scope}");
    scenario::assert_untouched(&s, &others).await;
    let after = pods_api.list(&ListParams::default()).await.unwrap().items;
    assert!(
        after
            .iter()
            .filter(|p| p.name_any() == holder)
            .all(|p| p.metadata.deletion_timestamp.is_some()),
        "GPU 3's pod left"
    );
    released(&s, &node).await;
    controller.stop().await;
}
