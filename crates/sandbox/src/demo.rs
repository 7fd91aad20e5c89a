//! `make demo`: one GPU node recycled live on a local control plane, by the real controller
//! binary running under the real manifests' service account and RBAC.
//!
//! The story, step by step: a control plane; a fleet of H100 nodes with a node-group provider
//! that replaces deleted nodes; GPU workloads behind PDBs; `manifests/` applied (CRDs, namespace,
//! RBAC); `config/policy-h100-replace.yaml` applied with its trigger's `for` shortened so nobody
//! waits two minutes; the controller started as a process with only its service account's token;
//! a GPU falls off the bus on the busiest node; it is quarantined at once and a new GPU pod aimed
//! at it is held off while `for` runs; the remediation is followed phase by phase; a
//! summary. Then the cluster stays up (the `KUBECONFIG` line is printed) until Ctrl-C, unless
//! `exit_after` is set (CI, the e2e test).
//!
//! - [`install`]: applies `manifests/` and speaks as one of its service accounts.
//! - [`controller_process`]: the controller binary as a child that never outlives the demo.
//! - [`held_off`]: the quarantine during `for`: a new GPU pod aimed at the broken node stays Pending.
//! - [`follow`]: the remediation followed phase by phase, as `kubectl get -w` would show it.
//! - [`progress`]: what is printed (pure).

pub mod controller_process;
mod follow;
pub mod held_off;
pub mod install;
pub mod ladder;
pub mod progress;
pub mod stage;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use gpu_remediation_api::GpuRemediationPolicy;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, PostParams},
};
use serde_json::Value;

use stage::{Clock, NAMESPACE, POLICY_FILE, RunDemoError, SERVICE_ACCOUNT, WORKLOAD_NAMESPACE, step};

use crate::{
    ControlPlane, ControlPlaneOptions, Fleet, FleetOptions, fault,
    fleet::FLEET_LABEL,
    population::{self, PopulationOptions},
    provider::{Provider, ProviderKind},
};

/// How to run the demo.
#[derive(Clone, Debug)]
pub struct DemoOptions {
    /// The repository root (for `manifests/` and `config/`).
    pub repo: PathBuf,
    /// The `gpu-remediator` binary.
    pub controller: PathBuf,
    /// GPU nodes. The sample policy's `maxUnhealthy: 10%` lets one node of ten be recycled; with
    /// fewer, one broken node already opens the circuit breaker.
    pub nodes: usize,
    /// GPU pods (one GPU each) across the fleet, in Deployments of `pods_per_deployment`.
    pub pods: usize,
    /// Replicas per Deployment.
    pub pods_per_deployment: usize,
    /// The trigger's `for`, replacing the sample's 2m.
    pub trigger_for: Duration,
    /// Longest wait for the remediation to finish.
    pub timeout: Duration,
    /// End after the summary instead of waiting for Ctrl-C.
    pub exit_after: bool,
    /// Keep the control plane's data directory.
    pub keep_data: bool,
}

impl Default for DemoOptions {
    fn default() -> Self {
        Self {
            repo: PathBuf::from("."),
            controller: PathBuf::from("target/debug/gpu-remediator"),
            nodes: 10,
            pods: 48,
            pods_per_deployment: 8,
            trigger_for: Duration::from_secs(5),
            timeout: Duration::from_secs(300),
            exit_after: false,
            keep_data: false,
        }
    }
}

/// Runs the demo; returns its figures after tearing everything down.
pub async fn run(options: &DemoOptions) -> Result<progress::Figures, RunDemoError> {
    let clock = Clock(Instant::now());
    clock
        .say("starting a local control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler");
    let control_plane = ControlPlane::start(ControlPlaneOptions {
        keep_data_dir: options.keep_data,
        ..ControlPlaneOptions::default()
    })
    .await?;
    clock.say(&format!(
        "control plane ready at {} (logs in {})",
        control_plane.server_url(),
        control_plane.data_dir().join("logs").display()
    ));
    let result = run_on(&control_plane, options, &clock).await;
    control_plane.stop().await;
    clock.say("torn down: controller, fleet and control plane stopped");
    result
}

/// Everything after the control plane is up; the caller stops it whatever happens here.
async fn run_on(
    control_plane: &ControlPlane,
    options: &DemoOptions,
    clock: &Clock,
) -> Result<progress::Figures, RunDemoError> {
    let admin = control_plane.client();
    let fleet = Arc::new(
        Fleet::start(
            admin.clone(),
            FleetOptions {
                nodes: options.nodes,
                name_prefix: "gpu".to_owned(),
                heartbeat_interval: Duration::from_secs(5),
                ..FleetOptions::default()
            },
        )
        .await
        .map_err(step("starting the GPU fleet"))?,
    );
    let provider = Provider::start(admin.clone(), fleet.clone(), ProviderKind::NodeGroup)
        .await
        .map_err(step("starting the node group provider"))?;
    clock.say(&format!(
        "{} GPU nodes Ready (8x NVIDIA-H100-80GB-HBM3 each); a node group replaces deleted nodes",
        fleet.node_names().len()
    ));

    populate(&admin, options, clock).await?;
    install_manifests(control_plane, &admin, &options.repo, clock).await?;
    let policy = apply_policy(&admin, &options.repo, options.trigger_for, clock).await?;

    let kubeconfig = controller_kubeconfig(control_plane, &admin).await?;
    let controller = controller_process::start(
        &options.controller,
        &kubeconfig,
        NAMESPACE,
        &control_plane.data_dir().join("logs/gpu-remediator.log"),
    )
    .map_err(step("starting the controller"))?;
    clock.say(&format!(
        "controller running as system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT} (leader-elected, \
         /metrics on {}; JSON log {})",
        controller.listen,
        controller.log.display()
    ));
    println!(
        "           follow along: KUBECONFIG={} kubectl get gpuremediations -w",
        control_plane.kubeconfig_path().display()
    );
    wait_leader(&admin).await?;

    let broken = busiest_node(&admin).await?;
    training_job(&admin, &broken, &fleet.node_names(), clock).await?;
    let fault_at = Instant::now();
    let gpus_left = fault::drop_gpu(&admin, &broken)
        .await
        .map_err(step("dropping a GPU"))?;
    fault::set_gpu_condition(
        &admin,
        &broken,
        "False",
        "XID79",
        "GPU 00000000:3B:00.0 has fallen off the bus (Xid 79)",
    )
    .await
    .map_err(step("reporting the GPU fault"))?;
    clock.say(&format!(
        "FAULT on {broken}: GPU 3 fell off the bus (XID79); nvidia.com/gpu capacity now {gpus_left}; the node \
         itself stays Ready"
    ));

    show_quarantine(&admin, &broken, fault_at, options.trigger_for, clock).await?;

    explain(
        &options.controller,
        control_plane.kubeconfig_path(),
        &broken,
        clock,
    )
    .await;

    let followed = follow::follow(&admin, &broken, &policy, fault_at, options.timeout, clock).await;
    let mut figures = followed?;
    figures.trigger_for = options.trigger_for;
    figures.evictions = controller
        .metrics()
        .await
        .map(|m| progress::evictions_by_result(&m));
    // The node group brings a fresh node once the old one is gone, as a cloud would.
    let deadline = Instant::now() + Duration::from_secs(30);
    while figures.replacement_node.is_none() && Instant::now() < deadline {
        figures.replacement_node = provider
            .replacements()
            .into_iter()
            .find(|r| r.old_node == broken)
            .map(|r| r.new_node);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    match &figures.replacement_node {
        Some(new_node) => clock.say(&format!(
            "the node group brought up {new_node} in place of {broken}"
        )),
        None => clock.say("the node group has not replaced the node within 30s"),
    }
    ladder::story(&admin, &fleet, clock).await?;
    figures.wall = clock.0.elapsed();
    println!();
    print!("{}", progress::summary(&figures));

    if !options.exit_after {
        println!();
        println!("export KUBECONFIG={}", control_plane.kubeconfig_path().display());
        println!("the cluster stays up until Ctrl-C");
        wait_for_signal().await;
    }
    if !controller.stop(Duration::from_secs(15)).await {
        clock.say("the controller did not exit within 15s of SIGTERM");
    }
    drop(provider);
    match Arc::try_unwrap(fleet) {
        Ok(fleet) => {
            let _ = fleet.stop().await;
        }
        Err(fleet) => drop(fleet),
    }
    Ok(figures)
}

async fn populate(admin: &Client, options: &DemoOptions, clock: &Clock) -> Result<(), RunDemoError> {
    let population = PopulationOptions {
        namespace: WORKLOAD_NAMESPACE.to_owned(),
        pods: options.pods,
        pods_per_deployment: options.pods_per_deployment,
        gpu_every: 1,
        node_selector: (FLEET_LABEL.to_owned(), "gpu".to_owned()),
    };
    let workloads = population::create(admin, &population)
        .await
        .map_err(step("creating the GPU workloads"))?;
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let ready = population::ready_pods(admin, WORKLOAD_NAMESPACE)
            .await
            .map_err(step("counting ready pods"))?;
        if ready >= options.pods {
            break;
        }
        if Instant::now() > deadline {
            return Err(RunDemoError::Step {
                step: "waiting for the GPU workloads",
                message: format!("{ready}/{} pods Ready after 180s", options.pods),
            });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for app in &workloads {
        crate::workload::wait_pdb_observed(admin, WORKLOAD_NAMESPACE, &app.name, Duration::from_secs(60))
            .await
            .map_err(step("waiting for the PDBs"))?;
    }
    clock.say(&format!(
        "{} GPU pods Ready in {} Deployments, each behind a PDB (maxUnavailable 10%)",
        options.pods,
        workloads.len()
    ));
    Ok(())
}

async fn install_manifests(
    control_plane: &ControlPlane,
    admin: &Client,
    repo: &Path,
    clock: &Clock,
) -> Result<(), RunDemoError> {
    let rendered = install::render(&control_plane.kubectl(), &repo.join("manifests"))
        .await
        .map_err(step("rendering manifests/"))?;
    let (applied, left_out): (Vec<Value>, Vec<Value>) =
        rendered.into_iter().partition(install::is_applied_in_sandbox);
    install::apply(admin, &applied)
        .await
        .map_err(step("applying manifests/"))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while Api::<GpuRemediationPolicy>::all(admin.clone())
        .list(&ListParams::default())
        .await
        .is_err()
    {
        if Instant::now() > deadline {
            return Err(RunDemoError::Step {
                step: "waiting for the CRDs",
                message: "not served after 30s".to_owned(),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let left_out: Vec<String> = left_out.iter().map(install::describe).collect();
    clock.say(&format!(
        "kubectl apply -k manifests/: {} objects (CRDs, namespace, RBAC, Service, PDB); left out: {} (the controller \
         runs here as a process, and no real kubelet would run the agent)",
        applied.len(),
        left_out.join(", ")
    ));
    Ok(())
}

async fn apply_policy(
    admin: &Client,
    repo: &Path,
    trigger_for: Duration,
    clock: &Clock,
) -> Result<String, RunDemoError> {
    let path = repo.join(POLICY_FILE);
    let text = std::fs::read_to_string(&path).map_err(step("reading the sample policy"))?;
    let mut document: Value = serde_yaml::from_str(&text).map_err(step("parsing the sample policy"))?;
    let shortened = format!("{}s", trigger_for.as_secs());
    if let Some(triggers) = document
        .pointer_mut("/spec/triggers")
        .and_then(Value::as_array_mut)
    {
        for trigger in triggers {
            trigger["for"] = Value::String(shortened.clone());
        }
    }
    let policy: GpuRemediationPolicy =
        serde_json::from_value(document).map_err(step("reading the sample policy"))?;
    let name = policy.name_any();
    Api::<GpuRemediationPolicy>::all(admin.clone())
        .create(&PostParams::default(), &policy)
        .await
        .map_err(step("creating the policy"))?;
    clock.say(&format!(
        "policy {name} from {POLICY_FILE} (XID79/GpuMissing -> cordon, drain, DeleteNode; 1 at a time, maxUnhealthy \
         10%); trigger `for` shortened from 2m to {shortened} for the demo"
    ));
    Ok(name)
}

/// A kubeconfig for the controller: the admin one's server and CA, the service account's token.
async fn controller_kubeconfig(
    control_plane: &ControlPlane,
    admin: &Client,
) -> Result<PathBuf, RunDemoError> {
    let token = install::service_account_token(admin, NAMESPACE, SERVICE_ACCOUNT, 24 * 3600)
        .await
        .map_err(step("requesting the controller's token"))?;
    let admin_config = std::fs::read_to_string(control_plane.kubeconfig_path())
        .map_err(step("reading the admin kubeconfig"))?;
    let text = install::kubeconfig_with_token(&admin_config, &token).ok_or_else(|| RunDemoError::Step {
        step: "writing the controller's kubeconfig",
        message: "the admin kubeconfig has no token line".to_owned(),
    })?;
    let path = control_plane.data_dir().join("gpu-remediator.kubeconfig");
    std::fs::write(&path, text).map_err(step("writing the controller's kubeconfig"))?;
    Ok(path)
}

/// The quarantine while `for` runs (see [`held_off`]), said in one line.
async fn show_quarantine(
    admin: &Client,
    broken: &str,
    fault_at: Instant,
    trigger_for: Duration,
    clock: &Clock,
) -> Result<(), RunDemoError> {
    let held_off = held_off::show(admin, WORKLOAD_NAMESPACE, broken, fault_at, trigger_for)
        .await
        .map_err(|message| RunDemoError::Step {
            step: "showing the quarantine",
            message,
        })?;
    clock.say(&format!(
        "QUARANTINED {broken} {:.0} ms after the fault (taint {}:NoSchedule), while the trigger's {}s `for` runs: \
         new pod {} aimed at it stays Pending ({}); deleted",
        held_off.quarantined_after.as_secs_f64() * 1000.0,
        gpu_remediation_api::constants::QUARANTINE_TAINT_KEY,
        trigger_for.as_secs(),
        held_off.pod,
        held_off.scheduler_says.trim_end_matches('.'),
    ));
    Ok(())
}

/// Waits until the controller holds its Lease.
async fn wait_leader(admin: &Client) -> Result<(), RunDemoError> {
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(admin.clone(), NAMESPACE);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let held = leases
            .get_opt(SERVICE_ACCOUNT)
            .await
            .ok()
            .flatten()
            .and_then(|l| l.spec?.holder_identity)
            .is_some();
        if held {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(RunDemoError::Step {
                step: "waiting for the controller to lead",
                message: "no holder on Lease gpu-remediation/gpu-remediator after 60s (see its log)"
                    .to_owned(),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A training job with 2 replicas (one GPU each) on the node about to break, behind a PDB with
/// `minAvailable: 1`: the second eviction is refused (429) until the first pod's replacement runs elsewhere, so
/// the drain has to wait for the budget, as real drains do. Two other nodes are cordoned while
/// it starts so that every replica lands on `node`, then opened for the replacements.
async fn training_job(
    admin: &Client,
    node: &str,
    nodes: &[String],
    clock: &Clock,
) -> Result<(), RunDemoError> {
    use crate::workload::{self, Budget, Workload};
    let spares: Vec<String> = nodes.iter().filter(|n| *n != node).take(2).cloned().collect();
    let mut allowed = vec![node.to_owned()];
    allowed.extend(spares.iter().cloned());
    let job = Workload::new(WORKLOAD_NAMESPACE, "llm-train")
        .replicas(2)
        .gpus(1)
        .on_nodes(&allowed);
    let nodes_api = Api::<k8s_openapi::api::core::v1::Node>::all(admin.clone());
    let cordon = |unschedulable: bool| {
        let nodes_api = nodes_api.clone();
        let spares = spares.clone();
        async move {
            let patch = serde_json::json!({"spec": {"unschedulable": unschedulable}});
            for spare in &spares {
                nodes_api
                    .patch(
                        spare,
                        &kube::api::PatchParams::default(),
                        &kube::api::Patch::Merge(&patch),
                    )
                    .await
                    .map_err(step("cordoning the spare nodes while the training job starts"))?;
            }
            Ok::<(), RunDemoError>(())
        }
    };
    cordon(true).await?;
    workload::create(admin, &job.deployment())
        .await
        .map_err(step("creating the training job"))?;
    workload::wait_ready_pods(
        admin,
        WORKLOAD_NAMESPACE,
        &job.selector(),
        2,
        Duration::from_secs(60),
    )
    .await
    .map_err(step("waiting for the training job"))?;
    cordon(false).await?;
    workload::create(admin, &job.pdb(&Budget::min_available(1)))
        .await
        .map_err(step("creating the training job's PDB"))?;
    workload::wait_pdb_allows(admin, WORKLOAD_NAMESPACE, "llm-train", 1, Duration::from_secs(60))
        .await
        .map_err(step("waiting for the training job's PDB"))?;
    clock.say(&format!(
        "training job llm-train: 2 pods on {node}, PDB minAvailable 1 (only one may be away at a time)"
    ));
    Ok(())
}

/// The node to break: the one holding the most pods of a single Deployment (so that its PDB
/// has to refuse an eviction and the drain waits for a replacement pod), then the most pods.
async fn busiest_node(admin: &Client) -> Result<String, RunDemoError> {
    let pods = Api::<Pod>::namespaced(admin.clone(), WORKLOAD_NAMESPACE)
        .list(&ListParams::default())
        .await
        .map_err(step("listing the workload pods"))?;
    let placed: Vec<(String, String)> = pods
        .items
        .into_iter()
        .filter_map(|pod| {
            let owner = pod.owner_references().first()?.name.clone();
            Some((pod.spec?.node_name?, owner))
        })
        .collect();
    node_to_break(&placed).ok_or_else(|| RunDemoError::Step {
        step: "choosing a node to break",
        message: "no workload pod is scheduled".to_owned(),
    })
}

/// Of pods placed as `(node, owner)`, the node with the most pods of one owner, then the most
/// pods, then the first name. Pure.
fn node_to_break(placed: &[(String, String)]) -> Option<String> {
    let mut per_node: BTreeMap<&str, BTreeMap<&str, usize>> = BTreeMap::new();
    for (node, owner) in placed {
        *per_node.entry(node).or_default().entry(owner).or_default() += 1;
    }
    per_node
        .into_iter()
        .max_by_key(|(node, owners)| {
            let same_owner = owners.values().copied().max().unwrap_or(0);
            let total: usize = owners.values().sum();
            (same_owner, total, std::cmp::Reverse(*node))
        })
        .map(|(node, _)| node.to_owned())
}

/// Shows `gpu-remediator explain NODE` while the trigger's `for` runs: which policy governs the
/// node, which trigger holds and when the node counts as unhealthy.
async fn explain(controller: &Path, kubeconfig: &Path, node: &str, clock: &Clock) {
    clock.say(&format!("$ gpu-remediator explain {node}"));
    let output = tokio::process::Command::new(controller)
        .args(["explain", node])
        .env("KUBECONFIG", kubeconfig)
        .output()
        .await;
    match output {
        Ok(output) => {
            let text = String::from_utf8_lossy(&output.stdout);
            for line in text.lines() {
                println!("           {line}");
            }
            if !output.status.success() {
                println!(
                    "           (explain failed: {})",
                    String::from_utf8_lossy(&output.stderr).trim()
                );
            }
        }
        Err(error) => println!("           (explain could not run: {error})"),
    }
}

async fn wait_for_signal() {
    let terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate());
    match terminate {
        Ok(mut terminate) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = terminate.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placed(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(n, o)| ((*n).to_owned(), (*o).to_owned()))
            .collect()
    }

    #[test]
    fn the_node_with_most_pods_of_one_deployment_is_broken_so_a_budget_must_refuse() {
        let pods = placed(&[("a", "x"), ("a", "y"), ("a", "z"), ("b", "x"), ("b", "x")]);
        assert_eq!(node_to_break(&pods).as_deref(), Some("b"));
    }

    #[test]
    fn ties_go_to_more_pods_then_to_the_first_name() {
        let pods = placed(&[("b", "x"), ("b", "y"), ("a", "x"), ("a", "y"), ("c", "x")]);
        assert_eq!(node_to_break(&pods).as_deref(), Some("a"));
        assert_eq!(node_to_break(&[]), None);
    }
}
