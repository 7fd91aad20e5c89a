//! What the agent's e2e tests share: building the agent and the stand-in NVML library, the
//! agent's credentials from `manifests/agent/rbac.yaml`, scenario files, a running agent under
//! either probe, and waiting for what it publishes.
//!
//! Every scenario runs through both probes ([`Probe`]): the `file` probe reading the scenario
//! directly, and the real `nvml` probe loading the stand-in library (`crates/nvml-standin`), which
//! reads the same file through `GPU_STANDIN_SCENARIO`.
#![allow(
    dead_code,
    reason = "each agent test binary uses a different part of the support"
)]

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use gpu_remediation_api::constants::{gpu_reasons, node_conditions};
use gpu_sandbox::{Fleet, FleetOptions};
use k8s_openapi::api::{
    authentication::v1::{TokenRequest, TokenRequestSpec},
    core::v1::{Namespace, Node, NodeCondition, ServiceAccount},
    events::v1::Event,
    rbac::v1::{ClusterRole, ClusterRoleBinding},
};
use kube::{
    Api, Client,
    api::{ListParams, PostParams},
};
use serde_json::{Value, json};
use tokio::{process::Child, sync::OnceCell};

use crate::common;

pub mod kernel_log;
pub mod pod_resources;

/// Where the agent's role lives, relative to this package.
pub const RBAC_YAML: &str = include_str!("../../../manifests/agent/rbac.yaml");
pub const AGENT_NAMESPACE: &str = "gpu-remediation";
pub const AGENT_SERVICE_ACCOUNT: &str = "gpu-health-agent";
pub const GPUS: u32 = 4;

/// Where an agent's readings come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// `--probe file --probe-file <scenario>`.
    File,
    /// `--probe nvml --nvml-library libnvml_standin.so`, the scenario in `GPU_STANDIN_SCENARIO`.
    Nvml,
}

impl Probe {
    /// How an unloaded driver (`"nvmlError": "Driver Not Loaded"`) reads in the condition's
    /// message: the file's text, or nvml-wrapper's for `NVML_ERROR_DRIVER_NOT_LOADED`.
    pub fn driver_not_loaded(self) -> &'static str {
        match self {
            Probe::File => "Driver Not Loaded",
            Probe::Nvml => "NVIDIA driver is not loaded",
        }
    }
}

/// Generates one test per probe for a scenario `async fn name(probe: Probe)`: `name::file` and
/// `name::nvml`.
#[allow(unused_macros, reason = "agent_rbac runs no scenario")]
macro_rules! for_both_probes {
    ($($scenario:ident),+ $(,)?) => {$(
        mod $scenario {
            #[tokio::test]
            async fn file() {
                super::$scenario($crate::agent_support::Probe::File).await;
            }

            #[tokio::test]
            async fn nvml() {
                super::$scenario($crate::agent_support::Probe::Nvml).await;
            }
        }
    )+};
}

/// Builds the agent once per test binary and returns its path.
pub async fn agent_binary() -> &'static Path {
    static BINARY: OnceCell<PathBuf> = OnceCell::const_new();
    BINARY
        .get_or_init(|| async {
            let dir = tokio::task::spawn_blocking(|| {
                e2e::build_binaries(&[("gpu-health-agent", "gpu-health-agent")])
            })
            .await
            .expect("building the agent");
            let binary = dir.join("gpu-health-agent");
            assert!(binary.exists(), "{} not built", binary.display());
            binary
        })
        .await
}

/// The stand-in NVML library: `GPU_STANDIN_LIBRARY` if set, else built once per test binary (a
/// `cdylib`, which `e2e::build_binaries` does not build).
pub async fn standin_library() -> &'static Path {
    static LIBRARY: OnceCell<PathBuf> = OnceCell::const_new();
    LIBRARY
        .get_or_init(|| async {
            if let Some(path) = std::env::var_os("GPU_STANDIN_LIBRARY") {
                return PathBuf::from(path);
            }
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
            let status = tokio::process::Command::new(cargo)
                .args(["build", "--quiet", "-p", "nvml-standin"])
                .current_dir(e2e::WORKSPACE)
                .status()
                .await
                .expect("running cargo build");
            assert!(status.success(), "cargo build -p nvml-standin failed");
            let library = std::env::var_os("CARGO_TARGET_DIR")
                .map_or_else(|| Path::new(e2e::WORKSPACE).join("target"), PathBuf::from)
                .join("debug/libnvml_standin.so");
            assert!(library.exists(), "{} not built", library.display());
            library
        })
        .await
}

/// Creates the agent's service account and role from the manifest (once; other tests of this
/// binary may race to do the same) and writes a kubeconfig holding a token of that account.
pub async fn agent_kubeconfig(client: &Client, dir: &Path) -> PathBuf {
    let create = |result: Result<(), kube::Error>| match result {
        Ok(()) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(err) => panic!("creating agent RBAC: {err}"),
    };
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": AGENT_NAMESPACE}})).unwrap();
    create(
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .map(drop),
    );
    for document in RBAC_YAML.split("\n---\n") {
        let object: Value = serde_yaml::from_str(document).expect("rbac.yaml parses");
        let post = PostParams::default();
        let result = match object["kind"].as_str() {
            Some("ServiceAccount") => Api::<ServiceAccount>::namespaced(client.clone(), AGENT_NAMESPACE)
                .create(&post, &serde_json::from_value(object).unwrap())
                .await
                .map(drop),
            Some("ClusterRole") => Api::<ClusterRole>::all(client.clone())
                .create(&post, &serde_json::from_value(object).unwrap())
                .await
                .map(drop),
            Some("ClusterRoleBinding") => Api::<ClusterRoleBinding>::all(client.clone())
                .create(&post, &serde_json::from_value(object).unwrap())
                .await
                .map(drop),
            other => panic!("unexpected kind {other:?} in manifests/agent/rbac.yaml"),
        };
        create(result);
    }
    let request = TokenRequest {
        spec: TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    let token = Api::<ServiceAccount>::namespaced(client.clone(), AGENT_NAMESPACE)
        .create_token_request(AGENT_SERVICE_ACCOUNT, &PostParams::default(), &request)
        .await
        .expect("token for the agent's service account")
        .status
        .expect("token request status")
        .token;
    let admin = std::fs::read_to_string(common::cluster().await.kubeconfig_path()).expect("admin kubeconfig");
    let agent: Vec<String> = admin
        .lines()
        .map(|line| match line.split_once("token:") {
            Some((indent, _)) if indent.trim().is_empty() => format!("{indent}token: {token}"),
            _ => line.to_owned(),
        })
        .collect();
    assert!(
        agent.iter().any(|line| line.contains(&token)),
        "the admin kubeconfig has a token line to replace"
    );
    let path = dir.join("agent-kubeconfig");
    std::fs::write(&path, agent.join("\n")).unwrap();
    path
}

/// The GPUs of one simulated node, as the file probe reads them.
pub fn gpu(node: &str, index: u32) -> Value {
    json!({
        "index": index,
        "uuid": format!("GPU-{node}-{index:04}"),
        "pciBusId": format!("00000000:{:02X}:00.0", 0x18 + index * 0x10),
        "name": "NVIDIA H100 80GB HBM3",
        "serial": serial(node, index),
        "boardPartNumber": "692-2G520-0200-000",
        "vbiosVersion": "96.00.5E.00.01",
        "eccVolatileUncorrected": 0,
        "rowRemap": {"pending": false, "failed": false},
        "temperatureC": 35,
        "slowdownThresholdC": 87,
        "pcie": {"currentGen": 5, "maxGen": 5, "currentWidth": 16, "maxWidth": 16, "replayCounter": 0},
    })
}

/// The board serial of a simulated node's GPU.
pub fn serial(node: &str, index: u32) -> String {
    format!("SN-{node}-{index}")
}

pub fn healthy_gpus(node: &str) -> Value {
    json!({"gpus": (0..GPUS).map(|index| gpu(node, index)).collect::<Vec<_>>()})
}

/// Replaces the probe file atomically, as the agent expects writers to.
pub fn write_probe_file(path: &Path, content: &Value) {
    let temporary = path.with_extension("tmp");
    std::fs::write(&temporary, serde_json::to_vec_pretty(content).unwrap()).unwrap();
    std::fs::rename(&temporary, path).unwrap();
}

/// A running agent. Its stdin is a lifeline: dropping this (or this process dying in any way)
/// closes it, and the wrapping shell terminates the agent, so no agent outlives the test.
pub struct AgentProcess {
    _child: Child,
    log: PathBuf,
}

impl AgentProcess {
    /// Starts an agent for `node` reading `scenario` through `probe`, with `extra` flags.
    pub async fn start(
        probe: Probe,
        node: &str,
        kubeconfig: &Path,
        scenario: &Path,
        dir: &Path,
        extra: &[&str],
    ) -> Self {
        let log = dir.join(format!("{node}.log"));
        let log_file = std::fs::File::create(&log).unwrap();
        let mut args: Vec<String> = [
            "--node-name",
            node,
            "--kubeconfig",
            &kubeconfig.display().to_string(),
            "--interval",
            "1s",
            "--node-refresh",
            "1s",
            "--read-timeout",
            "2s",
        ]
        .iter()
        .map(|arg| (*arg).to_owned())
        .collect();
        let mut command = tokio::process::Command::new("bash");
        match probe {
            Probe::File => args.extend([
                "--probe".to_owned(),
                "file".to_owned(),
                "--probe-file".to_owned(),
                scenario.display().to_string(),
            ]),
            Probe::Nvml => {
                args.extend([
                    "--probe".to_owned(),
                    "nvml".to_owned(),
                    "--nvml-library".to_owned(),
                    standin_library().await.display().to_string(),
                ]);
                command.env("GPU_STANDIN_SCENARIO", scenario);
            }
        }
        // The host's /dev/kmsg is not the scenario's: a test that wants a kernel log names one.
        if !extra.iter().any(|arg| arg.starts_with("--kernel-log")) {
            args.push("--kernel-log=".to_owned());
        }
        args.extend(extra.iter().map(|arg| (*arg).to_owned()));
        let child = command
            .arg("-c")
            .arg(r#""$@" </dev/null & agent=$!; read -r _; kill -TERM "$agent" 2>/dev/null; wait "$agent""#)
            .arg("agent-lifeline")
            .arg(agent_binary().await)
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(log_file.try_clone().unwrap())
            .stderr(log_file)
            .spawn()
            .expect("starting gpu-health-agent");
        Self { _child: child, log }
    }

    /// The agent's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last lines of the agent's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }
}

pub fn gpu_condition(node: &Node) -> Option<NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|condition| condition.type_ == node_conditions::GPU_HEALTHY)
        .cloned()
}

/// `node`'s `GpuHealthy` condition as the server has it now (it must have one).
pub async fn current_condition(client: &Client, node: &str) -> NodeCondition {
    let read = Api::<Node>::all(client.clone()).get(node).await.unwrap();
    gpu_condition(&read).expect("a GpuHealthy condition")
}

/// Waits until the node's `GpuHealthy` condition has `status` and `reason`; returns it.
pub async fn wait_for_condition(
    client: &Client,
    node: &str,
    status: &str,
    reason: &str,
    timeout: Duration,
    agent: &AgentProcess,
) -> NodeCondition {
    let nodes: Api<Node> = Api::all(client.clone());
    let deadline = Instant::now() + timeout;
    loop {
        let current = nodes.get(node).await.ok().as_ref().and_then(gpu_condition);
        if let Some(condition) = &current
            && condition.status == status
            && condition.reason.as_deref() == Some(reason)
        {
            return condition.clone();
        }
        assert!(
            Instant::now() < deadline,
            "node {node}: GpuHealthy={status}/{reason} not seen within {timeout:?}; last {current:?}\nagent log:\n{}",
            agent.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits for an Event about `node` with `reason` (Node events live in `default`, as the kubelet's).
pub async fn wait_for_event(client: &Client, node: &str, reason: &str, agent: &AgentProcess) -> Event {
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let params = ListParams::default().fields(&format!("regarding.name={node}"));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let list = events.list(&params).await.unwrap();
        if let Some(event) = list
            .items
            .into_iter()
            .find(|event| event.reason.as_deref() == Some(reason))
        {
            return event;
        }
        assert!(
            Instant::now() < deadline,
            "no {reason} event for {node}\nagent log:\n{}",
            agent.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The HTTP status of a GET on `path`.
pub async fn http_status(address: std::net::SocketAddr, path: &str) -> u16 {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(address)
        .await
        .expect("connecting to the agent");
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0)
}

/// A scratch directory for this test's probe files, kubeconfig and logs.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gpu-health-agent-e2e-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

pub async fn fleet(client: &Client, nodes: usize) -> Fleet {
    Fleet::start(
        client.clone(),
        FleetOptions {
            nodes,
            name_prefix: common::unique_name("agent"),
            gpus_per_node: GPUS,
            ..FleetOptions::default()
        },
    )
    .await
    .expect("starting the simulated fleet")
}

/// An agent test's ground: the shared cluster's client, a scratch directory (the agent's
/// kubeconfig, the probe files and the agents' logs) and a fresh fleet.
pub struct AgentGround {
    pub client: Client,
    pub dir: PathBuf,
    pub kubeconfig: PathBuf,
    pub fleet: Fleet,
}

impl AgentGround {
    /// A scratch directory `name`, the agent's kubeconfig in it, and a fleet of `nodes`.
    pub async fn new(name: &str, nodes: usize) -> Self {
        let client = common::cluster().await.client();
        let dir = scratch(name);
        let kubeconfig = agent_kubeconfig(&client, &dir).await;
        let fleet = fleet(&client, nodes).await;
        Self {
            client,
            dir,
            kubeconfig,
            fleet,
        }
    }

    /// The probe file of `node`'s agent.
    pub fn probe_file(&self, node: &str) -> PathBuf {
        self.dir.join(format!("{node}.json"))
    }

    /// Writes `content` as `node`'s probe file and starts its agent, with `extra` flags.
    pub async fn start_agent(
        &self,
        probe: Probe,
        node: &str,
        content: &Value,
        extra: &[&str],
    ) -> AgentProcess {
        let probe_file = self.probe_file(node);
        write_probe_file(&probe_file, content);
        AgentProcess::start(probe, node, &self.kubeconfig, &probe_file, &self.dir, extra).await
    }

    /// Stops the fleet (drop its agents first).
    pub async fn stop(self) {
        self.fleet.stop().await.expect("stopping the fleet");
    }
}

/// A ground of one node whose agent reads healthy GPUs and has reported them: the ground, the
/// node and its agent.
pub async fn one_healthy_agent(name: &str, probe: Probe) -> (AgentGround, String, AgentProcess) {
    let ground = AgentGround::new(name, 1).await;
    let node = ground.fleet.node_names().remove(0);
    let agent = ground.start_agent(probe, &node, &healthy_gpus(&node), &[]).await;
    wait_until_healthy(&ground.client, &node, &agent).await;
    (ground, node, agent)
}

/// Waits (up to 60 s, an agent's start included) until `node`'s `GpuHealthy` is `True`/`Healthy`;
/// returns it.
pub async fn wait_until_healthy(client: &Client, node: &str, agent: &AgentProcess) -> NodeCondition {
    wait_for_condition(
        client,
        node,
        "True",
        gpu_reasons::HEALTHY,
        Duration::from_secs(60),
        agent,
    )
    .await
}

/// Waits until `node`'s `GpuHealthy` is `Unknown`/`NvmlUnavailable` (the agent cannot read its
/// GPUs); returns it.
pub async fn wait_until_nvml_unavailable(
    client: &Client,
    node: &str,
    within: Duration,
    agent: &AgentProcess,
) -> NodeCondition {
    wait_for_condition(
        client,
        node,
        "Unknown",
        gpu_reasons::NVML_UNAVAILABLE,
        within,
        agent,
    )
    .await
}

/// Waits (up to 5 s, the time a missing GPU has to show) until `node`'s `GpuHealthy` is
/// `False`/`GpuMissing`; returns it.
pub async fn wait_until_gpu_missing(client: &Client, node: &str, agent: &AgentProcess) -> NodeCondition {
    wait_for_condition(
        client,
        node,
        "False",
        gpu_reasons::GPU_MISSING,
        Duration::from_secs(5),
        agent,
    )
    .await
}

/// The Events about `node` with `reason`.
pub async fn count_events(client: &Client, node: &str, reason: &str) -> usize {
    let params = ListParams::default().fields(&format!("regarding.name={node}"));
    Api::<Event>::namespaced(client.clone(), "default")
        .list(&params)
        .await
        .unwrap()
        .items
        .iter()
        .filter(|event| event.reason.as_deref() == Some(reason))
        .count()
}

/// Waits (10 s) for `GpuHealthy=False` with `reason`, whose message names each of `names`; then,
/// 4 s later, asserts it was set once: the same transition time and one status-change Event.
pub async fn wait_for_fault_set_once(
    client: &Client,
    node: &str,
    reason: &str,
    names: &[&str],
    agent: &AgentProcess,
) -> NodeCondition {
    let condition = wait_for_condition(client, node, "False", reason, Duration::from_secs(10), agent).await;
    let message = condition.message.clone().unwrap_or_default();
    for name in names {
        assert!(message.contains(name), "names {name}: {message}");
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    let later = current_condition(client, node).await;
    assert_eq!(
        (later.reason.as_deref(), later.last_transition_time.as_ref()),
        (Some(reason), condition.last_transition_time.as_ref()),
        "set once"
    );
    assert_eq!(
        count_events(client, node, reason).await,
        1,
        "one status-change Event"
    );
    condition
}

/// Asserts `node`'s `GpuHealthy` stays `status` for 3 s.
pub async fn assert_condition_stays(client: &Client, node: &str, status: &str) {
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let condition = current_condition(client, node).await;
        assert_eq!(condition.status, status, "{condition:?}");
    }
}
