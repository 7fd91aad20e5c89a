//! `gpu-health-agent`: the `DaemonSet` binary. Parses flags, builds the probe and the API client,
//! and runs the loop (or one read with `--once`, printing what it saw with `--print`).

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use anyhow::{Context, bail};
use clap::{Parser, ValueEnum};
use gpu_health_agent::{
    agent::{Agent, AgentSettings, read_all},
    assess::{Memory, SignalKind},
    boot_time::host_boot_time,
    catalog::XidCatalog,
    dcgm::DcgmSource,
    health::{HealthState, WarningPolicy},
    inventory::inventory_of,
    kernel_log::{self, KernelLog},
    liveness::{self, Liveness},
    pod_resources::reader::PodResourcesReader,
    probe::{Probe, deadline::DeadlineReader, file::FileProbe, nvml::NvmlProbe},
    publish::NodePublisher,
    xid_paths::XidPaths,
};
use gpu_remediation_api::Duration as ApiDuration;
use kube::{Client, Config, config::KubeConfigOptions};

/// Where readings come from.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum ProbeKind {
    /// The real GPUs, through NVML.
    Nvml,
    /// A JSON file describing GPUs and events (sandbox, e2e tests).
    File,
}

/// Watches the GPUs of this node and publishes the `GpuHealthy` node condition.
#[derive(Debug, Parser)]
#[command(version)]
struct Flags {
    /// The node this agent runs on (the `DaemonSet` passes `spec.nodeName`).
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    /// A kubeconfig file; without one, the in-cluster or default configuration.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Where readings come from.
    #[arg(long, value_enum, default_value = "nvml")]
    probe: ProbeKind,
    /// The JSON file the `file` probe reads.
    #[arg(long, required_if_eq("probe", "file"))]
    probe_file: Option<PathBuf>,
    /// The NVML library to load (default: libnvidia-ml.so on the loader path). The image sets
    /// `NVML_LIBRARY` to the host's library under its architecture's directory (see the Dockerfile).
    #[arg(long, env = "NVML_LIBRARY")]
    nvml_library: Option<PathBuf>,
    /// How many GPUs this node must have; overrides the node label nvidia.com/gpu.count.
    #[arg(long)]
    expected_gpus: Option<u32>,
    /// The DRA driver whose devices in this node's `ResourceSlice`s are its GPUs: where neither
    /// --expected-gpus nor the label names a count (a DRA-only node), its whole GPUs are expected.
    /// Empty: never read slices.
    #[arg(long, default_value = gpu_health_agent::dra_slices::DEFAULT_DRIVER)]
    dra_driver: String,
    /// Time between reads.
    #[arg(long, default_value = "2s")]
    interval: ApiDuration,
    /// How long one read may take before NVML counts as hung.
    #[arg(long, default_value = "10s")]
    read_timeout: ApiDuration,
    /// Time between reads of the node while a fault is latched (for the clear annotation).
    #[arg(long, default_value = "30s")]
    node_refresh: ApiDuration,
    /// Time after which an unchanged condition is applied again, and the node re-read.
    #[arg(long, default_value = "5m")]
    resync: ApiDuration,
    /// Occurrences of a warning needed within the window before it becomes an Event.
    #[arg(long, default_value_t = 3)]
    warning_threshold: usize,
    /// The window warnings are counted in.
    #[arg(long, default_value = "10m")]
    warning_window: ApiDuration,
    /// Replace the built-in XID catalog with this file.
    #[arg(long)]
    xid_catalog: Option<PathBuf>,
    /// Merge this file over the catalog, one XID at a time (per-cluster overrides).
    #[arg(long)]
    xid_catalog_override: Option<PathBuf>,
    /// The kubelet's pod-resources socket, read at every tick for which pod holds which GPU through
    /// the device plugin (published as the gpuremediation.dev/gpu-pods node annotation); empty:
    /// not read, and not published.
    #[arg(long, default_value = gpu_health_agent::pod_resources::reader::DEFAULT_SOCKET)]
    pod_resources_socket: PathBuf,
    /// The kernel log read for the driver's XID lines (`NVRM: Xid ...`), including XIDs raised
    /// while the agent was down; a plain file of `/dev/kmsg` or `dmesg` lines in tests. Empty: not
    /// read. Reading `/dev/kmsg` needs `CAP_SYSLOG` where `kernel.dmesg_restrict=1`; a log that
    /// cannot be read sets `GpuHealthy=Unknown` (`KernelLogUnreadable`).
    #[arg(long, default_value = kernel_log::DEFAULT_PATH)]
    kernel_log: String,
    /// A DCGM exporter's metrics on this node, e.g. `http://127.0.0.1:9400/metrics`, scraped every
    /// tick as a second opinion (XIDs, double-bit ECC, row remapping); off when unset. One that
    /// does not answer within `--read-timeout` (at most 5s) sets `GpuHealthy=Unknown`
    /// (`DcgmUnavailable`).
    #[arg(long)]
    dcgm_metrics_url: Option<String>,
    /// Serve `/healthz` (liveness: the loop keeps ticking) on this address, e.g. `0.0.0.0:8081`.
    #[arg(long)]
    health_listen: Option<std::net::SocketAddr>,
    /// Read once and exit.
    #[arg(long)]
    once: bool,
    /// Print the readings, signals and the condition it would write, as JSON on stdout.
    #[arg(long)]
    print: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .json()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let flags = Flags::parse();
    let catalog = load_catalog(&flags)?;
    let probe: Arc<dyn Probe> = match flags.probe {
        ProbeKind::Nvml => Arc::new(NvmlProbe::new(
            flags.nvml_library.clone().map(Into::into),
            !flags.once,
        )),
        ProbeKind::File => Arc::new(FileProbe::new(
            flags.probe_file.as_deref().context("--probe-file is required")?,
        )),
    };
    let reader = DeadlineReader::new(probe, flags.read_timeout.as_std());
    let warning_policy = WarningPolicy {
        threshold: flags.warning_threshold.max(1),
        window: flags.warning_window.as_std(),
    };

    if flags.print {
        return print_once(&flags, &catalog, &reader, warning_policy).await;
    }
    let Some(node_name) = flags.node_name.clone() else {
        bail!("--node-name (or NODE_NAME) is required unless --print");
    };
    let client = client(flags.kubeconfig.as_ref()).await?;
    let mut publisher = NodePublisher::new(client, &node_name, std::env::var("POD_NAME").ok());
    if !flags.dra_driver.is_empty() {
        publisher = publisher.with_dra_driver(&flags.dra_driver);
    }
    let settings = AgentSettings {
        interval: flags.interval.as_std().max(Duration::from_millis(100)),
        node_refresh: flags.node_refresh.as_std(),
        resync: flags.resync.as_std(),
        expected_gpus: flags.expected_gpus,
        warning_policy,
        booted_at: host_boot_time(),
    };
    // A tick may take a read timeout plus API calls; three missed intervals (at least a minute)
    // mean the loop is stuck.
    let stale_after = (settings.interval * 3).max(Duration::from_secs(60)) + flags.read_timeout.as_std();
    let booted_at = settings.booted_at;
    let mut agent = Agent::start(settings, catalog, reader, publisher).await;
    if let Some(source) = dcgm_source(&flags)? {
        agent = agent.with_dcgm(source);
    }
    if let Some(log) = kernel_log(&flags, booted_at) {
        agent = agent.with_kernel_log(log);
    }
    if !flags.pod_resources_socket.as_os_str().is_empty() {
        // A hung kubelet must not hold up the GPU health loop for long.
        let deadline = flags.read_timeout.as_std().min(Duration::from_secs(2));
        agent = agent.with_pod_resources(PodResourcesReader::new(&flags.pod_resources_socket, deadline));
    }
    if flags.once {
        agent.tick().await;
        return Ok(());
    }
    if let Some(address) = flags.health_listen {
        let liveness = Liveness::new(stale_after);
        let listener = tokio::net::TcpListener::bind(address)
            .await
            .with_context(|| format!("listening on {address}"))?;
        let served = liveness.clone();
        tokio::spawn(async move {
            if let Err(err) = liveness::serve(listener, served, shutdown()).await {
                tracing::error!(error = %err, "the /healthz server stopped");
            }
        });
        agent = agent.with_liveness(liveness);
    }
    agent.run(shutdown()).await;
    Ok(())
}

/// The DCGM exporter to scrape, where `--dcgm-metrics-url` names one.
fn dcgm_source(flags: &Flags) -> anyhow::Result<Option<DcgmSource>> {
    let timeout = flags.read_timeout.as_std().min(Duration::from_secs(5));
    flags
        .dcgm_metrics_url
        .as_deref()
        .map(|url| DcgmSource::new(url, timeout).map_err(anyhow::Error::msg))
        .transpose()
}

/// The kernel log to read, unless `--kernel-log` is empty.
fn kernel_log(flags: &Flags, booted_at: Option<jiff::Timestamp>) -> Option<KernelLog> {
    (!flags.kernel_log.is_empty()).then(|| KernelLog::new(Path::new(&flags.kernel_log), booted_at))
}

fn load_catalog(flags: &Flags) -> anyhow::Result<XidCatalog> {
    let mut catalog = match &flags.xid_catalog {
        Some(path) => {
            let yaml =
                std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            XidCatalog::from_yaml(&yaml, &path.display().to_string())?
        }
        None => XidCatalog::shipped()?,
    };
    if let Some(path) = &flags.xid_catalog_override {
        catalog.merge_file(path)?;
    }
    Ok(catalog)
}

async fn client(kubeconfig: Option<&PathBuf>) -> anyhow::Result<Client> {
    let config = match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            Config::from_custom_kubeconfig(file, &KubeConfigOptions::default()).await?
        }
        None => Config::infer().await?,
    };
    Ok(Client::try_from(config)?)
}

/// One read without touching the API server: what the agent sees and would write, through every
/// path the loop reads (the probe, the kernel log and the DCGM exporter where configured; the
/// kernel log from the host's boot on, since there is no node record to say what was handled).
/// With `--node-name` and a reachable API server it could also publish; `--print` never does.
async fn print_once(
    flags: &Flags,
    catalog: &XidCatalog,
    reader: &DeadlineReader,
    warning_policy: WarningPolicy,
) -> anyhow::Result<()> {
    let mut paths = XidPaths::default();
    if let Some(source) = dcgm_source(flags)? {
        paths.set_dcgm(source);
    }
    if let Some(log) = kernel_log(flags, host_boot_time()) {
        paths.set_kernel_log(log);
    }
    let (read, signals, healthy_message) = read_all(
        reader,
        &mut paths,
        &Memory::default(),
        flags.expected_gpus,
        catalog,
        jiff::Timestamp::now(),
    )
    .await;
    let verdict =
        HealthState::new(warning_policy).observe(&signals, jiff::Timestamp::now(), &healthy_message);
    let kind = |kind: SignalKind| match kind {
        SignalKind::Fatal => "fatal",
        SignalKind::DetectorFault => "detectorFault",
        SignalKind::Warning => "warning",
    };
    let report = serde_json::json!({
        "probe": reader.name(),
        "kernelLog": (!flags.kernel_log.is_empty()).then_some(&flags.kernel_log),
        "dcgmMetricsUrl": flags.dcgm_metrics_url,
        "expectedGpus": flags.expected_gpus,
        "inventory": match &read {
            Ok(snapshot) => serde_json::to_value(inventory_of(snapshot))?,
            Err(_) => serde_json::Value::Null,
        },
        "readings": match &read {
            Ok(snapshot) => serde_json::to_value(snapshot)?,
            Err(err) => serde_json::json!({"error": err.to_string()}),
        },
        "signals": signals.iter().map(|signal| serde_json::json!({
            "kind": kind(signal.kind), "reason": signal.reason, "message": signal.message,
        })).collect::<Vec<_>>(),
        "condition": {
            "type": gpu_remediation_api::constants::node_conditions::GPU_HEALTHY,
            "status": verdict.condition.status.as_str(),
            "reason": verdict.condition.reason,
            "message": verdict.condition.message,
        },
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}

/// Completes on SIGTERM (the kubelet stopping the pod) or Ctrl-C.
async fn shutdown() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(err) => {
                tracing::warn!(error = %err, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        () = terminate => {},
    }
}
