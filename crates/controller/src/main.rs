//! `gpu-remediator`: the operator's binary. `run` starts the controller (leader-elected when
//! `--leader-elect` is given), with JSON logs and `/metrics`, `/healthz`, `/readyz` on `--listen`.
#![forbid(unsafe_code)]

use std::{net::SocketAddr, process::ExitCode, time::Duration};

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use gpu_remediator::{
    Settings,
    cli::{
        Connection,
        commands::{self, ExplainArgs, HistoryArgs, ValidateArgs},
    },
    controller::{Telemetry, run_with_telemetry},
    election::{ElectionConfig, Elector, FenceRequirement, identity::identity, lease_client},
    leader::Fence,
    telemetry::{self, Health, Metrics},
};
use tokio::sync::watch;

/// Self-healing for Kubernetes GPU nodes: cordon, drain and replace nodes whose GPUs failed.
#[derive(Parser, Debug)]
#[command(name = "gpu-remediator", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the controller against the cluster of the in-cluster or kubeconfig credentials.
    Run(RunArgs),
    /// Check policy files offline (schema, rules, duplicates, overlapping selectors); exits 1 on errors.
    Validate(ValidateArgs),
    /// Say why a node is or is not being remediated: which policy, which trigger, which limit; exits 1
    /// when there is no such node.
    Explain {
        #[command(flatten)]
        args: ExplainArgs,
        #[command(flatten)]
        connection: Connection,
    },
    /// List remediations: a node's (`NODE`), every recycle involving a GPU serial across nodes
    /// (`--serial`), or a node's and those of the GPUs it holds (`--node`).
    History {
        #[command(flatten)]
        args: HistoryArgs,
        #[command(flatten)]
        connection: Connection,
    },
}

#[derive(Args, Debug)]
struct RunArgs {
    /// Elect a leader through a Lease, so several replicas can run and only one acts.
    #[arg(long, env = "GPU_REMEDIATOR_LEADER_ELECT")]
    leader_elect: bool,
    /// Namespace of the leader Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "gpu-remediation")]
    lease_namespace: String,
    /// This replica's name in its identity on the Lease and in Events: the pod's name (default:
    /// the host name). A random per-process nonce is always added, and the pod's UID when given.
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// The pod's UID (from the downward API), so that two pods of one name never share an identity.
    #[arg(long, env = "POD_UID")]
    pod_uid: Option<String>,
    /// Lead even when the API server does not enforce the fence (no fence policy installed): for a
    /// development cluster only. By default a leader that cannot prove the fence refuses to lead.
    #[arg(long, env = "GPU_REMEDIATOR_ALLOW_UNFENCED")]
    allow_unfenced: bool,
    /// Address of the `/metrics`, `/healthz` and `/readyz` server.
    #[arg(long, default_value = "0.0.0.0:8080")]
    listen: SocketAddr,
    /// Enforce only the policies matching this label selector (default: every policy).
    #[arg(long)]
    policy_selector: Option<String>,
    /// How often to look at the cluster even when no watch event arrives.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    resync: Duration,
    /// Remediations started at once when many nodes fail together: their records' creates, and
    /// their fresh reads and cordons.
    #[arg(long, env = "GPU_REMEDIATOR_STARTING_CONCURRENCY", default_value_t = Settings::default().starting_concurrency)]
    starting_concurrency: usize,
    /// Connections to the API server kept open while leading, so that a burst of faults does not
    /// wait for new ones: as many requests for the server's version, at once, every minute (0: none).
    #[arg(long, env = "GPU_REMEDIATOR_WARM_CONNECTIONS", default_value_t = Settings::default().warm_connections)]
    warm_connections: usize,
}

/// How long a replica that lost its Lease waits for the controller to stop before it exits.
const LOST_LEASE_WIND_DOWN: Duration = Duration::from_secs(10);

fn parse_duration(text: &str) -> Result<Duration, String> {
    text.parse::<gpu_remediation_api::Duration>()
        .map(gpu_remediation_api::Duration::as_std)
        .map_err(|e| e.to_string())
}

#[tokio::main]
async fn main() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => {
            telemetry::init_json_logs().context("setting up logs")?;
            run(args).await.map(|()| ExitCode::SUCCESS)
        }
        Command::Validate(args) => Ok(commands::validate(&args)?),
        Command::Explain { args, connection } => Ok(commands::explain(&args, &connection).await?),
        Command::History { args, connection } => Ok(commands::history(&args, &connection).await?),
    }
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    let config = kube::Config::infer()
        .await
        .context("loading Kubernetes credentials")?;
    let identity = replica_identity(&args);
    let (stop, stopped) = watch::channel(false);
    let stop = std::sync::Arc::new(stop);
    tokio::spawn({
        let stop = stop.clone();
        async move {
            wait_for_signal().await;
            tracing::info!("shutdown requested");
            let _ = stop.send(true);
        }
    });
    let until_stopped = move || {
        let mut stopped = stopped.clone();
        async move {
            let _ = stopped.wait_for(|s| *s).await;
        }
    };

    // The election ends (and releases the Lease) only once the controller has stopped, every
    // advance included: a follower must not take over while this replica still acts.
    let (controller_ended, ended) = watch::channel(false);
    let (fence, election) = if args.leader_elect {
        let (fence, keeper) = Fence::keeper(Some(&args.lease_namespace));
        let fence_requirement = if args.allow_unfenced {
            FenceRequirement::Optional
        } else {
            FenceRequirement::Required
        };
        let elector = Elector::new(
            lease_client(config.clone()).context("building the Lease client")?,
            ElectionConfig {
                fence: fence_requirement,
                ..ElectionConfig::new(&args.lease_namespace, &identity)
            },
            keeper,
        );
        let mut ended = ended.clone();
        let after_the_controller = async move {
            let _ = ended.wait_for(|ended| *ended).await;
        };
        (fence, Some(tokio::spawn(elector.run(after_the_controller))))
    } else {
        (Fence::standalone(), None)
    };

    let metrics = Metrics::new();
    let health = Health::new(fence.clone());
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    let server = tokio::spawn(telemetry::serve(
        listener,
        metrics.clone(),
        health.clone(),
        until_stopped(),
    ));
    let settings = Settings {
        policy_selector: args.policy_selector,
        resync: args.resync,
        instance: Some(identity.clone()),
        warm_connections: args.warm_connections,
        starting_concurrency: args.starting_concurrency,
        ..Settings::default()
    };
    tracing::info!(%identity, leader_elect = args.leader_elect, listen = %args.listen, "starting");
    let telemetry = Telemetry {
        metrics,
        health: Some(health),
    };
    let mut controller = tokio::spawn(run_with_telemetry(
        config,
        settings,
        fence,
        telemetry,
        until_stopped(),
    ));

    match election {
        None => controller
            .await
            .context("the controller task panicked")?
            .context("the controller stopped")?,
        Some(mut election) => {
            tokio::select! {
                result = &mut controller => {
                    // Let the elector release the Lease, so a follower takes over at once: the
                    // controller and all its advances have stopped.
                    controller_ended.send_replace(true);
                    result.context("the controller task panicked")?.context("the controller stopped")?;
                    let ended = election.await.context("the election task panicked")?;
                    tracing::info!(?ended, "leader election ended");
                }
                ended = &mut election => match ended.context("the election task panicked")? {
                    // Losing the Lease ends the process (non-zero): state built while leading
                    // cannot be trusted once another replica may act.
                    Err(error) => {
                        // Stop, and let the advances under way end (the controller bounds that by
                        // its shutdown grace): the fence already refuses every new write, and any
                        // write past its check goes out under the lost claim, for the API
                        // server's fence policy to refuse, rather than vanish mid-request.
                        stop.send_replace(true);
                        if tokio::time::timeout(LOST_LEASE_WIND_DOWN, controller).await.is_err() {
                            tracing::warn!("the controller did not stop in time after the Lease was lost");
                        }
                        return Err(error).context("leader election");
                    }
                    Ok(ended) => {
                        tracing::info!(?ended, "leader election ended");
                        controller.await.context("the controller task panicked")?.context("the controller stopped")?;
                    }
                },
            }
        }
    }
    server
        .await
        .context("the HTTP server task panicked")?
        .context("the HTTP server failed")?;
    Ok(())
}

/// This process's identity on the Lease: unique per process, never the pid alone (1 in every
/// container), so that a restarted replica cannot mistake its predecessor's claim for its own (see
/// `election::identity`).
fn replica_identity(args: &RunArgs) -> String {
    let hostname = std::env::var("HOSTNAME").ok();
    let chosen = identity(
        args.identity.as_deref(),
        args.pod_uid.as_deref(),
        hostname.as_deref(),
        &process_nonce(),
    );
    if !chosen.in_pod {
        tracing::info!(
            identity = %chosen.name,
            "not in a pod (no POD_UID): the identity is the given name or the host name plus a random per-process nonce"
        );
    }
    chosen.name
}

/// A random nonce for this process's identity: 64 bits from the standard library's randomly keyed
/// hasher (seeded from the operating system), over the pid and the time.
fn process_nonce() -> String {
    use std::hash::BuildHasher as _;
    let random = std::collections::hash_map::RandomState::new()
        .hash_one((std::process::id(), std::time::SystemTime::now()));
    format!("{random:016x}")
}

/// SIGTERM (the kubelet stopping the pod) or Ctrl-C.
async fn wait_for_signal() {
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("installing a SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
