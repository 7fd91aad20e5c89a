//! Our records' status is ours alone (issue 39), on the real control plane with the controller
//! running: a user granted only `patch gpuremediations/status` tries to move a record awaiting
//! approval to `Replacing` (which, believed, deletes the node).
//!
//! - With the records policy (`manifests/controller/records-policy.yaml`) in force, the server
//!   refuses the write with the policy's message; an editor stripping the controller's finalizer
//!   from the record is refused too, and so is a person creating a record (for a healthy node). The record stays as it was, the node stands, uncordoned, its pods running.
//! - Without it, the write lands, and the controller holds the record as tampered: a `Tampered`
//!   condition and a `StatusTampered` Event naming the missing approval; the node stands,
//!   uncordoned, undrained.
//!
//! The in-process controller writes as the cluster's admin, so the policy is installed as shipped
//! but for the controller's user name (the admin's, from a `SelfSubjectReview`) and a binding
//! limited to the test's own records (`gpuremediation.dev/policy=<scope>`): the other tests of this
//! binary run without it.

mod common;
mod scenario;

use std::time::Duration;

use common::{bind, client_as, eventually};
use gpu_remediation_api::{
    GpuRemediation, Phase,
    constants::{POLICY_LABEL, REMEDIATION_FINALIZER},
};
use gpu_sandbox::workload::Workload;
use k8s_openapi::api::{authentication::v1::SelfSubjectReview, core::v1::Node, rbac::v1::ClusterRole};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use scenario::{RunningController, Scenario, event_notes, has_our_taint, is_unschedulable};
use serde_json::{Value, json};

const SHIPPED_CONTROLLER: &str = "system:serviceaccount:gpu-remediation:gpu-remediator";
const REFUSED_STATUS: &str = "the status of a GpuRemediation is the controller's record";
const REFUSED_CREATE: &str = "is the controller's record of what it does to a node";
const REFUSED_METADATA: &str = "labels, annotations and finalizer of a GpuRemediation are the controller's";

/// Grants `user` exactly `rules` (a `ClusterRole` of its own).
async fn grant(admin: &Client, user: &str, rules: Value) {
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": format!("e2e-{user}")}, "rules": rules,
    }))
    .unwrap();
    Api::<ClusterRole>::all(admin.clone())
        .create(&PostParams::default(), &role)
        .await
        .unwrap_or_else(|e| panic!("role of {user}: {e}"));
    bind(admin, user, &format!("e2e-{user}")).await;
}

/// A user who may only patch remediations' status (and read them).
async fn status_patcher(admin: &Client, user: &str) -> Client {
    grant(
        admin,
        user,
        json!([{"apiGroups": ["gpuremediation.dev"], "resources": ["gpuremediations/status"], "verbs": ["patch"]},
               {"apiGroups": ["gpuremediation.dev"], "resources": ["gpuremediations"], "verbs": ["get"]}]),
    )
    .await;
    client_as(user).await
}

fn to_replacing() -> Value {
    json!({"status": {"phase": "Replacing"}})
}

async fn patch_status(as_user: &Client, name: &str, patch: &Value) -> Result<GpuRemediation, kube::Error> {
    Api::<GpuRemediation>::all(as_user.clone())
        .patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
}

/// The server's refusal by the records policy (as installed for one scenario), in its words.
fn refusal(what: &str, result: Result<GpuRemediation, kube::Error>) -> String {
    common::refused_by("gpu-remediator-records-", what, result)
}

/// Installs the shipped records policy for the scenario's records, the admin standing in for the
/// controller's service account, and waits until the server enforces both its parts: the update
/// part probed by `attacker` patching the status of a record of the scope for a node that does not
/// exist (created before any controller runs), the create part by a user allowed to create records
/// asking, dry-run, to create one. The server loads each policy and binding on its own, so one
/// refusal says nothing of the other (a create let through this way failed CI once).
async fn install_records_policy(s: &Scenario, attacker: &Client) {
    let admin_name = Api::<SelfSubjectReview>::all(s.client.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .expect("who the admin is")
        .status
        .and_then(|st| st.user_info)
        .and_then(|u| u.username)
        .expect("the admin's user name");
    let shipped = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../manifests/controller/records-policy.yaml"
    ))
    .expect("the records policy");
    assert!(shipped.contains(SHIPPED_CONTROLLER));
    let mut objects =
        gpu_sandbox::demo::install::parse_documents(&shipped.replace(SHIPPED_CONTROLLER, &admin_name))
            .expect("records policy YAML");
    // Both policies (updates, creates) and their bindings, named for this scenario.
    let scoped = |name: &Value| json!(format!("{}-{}", name.as_str().expect("a name"), s.scope));
    for object in &mut objects {
        object["metadata"]["name"] = scoped(&object["metadata"]["name"]);
        if object["kind"] == "ValidatingAdmissionPolicyBinding" {
            object["spec"]["policyName"] = scoped(&object["spec"]["policyName"]);
            object["spec"]["matchResources"] =
                json!({"objectSelector": {"matchLabels": {POLICY_LABEL: s.scope}}});
        }
    }
    gpu_sandbox::demo::install::apply(&s.client, &objects)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let probe = common::unique_name("probe");
    let record: GpuRemediation = serde_json::from_value(json!({
        "apiVersion": "gpuremediation.dev/v1alpha1", "kind": "GpuRemediation",
        "metadata": {"name": probe, "labels": {POLICY_LABEL: s.scope}},
        "spec": {"nodeName": "no-such-node", "policyName": "no-such-policy", "action": "None", "mode": "Manual",
                 "trigger": {"conditionType": "GpuHealthy", "status": "False", "reason": "XID79"}},
    }))
    .unwrap();
    let records = Api::<GpuRemediation>::all(s.client.clone());
    records.create(&PostParams::default(), &record).await.unwrap();
    let replacing = to_replacing();
    common::until_refused_by(&format!("gpu-remediator-records-{}'", s.scope), || {
        patch_status(attacker, &probe, &replacing)
    })
    .await;
    records.delete(&probe, &DeleteParams::default()).await.unwrap();
    let creator = format!("probe-creator-{}", s.scope);
    grant(
        &s.client,
        &creator,
        json!([{"apiGroups": ["gpuremediation.dev"], "resources": ["gpuremediations"], "verbs": ["create"]}]),
    )
    .await;
    let as_creator = Api::<GpuRemediation>::all(client_as(&creator).await);
    let dry_run = common::dry_run();
    common::until_refused_by(&format!("gpu-remediator-records-create-{}'", s.scope), || {
        as_creator.create(&dry_run, &record)
    })
    .await;
}

/// The scenario's world: a `Manual`, `Replace` (by deleting the node) policy, the controller
/// running, two pods on the broken node, its remediation `AwaitingApproval`.
struct Awaiting {
    s: Scenario,
    controller: RunningController,
    broken: String,
    node_uid: Option<String>,
    pods: Vec<String>,
    record: GpuRemediation,
}

async fn awaiting_approval(s: Scenario) -> Awaiting {
    let broken = s.nodes()[0].clone();
    let app = Workload::new(&s.namespace, "train")
        .replicas(2)
        .on_nodes(&[&broken]);
    let mut pods: Vec<String> = s
        .run_workload(&app, 2, Duration::from_secs(60), "two pods on the node")
        .await
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    pods.sort();
    let controller = s
        .enforce_and_break(
            json!({"mode": "Manual", "action": "Replace", "safety": {"maxUnhealthy": "100%"}}),
            &broken,
        )
        .await;
    let record = s
        .wait_phase(&broken, Phase::AwaitingApproval, Duration::from_secs(30))
        .await;
    let node_uid = s.node(&broken).await.metadata.uid;
    Awaiting {
        s,
        controller,
        broken,
        node_uid,
        pods,
        record,
    }
}

impl Awaiting {
    /// The victims untouched: the node stands (the same one), uncordoned, untainted, its pods
    /// still on it and not leaving.
    async fn assert_untouched(&self) {
        let node = Api::<Node>::all(self.s.client.clone())
            .get_opt(&self.broken)
            .await
            .unwrap()
            .expect("the node was not deleted");
        assert_eq!(node.metadata.uid, self.node_uid, "the same node");
        assert!(!is_unschedulable(&node), "not cordoned");
        assert!(!has_our_taint(&node), "not tainted");
        let mut pods: Vec<String> = self
            .s
            .pods_on(&self.broken)
            .await
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .map(ResourceExt::name_any)
            .collect();
        pods.sort();
        assert_eq!(pods, self.pods, "not drained");
    }

    async fn stored(&self) -> GpuRemediation {
        Api::<GpuRemediation>::all(self.s.client.clone())
            .get(&self.record.name_any())
            .await
            .unwrap()
    }
}

#[tokio::test]
async fn with_the_records_policy_a_status_patcher_cannot_move_a_record_awaiting_approval_to_replacing() {
    let s = Scenario::new(2).await;
    let mallory = status_patcher(&s.client, &format!("mallory-{}", s.scope)).await;
    install_records_policy(&s, &mallory).await;
    let world = awaiting_approval(s).await;

    let message = refusal(
        "mallory's Replacing",
        patch_status(&mallory, &world.record.name_any(), &to_replacing()).await,
    );
    assert!(message.contains(REFUSED_STATUS), "{message}");
    assert!(message.contains("not mallory-"), "names the writer: {message}");

    // Long enough for a controller that believed it to act (the finding: a delete within 0.2 s).
    tokio::time::sleep(Duration::from_secs(3)).await;
    world.assert_untouched().await;
    let stored = world.stored().await;
    assert_eq!(stored.status, world.record.status, "the record unchanged");
    world.controller.stop().await;
}

#[tokio::test]
async fn with_the_records_policy_a_person_cannot_create_a_record_for_a_healthy_node() {
    let s = Scenario::new(2).await;
    let user = format!("mallory-{}", s.scope);
    grant(
        &s.client,
        &user,
        json!([{"apiGroups": ["gpuremediation.dev"], "resources": ["gpuremediations"], "verbs": ["create", "get", "list"]},
               {"apiGroups": ["gpuremediation.dev"], "resources": ["gpuremediations/status"], "verbs": ["patch"]}]),
    )
    .await;
    let mallory = client_as(&user).await;
    install_records_policy(&s, &mallory).await;
    let node = s.fleet.node_names()[0].clone();
    // A record as the controller would write it, for a node whose GPUs are healthy: believed, its
    // node would be cordoned, drained and deleted.
    let record: GpuRemediation = serde_json::from_value(json!({
        "apiVersion": "gpuremediation.dev/v1alpha1", "kind": "GpuRemediation",
        "metadata": {"name": common::unique_name("forged"), "labels": {POLICY_LABEL: s.scope}},
        "spec": {"nodeName": node, "policyName": s.scope, "action": "Replace", "mode": "Enforce",
                 "trigger": {"conditionType": "GpuHealthy", "status": "False", "reason": "XID79"}},
    }))
    .unwrap();
    let records = Api::<GpuRemediation>::all(mallory.clone());
    let message = refusal(
        "mallory's record",
        records.create(&PostParams::default(), &record).await,
    );
    assert!(message.contains("gpu-remediator-records-create-"), "{message}");
    assert!(message.contains(REFUSED_CREATE), "{message}");
    assert!(
        message.contains(&format!("not {user}")),
        "names the writer: {message}"
    );
    let stored = records
        .list(&kube::api::ListParams::default().labels(&format!("{POLICY_LABEL}={}", s.scope)))
        .await
        .unwrap();
    assert!(stored.items.is_empty(), "no record stored: {:?}", stored.items);
    let standing: Node = Api::all(s.client.clone()).get(&node).await.unwrap();
    assert!(
        !is_unschedulable(&standing) && !has_our_taint(&standing),
        "the node untouched"
    );
}

#[tokio::test]
async fn with_the_records_policy_an_editor_cannot_strip_the_controllers_finalizer() {
    let s = Scenario::new(2).await;
    let mallory = status_patcher(&s.client, &format!("mallory-{}", s.scope)).await;
    install_records_policy(&s, &mallory).await;
    let world = awaiting_approval(s).await;
    assert!(
        world
            .record
            .finalizers()
            .iter()
            .any(|f| f == REMEDIATION_FINALIZER),
        "the record carries the controller's finalizer"
    );
    let editor = format!("editor-{}", world.s.scope);
    grant(
        &world.s.client,
        &editor,
        json!([{"apiGroups": ["gpuremediation.dev"], "resources": ["gpuremediations"], "verbs": ["get", "patch"]}]),
    )
    .await;

    // Without it, deleting the record would no longer give back what it holds on the node.
    let strip = json!({"metadata": {"finalizers": null}});
    let message = refusal(
        "the editor's finalizer removal",
        Api::<GpuRemediation>::all(client_as(&editor).await)
            .patch(
                &world.record.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&strip),
            )
            .await,
    );
    assert!(message.contains(REFUSED_METADATA), "{message}");
    assert!(message.contains(&editor), "names the writer: {message}");

    tokio::time::sleep(Duration::from_secs(3)).await;
    world.assert_untouched().await;
    let stored = world.stored().await;
    assert_eq!(
        stored.finalizers(),
        world.record.finalizers(),
        "the finalizer kept"
    );
    assert_eq!(stored.status, world.record.status, "the record unchanged");
    world.controller.stop().await;
}

#[tokio::test]
async fn without_the_records_policy_a_record_moved_to_replacing_is_held_as_tampered_and_its_node_left_alone()
{
    let s = Scenario::new(2).await;
    let mallory = status_patcher(&s.client, &format!("mallory-{}", s.scope)).await;
    let world = awaiting_approval(s).await;
    let name = world.record.name_any();

    let landed = patch_status(&mallory, &name, &to_replacing())
        .await
        .expect("no policy: the write lands");
    assert_eq!(landed.status.map(|st| st.phase), Some(Phase::Replacing));

    let notes = eventually("the StatusTampered Event", Duration::from_secs(30), || async {
        let notes = event_notes(&world.s.client, &name, "StatusTampered").await;
        (!notes.is_empty()).then_some(notes)
    })
    .await;
    assert!(
        notes[0].contains("Replacing without an approval"),
        "names the tampering: {notes:?}"
    );
    assert!(
        notes[0].contains(&format!("nothing is done to node {}", world.broken)),
        "{notes:?}"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    world.assert_untouched().await;
    let stored = world.stored().await;
    let status = stored.status.expect("a status");
    assert_eq!(
        status.phase,
        Phase::Replacing,
        "held where it was put, not acted on"
    );
    let tampered = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Tampered")
        .expect("the Tampered condition");
    assert_eq!(tampered.status, "True");
    assert!(status.replacement.is_none(), "no replacement triggered");
    world.controller.stop().await;
}
