//! `gpu-sandbox`: a real local control plane with a simulated GPU fleet, for trying the operator
//! by hand, `make demo` and `make bench`. `gpu-sandbox up` prints `export KUBECONFIG=...` and runs
//! until Ctrl-C (or SIGTERM), then tears everything down.
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Parser, Subcommand};
use gpu_sandbox::controlplane::usage::ComponentUsage;
use gpu_sandbox::fleet::FLEET_LABEL;
use gpu_sandbox::population::{self, PopulationOptions};
use gpu_sandbox::real_node::{Binaries, Layout, RealNode};
use gpu_sandbox::workload::node_is_ready;
use gpu_sandbox::{ControlPlane, ControlPlaneOptions, Fleet, FleetOptions};

#[derive(Parser)]
#[command(
    version,
    about = "A real local Kubernetes control plane with a simulated GPU fleet"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start a control plane and a fleet, print `export KUBECONFIG=...`, run until Ctrl-C.
    Up(UpArgs),
    /// `make demo`: recycle one GPU node live with the real controller under its own RBAC.
    Demo(DemoArgs),
}

#[derive(clap::Args)]
struct DemoArgs {
    /// The gpu-remediator binary to run.
    #[arg(long, default_value = "target/debug/gpu-remediator")]
    controller: std::path::PathBuf,
    /// The repository root (manifests/ and config/).
    #[arg(long, default_value = ".")]
    repo: std::path::PathBuf,
    /// GPU nodes (the sample policy's maxUnhealthy 10% needs at least 10 to recycle one).
    #[arg(long, default_value_t = 10)]
    nodes: usize,
    /// GPU pods across the fleet, one GPU each, 8 per Deployment behind a PDB.
    #[arg(long, default_value_t = 48)]
    pods: usize,
    /// Seconds the fault must hold before the node counts as broken (the sample says 120).
    #[arg(long, default_value_t = 5)]
    trigger_for_seconds: u64,
    /// End after the summary instead of keeping the cluster up until Ctrl-C.
    #[arg(long)]
    exit_after: bool,
    /// Keep the data directory (etcd data, logs, certificates) after exit.
    #[arg(long)]
    keep_data: bool,
}

#[derive(clap::Args)]
struct UpArgs {
    /// Simulated GPU nodes.
    #[arg(long, default_value_t = 10)]
    nodes: usize,
    /// GPUs per node.
    #[arg(long, default_value_t = 8)]
    gpus_per_node: u32,
    /// The `nvidia.com/gpu.product` label.
    #[arg(long, default_value = "NVIDIA-H100-80GB-HBM3")]
    product: String,
    /// Node name prefix and fleet label value.
    #[arg(long, default_value = "gpu")]
    fleet: String,
    /// Pods to run across the fleet (Deployments behind PDBs in namespace `population`).
    #[arg(long, default_value_t = 0)]
    pods: usize,
    /// Replicas per Deployment.
    #[arg(long, default_value_t = 100)]
    pods_per_deployment: usize,
    /// Every n-th Deployment requests one GPU per pod (0: none).
    #[arg(long, default_value_t = 4)]
    gpu_every: usize,
    /// Seconds between a node's Lease renewals.
    #[arg(long, default_value_t = 10)]
    heartbeat_seconds: u64,
    /// After every pod is Ready, measure the control plane's CPU use over this many seconds.
    #[arg(long, default_value_t = 0)]
    measure_seconds: u64,
    /// Exit after start-up (and measurement) instead of waiting for Ctrl-C.
    #[arg(long)]
    exit: bool,
    /// Dynamic Resource Allocation: `off`, `on` (each node's GPUs published as a `ResourceSlice`
    /// by the simulated driver, claims from templates allocated by the scheduler), or
    /// `device-taints` (also `DeviceTaintRule`, KEP-5055, alpha).
    #[arg(long, default_value = "off", value_parser = ["off", "on", "device-taints"])]
    dra: String,
    /// Keep the data directory (etcd data, logs, certificates) after exit.
    #[arg(long)]
    keep_data: bool,
    /// Real nodes beside the simulated ones (`real-1`, `real-2`, ...): a kubelet, containerd and
    /// runc each, in namespaces of their own (root; the binaries named as `make real-node-test`
    /// names them: `GPU_REMEDIATOR_KUBELET`, `_CONTAINERD`, `_RUNC`, `_CNI_PLUGINS`, `_PAUSE`).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=200))]
    real_nodes: u8,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube_client::client::builder=off".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Up(args) => up(args).await,
        Command::Demo(args) => {
            let options = gpu_sandbox::demo::DemoOptions {
                repo: args.repo,
                controller: args.controller,
                nodes: args.nodes,
                pods: args.pods,
                trigger_for: Duration::from_secs(args.trigger_for_seconds),
                exit_after: args.exit_after,
                keep_data: args.keep_data,
                ..gpu_sandbox::demo::DemoOptions::default()
            };
            gpu_sandbox::demo::run(&options).await.map(drop).context("demo")
        }
    }
}

async fn up(args: UpArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let dra = match args.dra.as_str() {
        "on" => gpu_sandbox::Dra::On,
        "device-taints" => gpu_sandbox::Dra::DeviceTaints,
        _ => gpu_sandbox::Dra::Off,
    };
    let control_plane = ControlPlane::start(ControlPlaneOptions {
        keep_data_dir: args.keep_data,
        dra,
        ..ControlPlaneOptions::default()
    })
    .await
    .context("starting the control plane")?;
    eprintln!(
        "control plane ready in {:.1}s; logs in {}",
        started.elapsed().as_secs_f64(),
        control_plane.data_dir().join("logs").display()
    );
    let result = run(&control_plane, &args, started).await;
    eprintln!("stopping");
    control_plane.stop().await;
    result
}

async fn run(control_plane: &ControlPlane, args: &UpArgs, started: Instant) -> anyhow::Result<()> {
    let client = control_plane.client();
    let fleet = Fleet::start(
        client.clone(),
        FleetOptions {
            nodes: args.nodes,
            name_prefix: args.fleet.clone(),
            gpus_per_node: args.gpus_per_node,
            product: args.product.clone(),
            heartbeat_interval: Duration::from_secs(args.heartbeat_seconds),
            dra: args.dra != "off",
            ..FleetOptions::default()
        },
    )
    .await
    .context("starting the fleet")?;
    eprintln!(
        "{} nodes Ready at {:.1}s",
        fleet.node_names().len(),
        started.elapsed().as_secs_f64()
    );
    let real_nodes = start_real_nodes(control_plane, args.real_nodes).await?;
    if !real_nodes.is_empty() {
        let names: Vec<&str> = real_nodes.iter().map(RealNode::name).collect();
        wait_until_ready(&client, &names).await?;
        eprintln!(
            "{} real nodes Ready at {:.1}s (their logs under {})",
            real_nodes.len(),
            started.elapsed().as_secs_f64(),
            control_plane.data_dir().join("nodes").display()
        );
    }
    println!("export KUBECONFIG={}", control_plane.kubeconfig_path().display());
    if args.pods > 0 {
        populate(control_plane, args, started).await?;
    }
    report_memory(&control_plane.usage());
    if args.measure_seconds > 0 {
        measure_cpu(control_plane, Duration::from_secs(args.measure_seconds)).await;
    }
    if !args.exit {
        eprintln!("running; Ctrl-C to stop");
        wait_for_signal().await?;
    }
    drop(fleet);
    for node in real_nodes {
        node.stop().await;
    }
    Ok(())
}

/// Waits until every node `names` names reports Ready, for at most two minutes.
async fn wait_until_ready(client: &kube::Client, names: &[&str]) -> anyhow::Result<()> {
    let nodes = kube::Api::<k8s_openapi::api::core::v1::Node>::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(120);
    for name in names {
        loop {
            let ready = nodes
                .get_opt(name)
                .await
                .ok()
                .flatten()
                .is_some_and(|node| node_is_ready(&node));
            if ready {
                break;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "real node {name} not Ready within two minutes"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(())
}

/// Starts `count` real nodes, one after the other; on a failure, stops those already started.
async fn start_real_nodes(control_plane: &ControlPlane, count: u8) -> anyhow::Result<Vec<RealNode>> {
    if count == 0 {
        return Ok(Vec::new());
    }
    let binaries = Binaries::from_env().context("the real nodes' binaries")?;
    let mut started = Vec::new();
    for index in 1..=count {
        let name = format!("real-{index}");
        let layout = Layout {
            dir: control_plane.data_dir().join("nodes").join(&name),
            name,
            index,
            labels: std::collections::BTreeMap::new(),
        };
        match RealNode::start(control_plane, layout, &binaries).await {
            Ok(node) => started.push(node),
            Err(error) => {
                for node in started {
                    node.stop().await;
                }
                return Err(error).context(format!("starting real node {index}"));
            }
        }
    }
    Ok(started)
}

async fn populate(control_plane: &ControlPlane, args: &UpArgs, started: Instant) -> anyhow::Result<()> {
    let client = control_plane.client();
    let options = PopulationOptions {
        namespace: "population".to_owned(),
        pods: args.pods,
        pods_per_deployment: args.pods_per_deployment,
        gpu_every: args.gpu_every,
        node_selector: (FLEET_LABEL.to_owned(), args.fleet.clone()),
    };
    let workloads = population::create(&client, &options)
        .await
        .context("creating the pod population")?;
    eprintln!(
        "{} Deployments created at {:.1}s",
        workloads.len(),
        started.elapsed().as_secs_f64()
    );
    let deadline = Instant::now() + Duration::from_secs(3600);
    let mut last_report = Instant::now();
    loop {
        let ready = population::ready_pods(&client, &options.namespace)
            .await
            .context("counting ready pods")?;
        if ready >= args.pods {
            eprintln!("{ready} pods Ready at {:.1}s", started.elapsed().as_secs_f64());
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {ready}/{} pods Ready after an hour",
            args.pods
        );
        if last_report.elapsed() > Duration::from_secs(15) {
            eprintln!(
                "{ready}/{} pods Ready at {:.1}s",
                args.pods,
                started.elapsed().as_secs_f64()
            );
            last_report = Instant::now();
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

#[allow(
    clippy::cast_precision_loss,
    reason = "byte counts shown in MiB with one decimal"
)]
fn report_memory(usage: &[ComponentUsage]) {
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    for u in usage {
        eprintln!(
            "{:<24} RSS {:>8.1} MiB  peak {:>8.1} MiB  CPU so far {:>8.1}s",
            u.name,
            mib(u.rss_bytes),
            mib(u.peak_rss_bytes),
            u.cpu_seconds
        );
    }
    let total: u64 = usage.iter().map(|u| u.rss_bytes).sum();
    eprintln!("{:<24} RSS {:>8.1} MiB", "control plane total", mib(total));
}

async fn measure_cpu(control_plane: &ControlPlane, window: Duration) {
    let before = control_plane.usage();
    tokio::time::sleep(window).await;
    let after = control_plane.usage();
    let mut total = 0.0;
    for a in &after {
        if let Some(b) = before.iter().find(|b| b.name == a.name) {
            let cores = (a.cpu_seconds - b.cpu_seconds) / window.as_secs_f64();
            total += cores;
            eprintln!(
                "{:<24} CPU {:>6.2} cores (steady state over {}s)",
                a.name,
                cores,
                window.as_secs()
            );
        }
    }
    eprintln!("{:<24} CPU {total:>6.2} cores", "control plane total");
}

async fn wait_for_signal() -> anyhow::Result<()> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("listening for SIGTERM")?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result.context("listening for Ctrl-C"),
        _ = terminate.recv() => Ok(()),
    }
}
