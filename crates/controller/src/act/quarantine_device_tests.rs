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

#[tokio::test]
async fn a_marked_device_gets_its_rule_and_a_rule_no_node_names_is_deleted() {
    let since = Timestamp::now() - SignedDuration::from_secs(60);
    let mut node = crate::act::remediation::tests::broken_node(since);
    let failed = gpu("GPU-1", "gpu-1");
    assert!(device::mark(&mut node, "p", std::slice::from_ref(&failed)));
    let (ctx, recording) = context(
        vec![crate::act::remediation::tests::policy()],
        Vec::new(),
        vec![node],
    );
    recording.put(
        "/apis/resource.k8s.io/v1alpha3",
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "resource.k8s.io/v1alpha3",
               "resources": [{"name": "devicetaintrules", "singularName": "devicetaintrule", "namespaced": false,
                              "kind": "DeviceTaintRule", "verbs": ["create", "delete", "get", "list"]}]}),
    );
    // A rule of ours for a device no node names any more (its quarantine was lifted meanwhile).
    let stale = device::rule("p", "gpu-9", &gpu("GPU-9", "gpu-9"));
    let mut stale_json = serde_json::to_value(&stale).expect("a rule");
    stale_json["metadata"]["uid"] = json!("uid-stale");
    recording.put(&format!("{RULES}/{}", stale.name_any()), stale_json);

    super::reconcile(&ctx, &["gpu-1".to_owned()])
        .await
        .expect("the rules follow the nodes");

    let wanted = device::rule("p", "gpu-1", &failed);
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
    assert_eq!(
        created["apiVersion"],
        format!("{}/{}", wire::GROUP, wire::TAINT_RULE_VERSION)
    );
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
