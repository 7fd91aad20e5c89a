//! A broken or compromised node cannot steer the fleet (issue 39). The attacker holds what a node
//! holds: its kubelet's client certificate (`system:node:A`, under the Node authorizer and
//! `NodeRestriction`, see `gpu_sandbox::controlplane::node_credentials`) and the agent's token
//! bound to a pod on A (`common::agent_identity`). Each test makes one move (or moves of one kind in
//! turn) from node A of a three-node fleet (A, B, C) governed by a `Replace` policy and the
//! controller in-process, then asserts that no other node, Machine, `NodeClaim` or remediation
//! record was touched, that the refusal is visible (the server's message, or A's record), and that the policy still governs
//! the fleet: C's fault is remediated to the end.

mod common;

use std::{sync::Arc, time::Duration};

use common::agent_identity::{
    apply_metadata_and_status, apply_status, enforced_agent_on, gpu_healthy, refusal,
};
use gpu_remediation_api::{GpuRemediation, GpuRemediationPolicy, Phase, constants::NODE_LABEL};
use gpu_sandbox::{
    Fleet, FleetOptions,
    fault::set_gpu_condition,
    fleet::FLEET_LABEL,
    provider::{Provider, ProviderKind, machine_resource, node_claim_resource},
};
use k8s_openapi::{api::core::v1::Node, jiff::Timestamp};
use kube::{
    Api, Client,
    api::{DynamicObject, ListParams, Patch, PatchParams},
};
use serde_json::{Value, json};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures");
/// The Cluster API `MachineSet` (and so the Machine name prefix) of every world.
const MACHINE_SET: &str = "pool";

/// Who plays the infrastructure under the fleet.
#[derive(Clone, Copy)]
enum Infrastructure {
    ClusterApi,
    Karpenter,
}

/// One test's world: three nodes A, B, C (sorted), their Machines or `NodeClaims`, a `Replace`
/// policy over them and the controller enforcing it.
struct World {
    admin: Client,
    name: String,
    namespace: String,
    infrastructure: Infrastructure,
    nodes: [String; 3],
    _fleet: Arc<Fleet>,
    _provider: Provider,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl World {
    async fn new(infrastructure: Infrastructure) -> Self {
        let admin = crds_installed().await;
        let namespace = common::namespace().await;
        let name = common::unique_name("attack");
        let options = FleetOptions {
            nodes: 3,
            name_prefix: name.clone(),
            ..FleetOptions::default()
        };
        let fleet = Arc::new(Fleet::start(admin.clone(), options).await.expect("fleet"));
        let (kind, strategy) = match infrastructure {
            Infrastructure::ClusterApi => (
                ProviderKind::ClusterApi {
                    namespace: namespace.clone(),
                    cluster: "gpu".to_owned(),
                    set: MACHINE_SET.to_owned(),
                },
                "DeleteMachine",
            ),
            Infrastructure::Karpenter => (ProviderKind::Karpenter { pool: name.clone() }, "DeleteNodeClaim"),
        };
        let provider = Provider::start(admin.clone(), Arc::clone(&fleet), kind)
            .await
            .expect("provider");
        let mut names = fleet.node_names();
        names.sort();
        let nodes: [String; 3] = names.try_into().expect("three nodes");
        // The Machines predate the faults by more than the API's one-second timestamps.
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let policy: GpuRemediationPolicy = serde_json::from_value(json!({
            "apiVersion": "gpuremediation.dev/v1alpha1",
            "kind": "GpuRemediationPolicy",
            "metadata": {"name": name, "labels": {"e2e.gpuremediation.dev/scope": name}},
            "spec": {
                "nodeSelector": {"matchLabels": {FLEET_LABEL: name}},
                "triggers": [{"conditionType": "GpuHealthy", "status": "False", "for": "1s"}],
                // A's refused remediation holds a place until it fails; C's must not wait for it.
                "safety": {"maxUnhealthy": "100%", "maxConcurrent": 3},
                "action": "Replace",
                "replacement": {"strategy": strategy, "timeout": "2m"},
            },
        }))
        .expect("a policy");
        let stop = common::run_controller_over(&admin, &policy, &name).await;
        Self {
            admin,
            name,
            namespace,
            infrastructure,
            nodes,
            _fleet: fleet,
            _provider: provider,
            stop: Some(stop),
        }
    }

    /// The object standing for `node`: its Machine or its `NodeClaim`, as read now.
    async fn infrastructure_of(&self, node: &str) -> Option<DynamicObject> {
        let (api, name) = match self.infrastructure {
            Infrastructure::ClusterApi => (
                Api::<DynamicObject>::namespaced_with(
                    self.admin.clone(),
                    &self.namespace,
                    &machine_resource(),
                ),
                format!("{MACHINE_SET}-{node}"),
            ),
            Infrastructure::Karpenter => (
                Api::<DynamicObject>::all_with(self.admin.clone(), &node_claim_resource()),
                format!("{}-{node}", self.name),
            ),
        };
        api.get_opt(&name)
            .await
            .expect("reading the node's infrastructure")
    }

    async fn node(&self, node: &str) -> Node {
        Api::<Node>::all(self.admin.clone())
            .get(node)
            .await
            .expect("reading a node")
    }

    async fn remediation(&self, node: &str) -> Option<GpuRemediation> {
        Api::<GpuRemediation>::all(self.admin.clone())
            .list(&ListParams::default().labels(&format!("{NODE_LABEL}={node}")))
            .await
            .expect("listing remediations")
            .items
            .into_iter()
            .next()
    }

    /// What the controller may change on a node, and the node's infrastructure object: equal
    /// before and after a move means the move touched neither.
    async fn footprint(&self, node: &str) -> Value {
        let n = self.node(node).await;
        let infrastructure = self.infrastructure_of(node).await;
        json!({
            "spec": n.spec,
            "labels": n.metadata.labels,
            "annotations": n.metadata.annotations,
            "finalizers": n.metadata.finalizers,
            "ownerReferences": n.metadata.owner_references,
            "infrastructure": infrastructure.map(|o| (o.metadata.uid, o.metadata.deletion_timestamp)),
        })
    }

    /// Nothing of B's changed since `before`, no record of B exists, and the policy still governs:
    /// C's fault is remediated to the end, its own Machine or `NodeClaim` replaced.
    async fn assert_contained(&self, before: &Value) {
        let [_, b, c] = &self.nodes;
        // Give a controller that would act on the move the time to do so.
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(
            &self.footprint(b).await,
            before,
            "node B or its infrastructure was touched"
        );
        assert!(self.remediation(b).await.is_none(), "no record of B");
        set_gpu_condition(&self.admin, c, "False", "XID79", "GPU fell off the bus")
            .await
            .expect("C's fault");
        let done = common::eventually("C's remediation to succeed", Duration::from_secs(90), || async {
            let status = self.remediation(c).await?.status?;
            assert!(
                status.phase == Phase::Succeeded || !status.phase.is_terminal(),
                "C's remediation ended {status:?}"
            );
            (status.phase == Phase::Succeeded).then_some(status)
        })
        .await;
        let replaced = done.replacement.expect("C's replacement is recorded");
        assert!(
            replaced.name.ends_with(c.as_str()),
            "C's own object replaced: {replaced:?}"
        );
    }
}

impl Drop for World {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// The project's CRDs and the vendored Cluster API and Karpenter CRDs, once per test binary.
async fn crds_installed() -> Client {
    static INSTALLED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    let client = common::cluster().await.client();
    INSTALLED
        .get_or_init(|| async {
            common::install_generated_crds(&client).await;
            for file in ["cluster.x-k8s.io_machines.yaml", "karpenter.sh_nodeclaims.yaml"] {
                let path = format!("{FIXTURES}/{file}");
                let yaml = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
                common::install_crd(&client, &yaml).await;
            }
        })
        .await;
    client
}

/// Node A's kubelet.
async fn kubelet_of(node: &str) -> Client {
    common::cluster()
        .await
        .node_client(node)
        .expect("a client with the node's certificate")
}

fn annotate(annotations: &Value) -> Patch<Value> {
    Patch::Merge(json!({"metadata": {"annotations": annotations}}))
}

/// The server's refusal of `result`: its status code and message.
fn refused<T: std::fmt::Debug>(what: &str, result: Result<T, kube::Error>) -> (u16, String) {
    match result {
        Err(kube::Error::Api(status)) => (status.code, status.message),
        other => panic!("{what}: expected the server's refusal, got {other:?}"),
    }
}

/// A's kubelet may annotate its own Node, so it names B's Machine and raises a fault on itself: the
/// controller reads the Machine's `status.nodeRef` (Cluster API's, not the node's), refuses, and
/// says so on A's record. B's Machine stays.
#[tokio::test]
async fn a_node_naming_another_nodes_machine_gets_that_machine_deleted_never() {
    let world = World::new(Infrastructure::ClusterApi).await;
    let [a, b, _] = &world.nodes;
    let before = world.footprint(b).await;
    let kubelet = kubelet_of(a).await;
    Api::<Node>::all(kubelet.clone())
        .patch(
            a,
            &PatchParams::default(),
            &annotate(&json!({"cluster.x-k8s.io/machine": format!("{MACHINE_SET}-{b}")})),
        )
        .await
        .expect("a kubelet may annotate its own Node");
    set_gpu_condition(&kubelet, a, "False", "XID79", "GPU fell off the bus")
        .await
        .expect("a kubelet may write its own Node's conditions");

    let record = common::eventually(
        "A's record to say the Machine is not A's",
        Duration::from_secs(60),
        || async {
            let remediation = world.remediation(a).await?;
            let text = serde_json::to_string(&remediation.status?).ok()?;
            text.contains(&format!("its status.nodeRef names node {b}"))
                .then_some(text)
        },
    )
    .await;
    assert!(record.contains("nothing was deleted"), "{record}");
    world.assert_contained(&before).await;
}

/// A's kubelet cannot take B's instance: the provider ID it would need the `NodeClaim` to match is
/// immutable once set. It then names B's claim in an annotation and raises a fault on itself: the
/// controller finds the claim by its `status.nodeName` (Karpenter's) and replaces A's own, never
/// B's.
#[tokio::test]
async fn a_node_naming_another_nodes_node_claim_gets_only_its_own_replaced() {
    let world = World::new(Infrastructure::Karpenter).await;
    let [a, b, _] = &world.nodes;
    let before = world.footprint(b).await;
    let kubelet = kubelet_of(a).await;
    let nodes = Api::<Node>::all(kubelet.clone());
    let b_provider = world
        .node(b)
        .await
        .spec
        .and_then(|s| s.provider_id)
        .expect("B's provider ID");
    let (code, message) = refused(
        "A taking B's provider ID",
        nodes
            .patch(
                a,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"providerID": b_provider}})),
            )
            .await,
    );
    assert_eq!(code, 422, "{message}");
    assert!(message.contains("providerID"), "{message}");
    nodes
        .patch(
            a,
            &PatchParams::default(),
            &annotate(&json!({"karpenter.sh/nodeclaim": format!("{}-{b}", world.name)})),
        )
        .await
        .expect("a kubelet may annotate its own Node");
    set_gpu_condition(&kubelet, a, "False", "XID79", "GPU fell off the bus")
        .await
        .expect("a kubelet may write its own Node's conditions");

    let done = common::eventually("A's remediation to succeed", Duration::from_secs(90), || async {
        let status = world.remediation(a).await?.status?;
        (status.phase == Phase::Succeeded).then_some(status)
    })
    .await;
    let replaced = done.replacement.expect("A's replacement is recorded");
    assert_eq!(
        replaced.name,
        format!("{}-{a}", world.name),
        "A's own NodeClaim, not B's"
    );
    world.assert_contained(&before).await;
}

/// The agent's token on A adds a finalizer to A's Node (which would hold its deletion by the
/// replacement), or makes B's Node the owner of A's (so the garbage collector would delete A with
/// B): the policy refuses each.
#[tokio::test]
async fn the_agent_cannot_set_finalizers_or_owner_references_on_its_node() {
    let world = World::new(Infrastructure::ClusterApi).await;
    let [a, b, _] = &world.nodes;
    let before = world.footprint(b).await;
    let agent = enforced_agent_on(&world.admin, a).await;
    let owner = world.node(b).await;
    let moves = [
        (
            "a finalizer on A",
            json!({"finalizers": ["attacker.example/hold"]}),
        ),
        (
            "an owner reference on A",
            json!({"ownerReferences": [{
                "apiVersion": "v1", "kind": "Node", "name": b, "uid": owner.metadata.uid,
            }]}),
        ),
    ];
    for (what, metadata) in moves {
        let result =
            apply_metadata_and_status(&agent, a, metadata, &gpu_healthy("True", Timestamp::now())).await;
        let message = refusal(what, result);
        assert!(
            message.contains("finalizers or owner references"),
            "{what}: {message}"
        );
    }
    // Once, after both moves: it ends by replacing C, whose node is then gone.
    world.assert_contained(&before).await;
}

/// The agent's token on A publishes an inventory past its bound, then a `GpuHealthy` message past
/// its bound: the policy refuses both; a 72-GPU inventory passes.
#[tokio::test]
async fn the_agent_cannot_publish_oversized_annotations_or_conditions() {
    let world = World::new(Infrastructure::ClusterApi).await;
    let [a, b, _] = &world.nodes;
    let before = world.footprint(b).await;
    let agent = enforced_agent_on(&world.admin, a).await;
    let now = Timestamp::now();

    let gpu = |i: usize| {
        json!({"index": i, "uuid": format!("GPU-{i:08}-aaaa-bbbb-cccc-dddddddddddd"), "serial": "1654123456789",
               "pciBusId": "00000000:DB:00.0", "boardPartNumber": "692-2G520-0200-000",
               "vbiosVersion": "96.00.5E.00.01", "name": "NVIDIA H100 80GB HBM3"})
    };
    let inventory =
        |gpus: usize| Value::String(Value::from((0..gpus).map(gpu).collect::<Vec<_>>()).to_string());
    let seventy_two = inventory(72);
    apply_status(
        &agent,
        a,
        &json!({"gpuremediation.dev/gpu-inventory": seventy_two}),
        &gpu_healthy("True", now),
    )
    .await
    .expect("a 72-GPU inventory is within the bound");
    let oversized = Value::String("x".repeat(65537));
    for key in [
        "gpuremediation.dev/gpu-inventory",
        "gpuremediation.dev/failed-gpus",
    ] {
        let message = refusal(
            key,
            apply_status(&agent, a, &json!({key: oversized}), &gpu_healthy("True", now)).await,
        );
        assert!(message.contains("at most 65536 bytes"), "{message}");
    }
    let mut long = gpu_healthy("False", now);
    long["conditions"][0]["message"] = Value::String("m".repeat(4097));
    let message = refusal("a long message", apply_status(&agent, a, &json!({}), &long).await);
    assert!(message.contains("message of at most 4096 bytes"), "{message}");
    let mut long = gpu_healthy("False", now);
    long["conditions"][0]["reason"] = Value::String("R".repeat(129));
    let message = refusal("a long reason", apply_status(&agent, a, &json!({}), &long).await);
    assert!(message.contains("reason of at most 128 bytes"), "{message}");
    assert!(
        world.remediation(a).await.is_none(),
        "no refused fault reached the controller"
    );
    world.assert_contained(&before).await;
}

/// A's kubelet writes B's status (a fault on B): `NodeRestriction` refuses, naming both nodes.
#[tokio::test]
async fn a_nodes_kubelet_cannot_write_another_nodes_status() {
    let world = World::new(Infrastructure::ClusterApi).await;
    let [a, b, _] = &world.nodes;
    let before = world.footprint(b).await;
    let kubelet = kubelet_of(a).await;
    let fault = Patch::Strategic(json!({"status": gpu_healthy("False", Timestamp::now())}));
    let (code, message) = refused(
        "A's kubelet on B's status",
        Api::<Node>::all(kubelet)
            .patch_status(b, &PatchParams::default(), &fault)
            .await,
    );
    assert_eq!(code, 403, "{message}");
    assert!(
        message.contains(&format!("node \"{a}\" is not allowed to modify node \"{b}\"")),
        "{message}"
    );
    world.assert_contained(&before).await;
}
