//! The replacement's acting half against a recording API server: which writes each strategy's
//! plan turns into, that a retry writes nothing twice, that a refusal writes nothing, and that the
//! remediated node is read once per trigger and per look.

use gpu_remediation_api::{
    GpuRemediation,
    policy::{Replacement, Strategy},
};
use jiff::Timestamp;
use kube::ResourceExt as _;
use serde_json::{Value, json};

use super::Replacers;
use crate::{
    leader::Fence,
    replace::{
        REPLACEMENT_SELECTOR_ANNOTATION, TriggerReplacementError,
        fixtures::{self, machine, machine_of_another_node, node, node_naming_another_machine, remediation},
        verify::{Presence, ReplacementNode},
    },
    write::recording::{Recording, node_path, recording_writer, remediation_path},
};

const MACHINE: &str = "/apis/cluster.x-k8s.io/v1beta1/namespaces/capi/machines";
const NODE_CLAIMS: &str = "/apis/karpenter.sh/v1/nodeclaims";
const SNR: &str = "/apis/self-node-remediation.medik8s.io/v1alpha1/namespaces/openshift-workload-availability/selfnoderemediations";

/// Discovery as a server serving Cluster API `v1beta1`, Karpenter `v1` and Self Node Remediation
/// `v1alpha1` answers it.
fn serve_kinds(recording: &Recording) {
    let served = [
        ("cluster.x-k8s.io", "v1beta1", "machines", "Machine", true),
        ("karpenter.sh", "v1", "nodeclaims", "NodeClaim", false),
        (
            "self-node-remediation.medik8s.io",
            "v1alpha1",
            "selfnoderemediations",
            "SelfNodeRemediation",
            true,
        ),
    ];
    let groups: Vec<Value> = served
        .iter()
        .map(|(group, version, ..)| {
            let version = json!({"groupVersion": format!("{group}/{version}"), "version": version});
            json!({"name": group, "versions": [version.clone()], "preferredVersion": version})
        })
        .collect();
    recording.put(
        "/apis",
        json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}),
    );
    for (group, version, plural, kind, namespaced) in served {
        recording.put(
            &format!("/apis/{group}/{version}"),
            json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": format!("{group}/{version}"),
                   "resources": [{"name": plural, "singularName": kind.to_lowercase(), "namespaced": namespaced,
                                  "kind": kind, "verbs": ["create", "delete", "get", "list"]}]}),
        );
    }
}

/// A recording server holding gpu-1 (as `node`), its remediation and the served kinds.
fn server(node: &k8s_openapi::api::core::v1::Node, remediation: &GpuRemediation) -> (Replacers, Recording) {
    let (writer, recording) = recording_writer(Fence::standalone());
    serve_kinds(&recording);
    recording.put(&node_path("gpu-1"), serde_json::to_value(node).expect("a node"));
    recording.put(
        &remediation_path(&remediation.name_any()),
        serde_json::to_value(remediation).expect("a remediation"),
    );
    (Replacers::new(writer), recording)
}

fn strategy(strategy: Strategy) -> Replacement {
    Replacement {
        strategy,
        ..Replacement::default()
    }
}

/// How many times the remediated node was read.
fn node_reads(recording: &Recording) -> usize {
    recording
        .requests()
        .iter()
        .filter(|r| r.method == http::Method::GET && r.path == node_path("gpu-1"))
        .count()
}

fn delete_of(recording: &Recording, path: &str) -> Value {
    recording
        .requests()
        .into_iter()
        .find(|r| r.method == http::Method::DELETE && r.path == path)
        .map_or_else(
            || panic!("no DELETE {path}: {:?}", recording.writes()),
            |r| r.body,
        )
}

#[tokio::test]
async fn delete_node_deletes_the_node_pinned_to_its_uid_once_and_a_retry_finds_it_gone() {
    let remediation = remediation(Some("uid-gpu-1"));
    let (replacers, recording) = server(&node(), &remediation);
    let deleting = replacers.for_strategy(Strategy::DeleteNode);

    let triggered = deleting
        .trigger(&remediation, &strategy(Strategy::DeleteNode))
        .await
        .expect("triggered");

    assert_eq!(recording.writes(), [format!("DELETE {}", node_path("gpu-1"))]);
    assert_eq!(
        delete_of(&recording, &node_path("gpu-1"))["preconditions"]["uid"],
        "uid-gpu-1"
    );
    assert_eq!(triggered.reference.uid.as_deref(), Some("uid-gpu-1"));
    assert!(triggered.rewritten.is_none());
    let again = deleting
        .trigger(&remediation, &strategy(Strategy::DeleteNode))
        .await
        .expect("a retry");
    assert_eq!(recording.writes().len(), 1, "{:?}", recording.writes());
    assert_eq!(again.reference.uid, None);
    let looked = deleting
        .observe(&remediation, &triggered.reference, Timestamp::now())
        .await
        .expect("looked");
    assert_eq!(
        (looked.target, looked.node, looked.replacement),
        (Presence::Gone, Presence::Gone, ReplacementNode::Awaited)
    );
}

#[tokio::test]
async fn delete_machine_records_the_set_then_deletes_the_machine_reading_the_node_once() {
    let remediation = remediation(Some("uid-gpu-1"));
    let (replacers, recording) = server(&node(), &remediation);
    recording.put(
        &format!("{MACHINE}/pool-gpu-1"),
        serde_json::to_value(machine()).expect("a machine"),
    );

    let triggered = replacers
        .for_strategy(Strategy::DeleteMachine)
        .trigger(&remediation, &strategy(Strategy::DeleteMachine))
        .await
        .expect("triggered");

    assert_eq!(
        recording.writes(),
        [
            format!("PATCH {}", remediation_path("gpu-1-1a2b3c")),
            format!("DELETE {MACHINE}/pool-gpu-1"),
        ]
    );
    assert_eq!(node_reads(&recording), 1);
    assert_eq!(
        delete_of(&recording, &format!("{MACHINE}/pool-gpu-1"))["preconditions"]["uid"],
        "uid-machine-1"
    );
    let rewritten = triggered.rewritten.expect("the remediation as annotated");
    assert_eq!(
        rewritten
            .annotations()
            .get(REPLACEMENT_SELECTOR_ANNOTATION)
            .map(String::as_str),
        Some("cluster.x-k8s.io/set-name=pool")
    );
    assert_eq!(triggered.reference.uid.as_deref(), Some("uid-machine-1"));

    // Verifying: the Machine and the node are read, the set's Machines listed (none new yet).
    let before = recording.requests().len();
    let looked = replacers
        .for_strategy(Strategy::DeleteMachine)
        .observe(&rewritten, &triggered.reference, Timestamp::now())
        .await
        .expect("looked");
    assert_eq!(
        (looked.target, looked.node, looked.replacement),
        (Presence::Gone, Presence::Present, ReplacementNode::Awaited)
    );
    let reads: Vec<String> = recording.requests()[before..]
        .iter()
        .map(|r| r.path.clone())
        .collect();
    assert_eq!(
        reads,
        [
            node_path("gpu-1"),
            format!("{MACHINE}/pool-gpu-1"),
            MACHINE.to_owned()
        ],
        "one read of the node per look"
    );
}

#[tokio::test]
async fn a_node_naming_another_nodes_machine_fails_the_trigger_and_writes_nothing() {
    let remediation = remediation(Some("uid-gpu-1"));
    let (replacers, recording) = server(&node_naming_another_machine(), &remediation);
    let victim = format!("{MACHINE}/pool-gpu-7");
    recording.put(
        &victim,
        serde_json::to_value(machine_of_another_node()).expect("a machine"),
    );

    let refused = replacers
        .for_strategy(Strategy::DeleteMachine)
        .trigger(&remediation, &strategy(Strategy::DeleteMachine))
        .await;

    assert!(
        matches!(&refused, Err(TriggerReplacementError::MachineNotTheNodes { machine, .. }) if machine == "capi/pool-gpu-7"),
        "{refused:?}"
    );
    assert!(recording.writes().is_empty(), "{:?}", recording.writes());
    assert!(
        recording.object(&victim).is_some(),
        "the other node's Machine is untouched"
    );
}

#[tokio::test]
async fn delete_node_claim_deletes_the_claim_of_the_nodes_instance() {
    let remediation = remediation(Some("uid-gpu-1"));
    let (replacers, recording) = server(&node(), &remediation);
    for claim in fixtures::node_claims() {
        recording.put(
            &format!("{NODE_CLAIMS}/{}", claim.name_any()),
            serde_json::to_value(&claim).expect("a claim"),
        );
    }

    let triggered = replacers
        .for_strategy(Strategy::DeleteNodeClaim)
        .trigger(&remediation, &strategy(Strategy::DeleteNodeClaim))
        .await
        .expect("triggered");

    assert_eq!(
        recording.writes(),
        [format!("DELETE {NODE_CLAIMS}/gpu-pool-x7k2p")]
    );
    assert_eq!(triggered.reference.uid.as_deref(), Some("uid-claim-1"));
    assert_eq!(node_reads(&recording), 1);
}

#[tokio::test]
async fn a_claim_of_another_instance_fails_the_trigger_and_writes_nothing() {
    let remediation = remediation(Some("uid-gpu-1"));
    let mut moved = node();
    moved.spec.as_mut().expect("a spec").provider_id = Some("aws:///us-east-1a/i-0f9e8d7c".to_owned());
    let (replacers, recording) = server(&moved, &remediation);
    for claim in fixtures::node_claims() {
        recording.put(
            &format!("{NODE_CLAIMS}/{}", claim.name_any()),
            serde_json::to_value(&claim).expect("a claim"),
        );
    }

    let refused = replacers
        .for_strategy(Strategy::DeleteNodeClaim)
        .trigger(&remediation, &strategy(Strategy::DeleteNodeClaim))
        .await;

    assert!(
        matches!(refused, Err(TriggerReplacementError::NodeClaimNotTheNodes { .. })),
        "{refused:?}"
    );
    assert!(recording.writes().is_empty(), "{:?}", recording.writes());
}

#[tokio::test]
async fn a_template_object_is_created_owned_by_the_remediation_and_a_retry_finds_it() {
    let remediation = remediation(Some("uid-gpu-1"));
    let (replacers, recording) = server(&node(), &remediation);
    let replacement = fixtures::template_replacement();
    let creating = replacers.for_strategy(Strategy::Template);

    let first = creating
        .trigger(&remediation, &replacement)
        .await
        .expect("created");
    let again = creating
        .trigger(&remediation, &replacement)
        .await
        .expect("found again");

    assert_eq!(recording.writes(), [format!("POST {SNR}"), format!("POST {SNR}")]);
    assert_eq!(
        again.reference, first.reference,
        "the retry records the same object"
    );
    assert_eq!(first.reference.uid.as_deref(), Some("uid-gpu-1"));
    let created = recording.object(&format!("{SNR}/gpu-1")).expect("the object");
    assert_eq!(
        created["metadata"]["ownerReferences"][0]["uid"],
        "uid-remediation-1"
    );
    assert_eq!(created["metadata"]["ownerReferences"][0]["controller"], true);

    let before = node_reads(&recording);
    let looked = creating
        .observe(&remediation, &first.reference, Timestamp::now())
        .await
        .expect("looked");
    assert_eq!(
        (looked.target, looked.node, looked.reported),
        (
            Presence::Present,
            Presence::Present,
            crate::replace::Reported::InProgress
        )
    );
    assert_eq!(
        node_reads(&recording),
        before + 1,
        "one read of the node per look"
    );

    let mut other = remediation.clone();
    other.metadata.uid = Some("uid-remediation-2".to_owned());
    let refused = creating.trigger(&other, &replacement).await;
    assert!(
        matches!(refused, Err(TriggerReplacementError::TemplateNameTaken { .. })),
        "{refused:?}"
    );
}
