//! API Priority and Fairness as shipped (`manifests/controller/flow-schemas.yaml`, in the base):
//! the API server itself says, in the `X-Kubernetes-PF-FlowSchema-UID` and
//! `X-Kubernetes-PF-PriorityLevel-UID` headers of each answer, which FlowSchema and priority level
//! served a request. Sent as the shipped service accounts under the shipped RBAC, the fault path
//! (the controller's node reads and edits, remediation creates and status writes; the agents'
//! condition, in a schema of its own) is served by `workload-high` and the Lease by `leader-election`, while the bulk
//! (evictions, pod lists, Events, the agent's own reads) stays in `workload-low` with every other
//! service account, so a drain cannot queue the fence of the next fault behind its evictions. A
//! service account the manifest does not name gains nothing.

mod common;

use std::collections::BTreeMap;

use common::cluster;
use http::{Method, Request};
use k8s_openapi::api::{
    core::v1::{Node, Pod, ServiceAccount},
    flowcontrol::v1::{FlowSchema, PriorityLevelConfiguration},
};
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, ObjectMeta, PostParams},
};
use serde_json::{Value, json};

const NAMESPACE: &str = "gpu-remediation";

/// Which FlowSchema and priority level served one request, by name, and its status code.
#[derive(Debug)]
struct Served {
    status: u16,
    flow_schema: String,
    priority_level: String,
}

impl Served {
    /// Asserts it succeeded and was served by `expected` (FlowSchema, priority level).
    fn assert_by(&self, expected: (&str, &str), what: &str) {
        assert!(self.status < 300, "{what}: {self:?}");
        assert_eq!(
            (self.flow_schema.as_str(), self.priority_level.as_str()),
            expected,
            "{what}"
        );
    }
}

/// The cluster's FlowSchemas and priority levels by UID (the response headers carry UIDs).
struct Classifier {
    flow_schemas: BTreeMap<String, String>,
    priority_levels: BTreeMap<String, String>,
}

impl Classifier {
    async fn read(admin: &Client) -> Self {
        let by_uid = |names: Vec<(Option<String>, String)>| {
            names
                .into_iter()
                .map(|(uid, name)| (uid.expect("a stored object has a uid"), name))
                .collect()
        };
        let schemas = Api::<FlowSchema>::all(admin.clone())
            .list(&ListParams::default())
            .await
            .unwrap();
        let levels = Api::<PriorityLevelConfiguration>::all(admin.clone())
            .list(&ListParams::default())
            .await
            .unwrap();
        Self {
            flow_schemas: by_uid(schemas.iter().map(|s| (s.uid(), s.name_any())).collect()),
            priority_levels: by_uid(levels.iter().map(|l| (l.uid(), l.name_any())).collect()),
        }
    }

    /// Sends one request as `client` and names what served it.
    async fn send(
        &self,
        client: &Client,
        method: Method,
        uri: &str,
        content_type: &str,
        body: Option<&Value>,
    ) -> Served {
        let request = Request::builder()
            .method(method.clone())
            .uri(uri)
            .header(http::header::CONTENT_TYPE, content_type)
            .body(
                body.map(|b| serde_json::to_vec(b).unwrap())
                    .unwrap_or_default()
                    .into(),
            )
            .unwrap();
        let response = client
            .send(request)
            .await
            .unwrap_or_else(|e| panic!("{method} {uri}: {e}"));
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .unwrap_or_else(|| panic!("{method} {uri}: no {name} header in the answer"))
                .to_str()
                .unwrap()
                .to_owned()
        };
        let name = |names: &BTreeMap<String, String>, uid: String| {
            names
                .get(&uid)
                .cloned()
                .unwrap_or_else(|| format!("unknown uid {uid}"))
        };
        Served {
            status: response.status().as_u16(),
            flow_schema: name(&self.flow_schemas, header("X-Kubernetes-PF-FlowSchema-UID")),
            priority_level: name(&self.priority_levels, header("X-Kubernetes-PF-PriorityLevel-UID")),
        }
    }
}

/// A client of a fresh token of `account` in `namespace` (the account is created if missing).
async fn client_of(admin: &Client, namespace: &str, account: &str) -> Client {
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), namespace);
    let _ = accounts
        .create(
            &PostParams::default(),
            &ServiceAccount {
                metadata: ObjectMeta {
                    name: Some(account.into()),
                    ..ObjectMeta::default()
                },
                ..ServiceAccount::default()
            },
        )
        .await;
    let request = serde_json::from_value(json!({"spec": {"expirationSeconds": 3600}})).unwrap();
    let token = accounts
        .create_token_request(account, &PostParams::default(), &request)
        .await
        .expect("a token")
        .status
        .expect("a token status")
        .token;
    cluster().await.client_with_token(&token)
}

/// The shipped namespace, CRDs, RBAC and FlowSchemas (once per test binary: the tests run at
/// once), and a node with one pod on it.
async fn installed(admin: &Client) -> (String, String) {
    static SHIPPED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    SHIPPED
        .get_or_init(|| async {
            for file in [
                "manifests/namespace.yaml",
                "manifests/controller/rbac.yaml",
                "manifests/agent/rbac.yaml",
                "manifests/controller/flow-schemas.yaml",
            ] {
                common::kubectl_apply(file).await;
            }
        })
        .await;
    common::install_generated_crds(admin).await;
    let node: Node =
        serde_json::from_value(json!({"metadata": {"name": common::unique_name("apf-node")}})).unwrap();
    let node = Api::<Node>::all(admin.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap()
        .name_any();
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": common::unique_name("apf-pod"), "namespace": "default"},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "e2e:none"}]},
    }))
    .unwrap();
    let pod = Api::<Pod>::namespaced(admin.clone(), "default")
        .create(&PostParams::default(), &pod)
        .await
        .unwrap()
        .name_any();
    (node, pod)
}

const JSON: &str = "application/json";
const MERGE: &str = "application/merge-patch+json";
const APPLY: &str = "application/apply-patch+yaml";

#[tokio::test]
async fn the_fault_path_is_served_by_workload_high_and_a_drains_evictions_stay_in_workload_low() {
    let admin = cluster().await.client();
    let (node, pod) = installed(&admin).await;
    let classifier = Classifier::read(&admin).await;
    let controller = client_of(&admin, NAMESPACE, "gpu-remediator").await;
    let remediation = common::unique_name("apf");

    let cordon = json!({"spec": {"unschedulable": true}});
    let record = json!({
        "apiVersion": "gpuremediation.dev/v1alpha1", "kind": "GpuRemediation",
        "metadata": {"name": remediation},
        "spec": {"nodeName": node, "policyName": "p", "action": "None",
                 "trigger": {"conditionType": "GpuHealthy", "status": "False"}},
    });
    let phase = json!({"status": {"phase": "Cordoned"}});
    let fault_path = [
        (Method::GET, format!("/api/v1/nodes/{node}"), JSON, None),
        (
            Method::PATCH,
            format!("/api/v1/nodes/{node}"),
            MERGE,
            Some(&cordon),
        ),
        (
            Method::POST,
            "/apis/gpuremediation.dev/v1alpha1/gpuremediations".to_owned(),
            JSON,
            Some(&record),
        ),
        (
            Method::PATCH,
            format!("/apis/gpuremediation.dev/v1alpha1/gpuremediations/{remediation}/status"),
            MERGE,
            Some(&phase),
        ),
    ];
    for (method, uri, content_type, body) in fault_path {
        let served = classifier
            .send(&controller, method.clone(), &uri, content_type, body)
            .await;
        served.assert_by(
            ("gpu-remediator-fault-path", "workload-high"),
            &format!("{method} {uri} as the controller"),
        );
    }

    let eviction = json!({
        "apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": pod, "namespace": "default"},
    });
    let event = json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": common::unique_name("apf-event"), "namespace": "default"},
        "involvedObject": {"kind": "Node", "name": node, "apiVersion": "v1"},
        "reason": "Draining", "message": "e2e", "type": "Normal",
    });
    let bulk = [
        (
            Method::POST,
            format!("/api/v1/namespaces/default/pods/{pod}/eviction"),
            Some(&eviction),
        ),
        (
            Method::GET,
            format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{node}"),
            None,
        ),
        (
            Method::POST,
            "/api/v1/namespaces/default/events".to_owned(),
            Some(&event),
        ),
        (Method::GET, "/api/v1/nodes?limit=500".to_owned(), None),
    ];
    for (method, uri, body) in bulk {
        let served = classifier
            .send(&controller, method.clone(), &uri, JSON, body)
            .await;
        served.assert_by(
            ("service-accounts", "workload-low"),
            &format!("{method} {uri} as the controller"),
        );
    }
}

#[tokio::test]
async fn the_controllers_lease_is_served_by_leader_election() {
    let admin = cluster().await.client();
    installed(&admin).await;
    let classifier = Classifier::read(&admin).await;
    let controller = client_of(&admin, NAMESPACE, "gpu-remediator").await;
    let leases = format!("/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases");
    let name = common::unique_name("apf-lease");
    let lease = json!({"metadata": {"name": name}, "spec": {"holderIdentity": "replica-a"}});

    let created = classifier
        .send(&controller, Method::POST, &leases, JSON, Some(&lease))
        .await;
    let read = classifier
        .send(&controller, Method::GET, &format!("{leases}/{name}"), JSON, None)
        .await;
    let stored: Value = serde_json::to_value(
        Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(admin.clone(), NAMESPACE)
            .get(&name)
            .await
            .unwrap(),
    )
    .unwrap();
    let renewed = classifier
        .send(
            &controller,
            Method::PUT,
            &format!("{leases}/{name}"),
            JSON,
            Some(&stored),
        )
        .await;
    for (served, what) in [(created, "create"), (read, "get"), (renewed, "update")] {
        served.assert_by(("gpu-remediator-leader-election", "leader-election"), what);
    }
}

#[tokio::test]
async fn the_agents_condition_is_a_workload_high_flow_of_its_own_and_its_reads_are_not() {
    let admin = cluster().await.client();
    let (node, _) = installed(&admin).await;
    let classifier = Classifier::read(&admin).await;
    let agent = client_of(&admin, NAMESPACE, "gpu-health-agent").await;
    let condition = json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": node},
        "status": {"conditions": [{"type": "GpuHealthy", "status": "False", "reason": "XidError",
                                   "message": "e2e"}]},
    });
    let status = format!("/api/v1/nodes/{node}/status?fieldManager=gpu-health-agent&force=true");

    let written = classifier
        .send(&agent, Method::PATCH, &status, APPLY, Some(&condition))
        .await;
    written.assert_by(
        ("gpu-remediator-agents", "workload-high"),
        "the agent's condition",
    );
    // A schema of the agents' own: their writes are a flow apart from the controller's fault path
    // (one flow for every agent: they are one user, see the manifest).
    let schema = Api::<FlowSchema>::all(admin.clone())
        .get("gpu-remediator-agents")
        .await
        .expect("the agents' FlowSchema")
        .spec
        .expect("a spec");
    assert_eq!(
        schema.distinguisher_method.map(|d| d.type_).as_deref(),
        Some("ByUser")
    );
    let read = classifier
        .send(&agent, Method::GET, &format!("/api/v1/nodes/{node}"), JSON, None)
        .await;
    assert!(read.status < 300, "{read:?}");
    assert_eq!(read.flow_schema, "service-accounts");
}

#[tokio::test]
async fn a_service_account_the_manifest_does_not_name_gains_nothing() {
    let admin = cluster().await.client();
    let (node, _) = installed(&admin).await;
    let classifier = Classifier::read(&admin).await;
    // Same name as the controller's account, another namespace: subjects match by both.
    let impostor = client_of(&admin, "default", "gpu-remediator").await;
    let cordon = json!({"spec": {"unschedulable": true}});

    let served = classifier
        .send(
            &impostor,
            Method::PATCH,
            &format!("/api/v1/nodes/{node}"),
            MERGE,
            Some(&cordon),
        )
        .await;
    // Classified before it is authorized (and refused: it has no rights).
    assert_eq!(served.status, 403, "{served:?}");
    assert_eq!(
        (served.flow_schema.as_str(), served.priority_level.as_str()),
        ("service-accounts", "workload-low")
    );
}
