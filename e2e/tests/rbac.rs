//! The controller under the permissions a real installation gives it, on the real control plane:
//! `manifests/` is rendered by the pinned `kubectl kustomize` and applied (everything but the
//! workloads), a token is requested for the manifests' `gpu-remediator` service account, and the
//! controller, leader election included, runs with nothing but that token. It must complete a
//! remediation, and the server must refuse what the base role does not grant: deleting a pod,
//! which only the optional `force-delete` component allows. Admission's last look at a node (a read
//! naming a version, served from the API server's watch cache) is allowed and never older than it.

mod common;

use std::{path::PathBuf, time::Duration};

use common::eventually;
use gpu_remediation_api::{GpuRemediation, GpuRemediationPolicy, Phase};
use gpu_remediator::{
    Settings,
    drain::Leaving,
    election::{ElectionConfig, Elector, lease_client},
    leader::Fence,
    write::Writer,
};
use gpu_sandbox::{
    demo::install,
    fault,
    fleet::FLEET_LABEL,
    workload::{self, Budget, Workload},
};
use k8s_openapi::api::{
    core::v1::{Node, Pod},
    events::v1::Event,
    rbac::v1::ClusterRoleBinding,
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use tokio::sync::{Mutex, OnceCell};

const NAMESPACE: &str = "gpu-remediation";
const SERVICE_ACCOUNT: &str = "gpu-remediator";
/// Label on this binary's policies; the controller enforces only these.
const SCOPE_LABEL: &str = "e2e.gpuremediation.dev/scope";

/// Held by a test while it relies on the base RBAC alone, and by the test that grants the
/// optional role for a moment, so no test sees a permission it should not have.
static BASE_RBAC_ONLY: Mutex<()> = Mutex::const_new(());

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Renders `manifests/` and applies it (once per test binary), waiting until the CRDs serve.
async fn installed() -> Client {
    static INSTALLED: OnceCell<()> = OnceCell::const_new();
    let cluster = common::cluster().await;
    let client = cluster.client();
    INSTALLED
        .get_or_init(|| async {
            let objects = install::render(&cluster.kubectl(), &repo().join("manifests"))
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let applied: Vec<Value> = objects
                .into_iter()
                .filter(install::is_applied_in_sandbox)
                .collect();
            install::apply(&client, &applied)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            eventually("the CRDs to serve", Duration::from_secs(30), || {
                let client = client.clone();
                async move {
                    Api::<GpuRemediationPolicy>::all(client.clone())
                        .list(&ListParams::default())
                        .await
                        .ok()?;
                    Api::<GpuRemediation>::all(client)
                        .list(&ListParams::default())
                        .await
                        .ok()
                }
            })
            .await;
        })
        .await;
    client
}

/// A config that authenticates as the manifests' service account, with a fresh bound token.
async fn service_account_config(admin: &Client) -> kube::Config {
    let token = install::service_account_token(admin, NAMESPACE, SERVICE_ACCOUNT, 3600)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    common::cluster().await.config_with_token(&token)
}

async fn set_unschedulable(client: &Client, node: &str, unschedulable: bool) {
    let patch = json!({"spec": {"unschedulable": unschedulable}});
    Api::<Node>::all(client.clone())
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// The controller and its leader election, each speaking only with the service account's token,
/// enforcing only the policies labelled with `scope`.
struct ServiceAccountController {
    stop: tokio::sync::watch::Sender<bool>,
    controller: tokio::task::JoinHandle<Result<(), gpu_remediator::RunControllerError>>,
    election: tokio::task::JoinHandle<
        Result<gpu_remediator::election::ElectionEnd, gpu_remediator::election::RunElectionError>,
    >,
}

impl ServiceAccountController {
    async fn start(admin: &Client, scope: &str) -> Self {
        let config = service_account_config(admin).await;
        let (fence, keeper) = Fence::keeper(Some(NAMESPACE));
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let until_stopped = |mut stopped: tokio::sync::watch::Receiver<bool>| async move {
            let _ = stopped.wait_for(|s| *s).await;
        };
        let elector = Elector::new(
            lease_client(config.clone()).unwrap(),
            ElectionConfig::new(NAMESPACE, &format!("rbac-e2e-{scope}")),
            keeper,
        );
        let election = tokio::spawn(elector.run(until_stopped(stopped.clone())));
        let settings = Settings {
            policy_selector: Some(format!("{SCOPE_LABEL}={scope}")),
            eviction_backoff: Duration::from_secs(1),
            pod_poll: Duration::from_millis(250),
            instance: Some(format!("rbac-e2e-{scope}")),
            ..Settings::default()
        };
        let controller = tokio::spawn(gpu_remediator::run(
            config,
            settings,
            fence.clone(),
            until_stopped(stopped),
        ));
        eventually("the leader Lease", Duration::from_secs(30), || {
            let fence = fence.clone();
            async move { fence.is_current().then_some(()) }
        })
        .await;
        Self {
            stop,
            controller,
            election,
        }
    }

    /// Stops both, as a SIGTERM would, and checks they ended cleanly (the Lease released).
    async fn stop(self) {
        self.stop.send_replace(true);
        let ended = tokio::time::timeout(Duration::from_secs(15), async {
            (self.controller.await, self.election.await)
        })
        .await
        .expect("the controller and its election stop within 15s");
        ended.0.unwrap().expect("the controller ended without error");
        ended.1.unwrap().expect("the election ended without error");
    }
}

fn phase(remediation: &GpuRemediation) -> Option<Phase> {
    remediation.status.as_ref().map(|s| s.phase)
}

#[tokio::test]
async fn the_controller_with_only_its_service_account_token_completes_a_remediation() {
    common::init_logs();
    let admin = installed().await;
    let _base_only = BASE_RBAC_ONLY.lock().await;
    let namespace = common::namespace().await;
    let fleet = common::fleet(3).await;
    let mut nodes = fleet.node_names();
    nodes.sort();
    let (broken, spare) = (nodes[0].clone(), nodes[1].clone());

    // Three replicas on the node that breaks, behind a budget that lets one go at a time.
    let web = Workload::new(&namespace, "web")
        .replicas(3)
        .on_nodes(&[broken.clone(), spare.clone()]);
    set_unschedulable(&admin, &spare, true).await;
    workload::create(&admin, &web.deployment()).await.unwrap();
    workload::wait_ready_pods(&admin, &namespace, &web.selector(), 3, Duration::from_secs(60))
        .await
        .unwrap();
    set_unschedulable(&admin, &spare, false).await;
    workload::create(&admin, &web.pdb(&Budget::min_available(2)))
        .await
        .unwrap();
    workload::wait_pdb_allows(&admin, &namespace, "web", 1, Duration::from_secs(60))
        .await
        .unwrap();

    let scope = fleet.name().to_owned();
    let policy: GpuRemediationPolicy = serde_json::from_value(json!({
        "apiVersion": "gpuremediation.dev/v1alpha1",
        "kind": "GpuRemediationPolicy",
        "metadata": {"name": scope, "labels": {SCOPE_LABEL: scope}},
        "spec": {
            "nodeSelector": {"matchLabels": {FLEET_LABEL: scope}},
            "triggers": [{"conditionType": "GpuHealthy", "status": "False", "for": "1s"}],
            "action": "Replace",
            "replacement": {"strategy": "DeleteNode", "timeout": "5s"},
            "safety": {"maxConcurrent": 1, "maxUnhealthy": "50%"},
            "drain": {"timeout": "2m"},
        },
    }))
    .unwrap();
    Api::<GpuRemediationPolicy>::all(admin.clone())
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();

    let controller = ServiceAccountController::start(&admin, &scope).await;

    fault::set_gpu_condition(&admin, &broken, "False", "XID79", "GPU 3 fell off the bus")
        .await
        .unwrap();
    let remediations = Api::<GpuRemediation>::all(admin.clone());
    let done = eventually("the remediation to succeed", Duration::from_secs(90), || {
        let remediations = remediations.clone();
        let (broken, scope) = (broken.clone(), scope.clone());
        async move {
            let all = remediations.list(&ListParams::default()).await.ok()?;
            all.items.into_iter().find(|r| {
                r.spec.node_name == broken
                    && r.spec.policy_name == scope
                    && phase(r) == Some(Phase::Succeeded)
            })
        }
    })
    .await;
    let drain = done.status.as_ref().and_then(|s| s.drain.clone()).unwrap();
    assert_eq!((drain.pods_total, drain.pods_evicted), (3, 3), "{drain:?}");
    // Cordoned by a replace of the Node (the role's update verb), then deleted (its delete verb).
    let history: Vec<Phase> = done
        .status
        .as_ref()
        .map(|s| s.phase_history.iter().map(|t| t.phase).collect())
        .unwrap_or_default();
    for phase in [
        Phase::Cordoned,
        Phase::Draining,
        Phase::Replacing,
        Phase::Succeeded,
    ] {
        assert!(history.contains(&phase), "{phase} missing from {history:?}");
    }
    assert!(
        Api::<Node>::all(admin.clone())
            .get_opt(&broken)
            .await
            .unwrap()
            .is_none(),
        "the node was deleted under the service account's RBAC"
    );
    let left_on_node = Api::<Pod>::namespaced(admin.clone(), &namespace)
        .list(&ListParams::default().fields(&format!("spec.nodeName={broken}")))
        .await
        .unwrap();
    assert!(
        left_on_node.items.is_empty(),
        "evictions went through: {:?}",
        left_on_node.items
    );

    // Events were written too (the role's events verbs), by the controller's identity.
    let name = done.name_any();
    let events = Api::<Event>::namespaced(admin.clone(), "default");
    eventually("an Event about the remediation", Duration::from_secs(10), || {
        let events = events.clone();
        let name = name.clone();
        async move {
            let all = events.list(&ListParams::default()).await.ok()?;
            all.items
                .into_iter()
                .find(|e| {
                    e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name.as_str())
                        && e.reporting_controller.as_deref() == Some("gpu-remediator")
                })
                .map(drop)
        }
    })
    .await;

    // Every write carried the claim the base's fence policy checks: the status names it.
    let claim = done
        .status
        .as_ref()
        .and_then(|s| s.claim.clone())
        .unwrap_or_default();
    assert!(claim.starts_with(&format!("rbac-e2e-{scope}/")), "{claim}");

    controller.stop().await;
    fleet.stop().await.unwrap();
}

#[tokio::test]
async fn a_direct_pod_delete_is_refused_unless_the_optional_force_delete_role_is_installed() {
    let admin = installed().await;
    let namespace = common::namespace().await;
    let fleet = common::fleet(1).await;
    let node = fleet.node_names()[0].clone();
    let solo = Workload::new(&namespace, "solo");
    workload::create(&admin, &solo.bare_pod("solo", &node))
        .await
        .unwrap();
    let as_controller = Client::try_from(service_account_config(&admin).await).unwrap();
    let pods = Api::<Pod>::namespaced(as_controller, &namespace);

    // The base role: pods are listed and evicted, never deleted.
    let listed = pods
        .list(&ListParams::default())
        .await
        .expect("pods may be listed");
    assert_eq!(listed.items.len(), 1);
    {
        let _base_only = BASE_RBAC_ONLY.lock().await;
        match pods.delete("solo", &DeleteParams::default()).await {
            Err(kube::Error::Api(status)) => {
                assert_eq!(status.code, 403, "{status:?}");
                assert!(
                    status
                        .message
                        .contains("system:serviceaccount:gpu-remediation:gpu-remediator")
                        && status.message.contains("cannot delete resource \"pods\""),
                    "the refusal names who and what: {}",
                    status.message
                );
            }
            other => panic!("a direct pod delete must be refused with 403, got {other:?}"),
        }
    }

    // With the optional component, the controller's force delete (its claim stamped on the pod,
    // then a delete preconditioned on that write, as the base's fence policy asks) is allowed;
    // then the grant is taken back. No controller runs meanwhile: this test leads for a moment.
    let _granting = BASE_RBAC_ONLY.lock().await;
    let (fence, _keeper) = lead_for_a_moment(&admin, "rbac-e2e-force-delete").await;
    let reporter = kube::runtime::events::Reporter {
        controller: "gpu-remediator".into(),
        instance: None,
    };
    let as_controller = Client::try_from(service_account_config(&admin).await).unwrap();
    let ops = Writer::from_clients(as_controller.clone(), as_controller, fence, reporter);
    let solo_pod = pods.get("solo").await.unwrap();
    let leaving = Leaving {
        namespace: namespace.clone(),
        name: "solo".into(),
        uid: solo_pod.uid().unwrap(),
        terminating: false,
        gone_by: None,
        labels: std::collections::BTreeMap::new(),
        readiness: gpu_remediator::drain::Readiness::Ready,
        notice: gpu_remediator::drain::Notice::default(),
        gpus: 0,
    };
    let optional = std::fs::read_to_string(repo().join("manifests/optional/force-delete/rbac.yaml")).unwrap();
    let objects = install::parse_documents(&optional).unwrap();
    install::apply(&admin, &objects)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let deleted = eventually(
        "the force-delete role to take effect",
        Duration::from_secs(10),
        || {
            let (ops, leaving) = (ops.clone(), leaving.clone());
            async move {
                match ops.force_delete(&leaving, None).await {
                    Ok(Ok(())) => Some(Ok(())),
                    Ok(Err(words)) if words.code() == Some(403) && !words.message.contains("fenced") => None,
                    Ok(Err(words)) => Some(Err(format!("{words:?}"))),
                    Err(other) => Some(Err(other.to_string())),
                }
            }
        },
    )
    .await;
    let revoke = Api::<ClusterRoleBinding>::all(admin.clone())
        .delete("gpu-remediator-force-delete", &DeleteParams::default())
        .await;
    deleted.expect("the delete is allowed with the optional role");
    revoke.expect("the optional binding is removed again");
    assert!(
        pods.get_opt("solo")
            .await
            .unwrap()
            .is_none_or(|pod| pod.metadata.deletion_timestamp.is_some()),
        "the pod is deleted"
    );
    fleet.stop().await.unwrap();
}

#[tokio::test]
async fn the_last_look_at_a_node_is_at_least_as_fresh_as_the_version_named_and_the_role_allows_it() {
    let admin = installed().await;
    let fleet = common::fleet(1).await;
    let node = fleet.node_names()[0].clone();
    let reporter = kube::runtime::events::Reporter {
        controller: "gpu-remediator".into(),
        instance: None,
    };
    let as_controller = Client::try_from(service_account_config(&admin).await).unwrap();
    let ops = Writer::from_clients(
        as_controller.clone(),
        as_controller,
        Fence::standalone(),
        reporter,
    );

    // A write the controller's watch may not have delivered yet: a read naming its version is
    // answered from the API server's watch cache once that cache holds it, never older.
    let written = Api::<Node>::all(admin.clone())
        .patch(
            &node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"e2e.gpuremediation.dev/seen": "fresh"}}})),
        )
        .await
        .unwrap();
    let version = written.resource_version().unwrap();
    let read = ops
        .reader()
        .read_node(&node, Some(&version))
        .await
        .expect("the base role reads nodes")
        .expect("the node exists");
    assert_eq!(
        read.labels()
            .get("e2e.gpuremediation.dev/seen")
            .map(String::as_str),
        Some("fresh"),
        "the read is at least as fresh as version {version}"
    );
    assert!(
        ops.reader()
            .read_node("no-such-node", Some(&version))
            .await
            .unwrap()
            .is_none(),
        "a node that does not exist reads as gone"
    );
    fleet.stop().await.unwrap();
}

/// Writes the controller's Lease as held by `holder` (one more transition, a one-second lease, so
/// the next controller takes over at once) and returns a fence holding that claim.
async fn lead_for_a_moment(admin: &Client, holder: &str) -> (Fence, gpu_remediator::leader::FenceKeeper) {
    use k8s_openapi::{
        api::coordination::v1::{Lease, LeaseSpec},
        apimachinery::pkg::apis::meta::v1::MicroTime,
    };
    let leases = Api::<Lease>::namespaced(admin.clone(), NAMESPACE);
    let existing = leases.get_opt("gpu-remediator").await.unwrap();
    let transitions = existing
        .as_ref()
        .and_then(|l| l.spec.as_ref())
        .and_then(|s| s.lease_transitions)
        .unwrap_or(0)
        + 1;
    let mut lease = existing.unwrap_or_else(|| Lease {
        metadata: kube::api::ObjectMeta {
            name: Some("gpu-remediator".into()),
            namespace: Some(NAMESPACE.into()),
            ..kube::api::ObjectMeta::default()
        },
        spec: None,
    });
    lease.spec = Some(LeaseSpec {
        holder_identity: Some(holder.into()),
        lease_duration_seconds: Some(1),
        lease_transitions: Some(transitions),
        renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
        acquire_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
        ..LeaseSpec::default()
    });
    if lease.metadata.resource_version.is_some() {
        leases
            .replace("gpu-remediator", &PostParams::default(), &lease)
            .await
            .unwrap();
    } else {
        leases.create(&PostParams::default(), &lease).await.unwrap();
    }
    let (fence, keeper) = Fence::keeper(None);
    keeper.hold_until(tokio::time::Instant::now() + Duration::from_secs(120));
    keeper.claimed_as(holder, transitions);
    (fence, keeper)
}
