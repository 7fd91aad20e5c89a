//! The agent's credentials, as the kubelet gives them to its pod: a token of the agent's service
//! account bound to a pod on one node (the policy reads the node from it), and the agent's manifests
//! (namespace, RBAC, admission policy) that confine it. For the tests of that confinement
//! (`admission_agent`, `attacker_node`).

use k8s_openapi::api::{
    authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec},
    core::v1::{Node, Pod, ServiceAccount},
};
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};

use super::cluster;

/// The agent's namespace.
pub const NAMESPACE: &str = "gpu-remediation";
/// The agent's service account.
pub const SERVICE_ACCOUNT: &str = "gpu-health-agent";

/// The namespace, the agent's RBAC and its admission policy, applied once per test binary: two tests
/// applying them at once race (`kubectl apply` of a missing object creates it, and one loses with
/// `AlreadyExists`).
pub async fn install_agent_manifests() {
    static INSTALLED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    INSTALLED
        .get_or_init(|| async {
            super::kubectl_apply("manifests/namespace.yaml").await;
            super::kubectl_apply("manifests/agent/rbac.yaml").await;
            super::kubectl_apply("manifests/agent/admission-policy.yaml").await;
        })
        .await;
}

/// A token of the agent's service account, bound to `pod` when given (as the kubelet's projected
/// token is), or to nothing.
pub async fn token(admin: &Client, pod: Option<&Pod>) -> String {
    token_of(admin, SERVICE_ACCOUNT, pod).await
}

/// A token of `service_account` (in [`NAMESPACE`]), bound to `pod` when given, or to nothing.
pub async fn token_of(admin: &Client, service_account: &str, pod: Option<&Pod>) -> String {
    let request = TokenRequest {
        spec: TokenRequestSpec {
            expiration_seconds: Some(3600),
            bound_object_ref: pod.map(|pod| BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(pod.name_any()),
                uid: pod.metadata.uid.clone(),
            }),
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    Api::<ServiceAccount>::namespaced(admin.clone(), NAMESPACE)
        .create_token_request(service_account, &PostParams::default(), &request)
        .await
        .unwrap_or_else(|e| panic!("a token for {service_account}: {e}"))
        .status
        .expect("a token request status")
        .token
}

/// A client of the agent on `node`: a token bound to a pod there, as the kubelet projects it.
pub async fn agent_on(admin: &Client, node: &str) -> Client {
    client_on(admin, SERVICE_ACCOUNT, node).await
}

/// A client of `service_account` (in [`NAMESPACE`]) on `node`: a token bound to a pod of that
/// account there, as the kubelet projects it.
pub async fn client_on(admin: &Client, service_account: &str, node: &str) -> Client {
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": super::unique_name(service_account), "namespace": NAMESPACE},
        "spec": {"nodeName": node, "serviceAccountName": service_account, "automountServiceAccountToken": false,
                 "containers": [{"name": "main", "image": format!("{service_account}:e2e")}]},
    }))
    .unwrap();
    let pod = Api::<Pod>::namespaced(admin.clone(), NAMESPACE)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("{service_account}'s pod on {node}: {e}"));
    cluster()
        .await
        .client_with_token(&token_of(admin, service_account, Some(&pod)).await)
}

/// The agent's write: a server-side apply of `status` (and `annotations`) on `node`'s status.
pub async fn apply_status(
    agent: &Client,
    node: &str,
    annotations: &Value,
    status: &Value,
) -> Result<Node, kube::Error> {
    apply_metadata_and_status(agent, node, json!({"annotations": annotations}), status).await
}

/// [`apply_status`] with any `metadata` (its name set to `node`): what the agent's token could
/// write beyond what the agent does.
pub async fn apply_metadata_and_status(
    agent: &Client,
    node: &str,
    mut metadata: Value,
    status: &Value,
) -> Result<Node, kube::Error> {
    metadata["name"] = json!(node);
    let patch = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": metadata,
        "status": status,
    });
    Api::<Node>::all(agent.clone())
        .patch_status(
            node,
            &PatchParams::apply("gpu-health-agent").force(),
            &Patch::Apply(&patch),
        )
        .await
}

/// The refusal's message, asserting the agent's admission policy made it.
pub fn refusal<T: std::fmt::Debug>(what: &str, result: Result<T, kube::Error>) -> String {
    super::refused_by("gpu-health-agent-own-node-", what, result)
}

/// The agent's `GpuHealthy` condition, `status` since `since` (an XID 79).
pub fn gpu_healthy(status: &str, since: k8s_openapi::jiff::Timestamp) -> Value {
    json!({"conditions": [{
        "type": "GpuHealthy", "status": status, "reason": "XID79", "message": "GPU 3 fell off the bus",
        "lastTransitionTime": since.to_string(), "lastHeartbeatTime": k8s_openapi::jiff::Timestamp::now().to_string(),
    }]})
}

/// [`install_agent_manifests`] and [`agent_on`] `node`, once the API server enforces the policy: a
/// freshly created policy takes a moment to be loaded, and until then the agent's writes pass
/// unchecked. The probe, a healthy `GpuHealthy` with a `lastTransitionTime` an hour ahead, is
/// refused once it is loaded (and, written before, is overwritten by the node's next write).
pub async fn enforced_agent_on(admin: &Client, node: &str) -> Client {
    install_agent_manifests().await;
    let agent = agent_on(admin, node).await;
    super::eventually(
        "the agent's admission policy to be enforced",
        std::time::Duration::from_secs(30),
        || async {
            let ahead =
                k8s_openapi::jiff::Timestamp::now() + k8s_openapi::jiff::SignedDuration::from_hours(1);
            apply_status(&agent, node, &json!({}), &gpu_healthy("True", ahead))
                .await
                .is_err()
                .then_some(())
        },
    )
    .await;
    agent
}
