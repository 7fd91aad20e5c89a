//! The sandbox one benchmark run shares: a control plane whose API server audits the two peers'
//! requests, the project's CRDs, an identity per peer, and the helpers every scenario uses to
//! write a policy, break a node at a chosen instant and clean up.

use std::path::{Path, PathBuf};
use std::time::Duration;

use gpu_remediation_api::{
    GpuRemediation, GpuRemediationPolicy,
    constants::{FAILED_GPUS_ANNOTATION, node_conditions},
    crds,
};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::api::flowcontrol::v1::FlowSchema;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};

use super::actor::{self, ControllerOptions, ControllerProcess, Identity};
use super::audit::{self, AuditLog};
use super::setup::{BenchSetupError, api_error, eventually};
use crate::fault;
use crate::fleet::FLEET_LABEL;
use crate::retry::retrying;
use crate::{ControlPlane, ControlPlaneOptions};

/// Label on bench policies; each controller process enforces only its scenario's.
pub const SCOPE_LABEL: &str = "bench.gpuremediation.dev/scope";
/// Namespace of the peers' service accounts and the controller's Lease.
pub const BENCH_NAMESPACE: &str = "gpu-bench";

/// The shared sandbox.
pub struct BenchEnv {
    /// The control plane.
    pub control_plane: ControlPlane,
    /// Admin client.
    pub client: Client,
    /// Scratch files: kubeconfigs, logs, the audit log.
    pub scratch: PathBuf,
    /// The API server's audit log of the peers' requests.
    pub audit_log: PathBuf,
    /// The controller's identity.
    pub controller: Identity,
    /// kubectl's identity.
    pub kubectl: Identity,
    /// The `gpu-remediator` binary.
    pub controller_binary: PathBuf,
    /// Whether the shipped fence is installed ([`BenchEnv::install_fence`]): controllers then
    /// elect on a Lease in the bench namespace, and their writes carry the claim.
    pub fenced: bool,
    /// Whether the shipped approval policy is installed ([`BenchEnv::install_approval`]).
    pub approval: bool,
    /// The controllers' `--starting-concurrency`, given explicitly so that the cordon floor's
    /// paced arm runs at the very limit the controller ran with.
    pub starting_concurrency: usize,
}

/// The controller's default `--starting-concurrency` (`Settings::starting_concurrency`).
pub const STARTING_CONCURRENCY: usize = 100;

fn username(name: &str) -> String {
    format!("system:serviceaccount:{BENCH_NAMESPACE}:{name}")
}

impl BenchEnv {
    /// Starts the audited control plane, installs the CRDs and creates both identities.
    pub async fn start(
        controller_binary: &Path,
        mut options: ControlPlaneOptions,
    ) -> Result<Self, BenchSetupError> {
        // One per environment: several tests of one binary may each start their own.
        static SEQUENCE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = SEQUENCE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let scratch = std::env::temp_dir().join(format!("gpu-bench-{}-{n}", std::process::id()));
        let file_error = |path: &Path| {
            let path = path.to_owned();
            move |source| BenchSetupError::File { path, source }
        };
        std::fs::create_dir_all(&scratch).map_err(file_error(&scratch))?;
        let policy_file = scratch.join("audit-policy.yaml");
        let audit_log = scratch.join("audit.log");
        // Karpenter's identity exists only in the peer scenario (`karpenter_peer`).
        let policy = audit::policy(
            &[
                &username("gpu-remediator"),
                &username("kubectl"),
                &username("karpenter"),
            ],
            // Every budget status write and the drain fleets' pod status writes, with their
            // bodies: where a drain's time goes (`drain_links`).
            &[&super::drain_links::audit_rules(&super::drain_links::NAMESPACES)],
        );
        std::fs::write(&policy_file, policy).map_err(file_error(&policy_file))?;
        options
            .extra_apiserver_args
            .extend(audit::apiserver_args(&policy_file, &audit_log));
        let control_plane = ControlPlane::start(options).await?;
        let client = control_plane.client();
        install_crds(&client).await?;
        let server = control_plane.server_url().to_owned();
        let controller = actor::create_identity(
            &control_plane,
            BENCH_NAMESPACE,
            "gpu-remediator",
            &server,
            &scratch,
        )
        .await?;
        let kubectl =
            actor::create_identity(&control_plane, BENCH_NAMESPACE, "kubectl", &server, &scratch).await?;
        Ok(Self {
            control_plane,
            client,
            scratch,
            audit_log,
            controller,
            kubectl,
            controller_binary: controller_binary.to_owned(),
            fenced: false,
            approval: false,
            starting_concurrency: STARTING_CONCURRENCY,
        })
    }

    /// Installs the shipped fence policy for the controller's identity and its Lease in the bench
    /// namespace (`bench::fence`); every controller started afterwards elects on that Lease.
    ///
    /// # Errors
    /// The policy could not be installed.
    pub async fn install_fence(&mut self) -> Result<(), BenchSetupError> {
        super::fence::install(&self.client, &self.controller.username, BENCH_NAMESPACE).await?;
        self.fenced = true;
        Ok(())
    }

    /// Installs the shipped approval policy (`bench::approval`): every create and update of a
    /// remediation is checked by the API server from then on.
    ///
    /// # Errors
    /// The policy could not be installed.
    pub async fn install_approval(&mut self) -> Result<(), BenchSetupError> {
        super::approval::install(&self.client).await?;
        self.approval = true;
        Ok(())
    }

    /// Installs the shipped FlowSchemas (`manifests/controller/flow-schemas.yaml`) for the bench's
    /// service accounts, as an installation has them: the controller's fault path in
    /// `workload-high`, its Lease in `leader-election`. `kubectl`'s identity keeps the cluster's
    /// defaults, as `kubectl drain` has no FlowSchema of its own.
    pub async fn install_flow_schemas(&self) -> Result<(), BenchSetupError> {
        let api = Api::<FlowSchema>::all(self.client.clone());
        for schema in shipped_flow_schemas(BENCH_NAMESPACE)? {
            let name = schema.name_any();
            retrying(&format!("creating FlowSchema {name}"), || async {
                match api.create(&PostParams::default(), &schema).await {
                    Err(kube::Error::Api(status)) if status.is_already_exists() => Ok(()),
                    created => created.map(drop),
                }
            })
            .await
            .map_err(api_error(format!("creating FlowSchema {name}")))?;
        }
        Ok(())
    }

    /// The audit log, marked at its current end.
    #[must_use]
    pub fn audit(&self) -> AuditLog {
        AuditLog::new(&self.audit_log)
    }

    /// Starts a controller enforcing only `scope`'s policies, as the controller identity, talking
    /// to `kubeconfig` (default: its own, straight to the server): alone (no election), or, once
    /// the fence is installed, elected on the bench namespace's Lease (the scenarios run one
    /// controller at a time; each releases the Lease when it stops).
    pub fn start_controller(
        &self,
        scope: &str,
        kubeconfig: Option<&Path>,
    ) -> Result<ControllerProcess, actor::StartControllerError> {
        ControllerProcess::start(&ControllerOptions {
            binary: self.controller_binary.clone(),
            kubeconfig: kubeconfig.map_or_else(|| self.controller.kubeconfig.clone(), Path::to_owned),
            policy_selector: format!("{SCOPE_LABEL}={scope}"),
            identity: format!("controller-{scope}"),
            lease_namespace: self.fenced.then(|| BENCH_NAMESPACE.to_owned()),
            log_dir: self.scratch.clone(),
            extra_args: vec![format!("--starting-concurrency={}", self.starting_concurrency)],
        })
    }

    /// Creates policy `scope` over fleet `fleet`'s nodes: one `GpuHealthy=False` trigger held
    /// `for`, `action: None`, and `spec` merged over that.
    pub async fn create_policy(
        &self,
        scope: &str,
        fleet: &str,
        trigger_for: &str,
        spec: serde_json::Value,
    ) -> Result<GpuRemediationPolicy, BenchSetupError> {
        let mut full = serde_json::json!({
            "nodeSelector": {"matchLabels": {FLEET_LABEL: fleet}},
            "triggers": [{"conditionType": node_conditions::GPU_HEALTHY, "status": "False", "for": trigger_for}],
            "action": "None",
            "safety": {"maxConcurrent": "100%", "maxUnhealthy": "100%", "rate": {"limit": 10000, "per": "1h"},
                       "maxAttemptsPerNode": {"count": 100, "per": "1h"}},
            "drain": {"timeout": "10m"},
            "release": {"healthyFor": "1s"},
        });
        merge(&mut full, spec);
        let policy: GpuRemediationPolicy = serde_json::from_value(serde_json::json!({
            "apiVersion": "gpuremediation.dev/v1alpha1",
            "kind": "GpuRemediationPolicy",
            "metadata": {"name": scope, "labels": {SCOPE_LABEL: scope}},
            "spec": full,
        }))
        .map_err(|e| BenchSetupError::Api {
            what: format!("building policy {scope}"),
            source: kube::Error::SerdeError(e),
        })?;
        Api::<GpuRemediationPolicy>::all(self.client.clone())
            .create(&PostParams::default(), &policy)
            .await
            .map_err(api_error(format!("creating policy {scope}")))
    }

    /// The remediations policy `scope` made.
    pub async fn remediations(&self, scope: &str) -> Result<Vec<GpuRemediation>, BenchSetupError> {
        Ok(Api::<GpuRemediation>::all(self.client.clone())
            .list(&ListParams::default())
            .await
            .map_err(api_error("listing remediations"))?
            .items
            .into_iter()
            .filter(|r| r.spec.policy_name == scope)
            .collect())
    }

    /// Deletes namespace `name` without waiting.
    pub async fn delete_namespace(&self, name: &str) -> Result<(), BenchSetupError> {
        let namespaces = Api::<Namespace>::all(self.client.clone());
        let params = DeleteParams::default();
        match retrying(&format!("deleting namespace {name}"), || {
            namespaces.delete(name, &params)
        })
        .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.is_not_found() => Ok(()),
            Err(source) => Err(api_error(format!("deleting namespace {name}"))(source)),
        }
    }

    /// Deletes policy `scope`.
    pub async fn delete_policy(&self, scope: &str) -> Result<(), BenchSetupError> {
        let policies = Api::<GpuRemediationPolicy>::all(self.client.clone());
        let params = DeleteParams::default();
        match retrying(&format!("deleting policy {scope}"), || {
            policies.delete(scope, &params)
        })
        .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.is_not_found() => Ok(()),
            Err(source) => Err(api_error(format!("deleting policy {scope}"))(source)),
        }
    }

    /// A scenario's teardown: its policy (if any), its fleet's nodes and its namespace, each
    /// retried while the server does not answer. It cannot fail the run: the figures are taken
    /// by then, and what could not be deleted is logged (the sandbox goes with the run anyway).
    pub async fn tear_down(&self, policy: Option<&str>, fleet: Option<crate::Fleet>, namespace: &str) {
        if let Some(policy) = policy
            && let Err(e) = self.delete_policy(policy).await
        {
            eprintln!("teardown (not counted as a failure): {e}");
        }
        if let Some(fleet) = fleet
            && let Err(e) = fleet.stop().await
        {
            eprintln!("teardown (not counted as a failure): {e}");
        }
        if let Err(e) = self.delete_namespace(namespace).await {
            eprintln!("teardown (not counted as a failure): {e}");
        }
    }
}

/// Whether a remediation under an `action: None` policy (the bench's) has finished its drain: it
/// then holds the node cordoned in `Verifying` until a person or a recovery releases it (earlier
/// controller builds went straight to `Succeeded`).
#[must_use]
pub fn drained(phase: gpu_remediation_api::Phase) -> bool {
    matches!(
        phase,
        gpu_remediation_api::Phase::Verifying | gpu_remediation_api::Phase::Succeeded
    )
}

/// Sets `GpuHealthy` on every node of `nodes` with the same `lastTransitionTime` `at` (so every
/// trigger's `for` elapses at the same instant), a few nodes at a time.
pub async fn set_condition_at(
    client: &Client,
    nodes: &[String],
    status: &str,
    reason: &str,
    at: Timestamp,
) -> Result<(), BenchSetupError> {
    write_gpu_health(client, nodes, status, reason, at, FailedGpus::Untouched).await
}

/// Fails GPU `gpu` of every node of `nodes` as the agent reports an XID 79, in one write per node:
/// `GpuHealthy=False` with the same `lastTransitionTime` `at`, and the failed-GPUs annotation naming
/// that GPU of the node's inventory (`dra::node_gpus`), so that admission reads a failed serial
/// and looks for other nodes claiming it, as on an installed fleet.
pub async fn fail_gpu_at(
    client: &Client,
    nodes: &[String],
    gpu: u32,
    at: Timestamp,
) -> Result<(), BenchSetupError> {
    write_gpu_health(client, nodes, "False", "XID79", at, FailedGpus::Named(gpu)).await
}

/// Heals every node of `nodes` as the agent does: `GpuHealthy=True` and no failed GPU named.
pub async fn heal_at(client: &Client, nodes: &[String], at: Timestamp) -> Result<(), BenchSetupError> {
    write_gpu_health(client, nodes, "True", "GpusHealthy", at, FailedGpus::None).await
}

/// What a `GpuHealthy` write says of the failed-GPUs annotation.
#[derive(Clone, Copy)]
enum FailedGpus {
    /// Nothing: the annotation is left as it is.
    Untouched,
    /// This GPU of the node's inventory, by NVML index.
    Named(u32),
    /// None: the annotation is taken off.
    None,
}

/// The write behind [`set_condition_at`], [`fail_gpu_at`] and [`heal_at`].
async fn write_gpu_health(
    client: &Client,
    nodes: &[String],
    status: &str,
    reason: &str,
    at: Timestamp,
    failed: FailedGpus,
) -> Result<(), BenchSetupError> {
    use futures::{StreamExt, TryStreamExt};
    let api: Api<Node> = Api::all(client.clone());
    futures::stream::iter(nodes)
        .map(|node| {
            let api = api.clone();
            async move {
                let mut patch = fault::condition_patch(
                    None,
                    node_conditions::GPU_HEALTHY,
                    status,
                    reason,
                    "set by gpu-bench",
                    at,
                );
                if let Some(metadata) = failed_gpus_patch(node, failed) {
                    patch["metadata"] = metadata;
                }
                api.patch_status(node, &PatchParams::default(), &Patch::Strategic(patch))
                    .await
                    .map(|_| ())
                    .map_err(api_error(format!("setting GpuHealthy={status} on {node}")))
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<()>>()
        .await
        .map(|_| ())
}

/// The metadata patch that makes `node`'s failed-GPUs annotation say `failed`, as the agent writes
/// it (`None` when it is left alone).
fn failed_gpus_patch(node: &str, failed: FailedGpus) -> Option<serde_json::Value> {
    let text = match failed {
        FailedGpus::Untouched => return None,
        FailedGpus::None => None,
        FailedGpus::Named(gpu) => crate::dra::node_gpus(node, gpu + 1)
            .pop()
            .map(|g| serde_json::json!([{"uuid": g.uuid, "reason": "XID79"}]).to_string()),
    };
    Some(serde_json::json!({"annotations": {FAILED_GPUS_ANNOTATION: text}}))
}

/// The next whole second after now (plus `margin`): condition times are stored to the second.
#[must_use]
pub fn next_whole_second(margin: Duration) -> Timestamp {
    let at = Timestamp::now()
        .checked_add(jiff::SignedDuration::try_from(margin).unwrap_or_default())
        .unwrap_or_else(|_| Timestamp::now());
    let whole = at.as_second() + 1;
    Timestamp::from_second(whole).unwrap_or(at)
}

/// The shipped FlowSchemas with their service accounts and Lease namespace moved to `namespace`.
fn shipped_flow_schemas(namespace: &str) -> Result<Vec<FlowSchema>, BenchSetupError> {
    const SHIPPED: &str = include_str!("../../../../manifests/controller/flow-schemas.yaml");
    let moved = SHIPPED
        .replace(
            "namespace: gpu-remediation\n",
            &format!("namespace: {namespace}\n"),
        )
        .replace(
            "namespaces: [gpu-remediation]",
            &format!("namespaces: [{namespace}]"),
        );
    serde_yaml::Deserializer::from_str(&moved)
        .map(|document| {
            serde::Deserialize::deserialize(document).map_err(|e| BenchSetupError::Api {
                what: "parsing manifests/controller/flow-schemas.yaml".into(),
                source: kube::Error::Service(Box::new(e)),
            })
        })
        .collect()
}

async fn install_crds(client: &Client) -> Result<(), BenchSetupError> {
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    for (file, yaml) in crds::render_all() {
        let crd: CustomResourceDefinition =
            serde_yaml::from_str(&yaml).map_err(|e| BenchSetupError::Api {
                what: format!("parsing {file}"),
                source: kube::Error::Service(Box::new(e)),
            })?;
        let name = crd.name_any();
        match api.create(&PostParams::default(), &crd).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.is_already_exists() => {}
            Err(source) => return Err(api_error(format!("creating CRD {name}"))(source)),
        }
        eventually(
            &format!("CRD {name} established"),
            Duration::from_secs(60),
            || {
                let (api, name) = (api.clone(), name.clone());
                async move {
                    let crd = api.get(&name).await.ok()?;
                    crd.status?
                        .conditions?
                        .iter()
                        .any(|c| c.type_ == "Established" && c.status == "True")
                        .then_some(())
                }
            },
        )
        .await?;
    }
    eventually("the new kinds to be served", Duration::from_secs(60), || {
        let client = client.clone();
        async move {
            Api::<GpuRemediationPolicy>::all(client.clone())
                .list(&ListParams::default().limit(1))
                .await
                .ok()?;
            Api::<GpuRemediation>::all(client)
                .list(&ListParams::default().limit(1))
                .await
                .ok()
        }
    })
    .await
    .map(|_| ())
}

fn merge(base: &mut serde_json::Value, over: serde_json::Value) {
    match (base, over) {
        (serde_json::Value::Object(base), serde_json::Value::Object(over)) => {
            for (key, value) in over {
                merge(base.entry(key).or_insert(serde_json::Value::Null), value);
            }
        }
        (base, over) => *base = over,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_gpu_is_named_by_its_uuid_in_the_nodes_inventory_and_healing_takes_it_off() {
        let gpu_1 = crate::dra::node_gpus("gpu-7", 8)[1].uuid.clone();
        let named = failed_gpus_patch("gpu-7", FailedGpus::Named(1)).expect("a patch");
        let text = named["annotations"][FAILED_GPUS_ANNOTATION]
            .as_str()
            .expect("a text");
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(text).unwrap(),
            serde_json::json!([{"uuid": gpu_1, "reason": "XID79"}])
        );
        assert_eq!(
            failed_gpus_patch("gpu-7", FailedGpus::None),
            Some(serde_json::json!({"annotations": {FAILED_GPUS_ANNOTATION: null}}))
        );
        assert_eq!(failed_gpus_patch("gpu-7", FailedGpus::Untouched), None);
    }

    #[test]
    fn the_shipped_flow_schemas_name_the_benchs_service_accounts_and_lease_namespace() {
        let schemas = shipped_flow_schemas("gpu-bench").unwrap();
        let names: Vec<_> = schemas.iter().map(ResourceExt::name_any).collect();
        assert_eq!(
            names,
            [
                "gpu-remediator-fault-path",
                "gpu-remediator-agents",
                "gpu-remediator-leader-election"
            ]
        );
        let json = serde_json::to_string(&schemas).unwrap();
        assert!(!json.contains("gpu-remediation\""), "{json}");
        for schema in &schemas {
            let spec = schema.spec.as_ref().unwrap();
            for rule in spec.rules.iter().flatten() {
                for subject in &rule.subjects {
                    let account = subject.service_account.as_ref().unwrap();
                    assert_eq!(account.namespace, "gpu-bench");
                }
                for resources in rule.resource_rules.iter().flatten() {
                    for namespace in resources.namespaces.iter().flatten() {
                        assert_eq!(namespace, "gpu-bench");
                    }
                }
            }
        }
    }
}
