//! Device-level quarantine's acting half against a recording writer: the rules follow the nodes.

use gpu_remediation_api::constants::DEVICE_QUARANTINE_LABEL;
use jiff::{SignedDuration, Timestamp};
use kube::ResourceExt as _;
use serde_json::json;

use crate::quarantine::device::{self, QuarantinedDevice};
use crate::{dra::wire, write::recording::context};

const RULES: &str = "/apis/resource.k8s.io/v1alpha3/devicetaintrules";

fn gpu(uuid: &str, name: &str) -> QuarantinedDevice {
    QuarantinedDevice {
        uuid: uuid.into(),
        driver: "gpu.nvidia.com".into(),
        pool: "gpu-1".into(),
        device: name.into(),
    }
}

/// A context whose one node, `gpu-1`, carries policy `p`'s device-level quarantine of GPU-1.
fn with_gpu_1_marked() -> (
    crate::context::Context,
    crate::write::recording::Recording,
    QuarantinedDevice,
) {
    let since = Timestamp::now() - SignedDuration::from_secs(60);
    let mut node = crate::act::remediation::tests::broken_node(since);
    let failed = gpu("GPU-1", "gpu-1");
    assert!(device::mark(&mut node, "p", std::slice::from_ref(&failed)));
    let (ctx, recording) = context(
        vec![crate::act::remediation::tests::policy()],
        Vec::new(),
        vec![node],
    );
    (ctx, recording, failed)
}

#[tokio::test]
async fn a_marked_device_gets_its_rule_and_a_rule_no_node_names_is_deleted() {
    let (ctx, recording, failed) = with_gpu_1_marked();
    recording.put("/apis/resource.k8s.io/v1alpha3", discovery("v1alpha3", true));
    // A rule of ours for a device no node names any more (its quarantine was lifted meanwhile).
    let stale = device::rule(
        wire::TaintRuleVersion::V1alpha3,
        "p",
        "gpu-9",
        &gpu("GPU-9", "gpu-9"),
    );
    let mut stale_json = serde_json::to_value(&stale).expect("a rule");
    stale_json["metadata"]["uid"] = json!("uid-stale");
    recording.put(&format!("{RULES}/{}", stale.name_any()), stale_json);

    super::reconcile(&ctx, &["gpu-1".to_owned()])
        .await
        .expect("the rules follow the nodes");

    let wanted = device::rule(wire::TaintRuleVersion::V1alpha3, "p", "gpu-1", &failed);
    assert_eq!(
        recording.writes(),
        [
            format!("POST {RULES}"),
            format!("DELETE {RULES}/{}", stale.name_any())
        ]
    );
    let created = recording
        .object(&format!("{RULES}/{}", wanted.name_any()))
        .expect("the rule is stored");
    assert_eq!(created["metadata"]["labels"][DEVICE_QUARANTINE_LABEL], "true");
    assert_eq!(created["spec"]["deviceSelector"]["device"], "gpu-1");
    assert_eq!(created["apiVersion"], "resource.k8s.io/v1alpha3");
    let delete = recording
        .requests()
        .into_iter()
        .find(|r| r.method == http::Method::DELETE)
        .expect("the delete");
    assert_eq!(
        delete.body["preconditions"]["uid"], "uid-stale",
        "only the rule read, by its UID"
    );
}

/// The discovery document of `resource.k8s.io/<version>`, serving `devicetaintrules` or not.
fn discovery(version: &str, rules: bool) -> serde_json::Value {
    let resources = if rules {
        json!([{"name": "devicetaintrules", "singularName": "devicetaintrule", "namespaced": false,
                "kind": "DeviceTaintRule", "verbs": ["create", "delete", "get", "list"]}])
    } else {
        json!([])
    };
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": format!("resource.k8s.io/{version}"),
           "resources": resources})
}

#[tokio::test]
async fn the_most_stable_version_served_is_spoken_and_asked_again_once_forgotten() {
    use wire::TaintRuleVersion::{V1, V1alpha3};
    let (ctx, recording, _) = with_gpu_1_marked();
    assert_eq!(
        super::served(&ctx.reader).await,
        None,
        "nothing served: the node taint"
    );
    ctx.reader.forget_served("resource.k8s.io/v1");
    ctx.reader.forget_served("resource.k8s.io/v1beta2");
    ctx.reader.forget_served("resource.k8s.io/v1alpha3");
    recording.put("/apis/resource.k8s.io/v1alpha3", discovery("v1alpha3", true));
    recording.put("/apis/resource.k8s.io/v1beta2", discovery("v1beta2", false));
    recording.put("/apis/resource.k8s.io/v1", discovery("v1", true));
    assert_eq!(super::served(&ctx.reader).await, Some(V1));

    super::reconcile(&ctx, &["gpu-1".to_owned()])
        .await
        .expect("the rules follow the nodes");
    assert_eq!(
        recording.writes(),
        ["POST /apis/resource.k8s.io/v1/devicetaintrules"],
        "created in the GA version"
    );

    // The server stops serving v1 (a downgrade): the answer is kept until forgotten (a 404).
    recording.put("/apis/resource.k8s.io/v1", discovery("v1", false));
    assert_eq!(super::served(&ctx.reader).await, Some(V1), "kept a minute");
    ctx.reader.forget_served("resource.k8s.io/v1");
    assert_eq!(super::served(&ctx.reader).await, Some(V1alpha3));
}
