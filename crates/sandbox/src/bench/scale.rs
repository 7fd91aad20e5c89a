//! Scale fleets (`gpu-bench --scale 10000,50000`), measured the way NVIDIA `NVSentinel`'s scale
//! report measures (percentiles, harness load excluded from the controller's figures).
//!
//! What is simulated, exactly: every node is a real `Node` object in the API server (registered
//! with the GPU labels and `nvidia.com/gpu` capacity a kubelet with the device plugin reports,
//! `Ready=True`, and the agent's `GpuHealthy=True`), so the controller lists, watches, caches and
//! plans over all of them. Nothing runs behind them: no kubelet, no Lease heartbeats, no pods, and
//! kube-controller-manager runs without its node-lifecycle controller, so that silent nodes are not
//! marked `Unknown` and tainted. With `--scale-churn RATE` the bench then writes the nodes' status
//! as their kubelets and agents would, and measures the controller under that traffic
//! ([`scale_churn`](super::scale_churn)). A fault is the
//! `GpuHealthy=False` condition written on the node, as the node agent writes it. With
//! `--with-fence` the controller elects and the shipped fence policy checks each of its writes, as
//! in an installation; a probe shows the fence in force before the idle window.
//!
//! Reported per size: registration time (harness, not the controller), the controller's time from
//! start to `/readyz` (every watch listed), its peak RSS and CPU once idle, its requests per second
//! while nothing happens (audit log, its own service account), and detection to cordon for 1, 10
//! and 100 simultaneous faults (the latency scenario's rounds), with RSS and CPU after them; with
//! churn, the same under the fleet's own traffic.

use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt, stream};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::audit;
use super::bench_env::BenchEnv;
use super::cordon_floor::{self, FloorRound};
use super::cordon_watch::CordonWatch;
use super::latency::{self, LatencyOptions, LatencyResult, wait_policy_observed};
use super::node_churn::{HEALTHY_MESSAGE, healthy_condition};
use super::scale_churn::{self, ChurnOptions, ChurnResult};
use super::setup::{BenchSetupError, api_error, eventually};
use crate::controlplane::usage::{ComponentUsage, load_average};
use crate::fleet::FLEET_LABEL;
use crate::fleet::node::{NodeShape, simulated_node};
use crate::retry::retrying;

/// Node creations in flight at once.
const REGISTRATION_CONCURRENCY: usize = 32;

/// How long the idle window lasts (requests per second are counted over it): a little over the
/// controller's longest fixed period, the minute after which it uses its warm connections again
/// (`write::keep_warm`) and its resync passes, so that what it costs while nothing happens is in
/// the count.
const IDLE_WINDOW: Duration = Duration::from_secs(65);

/// One scale fleet's figures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ScaleResult {
    /// Nodes registered.
    pub nodes: usize,
    /// The labels each node carried besides the fleet's own (`--scale-labels`).
    pub labels: ScaleLabels,
    /// Seconds the harness took to register them (the API server's and the harness's pace).
    pub registration_seconds: f64,
    /// Seconds from the controller's start to `/readyz` answering 200 (every watch listed).
    pub ready_seconds: f64,
    /// Peak RSS once idle (ready, policy observed, then the idle window).
    pub idle_peak_rss_mib: f64,
    /// CPU seconds from start to the end of the idle window.
    pub idle_cpu_seconds: f64,
    /// The controller's requests per second over the idle window.
    pub idle_requests_per_second: f64,
    /// The detection-to-cordon rounds.
    pub rounds: Vec<LatencyResult>,
    /// Peak RSS after every round.
    pub peak_rss_mib: f64,
    /// CPU seconds spent during the rounds.
    pub rounds_cpu_seconds: f64,
    /// The machine's load averages (1, 5, 15 min) when the fleet was registered and when the
    /// rounds ended: figures under load are upper bounds.
    pub load_average: [String; 2],
    /// With the fence in force (`--with-fence`): the probe's refusal and the controller's writes
    /// refused during the rounds (a claim the fence did not accept: none expected).
    pub fence: Option<FenceCheck>,
    /// With the approval policy in force (`--with-approval`): the probe's refusal and the
    /// controller's creates and updates of remediations refused during the rounds (none expected).
    pub approval: Option<ApprovalCheck>,
    /// The same fleet under its own traffic (`--scale-churn`), after the quiet rounds.
    pub churn: Option<ChurnResult>,
    /// The cordon floor's rounds (`cordon_floor`), once the controller stopped: every round with
    /// all its faults in flight, then the rounds larger than the controller's starting concurrency
    /// with that many in flight. Empty when the fleet had too few untouched nodes left.
    pub cordon_floor: Vec<FloorRound>,
}

/// What shows the fence was in force during a fleet's rounds.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FenceCheck {
    /// The API server's refusal of the probe (a dry-run write without a claim).
    pub probe_refusal: String,
    /// The controller's writes answered 403 during the idle window and the rounds.
    pub writes_refused: usize,
}

/// What shows the approval policy was in force during a fleet's rounds.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ApprovalCheck {
    /// The API server's refusal of the probe (a dry-run create approved in another user's name).
    pub probe_refusal: String,
    /// The controller's creates and updates of remediations answered 403 during the idle window
    /// and the rounds.
    pub records_refused: usize,
}

/// The labels a scale fleet's nodes carry besides the simulated fleet's own (its name, the GPU
/// product, count and presence).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ScaleLabels {
    /// None.
    #[default]
    Bench,
    /// The 123 labels of a GPU-operator node on a cloud (`fleet::operator_labels`): about 22 KB a
    /// node more in etcd, in the API server's watch cache and in each watch event.
    Operator,
}

impl ScaleLabels {
    /// The labels added to each node.
    #[must_use]
    pub fn extra(self) -> std::collections::BTreeMap<String, String> {
        match self {
            Self::Bench => std::collections::BTreeMap::new(),
            Self::Operator => crate::fleet::operator_labels::operator_labels(),
        }
    }
}

/// Registers `nodes` bare nodes of fleet `fleet`, `REGISTRATION_CONCURRENCY` at a time, each
/// creation retried while the server does not answer (an existing node is left as it is). Each
/// carries what a node of an installed GPU fleet carries: the agent's `GpuHealthy=True` beside the
/// kubelet's conditions, the agent's inventory of its eight GPUs, and the controller's first-seen
/// stamps of their serials.
///
/// # Errors
/// A creation the server refused, or one that never got an answer.
pub async fn register(
    env: &BenchEnv,
    fleet: &str,
    nodes: usize,
    labels: ScaleLabels,
) -> Result<(), BenchSetupError> {
    let api: Api<Node> = Api::all(env.client.clone());
    let shape = NodeShape {
        fleet: fleet.to_owned(),
        gpus: 8,
        product: "NVIDIA-H100-80GB-HBM3".to_owned(),
        labels: labels.extra(),
    };
    let now = Timestamp::now();
    stream::iter(0..nodes)
        .map(|i| {
            let mut node = simulated_node(&shape, i, now);
            let name = node.metadata.name.clone().unwrap_or_default();
            crate::hardware::installed_with(&mut node, &crate::dra::node_gpus(&name, shape.gpus), now);
            if let Some(conditions) = node.status.as_mut().and_then(|s| s.conditions.as_mut()) {
                conditions.push(
                    serde_json::from_value(healthy_condition(HEALTHY_MESSAGE, now, now))
                        .expect("the agent's healthy condition is a NodeCondition"),
                );
            }
            let api = api.clone();
            async move {
                let name = node.metadata.name.clone().unwrap_or_default();
                let params = PostParams::default();
                match retrying(&format!("registering node {name}"), || api.create(&params, &node)).await {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
                    Err(source) => Err(api_error(format!("registering node {name}"))(source)),
                }
            }
        })
        .buffer_unordered(REGISTRATION_CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// Whether `GET /readyz` on `listen` answers 200.
async fn ready(listen: &str) -> bool {
    let Ok(mut stream) = tokio::net::TcpStream::connect(listen).await else {
        return false;
    };
    let request = format!("GET /readyz HTTP/1.0\r\nHost: {listen}\r\n\r\n");
    if stream.write_all(request.as_bytes()).await.is_err() {
        return false;
    }
    let mut head = [0_u8; 12];
    stream.read_exact(&mut head).await.is_ok() && head.ends_with(b"200")
}

/// Registers a fleet of `nodes` bare nodes, starts a controller over it and measures it.
///
/// # Errors
/// A step of the setup failed (the teardown never fails it).
pub async fn run(
    env: &BenchEnv,
    nodes: usize,
    faults: &[usize],
    trigger_for: Duration,
    churn: Option<ChurnOptions>,
    labels: ScaleLabels,
) -> Result<ScaleResult, BenchSetupError> {
    let scope = format!("scale-{nodes}");
    let load_before = load_average();
    eprintln!("scale: registering {nodes} bare nodes (load average {load_before})");
    let registering = Instant::now();
    let registered = register(env, &scope, nodes, labels).await;
    let registration_seconds = registering.elapsed().as_secs_f64();
    let measured = match registered {
        Ok(()) => measure(env, &scope, nodes, faults, trigger_for, churn).await,
        Err(e) => Err(e),
    };
    // Teardown: never fails the run.
    if let Err(e) = env.delete_policy(&scope).await {
        eprintln!("teardown (not counted as a failure): {e}");
    }
    let api: Api<Node> = Api::all(env.client.clone());
    // One request: a collection of tens of thousands of nodes outlasts the server's request
    // timeout on a loaded machine (the 50,000-node run: five attempts of about a minute each, all
    // without an answer), and asking again only adds load.
    // What is left goes with the sandbox at the end of the run.
    let list = ListParams::default().labels(&format!("{FLEET_LABEL}={scope}"));
    if let Err(e) = api.delete_collection(&DeleteParams::default(), &list).await {
        eprintln!("teardown (not counted as a failure): deleting fleet {scope}: {e}");
    }
    let mut result = measured?;
    result.registration_seconds = registration_seconds;
    result.labels = labels;
    result.load_average[0] = load_before;
    Ok(result)
}

/// Waits for the controller to lead (its claim on the bench Lease), then probes the fence.
async fn fence_in_force(
    env: &BenchEnv,
    scope: &str,
    controller: &super::actor::ControllerProcess,
) -> Result<String, BenchSetupError> {
    let identity = format!("controller-{scope}");
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(env.client.clone(), super::bench_env::BENCH_NAMESPACE);
    eventually("the controller to lead", Duration::from_secs(120), || async {
        let lease = leases.get_opt("gpu-remediator").await.ok()??;
        let holder = lease.spec?.holder_identity?;
        holder.starts_with(&identity).then_some(())
    })
    .await
    .map_err(|e| BenchSetupError::Step(format!("{e}\n{}", controller.log_tail(30))))?;
    let as_controller = super::actor::client_for(&env.control_plane, &env.controller);
    let refusal = super::fence::probe(&as_controller, &crate::fleet::node::node_name(scope, 0)).await?;
    eprintln!("scale: the fence is in force: {refusal}");
    Ok(refusal)
}

async fn measure(
    env: &BenchEnv,
    scope: &str,
    nodes: usize,
    faults: &[usize],
    trigger_for: Duration,
    churn: Option<ChurnOptions>,
) -> Result<ScaleResult, BenchSetupError> {
    // The bench's own node watch lists the fleet before the controller starts, so that its list
    // does not compete with the controller's start (50,000 nodes take minutes on a loaded server).
    let list_wait = Duration::from_secs(60 + u64::try_from(nodes / 100).unwrap_or(u64::MAX));
    let watch = CordonWatch::start_within(&env.client, &format!("{FLEET_LABEL}={scope}"), list_wait)
        .await
        .map_err(|e| BenchSetupError::Step(e.to_string()))?;
    let for_text = format!("{}s", trigger_for.as_secs());
    env.create_policy(scope, scope, &for_text, serde_json::json!({}))
        .await?;
    let started = Instant::now();
    let mut controller = env.start_controller(scope, None)?;
    let listen = controller.listen.clone();
    eventually("the controller's /readyz", Duration::from_secs(600), || async {
        ready(&listen).await.then_some(())
    })
    .await?;
    let ready_seconds = started.elapsed().as_secs_f64();
    wait_policy_observed(env, scope).await?;
    let probe_refusal = if env.fenced {
        Some(fence_in_force(env, scope, &controller).await?)
    } else {
        None
    };
    let approval_refusal = if env.approval {
        // As the bench's other identity: cluster-admin, so it may approve, and outside the fence.
        let approver = super::actor::client_for(&env.control_plane, &env.kubectl);
        let node = crate::fleet::node::node_name(scope, 0);
        let refusal = super::approval::probe(&approver, &node, scope).await?;
        eprintln!("scale: the approval policy is in force: {refusal}");
        Some(refusal)
    } else {
        None
    };
    let mut log = env.audit();
    log.mark();
    tokio::time::sleep(IDLE_WINDOW).await;
    let idle_requests = audit::count(&log.since_mark(), &env.controller.username).total;
    let idle = controller.usage().ok_or_else(|| {
        BenchSetupError::Step(format!("the controller exited:\n{}", controller.log_tail(30)))
    })?;
    let mut names: Vec<String> = (0..nodes)
        .map(|i| crate::fleet::node::node_name(scope, i))
        .collect();
    names.sort();
    let options = LatencyOptions {
        nodes,
        pods_per_node: 0,
        faults: faults.iter().copied().filter(|&f| f <= nodes).collect(),
        trigger_for,
    };
    let rounds = latency::run_rounds(env, &options, scope, &names, &watch, &controller).await;
    let after = controller.usage();
    let churned = match (&rounds, churn) {
        (Ok(_), Some(churn)) => {
            Some(scale_churn::run(env, scope, &names, &options, churn, &watch, &controller).await)
        }
        _ => None,
    };
    if controller.exited().is_some() {
        eprintln!("scale: the controller exited early:\n{}", controller.log_tail(30));
    }
    controller.terminate().await;
    let rounds = rounds?;
    let churn = churned.transpose()?;
    let cordon_floor = cordon_floor::run(env, scope, &names, &options.faults, &watch).await?;
    // The audit log is read only when a policy was in force to refuse anything.
    let refused: Vec<_> = if probe_refusal.is_some() || approval_refusal.is_some() {
        audit::requests(&log.since_mark(), &env.controller.username)
            .into_iter()
            .filter(|r| r.is_write() && r.code == Some(403))
            .collect()
    } else {
        Vec::new()
    };
    let fence = probe_refusal.map(|probe_refusal| FenceCheck {
        probe_refusal,
        writes_refused: refused.len(),
    });
    let approval = approval_refusal.map(|probe_refusal| ApprovalCheck {
        probe_refusal,
        records_refused: refused.iter().filter(|r| r.resource == "gpuremediations").count(),
    });
    #[allow(clippy::cast_precision_loss, reason = "request counts are small")]
    let idle_requests_per_second = idle_requests as f64 / IDLE_WINDOW.as_secs_f64();
    let result = ScaleResult {
        nodes,
        labels: ScaleLabels::Bench,
        registration_seconds: 0.0,
        ready_seconds,
        idle_peak_rss_mib: idle.peak_rss_mib(),
        idle_cpu_seconds: idle.cpu_seconds,
        idle_requests_per_second,
        rounds,
        peak_rss_mib: after.as_ref().map_or(f64::NAN, ComponentUsage::peak_rss_mib),
        rounds_cpu_seconds: after.map_or(f64::NAN, |u| u.cpu_seconds - idle.cpu_seconds),
        load_average: [String::new(), load_average()],
        fence,
        approval,
        churn,
        cordon_floor,
    };
    eprintln!(
        "scale: {nodes} nodes: ready in {:.2} s, idle {:.1} MiB, {:.2} requests/s idle, peak {:.1} MiB",
        result.ready_seconds, result.idle_peak_rss_mib, result.idle_requests_per_second, result.peak_rss_mib
    );
    Ok(result)
}
