//! e2e: the loop closed. The remediation controller, running in-process under the policy shipped
//! in `config/`, replaces the node the real agent reported missing a GPU, and leaves alone the node
//! whose NVML failed; under both probes (the `file` probe and the stand-in NVML library).

#[macro_use]
mod agent_support;
mod common;

use std::time::{Duration, Instant};

use agent_support::{
    AgentGround, Probe, healthy_gpus, wait_until_gpu_missing, wait_until_healthy,
    wait_until_nvml_unavailable, write_probe_file,
};
use gpu_remediation_api::{GpuRemediation, GpuRemediationPolicy, Phase, constants::gpu_reasons};
use gpu_remediator::{Settings, leader::Fence};
use gpu_sandbox::fleet::FLEET_LABEL;
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client,
    api::{ListParams, PostParams},
};
use serde_json::{Value, json};

for_both_probes!(
    the_controller_remediates_a_node_the_agent_reports_missing_a_gpu_but_not_one_whose_nvml_failed
);

/// Label on this file's policies; the controller of a test enforces only its own.
const SCOPE_LABEL: &str = "e2e.gpuremediation.dev/scope";

/// `config/policy-h100-replace.yaml` as shipped, narrowed to one fleet: its name and scope label
/// are the fleet's, its node selector also requires the fleet's label, and its trigger's `for` is
/// 3s instead of 2m so the test does not wait minutes; no node group replaces the deleted node
/// here, so its `replacement.timeout` (how long a replacement is awaited) is 5s instead of 30m.
/// Every safety limit stays as shipped.
fn shipped_replace_policy(fleet: &str) -> GpuRemediationPolicy {
    let mut policy: Value =
        serde_yaml::from_str(include_str!("../../config/policy-h100-replace.yaml")).unwrap();
    policy["metadata"]["name"] = json!(fleet);
    policy["metadata"]["labels"] = json!({SCOPE_LABEL: fleet});
    policy["spec"]["nodeSelector"]["matchLabels"][FLEET_LABEL] = json!(fleet);
    let triggers = policy["spec"]["triggers"].as_array_mut().unwrap();
    assert_eq!(triggers.len(), 1, "the shipped policy has one trigger");
    assert_eq!(triggers[0]["reasons"], json!(["XID79", "GpuMissing"]));
    triggers[0]["for"] = json!("3s");
    policy["spec"]["replacement"]["timeout"] = json!("5s");
    serde_json::from_value(policy).expect("the shipped policy parses")
}

async fn remediation_of(client: &Client, policy: &str, node: &str) -> Option<GpuRemediation> {
    Api::<GpuRemediation>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|r| r.spec.policy_name == policy && r.spec.node_name == node)
}

/// Waits until `policy`'s remediation of `node` has succeeded.
async fn wait_until_succeeded(client: &Client, policy: &str, node: &str) -> GpuRemediation {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let current = remediation_of(client, policy, node).await;
        if let Some(done) = current.as_ref().filter(|r| {
            r.status
                .as_ref()
                .is_some_and(|status| status.phase == Phase::Succeeded)
        }) {
            return done.clone();
        }
        if Instant::now() > deadline {
            let policy = Api::<GpuRemediationPolicy>::all(client.clone())
                .get(policy)
                .await
                .ok();
            panic!(
                "the remediation of {node} did not succeed within 60s\nremediation: {:#?}\npolicy status: {:#?}",
                current.map(|r| r.status),
                policy.map(|p| p.status)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The remediation controller, in-process, enforcing only the policies labelled with `scope`.
struct InProcessController {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), gpu_remediator::RunControllerError>>,
}

impl InProcessController {
    async fn start(scope: &str) -> Self {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let settings = Settings {
            policy_selector: Some(format!("{SCOPE_LABEL}={scope}")),
            ..Settings::default()
        };
        let task = tokio::spawn(gpu_remediator::run(
            common::cluster().await.config(),
            settings,
            Fence::standalone(),
            async move {
                let _ = stopped.await;
            },
        ));
        Self { stop, task }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("the controller stops")
            .expect("the controller did not panic")
            .expect("the controller ended without error");
    }
}

async fn the_controller_remediates_a_node_the_agent_reports_missing_a_gpu_but_not_one_whose_nvml_failed(
    probe: Probe,
) {
    common::install_generated_crds(&common::cluster().await.client()).await;
    // Ten nodes, so one broken node is 10% of the fleet: within the shipped maxUnhealthy.
    let ground = AgentGround::new(&format!("remediation-{probe:?}"), 10).await;
    let (client, fleet) = (ground.client.clone(), &ground.fleet);
    let mut names = fleet.node_names();
    names.sort();
    let (broken, blind, healthy) = (&names[0], &names[1], &names[2]);
    let mut agents = Vec::new();
    for name in [broken, blind, healthy] {
        let agent = ground.start_agent(probe, name, &healthy_gpus(name), &[]).await;
        wait_until_healthy(&client, name, &agent).await;
        agents.push((ground.probe_file(name), agent));
    }
    let policy = shipped_replace_policy(fleet.name());
    Api::<GpuRemediationPolicy>::all(client.clone())
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();
    let controller = InProcessController::start(fleet.name()).await;

    // NVML fails on one node: Unknown, and well past the trigger's `for` nothing happens to it,
    // while the controller is running with its whole budget free.
    write_probe_file(&agents[1].0, &json!({"nvmlError": "Driver Not Loaded"}));
    wait_until_nvml_unavailable(&client, blind, Duration::from_secs(5), &agents[1].1).await;
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert!(
        remediation_of(&client, fleet.name(), blind).await.is_none(),
        "a broken detector started a remediation"
    );
    let node = Api::<Node>::all(client.clone()).get(blind).await.unwrap();
    assert_ne!(
        node.spec.and_then(|spec| spec.unschedulable),
        Some(true),
        "a broken detector cordoned the node"
    );

    // A GPU falls off another node: the agent says GpuMissing, the controller replaces the node.
    let mut fallen = healthy_gpus(broken);
    fallen["gpus"].as_array_mut().unwrap().remove(3);
    write_probe_file(&agents[0].0, &fallen);
    wait_until_gpu_missing(&client, broken, &agents[0].1).await;
    let remediation = wait_until_succeeded(&client, fleet.name(), broken).await;
    assert_eq!(remediation.spec.trigger.reason, gpu_reasons::GPU_MISSING);
    assert!(
        remediation
            .spec
            .trigger
            .message
            .contains(&format!("GPU-{broken}-0003"))
    );
    let history: Vec<Phase> = remediation
        .status
        .as_ref()
        .unwrap()
        .phase_history
        .iter()
        .map(|step| step.phase)
        .collect();
    for phase in [
        Phase::Cordoned,
        Phase::Draining,
        Phase::Replacing,
        Phase::Succeeded,
    ] {
        assert!(history.contains(&phase), "{phase:?} missing from {history:?}");
    }
    assert!(
        Api::<Node>::all(client.clone())
            .get_opt(broken)
            .await
            .unwrap()
            .is_none(),
        "the shipped policy's DeleteNode replacement deleted the broken node"
    );
    for quiet in [blind, healthy] {
        assert!(
            remediation_of(&client, fleet.name(), quiet).await.is_none(),
            "{quiet} was remediated"
        );
    }

    controller.stop().await;
    drop(agents);
    ground.stop().await;
}
