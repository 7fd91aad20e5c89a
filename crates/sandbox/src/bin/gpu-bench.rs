//! `gpu-bench` (`make bench`): puts numbers on the project's claims on the sandbox, the controller
//! and `kubectl drain` side by side in one run. Prints Markdown tables and writes JSON.
//!
//! The sizes (`--full`) do not fit a 2-core machine in reasonable time; the defaults are
//! the largest that do, and the table says which sizes ran.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use gpu_sandbox::ControlPlaneOptions;
use gpu_sandbox::bench::bench_env::BenchEnv;
use gpu_sandbox::bench::footprint::FootprintOptions;
use gpu_sandbox::bench::karpenter_peer::{self, PeerOptions};
use gpu_sandbox::bench::latency::LatencyOptions;
use gpu_sandbox::bench::quarantine::QuarantineOptions;
use gpu_sandbox::bench::report::{self, BenchResults};
use gpu_sandbox::bench::{drain, footprint, gang, latency, quarantine, scale, scale_churn};

#[derive(Parser)]
#[allow(
    clippy::struct_excessive_bools,
    reason = "command-line switches: each bool is one flag the operator types"
)]
#[command(
    version,
    about = "Benchmarks of gpu-remediator against kubectl drain on the sandbox"
)]
struct Cli {
    /// The `gpu-remediator` binary (default: next to this one).
    #[arg(long)]
    controller_bin: Option<PathBuf>,
    /// Where to write the JSON results.
    #[arg(long, default_value = "target/bench/results.json")]
    out: PathBuf,
    /// Scenarios to run (default: latency, drain, footprint, quarantine, gang): those, churn and
    /// karpenter-peer (Karpenter's node repair against the policy: over 10 minutes, needs the
    /// Karpenter binary, `make bench-peer`).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Fleet sizes of the latency scenario.
    #[arg(long, value_delimiter = ',', default_value = "100,1000")]
    latency_nodes: Vec<usize>,
    /// Pods per node in the latency scenario, one value per fleet size (or one for all).
    #[arg(long, value_delimiter = ',', default_value = "20,2")]
    latency_pods_per_node: Vec<usize>,
    /// Simultaneous faults per latency round.
    #[arg(long, value_delimiter = ',', default_value = "1,10,100")]
    faults: Vec<usize>,
    /// The trigger's `for`, seconds (long enough to set every fault before it elapses).
    #[arg(long, default_value_t = 5)]
    trigger_for_seconds: u64,
    /// Fleet sizes of the footprint scenario, as `nodes` or `nodes:pods_per_node`.
    #[arg(long, value_delimiter = ',', default_value = "100,100:20,1000,5000")]
    footprint: Vec<String>,
    /// Nodes failed at once in each footprint run.
    #[arg(long, default_value_t = 10)]
    footprint_faults: usize,
    /// The churn scenario (`--only churn`): the footprint run `20:20` padded with bare nodes to
    /// this many nodes, once quiet and once with every node's status rewritten every
    /// `--churn-period-seconds`; pod lists per remediation compared.
    #[arg(long, default_value_t = 1000)]
    churn_nodes: usize,
    /// How often each node's status is rewritten in the churn scenario.
    #[arg(long, default_value_t = 10)]
    churn_period_seconds: u64,
    /// The karpenter-peer scenario: the policy trigger's `for` on `Ready=False`.
    #[arg(long, default_value = "1m")]
    peer_trigger_for: String,
    /// The full sizes: 20 pods per node on every latency fleet.
    #[arg(long)]
    full: bool,
    /// Scale fleets of bare Node objects (no kubelets, no heartbeats; kube-controller-manager
    /// without its node-lifecycle controller), e.g. `--scale 10000,50000`: detection to cordon for
    /// `--faults`, time to /readyz, RSS, CPU and idle requests per second. Runs the scale scenario
    /// alone unless `--only` names others too.
    #[arg(long, value_delimiter = ',')]
    scale: Vec<usize>,
    /// After each scale fleet's quiet rounds, write its nodes' status at this rate (writes a
    /// second, or `real`: what a real fleet of the size sends, its kubelets' and agents' reports
    /// every 5 minutes each) and measure the controller's CPU per 1,000 updates and the same
    /// rounds under that traffic (`bench::scale_churn`).
    #[arg(long)]
    scale_churn: Option<scale_churn::ChurnRate>,
    /// The labels each scale fleet's node carries besides the fleet's own: `bench` (none) or
    /// `operator` (the 123 of a GPU-operator node on a cloud, `fleet::operator_labels`).
    #[arg(long, value_enum, default_value_t = scale::ScaleLabels::Bench)]
    scale_labels: scale::ScaleLabels,
    /// The window over which the controller's CPU under churn is taken.
    #[arg(long, default_value_t = 60)]
    scale_churn_window_seconds: u64,
    /// Leave out the shipped FlowSchemas (`manifests/controller/flow-schemas.yaml`): every request
    /// of the controller in the cluster's default `service-accounts` flow, as before they shipped.
    #[arg(long)]
    without_flow_schemas: bool,
    /// Run the controller as an installation does: elected on a Lease in the bench namespace,
    /// with the shipped fence policy (`manifests/controller/fence-policy.yaml`) in force, so that
    /// every write carries its claim and is checked; before the scale rounds a dry-run write
    /// without the claim must be refused (measured with `--scale`; the other scenarios start
    /// their controllers the same way, one at a time)
    #[arg(long)]
    with_fence: bool,
    /// Install the shipped approval policy (`manifests/approval/admission-policy.yaml`): the API
    /// server checks every create and update of a remediation; before the scale rounds a dry-run
    /// create approved in another user's name must be refused (measured with `--scale`)
    #[arg(long)]
    with_approval: bool,
    /// The controllers' `--starting-concurrency` (remediations started at once); the cordon
    /// floor's second arm sends as many faults' writes at a time.
    #[arg(long, default_value_t = gpu_sandbox::bench::bench_env::STARTING_CONCURRENCY)]
    starting_concurrency: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,kube_client::client::builder=off".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let controller_bin = match &cli.controller_bin {
        Some(path) => path.clone(),
        None => std::env::current_exe()
            .context("locating gpu-bench")?
            .with_file_name("gpu-remediator"),
    };
    anyhow::ensure!(
        controller_bin.exists(),
        "{} does not exist: build it (cargo build --release -p gpu-remediator --bin gpu-remediator) or pass --controller-bin",
        controller_bin.display()
    );
    let scaling = !cli.scale.is_empty();
    let wants = |name: &str| {
        if cli.only.is_empty() {
            // `--scale` alone runs the scale scenario alone; churn and the Karpenter peer run only
            // when named.
            !matches!(name, "churn" | "karpenter-peer") && (name == "scale") == scaling
        } else {
            cli.only.iter().any(|o| o == name) || (name == "scale" && scaling)
        }
    };
    let mut options = ControlPlaneOptions {
        // Bench fleets renew their Leases every 30 s (see `latency::fleet_options`).
        node_monitor_grace_period: Some(Duration::from_secs(180)),
        ..ControlPlaneOptions::default()
    };
    if scaling {
        // Bare nodes send no heartbeats: nothing may mark them Unknown and taint them.
        options.controllers.retain(|c| c != "node-lifecycle-controller");
    }
    let mut env = BenchEnv::start(&controller_bin, options)
        .await
        .context("starting the bench sandbox")?;
    env.starting_concurrency = cli.starting_concurrency;
    if !cli.without_flow_schemas {
        env.install_flow_schemas()
            .await
            .context("installing the FlowSchemas")?;
    }
    if cli.with_fence {
        env.install_fence().await.context("installing the fence policy")?;
    }
    if cli.with_approval {
        env.install_approval()
            .await
            .context("installing the approval policy")?;
    }
    eprintln!("sandbox ready; scratch files in {}", env.scratch.display());
    let mut results = BenchResults {
        started: jiff::Timestamp::now().to_string(),
        controller_binary: controller_bin.display().to_string(),
        kubernetes: env.control_plane.release().to_owned(),
        flow_schemas: !cli.without_flow_schemas,
        fence: cli.with_fence,
        approval: cli.with_approval,
        ..BenchResults::default()
    };
    run(&env, &cli, wants, &mut results).await;
    let json = serde_json::to_string_pretty(&results).context("serialising results")?;
    if let Some(dir) = cli.out.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(&cli.out, json).with_context(|| format!("writing {}", cli.out.display()))?;
    println!("{}", report::markdown(&results));
    eprintln!("results written to {}", cli.out.display());
    env.control_plane.stop().await;
    anyhow::ensure!(
        results.failures.is_empty(),
        "{} scenario(s) failed: {:?}",
        results.failures.len(),
        results.failures
    );
    Ok(())
}

/// Runs every wanted scenario; one that fails is recorded in `results.failures` (and fails the
/// run at the end) without keeping the others from running.
/// The scale fleets, one after another, each under churn too when `--scale-churn` asks.
async fn run_scale(env: &BenchEnv, cli: &Cli, results: &mut BenchResults) {
    for &nodes in &cli.scale {
        let churn = cli.scale_churn.map(|rate| scale_churn::ChurnOptions {
            per_second: rate.on(nodes),
            window: Duration::from_secs(cli.scale_churn_window_seconds),
        });
        let trigger_for = Duration::from_secs(cli.trigger_for_seconds);
        match scale::run(env, nodes, &cli.faults, trigger_for, churn, cli.scale_labels).await {
            Ok(result) => results.scale.push(result),
            Err(e) => results
                .failures
                .push(format!("the scale scenario on {nodes} nodes: {e}")),
        }
    }
}

async fn run(env: &BenchEnv, cli: &Cli, wants: impl Fn(&str) -> bool, results: &mut BenchResults) {
    if wants("drain") {
        match drain::run(env).await {
            Ok(drain) => results.drain = Some(drain),
            Err(e) => results.failures.push(format!("the drain scenario: {e}")),
        }
    }
    if wants("latency") {
        for (i, &nodes) in cli.latency_nodes.iter().enumerate() {
            let pods_per_node = if cli.full {
                20
            } else {
                cli.latency_pods_per_node
                    .get(i)
                    .or(cli.latency_pods_per_node.last())
                    .copied()
                    .unwrap_or(0)
            };
            let options = LatencyOptions {
                nodes,
                pods_per_node,
                faults: cli.faults.iter().copied().filter(|&f| f <= nodes).collect(),
                trigger_for: Duration::from_secs(cli.trigger_for_seconds),
            };
            match latency::run(env, &options).await {
                Ok(rounds) => results.latency.extend(rounds),
                Err(e) => results
                    .failures
                    .push(format!("the latency scenario on {nodes} nodes: {e}")),
            }
        }
    }
    if wants("scale") {
        run_scale(env, cli, results).await;
    }
    if wants("quarantine") {
        match quarantine::run(env, &QuarantineOptions::default()).await {
            Ok(arms) => results.quarantine = arms,
            Err(e) => results.failures.push(format!("the quarantine scenario: {e}")),
        }
    }
    if wants("gang") {
        match gang::run(env, &gang::GangOptions::default()).await {
            Ok(arms) => results.gang = arms,
            Err(e) => results.failures.push(format!("the gang scenario: {e}")),
        }
    }
    if wants("footprint") {
        for size in &cli.footprint {
            let parsed = match size.split_once(':') {
                Some((n, p)) => n.parse().ok().zip(p.parse().ok()),
                None => size.parse().ok().map(|n| (n, 0)),
            };
            let Some((nodes, pods_per_node)) = parsed else {
                results
                    .failures
                    .push(format!("--footprint {size}: not NODES or NODES:PODS_PER_NODE"));
                continue;
            };
            let options = FootprintOptions {
                nodes,
                pods_per_node,
                faults: cli.footprint_faults.min(nodes),
                bystanders: 0,
                churn: None,
            };
            match footprint::run(env, &options).await {
                Ok(result) => results.footprint.push(result),
                Err(e) => results
                    .failures
                    .push(format!("the footprint scenario on {nodes} nodes: {e}")),
            }
        }
    }
    if wants("karpenter-peer") {
        let options = PeerOptions {
            trigger_for: cli.peer_trigger_for.clone(),
            ..PeerOptions::default()
        };
        match karpenter_peer::run(env, &options).await {
            Ok(peer) => results.karpenter_peer = Some(peer),
            Err(e) => results.failures.push(format!("the karpenter-peer scenario: {e}")),
        }
    }
    if wants("churn") {
        for churn in [None, Some(Duration::from_secs(cli.churn_period_seconds))] {
            let options = FootprintOptions {
                nodes: 20,
                pods_per_node: 20,
                faults: 10,
                bystanders: cli.churn_nodes.saturating_sub(20),
                churn,
            };
            match footprint::run(env, &options).await {
                Ok(result) => results.footprint.push(result),
                Err(e) => results.failures.push(format!(
                    "the churn scenario ({}): {e}",
                    if churn.is_some() { "churning" } else { "quiet" }
                )),
            }
        }
    }
}
