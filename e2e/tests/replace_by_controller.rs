//! The replacement strategies carried out by the controller itself (in-process, scoped to each
//! test's policy), end to end: a broken node is cordoned, drained and replaced through its Cluster
//! API Machine, its Karpenter `NodeClaim`, or a template object, with the sandbox's fake provider
//! playing Cluster API and Karpenter against their real CRDs; and action `None` stops after the
//! drain, holds the node cordoned for a person or for recovery, and uncordons it once it recovers.

mod common;

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::StreamExt as _;
use gpu_remediation_api::{GpuRemediation, GpuRemediationPolicy, Phase, constants::NODE_LABEL};
use gpu_remediator::{
    Settings,
    controller::{Telemetry, run_with_telemetry},
    leader::Fence,
    telemetry::Metrics,
};
use gpu_sandbox::{
    Fleet, FleetOptions,
    fleet::FLEET_LABEL,
    provider::{Provider, ProviderKind},
    workload::{self, Workload},
};
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client, ResourceExt as _,
    api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams},
    core::GroupVersionKind,
    runtime::{WatchStreamExt as _, watcher},
};
use serde_json::json;
use tokio::sync::OnceCell;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures");

async fn crds_installed() -> Client {
    static INSTALLED: OnceCell<()> = OnceCell::const_new();
    INSTALLED
        .get_or_init(|| async {
            let client = common::cluster().await.client();
            let read =
                |path: String| std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
            common::install_generated_crds(&client).await;
            for file in [
                format!("{FIXTURES}/cluster.x-k8s.io_machines.yaml"),
                format!("{FIXTURES}/karpenter.sh_nodeclaims.yaml"),
            ] {
                common::install_crd(&client, &read(file)).await;
            }
            common::install_crd(&client, common::REBOOT_CRD).await;
        })
        .await;
    common::cluster().await.client()
}

/// One test's world: its fleet, namespace, policy and in-process controller.
struct Scenario {
    client: Client,
    namespace: String,
    fleet: Arc<Fleet>,
    name: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    /// The in-process controller's metrics.
    metrics: Metrics,
}

impl Scenario {
    /// A fleet of `nodes`, one pod on the first, and a policy with `spec` merged in.
    async fn new(nodes: usize, spec: serde_json::Value) -> Self {
        let client = crds_installed().await;
        let namespace = common::namespace().await;
        let name = common::unique_name("byctl");
        let options = FleetOptions {
            nodes,
            name_prefix: name.clone(),
            ..FleetOptions::default()
        };
        let fleet = Arc::new(Fleet::start(client.clone(), options).await.expect("fleet"));
        let first = fleet.node_names()[0].clone();
        let app = Workload::new(&namespace, "job").on_nodes(&[first.as_str()]);
        workload::create(&client, &app.deployment())
            .await
            .expect("deployment");
        workload::wait_ready_pods(&client, &namespace, &app.selector(), 1, Duration::from_secs(60))
            .await
            .expect("pod ready");
        let mut policy_spec = json!({
            "nodeSelector": {"matchLabels": {FLEET_LABEL: name}},
            "triggers": [{"conditionType": "GpuHealthy", "status": "False", "for": "1s"}],
            "safety": {"maxUnhealthy": "100%"},
        });
        policy_spec
            .as_object_mut()
            .expect("object")
            .extend(spec.as_object().expect("object").clone());
        let policy: GpuRemediationPolicy = serde_json::from_value(json!({
            "apiVersion": "gpuremediation.dev/v1alpha1",
            "kind": "GpuRemediationPolicy",
            "metadata": {"name": name, "labels": {"e2e.gpuremediation.dev/scope": name}},
            "spec": policy_spec,
        }))
        .expect("a policy");
        Api::<GpuRemediationPolicy>::all(client.clone())
            .create(&PostParams::default(), &policy)
            .await
            .expect("policy");
        Self {
            client,
            namespace,
            fleet,
            name,
            stop: None,
            metrics: Metrics::new(),
        }
    }

    async fn start_controller(&mut self) {
        let settings = Settings {
            policy_selector: Some(format!("e2e.gpuremediation.dev/scope={}", self.name)),
            pod_poll: Duration::from_millis(250),
            instance: Some(self.name.clone()),
            ..Settings::default()
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let config = common::cluster().await.config();
        let telemetry = Telemetry {
            metrics: self.metrics.clone(),
            health: None,
        };
        tokio::spawn(run_with_telemetry(
            config,
            settings,
            Fence::standalone(),
            telemetry,
            async move {
                let _ = stopped.await;
            },
        ));
        self.stop = Some(stop);
    }

    async fn break_node(&self, node: &str) {
        gpu_sandbox::fault::set_gpu_condition(&self.client, node, "False", "XID79", "GPU fell off the bus")
            .await
            .expect("fault");
    }

    async fn remediation(&self, node: &str) -> Option<GpuRemediation> {
        let remediations: Api<GpuRemediation> = Api::all(self.client.clone());
        let list = remediations
            .list(&ListParams::default().labels(&format!("{NODE_LABEL}={node}")))
            .await
            .ok()?;
        list.items.into_iter().next()
    }

    async fn wait_phase(&self, node: &str, phase: Phase, within: Duration) -> GpuRemediation {
        common::eventually(
            &format!("{node}'s remediation to reach {phase}"),
            within,
            || async {
                let remediation = self.remediation(node).await?;
                let current = remediation.status.as_ref()?.phase;
                assert!(
                    current == phase || !current.is_terminal(),
                    "{node}'s remediation ended {current}, not {phase}: {:?}",
                    remediation.status
                );
                (current == phase).then_some(remediation)
            },
        )
        .await
    }

    /// How many advances of a remediation failed (and were retried) so far.
    fn remediation_errors(&self) -> Option<f64> {
        e2e::sample(
            &self.metrics.encode(),
            r#"gpu_remediator_reconcile_errors_total{reconciler="remediation"}"#,
        )
    }

    /// Every version of `node`'s remediation the watch delivers: its phase, and whether it names
    /// the replacement's object.
    fn watch_phases(&self, node: &str) -> Arc<Mutex<Vec<(Phase, bool)>>> {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let api = Api::<GpuRemediation>::all(self.client.clone());
        let config = watcher::Config::default().labels(&format!("{NODE_LABEL}={node}"));
        let record = seen.clone();
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(watcher(api, config).applied_objects());
            while let Some(Ok(remediation)) = stream.next().await {
                if let Some(status) = remediation.status {
                    record
                        .lock()
                        .unwrap()
                        .push((status.phase, status.replacement.is_some()));
                }
            }
        });
        seen
    }

    async fn node(&self, node: &str) -> Option<Node> {
        Api::<Node>::all(self.client.clone())
            .get_opt(node)
            .await
            .expect("reading node")
    }
}

impl Drop for Scenario {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

#[tokio::test]
async fn the_controller_replaces_a_cluster_api_node_by_deleting_its_machine() {
    let spec = json!({"action": "Replace", "replacement": {"strategy": "DeleteMachine", "timeout": "2m"}});
    let mut s = Scenario::new(2, spec).await;
    let kind = ProviderKind::ClusterApi {
        namespace: s.namespace.clone(),
        cluster: "gpu".to_owned(),
        set: "pool".to_owned(),
    };
    let provider = Provider::start(s.client.clone(), Arc::clone(&s.fleet), kind)
        .await
        .expect("provider");
    let broken = s.fleet.node_names()[0].clone();
    // The pool's Machines predate the failure by more than the API's one-second timestamps.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    s.start_controller().await;
    let versions = s.watch_phases(&broken);

    s.break_node(&broken).await;
    let done = s
        .wait_phase(&broken, Phase::Succeeded, Duration::from_secs(90))
        .await;

    let status = done.status.expect("status");
    let replacement = status.replacement.expect("the Machine is recorded");
    assert_eq!(
        (replacement.kind.as_str(), replacement.name.as_str()),
        ("Machine", format!("pool-{broken}").as_str()),
        "the Machine deleted, not the node found gone by a second try"
    );
    let versions = versions.lock().unwrap().clone();
    assert!(
        versions.contains(&(Phase::Replacing, false)),
        "Replacing is on record before the Machine is deleted: {versions:?}"
    );
    // A counter: below one is none.
    assert!(
        s.remediation_errors().unwrap_or_default() < 1.0,
        "no advance failed (the trigger's own write to the record is no conflict): {:?}",
        s.remediation_errors()
    );
    let replaced = common::eventually(
        "the provider to record the replacement",
        Duration::from_secs(5),
        || {
            let replaced = provider.replacements().into_iter().find(|r| r.old_node == broken);
            async move { replaced }
        },
    )
    .await;
    assert!(
        status
            .message
            .as_deref()
            .is_some_and(|m| m.contains(&replaced.new_node)),
        "{:?}",
        status.message
    );
    assert!(s.node(&broken).await.is_none());
    assert!(provider.errors().is_empty(), "{:?}", provider.errors());
}

#[tokio::test]
async fn the_controller_replaces_a_karpenter_node_by_deleting_its_node_claim() {
    let spec = json!({"action": "Replace", "replacement": {"strategy": "DeleteNodeClaim", "timeout": "2m"}});
    let mut s = Scenario::new(2, spec).await;
    let pool = s.name.clone();
    let provider = Provider::start(
        s.client.clone(),
        Arc::clone(&s.fleet),
        ProviderKind::Karpenter { pool: pool.clone() },
    )
    .await
    .expect("provider");
    let broken = s.fleet.node_names()[0].clone();
    s.start_controller().await;

    s.break_node(&broken).await;
    let done = s
        .wait_phase(&broken, Phase::Succeeded, Duration::from_secs(90))
        .await;

    common::assert_replaced_through(&done, "NodeClaim", &format!("{pool}-{broken}"));
    assert!(s.node(&broken).await.is_none());
    common::eventually("Karpenter to bring a node", Duration::from_secs(10), || {
        let replaced = provider.replacements().into_iter().next();
        async move { replaced }
    })
    .await;
}

#[tokio::test]
async fn a_template_reporting_done_is_no_proof_the_node_is_released_once_healthy_for_the_dwell() {
    let namespace_placeholder = "NAMESPACE";
    let spec = json!({
        "action": "Reboot",
        "release": {"healthyFor": "2s"},
        "replacement": {"strategy": "Template", "timeout": "2m", "template": {
            "apiVersion": "e2e.gpuremediation.dev/v1",
            "kind": "FakeReboot",
            "metadata": {"name": "{{nodeName}}", "namespace": namespace_placeholder},
            "spec": {"remediationStrategy": "Automatic", "remediation": "{{remediationName}}"},
        }},
    });
    let namespace = common::namespace().await;
    let spec: serde_json::Value =
        serde_json::from_str(&spec.to_string().replace(namespace_placeholder, &namespace)).expect("spec");
    let mut s = Scenario::new(1, spec).await;
    let broken = s.fleet.node_names()[0].clone();
    s.start_controller().await;
    let reboots: Api<DynamicObject> = Api::namespaced_with(
        s.client.clone(),
        &namespace,
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("e2e.gpuremediation.dev", "v1", "FakeReboot"),
            "fakereboots",
        ),
    );

    s.break_node(&broken).await;
    // Play Self Node Remediation: when the object appears, "reboot" and report success.
    let reboot = common::eventually("the template's object", Duration::from_secs(60), || {
        let reboots = reboots.clone();
        let broken = broken.clone();
        async move { reboots.get_opt(&broken).await.ok()? }
    })
    .await;
    reboots
        .patch_status(
            &broken,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": [{"type": "Succeeded", "status": "True", "message": "rebooted"}]}})),
        )
        .await
        .expect("reporting done");
    // Done, yet the GPU is still broken: no release (it used to succeed here).
    common::eventually(
        "the record saying why it waits",
        Duration::from_secs(30),
        || async {
            let r = s.remediation(&broken).await?;
            let status = r.status?;
            (status.phase == Phase::Verifying
                && status.message.as_deref().is_some_and(|m| {
                    m.contains("reported condition Succeeded=True") && m.contains("stays cordoned")
                }))
            .then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let held = s.remediation(&broken).await.expect("the record");
    assert_eq!(
        held.status.map(|st| st.phase),
        Some(Phase::Verifying),
        "not released while broken"
    );
    gpu_sandbox::fault::set_gpu_condition(&s.client, &broken, "True", "GpusHealthy", "all GPUs healthy")
        .await
        .expect("heal");
    let done = s
        .wait_phase(&broken, Phase::Succeeded, Duration::from_secs(60))
        .await;

    assert_eq!(reboot.data["spec"]["remediation"], done.name_any());
    let owner = &reboot.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), Some(owner.uid.as_str())),
        ("GpuRemediation", done.uid().as_deref())
    );
    common::assert_replaced_through(&done, "FakeReboot", &broken);
    assert!(s.node(&broken).await.is_some(), "a reboot keeps the node");
}

#[tokio::test]
async fn action_none_holds_the_drained_node_cordoned_until_it_recovers_then_uncordons_and_succeeds() {
    let spec = json!({"action": "None", "release": {"healthyFor": "2s"}});
    let mut s = Scenario::new(1, spec).await;
    let broken = s.fleet.node_names()[0].clone();
    s.start_controller().await;

    s.break_node(&broken).await;
    let held = s
        .wait_phase(&broken, Phase::Verifying, Duration::from_secs(60))
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    let status = held.status.expect("status");
    assert!(
        status.replacement.is_none(),
        "nothing replaces the node: {:?}",
        status.replacement
    );
    assert!(
        status.phase_history.iter().all(|t| t.phase != Phase::Replacing),
        "{:?}",
        status.phase_history
    );
    assert!(
        status
            .message
            .as_deref()
            .is_some_and(|m| m.contains("waits for a person") && m.contains("recovery")),
        "{:?}",
        status.message
    );
    assert_eq!(status.drain.map(|d| d.pods_remaining), Some(0), "drained");
    let still = s
        .remediation(&broken)
        .await
        .and_then(|r| r.status)
        .map(|st| st.phase);
    assert_eq!(
        still,
        Some(Phase::Verifying),
        "it keeps waiting while the node is broken"
    );
    let node = s.node(&broken).await.expect("the node stays");
    assert_eq!(
        node.spec.and_then(|spec| spec.unschedulable),
        Some(true),
        "still cordoned, waiting for a person or for recovery"
    );

    // The trigger clears and stays clear for release.healthyFor: uncordoned, Succeeded.
    gpu_sandbox::fault::set_gpu_condition(&s.client, &broken, "True", "GpusHealthy", "all GPUs healthy")
        .await
        .expect("heal");
    let done = s
        .wait_phase(&broken, Phase::Succeeded, Duration::from_secs(30))
        .await;
    assert!(
        done.status
            .as_ref()
            .and_then(|st| st.message.as_deref())
            .is_some_and(|m| m.contains("recovered")),
        "{:?}",
        done.status
    );
    let node = s.node(&broken).await.expect("the node stays");
    assert_ne!(
        node.spec.as_ref().and_then(|spec| spec.unschedulable),
        Some(true),
        "recovery uncordons the node we cordoned"
    );
    assert!(
        node.spec
            .and_then(|spec| spec.taints)
            .unwrap_or_default()
            .iter()
            .all(|t| !t.key.starts_with("gpuremediation.dev")),
        "our taint is gone"
    );
}
