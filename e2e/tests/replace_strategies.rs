//! Each replacement strategy end to end against the real control plane, with the real Cluster API
//! Machine and Karpenter `NodeClaim` CRDs (vendored in `e2e/fixtures/`) and the sandbox's fake
//! provider playing their controllers. The strategies are driven as the controller drives them
//! (trigger once, then observe and judge until done); the full remediation loop is covered by the
//! controller's own scenarios.

mod common;

use std::{sync::Arc, time::Duration};

use gpu_remediation_api::{
    GpuRemediation, GpuRemediationSpec,
    object_reference::ObjectReference,
    policy::{Action, ConditionStatus, Mode, Replacement, Strategy},
    remediation::TriggerRecord,
};
use gpu_remediator::{
    act::replace::Replacers,
    leader::{Fence, FenceError},
    replace::{
        Progress, REPLACEMENT_SELECTOR_ANNOTATION, TriggerReplacementError, Triggered, Verification, judge,
        verify::{REPLACEMENT_FAILED, REPLACEMENT_TIMEOUT},
    },
};
use gpu_sandbox::{
    Fleet, FleetOptions,
    fleet::FLEET_LABEL,
    provider::{Provider, ProviderKind, machine_resource, node_claim_resource},
};
use k8s_openapi::{
    api::core::v1::{Node, Pod},
    jiff::Timestamp,
};
use kube::{
    Api, Client, ResourceExt as _,
    api::{ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams},
    core::GroupVersionKind,
};
use serde_json::json;
use tokio::sync::OnceCell;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures");

/// Installs every CRD these tests need, once per test binary.
async fn crds_installed() -> Client {
    static INSTALLED: OnceCell<()> = OnceCell::const_new();
    let client = common::cluster().await.client();
    INSTALLED
        .get_or_init(|| async {
            let read = |path: String| {
                std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"))
            };
            let client = common::cluster().await.client();
            common::install_generated_crds(&client).await;
            common::install_crd(
                &client,
                &read(format!("{FIXTURES}/cluster.x-k8s.io_machines.yaml")),
            )
            .await;
            common::install_crd(&client, &read(format!("{FIXTURES}/karpenter.sh_nodeclaims.yaml"))).await;
            common::install_crd(&client, common::REBOOT_CRD).await;
        })
        .await;
    client
}

async fn fleet(client: &Client, nodes: usize) -> Arc<Fleet> {
    let options = FleetOptions {
        nodes,
        name_prefix: common::unique_name("rp"),
        ..FleetOptions::default()
    };
    Arc::new(
        Fleet::start(client.clone(), options)
            .await
            .expect("starting the fleet"),
    )
}

/// Creates the remediation of `node` as the controller would have, and returns it as read back.
/// The instant a test triggers a replacement: the start of the next whole second. Creation
/// timestamps have whole seconds, and a node created in the trigger's own second counts as a
/// replacement (`replace::node_presence`); in a cluster a GPU node is never created in the second
/// its fault triggers, but a test's fresh node can be, so the trigger waits for the next second.
async fn trigger_instant() -> Timestamp {
    let now = Timestamp::now();
    let next_second = Timestamp::from_second(now.as_second() + 1).expect("a representable second");
    tokio::time::sleep(next_second.duration_since(now).unsigned_abs()).await;
    Timestamp::now()
}

async fn remediation(client: &Client, node: &str, action: Action) -> GpuRemediation {
    let spec = GpuRemediationSpec {
        node_name: node.to_owned(),
        policy_name: "gpus".to_owned(),
        trigger: TriggerRecord {
            condition_type: "GpuHealthy".to_owned(),
            status: ConditionStatus::False,
            reason: "XID79".to_owned(),
            message: "GPU 3 fell off the bus".to_owned(),
            since: None,
        },
        action,
        mode: Mode::Enforce,
        node_uid: None,
        previous_incident: None,
        policy_snapshot: None,
        hardware: None,
    };
    let remediations: Api<GpuRemediation> = Api::all(client.clone());
    remediations
        .create(
            &PostParams::default(),
            &GpuRemediation::new(&format!("{node}-r"), spec),
        )
        .await
        .expect("creating the remediation")
}

fn replacement(strategy: Strategy, template: Option<serde_json::Value>, timeout: Duration) -> Replacement {
    Replacement {
        strategy,
        template,
        timeout: timeout.into(),
    }
}

/// One replacement driven as the controller drives it: the remediation of a node, every strategy
/// writing through one fence, and the policy's replacement settings.
struct Drive {
    client: Client,
    remediation: GpuRemediation,
    replacers: Replacers,
    policy: Replacement,
    /// The selector of the node's fleet, as a policy selects it (a `DeleteNode`'s replacement is
    /// a new node it selects).
    fleet: String,
}

impl Drive {
    /// Creates the remediation of `node` and drives `policy` as the one replica (a standalone
    /// fence).
    async fn standalone(client: &Client, node: &str, action: Action, policy: Replacement) -> Self {
        Self::fenced(client, node, action, policy, Fence::standalone()).await
    }

    /// [`Self::standalone`], writing through `fence`.
    async fn fenced(client: &Client, node: &str, action: Action, policy: Replacement, fence: Fence) -> Self {
        let remediation = remediation(client, node, action).await;
        let replacers = Replacers::new(gpu_remediator::write::Writer::over(client.clone(), fence));
        let labels = Api::<Node>::all(client.clone())
            .get(node)
            .await
            .expect("reading the node")
            .labels()
            .clone();
        let fleet = format!("{FLEET_LABEL}={}", labels.get(FLEET_LABEL).expect("a fleet node"));
        Self {
            client: client.clone(),
            remediation,
            replacers,
            policy,
            fleet,
        }
    }

    /// Triggers the replacement once.
    async fn trigger(&self) -> Result<Triggered, TriggerReplacementError> {
        self.replacers
            .for_strategy(self.policy.strategy)
            .trigger(&self.remediation, &self.policy)
            .await
    }

    /// Triggers the replacement at the next whole second ([`trigger_instant`]); that instant and
    /// what the trigger started.
    async fn trigger_at_next_second(&self) -> (Timestamp, Triggered) {
        let triggered_at = trigger_instant().await;
        (triggered_at, self.trigger().await.expect("trigger"))
    }

    /// Observes and judges until the verdict is no longer `Waiting`, as the controller's
    /// `Verifying` phase does; `node_healthy` stands for the controller's detection.
    async fn follow(
        &self,
        reference: &ObjectReference,
        triggered_at: Timestamp,
        within: Duration,
    ) -> Progress {
        let remediations: Api<GpuRemediation> = Api::all(self.client.clone());
        let name = self.remediation.name_any();
        let strategy = self.policy.strategy;
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let remediation = remediations.get(&name).await.expect("reading the remediation");
            let mut observation = self
                .replacers
                .for_strategy(strategy)
                .observe(&remediation, reference, triggered_at)
                .await
                .expect("observing the replacement");
            if strategy == Strategy::DeleteNode {
                // As the controller does from its node cache, with the policy's selector (here: the
                // fleet's label).
                let nodes = Api::<Node>::all(self.client.clone())
                    .list(&ListParams::default().labels(&self.fleet))
                    .await
                    .expect("listing nodes");
                observation.replacement = gpu_remediator::replace::verify::replacement_seen(
                    &nodes.items,
                    |_| true,
                    remediation.spec.node_uid.as_deref(),
                    triggered_at,
                );
            }
            let progress = judge(&Verification {
                strategy,
                observation: &observation,
                node_healthy: false,
                triggered_at,
                timeout: self.policy.timeout.into(),
                now: Timestamp::now(),
            });
            if !matches!(progress, Progress::Waiting { .. }) {
                return progress;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "still {progress:?} after {within:?}: {observation:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

async fn node_exists(client: &Client, node: &str) -> bool {
    Api::<Node>::all(client.clone())
        .get_opt(node)
        .await
        .expect("reading node")
        .is_some()
}

async fn node_is_ready(client: &Client, node: &str) -> bool {
    Api::<Node>::all(client.clone())
        .get_opt(node)
        .await
        .expect("reading node")
        .is_some_and(|node| gpu_remediator::replace::verify::node_is_ready(&node))
}

#[tokio::test]
async fn delete_node_removes_the_node_then_its_pods_and_a_new_node_joins() {
    let client = crds_installed().await;
    let namespace = common::namespace().await;
    let fleet = fleet(&client, 2).await;
    let provider = Provider::start(client.clone(), Arc::clone(&fleet), ProviderKind::NodeGroup)
        .await
        .expect("provider");
    let broken = fleet.node_names()[0].clone();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "left-behind"},
        "spec": {"nodeName": broken, "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}
    }))
    .expect("a pod");
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("creating a pod on the node");
    let drive = Drive::standalone(
        &client,
        &broken,
        Action::Replace,
        replacement(Strategy::DeleteNode, None, Duration::from_secs(120)),
    )
    .await;

    let (triggered_at, triggered) = drive.trigger_at_next_second().await;
    let reference = triggered.reference;

    assert_eq!(
        (reference.kind.as_str(), reference.name.as_str()),
        ("Node", broken.as_str())
    );
    let progress = drive
        .follow(&reference, triggered_at, Duration::from_secs(60))
        .await;
    // Success needs the replacement seen: the node group's new node, Ready.
    assert!(
        matches!(&progress, Progress::Succeeded { message } if message.contains("replacement")),
        "{progress:?}"
    );
    assert!(!node_exists(&client, &broken).await);
    // The pod garbage collector removes pods of a vanished node after its 40s quarantine.
    common::eventually(
        "the deleted node's pod to be garbage-collected",
        Duration::from_secs(120),
        || {
            let pods = pods.clone();
            async move { pods.get_opt("left-behind").await.ok()?.is_none().then_some(()) }
        },
    )
    .await;
    let joined = common::eventually("a new node to join", Duration::from_secs(30), || {
        let replaced = provider.replacements().into_iter().find(|r| r.old_node == broken);
        async move { replaced }
    })
    .await;
    assert!(
        node_is_ready(&client, &joined.new_node).await,
        "{} is not Ready",
        joined.new_node
    );
    assert!(provider.errors().is_empty(), "{:?}", provider.errors());
}

#[tokio::test]
async fn delete_machine_deletes_the_cluster_api_machine_and_waits_for_the_machine_sets_new_node() {
    let client = crds_installed().await;
    let namespace = common::namespace().await;
    let fleet = fleet(&client, 2).await;
    let kind = ProviderKind::ClusterApi {
        namespace: namespace.clone(),
        cluster: "gpu".to_owned(),
        set: "gpu-pool".to_owned(),
    };
    let provider = Provider::start(client.clone(), Arc::clone(&fleet), kind)
        .await
        .expect("provider");
    let broken = fleet.node_names()[0].clone();
    let machine_name = format!("gpu-pool-{broken}");
    // A replacement Machine is one created since the trigger, and creation timestamps have whole
    // seconds: let the pool's Machines predate the failure, as they do outside a test.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let drive = Drive::standalone(
        &client,
        &broken,
        Action::Replace,
        replacement(Strategy::DeleteMachine, None, Duration::from_secs(120)),
    )
    .await;

    let (triggered_at, triggered) = drive.trigger_at_next_second().await;
    let reference = triggered.reference.clone();

    assert_eq!(reference.kind, "Machine");
    assert_eq!(
        reference.api_version, "cluster.x-k8s.io/v1beta2",
        "the preferred served version, by discovery"
    );
    assert_eq!(
        (reference.name.as_str(), reference.namespace.as_deref()),
        (machine_name.as_str(), Some(namespace.as_str()))
    );
    let recorded = Api::<GpuRemediation>::all(client.clone())
        .get(&drive.remediation.name_any())
        .await
        .expect("remediation");
    assert_eq!(
        recorded
            .annotations()
            .get(REPLACEMENT_SELECTOR_ANNOTATION)
            .map(String::as_str),
        Some("cluster.x-k8s.io/set-name=gpu-pool")
    );
    assert_eq!(
        triggered
            .rewritten
            .as_ref()
            .map(kube::ResourceExt::resource_version),
        Some(recorded.resource_version()),
        "the trigger hands back the record as it wrote it (the status write after it is made over it)"
    );
    let progress = drive
        .follow(&reference, triggered_at, Duration::from_secs(60))
        .await;

    let Progress::Succeeded { message } = progress else {
        panic!("{progress:?}")
    };
    // The provider records a replacement once it has finished it, a moment after it is visible.
    let replaced = common::eventually(
        "the provider to record the replacement",
        Duration::from_secs(5),
        || {
            let replaced = provider.replacements();
            async move { (!replaced.is_empty()).then_some(replaced) }
        },
    )
    .await;
    assert_eq!(replaced.len(), 1, "{replaced:?}");
    assert_eq!(replaced[0].old_node, broken);
    assert_eq!(
        message,
        format!(
            "the node is gone and its replacement {} is Ready",
            replaced[0].new_node
        )
    );
    let machines: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &machine_resource());
    assert!(
        machines
            .get_opt(&machine_name)
            .await
            .expect("reading machine")
            .is_none()
    );
    assert!(!node_exists(&client, &broken).await);
    assert!(provider.errors().is_empty(), "{:?}", provider.errors());
}

#[tokio::test]
async fn delete_node_claim_deletes_the_karpenter_claim_naming_the_node_and_the_node_goes() {
    let client = crds_installed().await;
    let fleet = fleet(&client, 2).await;
    let pool = common::unique_name("pool");
    let provider = Provider::start(
        client.clone(),
        Arc::clone(&fleet),
        ProviderKind::Karpenter { pool: pool.clone() },
    )
    .await
    .expect("provider");
    let broken = fleet.node_names()[1].clone();
    let drive = Drive::standalone(
        &client,
        &broken,
        Action::Replace,
        replacement(Strategy::DeleteNodeClaim, None, Duration::from_secs(120)),
    )
    .await;

    let (triggered_at, triggered) = drive.trigger_at_next_second().await;
    let reference = triggered.reference;

    assert_eq!(
        (reference.api_version.as_str(), reference.kind.as_str()),
        ("karpenter.sh/v1", "NodeClaim")
    );
    assert_eq!(reference.name, format!("{pool}-{broken}"));
    let progress = drive
        .follow(&reference, triggered_at, Duration::from_secs(60))
        .await;
    assert!(matches!(progress, Progress::Succeeded { .. }), "{progress:?}");
    let claims: Api<DynamicObject> = Api::all_with(client.clone(), &node_claim_resource());
    assert!(
        claims
            .get_opt(&reference.name)
            .await
            .expect("reading claim")
            .is_none()
    );
    assert!(!node_exists(&client, &broken).await);
    let other = fleet.node_names()[0].clone();
    assert!(
        node_exists(&client, &other).await,
        "only the claim naming {broken} was deleted"
    );
    let replaced = common::eventually("Karpenter to bring a node", Duration::from_secs(30), || {
        let replaced = provider.replacements();
        async move { replaced.into_iter().next() }
    })
    .await;
    assert!(node_is_ready(&client, &replaced.new_node).await);
}

fn fake_reboots(client: &Client, namespace: &str) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("e2e.gpuremediation.dev", "v1", "FakeReboot"),
        "fakereboots",
    );
    Api::namespaced_with(client.clone(), namespace, &resource)
}

fn reboot_template(namespace: &str) -> serde_json::Value {
    json!({
        "apiVersion": "e2e.gpuremediation.dev/v1",
        "kind": "FakeReboot",
        "metadata": {"name": "reboot-{{nodeName}}", "namespace": namespace, "labels": {"remediation": "{{remediationName}}"}},
        "spec": {"node": "{{nodeName}}", "strategy": "Automatic"},
    })
}

/// A one-node fleet and a `Reboot` of its node through the template [`reboot_template`] in
/// `namespace`, with `timeout`: the fleet (kept for the test's length), the node and the drive.
async fn template_reboot(client: &Client, namespace: &str, timeout: Duration) -> (Arc<Fleet>, String, Drive) {
    let fleet = fleet(client, 1).await;
    let node = fleet.node_names()[0].clone();
    let policy = replacement(Strategy::Template, Some(reboot_template(namespace)), timeout);
    let drive = Drive::standalone(client, &node, Action::Reboot, policy).await;
    (fleet, node, drive)
}

#[tokio::test]
async fn a_template_object_is_created_owned_by_the_remediation_and_followed_until_it_reports_done() {
    let (client, namespace) = (crds_installed().await, common::namespace().await);
    let (_fleet, node, drive) = template_reboot(&client, &namespace, Duration::from_secs(120)).await;

    let (triggered_at, triggered) = drive.trigger_at_next_second().await;
    let reference = triggered.reference;
    let again = drive.trigger().await.expect("second trigger").reference;
    let remediation = &drive.remediation;

    assert_eq!(again, reference, "a repeated trigger finds the same object");
    let reboots = fake_reboots(&client, &namespace);
    let created = reboots
        .get(&format!("reboot-{node}"))
        .await
        .expect("the template's object");
    assert_eq!(
        created.data["spec"],
        json!({"node": node, "strategy": "Automatic"})
    );
    assert_eq!(created.labels().get("remediation"), Some(&remediation.name_any()));
    let owner = &created.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
        ("GpuRemediation", remediation.uid().unwrap().as_str(), Some(true))
    );

    // The object's own controller (here: the test) reports success a little later.
    let reporter = {
        let reboots = reboots.clone();
        let name = reference.name.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let status = json!({"status": {"conditions": [{"type": "Succeeded", "status": "True", "message": "rebooted"}]}});
            reboots
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(status))
                .await
                .expect("reporting done");
        })
    };
    let progress = drive
        .follow(&reference, triggered_at, Duration::from_secs(30))
        .await;
    reporter.await.expect("reporter");
    assert_eq!(
        progress,
        Progress::Succeeded {
            message: "the template's object reported condition Succeeded=True: rebooted".to_owned()
        }
    );

    // Finished remediations are removed after their TTL; their objects go with them.
    Api::<GpuRemediation>::all(client.clone())
        .delete(&remediation.name_any(), &DeleteParams::background())
        .await
        .expect("deleting the remediation");
    common::eventually(
        "the template's object to be garbage-collected",
        Duration::from_secs(60),
        || {
            let reboots = reboots.clone();
            let name = reference.name.clone();
            async move { reboots.get_opt(&name).await.ok()?.is_none().then_some(()) }
        },
    )
    .await;
}

#[tokio::test]
async fn a_template_object_that_never_reports_done_fails_the_replacement_at_its_timeout() {
    let (client, namespace) = (crds_installed().await, common::namespace().await);
    let (_fleet, _node, drive) = template_reboot(&client, &namespace, Duration::from_secs(3)).await;

    let (triggered_at, triggered) = drive.trigger_at_next_second().await;
    let reference = triggered.reference;
    let progress = drive
        .follow(&reference, triggered_at, Duration::from_secs(20))
        .await;

    let Progress::Failed { reason, message } = progress else {
        panic!("{progress:?}")
    };
    assert_eq!(reason, REPLACEMENT_TIMEOUT);
    assert!(
        message.contains("waiting for the template's object to report done"),
        "{message}"
    );
}

#[tokio::test]
async fn a_template_object_reporting_failure_fails_the_replacement() {
    let (client, namespace) = (crds_installed().await, common::namespace().await);
    let (_fleet, _node, drive) = template_reboot(&client, &namespace, Duration::from_secs(120)).await;

    let (triggered_at, triggered) = drive.trigger_at_next_second().await;
    let reference = triggered.reference;
    fake_reboots(&client, &namespace)
        .patch_status(
            &reference.name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Failed"}})),
        )
        .await
        .expect("reporting failure");
    let progress = drive
        .follow(&reference, triggered_at, Duration::from_secs(20))
        .await;

    assert_eq!(
        progress,
        Progress::Failed {
            reason: REPLACEMENT_FAILED,
            message: "the template's object reported phase Failed".to_owned()
        }
    );
}

#[tokio::test]
async fn a_replica_without_a_current_claim_deletes_nothing() {
    let client = crds_installed().await;
    let fleet = fleet(&client, 1).await;
    let node = fleet.node_names()[0].clone();
    let (unheld, _keeper) = Fence::keeper(None);
    let drive = Drive::fenced(
        &client,
        &node,
        Action::Replace,
        replacement(Strategy::DeleteNode, None, Duration::from_secs(120)),
        unheld,
    )
    .await;

    let refused = drive.trigger().await;

    assert!(
        matches!(
            refused,
            Err(TriggerReplacementError::Fenced(FenceError::NotHolder))
        ),
        "{refused:?}"
    );
    assert!(node_exists(&client, &node).await);
}

#[tokio::test]
async fn delete_machine_on_a_node_cluster_api_does_not_manage_says_so() {
    let client = crds_installed().await;
    let fleet = fleet(&client, 1).await;
    let node = fleet.node_names()[0].clone();
    let drive = Drive::standalone(
        &client,
        &node,
        Action::Replace,
        replacement(Strategy::DeleteMachine, None, Duration::from_secs(120)),
    )
    .await;

    let refused = drive.trigger().await;

    assert!(
        matches!(&refused, Err(TriggerReplacementError::NotAClusterApiNode { node: n, .. }) if *n == node),
        "{refused:?}"
    );
    let machines: Api<DynamicObject> = Api::all_with(client.clone(), &machine_resource());
    assert!(machines.list(&ListParams::default()).await.is_ok());
    assert!(node_exists(&client, &node).await);
}
