//! e2e: the real `gpu-health-agent` binary, one per simulated node, driven by the `file` probe and
//! authenticated as the agent's own service account under the RBAC of `manifests/agent/rbac.yaml`
//! (so these tests also prove that role is enough).
//!
//! The last test closes the loop: the remediation controller, running in-process under the policy
//! shipped in `config/`, replaces the node the agent reported.
//!
//! The agent binary is built with `cargo build -p gpu-health-agent` on first use (a binary of
//! another package has no `CARGO_BIN_EXE_` here).

mod common;

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use gpu_remediation_api::{
    GpuRemediation, GpuRemediationPolicy, Phase,
    constants::{CLEAR_ANNOTATION, gpu_reasons, node_conditions},
    crds,
};
use gpu_remediator::{Settings, leader::Fence};
use gpu_sandbox::{Fleet, FleetOptions, fleet::FLEET_LABEL};
use k8s_openapi::{
    api::{
        authentication::v1::{TokenRequest, TokenRequestSpec},
        core::v1::{Namespace, Node, NodeCondition, ServiceAccount},
        events::v1::Event,
        rbac::v1::{ClusterRole, ClusterRoleBinding},
    },
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use tokio::{process::Child, sync::OnceCell};

/// Where the agent's role lives, relative to this package.
const RBAC_YAML: &str = include_str!("../../manifests/agent/rbac.yaml");
const AGENT_NAMESPACE: &str = "gpu-remediation";
const AGENT_SERVICE_ACCOUNT: &str = "gpu-health-agent";
const GPUS: u32 = 4;

/// Builds the agent once per test binary and returns its path.
async fn agent_binary() -> &'static Path {
    static BINARY: OnceCell<PathBuf> = OnceCell::const_new();
    BINARY
        .get_or_init(|| async {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
            let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
                .parent()
                .expect("e2e sits in the workspace");
            let status = tokio::process::Command::new(cargo)
                .args([
                    "build",
                    "--quiet",
                    "-p",
                    "gpu-health-agent",
                    "--bin",
                    "gpu-health-agent",
                ])
                .current_dir(workspace)
                .status()
                .await
                .expect("running cargo build");
            assert!(status.success(), "cargo build -p gpu-health-agent failed");
            let target =
                std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| workspace.join("target"), PathBuf::from);
            let binary = target.join("debug").join("gpu-health-agent");
            assert!(binary.exists(), "{} not built", binary.display());
            binary
        })
        .await
}

/// Creates the agent's service account and role from the manifest (once; other tests of this
/// binary may race to do the same) and writes a kubeconfig holding a token of that account.
async fn agent_kubeconfig(client: &Client, dir: &Path) -> PathBuf {
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
fn gpu(node: &str, index: u32) -> Value {
    json!({
        "index": index,
        "uuid": format!("GPU-{node}-{index:04}"),
        "pciBusId": format!("00000000:{:02X}:00.0", 0x18 + index * 0x10),
        "name": "NVIDIA H100 80GB HBM3",
        "eccVolatileUncorrected": 0,
        "rowRemap": {"pending": false, "failed": false},
        "temperatureC": 35,
        "slowdownThresholdC": 87,
        "pcie": {"currentGen": 5, "maxGen": 5, "currentWidth": 16, "maxWidth": 16, "replayCounter": 0},
    })
}

fn healthy_gpus(node: &str) -> Value {
    json!({"gpus": (0..GPUS).map(|index| gpu(node, index)).collect::<Vec<_>>()})
}

/// Replaces the probe file atomically, as the agent expects writers to.
fn write_probe_file(path: &Path, content: &Value) {
    let temporary = path.with_extension("tmp");
    std::fs::write(&temporary, serde_json::to_vec_pretty(content).unwrap()).unwrap();
    std::fs::rename(&temporary, path).unwrap();
}

/// A running agent. Its stdin is a lifeline: dropping this (or this process dying in any way)
/// closes it, and the wrapping shell terminates the agent, so no agent outlives the test.
struct AgentProcess {
    _child: Child,
    log: PathBuf,
}

impl AgentProcess {
    async fn start(node: &str, kubeconfig: &Path, probe_file: &Path, dir: &Path, extra: &[&str]) -> Self {
        let log = dir.join(format!("{node}.log"));
        let log_file = std::fs::File::create(&log).unwrap();
        let mut args: Vec<String> = [
            "--node-name",
            node,
            "--kubeconfig",
            &kubeconfig.display().to_string(),
            "--probe",
            "file",
            "--probe-file",
            &probe_file.display().to_string(),
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
        args.extend(extra.iter().map(|arg| (*arg).to_owned()));
        let child = tokio::process::Command::new("bash")
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

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }
}

fn gpu_condition(node: &Node) -> Option<NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|condition| condition.type_ == node_conditions::GPU_HEALTHY)
        .cloned()
}

/// Waits until the node's `GpuHealthy` condition has `status` and `reason`; returns it.
async fn wait_for_condition(
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
async fn wait_for_event(client: &Client, node: &str, reason: &str, agent: &AgentProcess) -> Event {
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
async fn http_status(address: std::net::SocketAddr, path: &str) -> u16 {
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
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gpu-health-agent-e2e-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn fleet(client: &Client, nodes: usize) -> Fleet {
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

#[tokio::test]
async fn a_gpu_falling_off_one_of_three_nodes_sets_gpu_missing_within_five_seconds_and_latches() {
    let cluster = common::cluster().await;
    let client = cluster.client();
    let dir = scratch("missing");
    let kubeconfig = agent_kubeconfig(&client, &dir).await;
    let fleet = fleet(&client, 3).await;
    let names = fleet.node_names();
    let mut agents = Vec::new();
    for name in &names {
        let probe_file = dir.join(format!("{name}.json"));
        write_probe_file(&probe_file, &healthy_gpus(name));
        agents.push((
            probe_file.clone(),
            AgentProcess::start(name, &kubeconfig, &probe_file, &dir, &[]).await,
        ));
    }
    for (name, (_, agent)) in names.iter().zip(&agents) {
        let condition = wait_for_condition(
            &client,
            name,
            "True",
            gpu_reasons::HEALTHY,
            Duration::from_secs(60),
            agent,
        )
        .await;
        assert_eq!(
            condition.message.as_deref(),
            Some("4 of 4 expected GPUs present and healthy")
        );
    }

    // GPU 2 of the second node falls off the bus: it vanishes from the driver's list, no XID.
    let (broken, (probe_file, agent)) = (&names[1], &agents[1]);
    let mut fallen = healthy_gpus(broken);
    fallen["gpus"].as_array_mut().unwrap().remove(2);
    let started = Instant::now();
    write_probe_file(probe_file, &fallen);
    let condition = wait_for_condition(
        &client,
        broken,
        "False",
        gpu_reasons::GPU_MISSING,
        Duration::from_secs(5),
        agent,
    )
    .await;
    let detected_after = started.elapsed();
    println!("GpuMissing published {detected_after:?} after the GPU disappeared");
    let message = condition.message.unwrap_or_default();
    assert!(
        message.contains(&format!("GPU-{broken}-0002")),
        "names the UUID: {message}"
    );
    assert!(
        message.contains("00000000:38:00.0"),
        "names the PCI address: {message}"
    );

    // Only the broken node changed, and the agent wrote only its own condition.
    let nodes: Api<Node> = Api::all(client.clone());
    for healthy in [&names[0], &names[2]] {
        let condition = gpu_condition(&nodes.get(healthy).await.unwrap()).unwrap();
        assert_eq!(condition.status, "True", "{healthy}");
    }
    let node = nodes.get(broken).await.unwrap();
    let ready = node
        .status
        .as_ref()
        .unwrap()
        .conditions
        .as_ref()
        .unwrap()
        .iter()
        .find(|c| c.type_ == "Ready")
        .cloned();
    assert_eq!(
        ready.map(|ready| ready.status).as_deref(),
        Some("True"),
        "Ready is the kubelet's, untouched"
    );
    let managers: Vec<String> = node
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter(|entry| entry.subresource.as_deref() == Some("status"))
        .filter(|entry| {
            entry
                .fields_v1
                .as_ref()
                .is_some_and(|fields| fields.0.to_string().contains(r#"{\"type\":\"GpuHealthy\"}"#))
        })
        .filter_map(|entry| entry.manager)
        .collect();
    assert_eq!(
        managers,
        vec!["gpu-health-agent".to_owned()],
        "only the agent's field manager owns GpuHealthy"
    );
    let event = wait_for_event(&client, broken, gpu_reasons::GPU_MISSING, agent).await;
    assert_eq!(
        event.type_.as_deref(),
        Some("Warning"),
        "the failure is on record in the node's events"
    );

    assert_latched_until_cleared(&client, broken, probe_file, agent).await;
    drop(agents);
    fleet.stop().await.expect("stopping the fleet");
}

/// The GPU comes back, yet the fault stays latched; a clear written before the fault does
/// nothing; one written after it releases the latch.
async fn assert_latched_until_cleared(
    client: &Client,
    broken: &str,
    probe_file: &Path,
    agent: &AgentProcess,
) {
    let nodes: Api<Node> = Api::all(client.clone());
    write_probe_file(probe_file, &healthy_gpus(broken));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let condition = gpu_condition(&nodes.get(broken).await.unwrap()).unwrap();
    assert_eq!(
        condition.status, "False",
        "a fatal fault latches until recycled or cleared"
    );
    let since = condition.last_transition_time.unwrap().0;

    // A clear written before the fault does nothing; one written after it releases the latch.
    let annotate = |at: Timestamp| {
        Patch::Merge(json!({"metadata": {"annotations": {CLEAR_ANNOTATION: at.to_string()}}}))
    };
    let before = since.checked_sub(jiff_seconds(60)).unwrap();
    nodes
        .patch(broken, &PatchParams::default(), &annotate(before))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        gpu_condition(&nodes.get(broken).await.unwrap()).unwrap().status,
        "False"
    );
    nodes
        .patch(broken, &PatchParams::default(), &annotate(Timestamp::now()))
        .await
        .unwrap();
    wait_for_condition(
        client,
        broken,
        "True",
        gpu_reasons::HEALTHY,
        Duration::from_secs(10),
        agent,
    )
    .await;
}

fn jiff_seconds(seconds: i64) -> k8s_openapi::jiff::SignedDuration {
    k8s_openapi::jiff::SignedDuration::from_secs(seconds)
}

#[tokio::test]
async fn a_failing_or_hung_nvml_reads_unknown_never_false() {
    let cluster = common::cluster().await;
    let client = cluster.client();
    let dir = scratch("nvml");
    let kubeconfig = agent_kubeconfig(&client, &dir).await;
    let fleet = fleet(&client, 2).await;
    let names = fleet.node_names();
    let (failing, hung) = (&names[0], &names[1]);
    let failing_file = dir.join(format!("{failing}.json"));
    let hung_file = dir.join(format!("{hung}.json"));
    write_probe_file(&failing_file, &healthy_gpus(failing));
    write_probe_file(&hung_file, &healthy_gpus(hung));
    let failing_agent = AgentProcess::start(failing, &kubeconfig, &failing_file, &dir, &[]).await;
    let hung_agent = AgentProcess::start(hung, &kubeconfig, &hung_file, &dir, &[]).await;
    wait_for_condition(
        &client,
        failing,
        "True",
        gpu_reasons::HEALTHY,
        Duration::from_secs(60),
        &failing_agent,
    )
    .await;
    wait_for_condition(
        &client,
        hung,
        "True",
        gpu_reasons::HEALTHY,
        Duration::from_secs(60),
        &hung_agent,
    )
    .await;

    write_probe_file(&failing_file, &json!({"nvmlError": "Driver Not Loaded"}));
    let mut hanging = healthy_gpus(hung);
    hanging["hangSeconds"] = json!(30);
    write_probe_file(&hung_file, &hanging);

    let condition = wait_for_condition(
        &client,
        failing,
        "Unknown",
        gpu_reasons::NVML_UNAVAILABLE,
        Duration::from_secs(5),
        &failing_agent,
    )
    .await;
    assert!(
        condition
            .message
            .unwrap_or_default()
            .contains("Driver Not Loaded")
    );
    let condition = wait_for_condition(
        &client,
        hung,
        "Unknown",
        gpu_reasons::NVML_UNAVAILABLE,
        Duration::from_secs(8),
        &hung_agent,
    )
    .await;
    assert!(condition.message.unwrap_or_default().contains("hung"));

    // It stays Unknown: a broken detector never turns into a False that would replace the node.
    let nodes: Api<Node> = Api::all(client.clone());
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        for name in [failing, hung] {
            let status = gpu_condition(&nodes.get(name).await.unwrap()).unwrap().status;
            assert_eq!(status, "Unknown", "{name}");
        }
    }
    drop((failing_agent, hung_agent));
    fleet.stop().await.expect("stopping the fleet");
}

#[tokio::test]
async fn a_repeating_warning_becomes_one_warning_event_on_the_node() {
    let cluster = common::cluster().await;
    let client = cluster.client();
    let dir = scratch("warning");
    let kubeconfig = agent_kubeconfig(&client, &dir).await;
    let fleet = fleet(&client, 1).await;
    let node = fleet.node_names().remove(0);
    let probe_file = dir.join(format!("{node}.json"));
    let health = {
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        free.local_addr().unwrap()
    };
    let mut hot = healthy_gpus(&node);
    hot["gpus"][1]["temperatureC"] = json!(91);
    write_probe_file(&probe_file, &hot);
    let agent = AgentProcess::start(
        &node,
        &kubeconfig,
        &probe_file,
        &dir,
        &[
            "--warning-threshold",
            "3",
            "--warning-window",
            "1m",
            "--health-listen",
            &health.to_string(),
        ],
    )
    .await;
    wait_for_condition(
        &client,
        &node,
        "True",
        gpu_reasons::HEALTHY,
        Duration::from_secs(60),
        &agent,
    )
    .await;
    let warning = wait_for_event(&client, &node, "GpuTemperatureHigh", &agent).await;
    assert_eq!(
        http_status(health, "/healthz").await,
        200,
        "the liveness endpoint answers"
    );
    assert_eq!(warning.type_.as_deref(), Some("Warning"));
    assert_eq!(warning.reporting_controller.as_deref(), Some("gpu-health-agent"));
    assert!(
        warning
            .note
            .unwrap_or_default()
            .contains(&format!("GPU-{node}-0001"))
    );
    // Once per window: a few more hot reads add no second event.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let params = ListParams::default().fields(&format!("regarding.name={node}"));
    let count = events
        .list(&params)
        .await
        .unwrap()
        .items
        .iter()
        .filter(|event| event.reason.as_deref() == Some("GpuTemperatureHigh"))
        .count();
    assert_eq!(count, 1);
    let condition = gpu_condition(&Api::<Node>::all(client.clone()).get(&node).await.unwrap()).unwrap();
    assert_eq!(condition.status, "True", "warnings never change the condition");
    drop(agent);
    fleet.stop().await.expect("stopping the fleet");
}

/// Label on this file's policies; the controller of a test enforces only its own.
const SCOPE_LABEL: &str = "e2e.gpuremediation.dev/scope";

/// Installs the generated CRDs once per test binary and waits until both kinds are served.
async fn install_crds(client: &Client) {
    static CRDS: OnceCell<()> = OnceCell::const_new();
    CRDS.get_or_init(|| async {
        let api = Api::<CustomResourceDefinition>::all(client.clone());
        for (file, yaml) in crds::render_all() {
            let crd: CustomResourceDefinition =
                serde_yaml::from_str(&yaml).unwrap_or_else(|e| panic!("parsing {file}: {e}"));
            match api.create(&PostParams::default(), &crd).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.is_already_exists() => {}
                Err(e) => panic!("creating the CRD from {file}: {e}"),
            }
        }
        common::eventually(
            "the remediation kinds to be served",
            Duration::from_secs(30),
            || async {
                let policies = Api::<GpuRemediationPolicy>::all(client.clone())
                    .list(&ListParams::default())
                    .await
                    .ok()?;
                Api::<GpuRemediation>::all(client.clone())
                    .list(&ListParams::default())
                    .await
                    .ok()?;
                Some(policies)
            },
        )
        .await;
    })
    .await;
}

/// `config/policy-h100-replace.yaml` as shipped, narrowed to one fleet: its name and scope label
/// are the fleet's, its node selector also requires the fleet's label, and its trigger's `for` is
/// 3s instead of 2m so the test does not wait minutes. Every safety limit stays as shipped.
fn shipped_replace_policy(fleet: &str) -> GpuRemediationPolicy {
    let mut policy: Value =
        serde_yaml::from_str(include_str!("../../config/policy-h100-replace.yaml")).unwrap();
    policy["metadata"]["name"] = json!(fleet);
    policy["metadata"]["labels"] = json!({SCOPE_LABEL: fleet});
    policy["spec"]["nodeSelector"]["matchLabels"][FLEET_LABEL] = json!(fleet);
    let triggers = policy["spec"]["triggers"].as_array_mut().unwrap();
    assert_eq!(triggers.len(), 1, "the shipped policy has one trigger");
    assert_eq!(triggers[0]["reasons"], json!(["XID79", "GpuMissing"]));
    triggers[0]["for"] = json!("3s");
    serde_json::from_value(policy).expect("the shipped policy parses")
}

async fn remediation_of(client: &Client, policy: &str, node: &str) -> Option<GpuRemediation> {
    Api::<GpuRemediation>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|r| r.spec.policy_name == policy && r.spec.node_name == node)
}

/// Waits until `policy`'s remediation of `node` has succeeded.
async fn wait_until_succeeded(client: &Client, policy: &str, node: &str) -> GpuRemediation {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let current = remediation_of(client, policy, node).await;
        if let Some(done) = current.as_ref().filter(|r| {
            r.status
                .as_ref()
                .is_some_and(|status| status.phase == Phase::Succeeded)
        }) {
            return done.clone();
        }
        if Instant::now() > deadline {
            let policy = Api::<GpuRemediationPolicy>::all(client.clone())
                .get(policy)
                .await
                .ok();
            panic!(
                "the remediation of {node} did not succeed within 60s\nremediation: {:#?}\npolicy status: {:#?}",
                current.map(|r| r.status),
                policy.map(|p| p.status)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The remediation controller, in-process, enforcing only the policies labelled with `scope`.
struct InProcessController {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), gpu_remediator::RunControllerError>>,
}

impl InProcessController {
    async fn start(scope: &str) -> Self {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let settings = Settings {
            policy_selector: Some(format!("{SCOPE_LABEL}={scope}")),
            ..Settings::default()
        };
        let task = tokio::spawn(gpu_remediator::run(
            common::cluster().await.config(),
            settings,
            Fence::standalone(),
            async move {
                let _ = stopped.await;
            },
        ));
        Self { stop, task }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("the controller stops")
            .expect("the controller did not panic")
            .expect("the controller ended without error");
    }
}

#[tokio::test]
async fn the_controller_remediates_a_node_the_agent_reports_missing_a_gpu_but_not_one_whose_nvml_failed() {
    let cluster = common::cluster().await;
    let client = cluster.client();
    install_crds(&client).await;
    let dir = scratch("remediation");
    let kubeconfig = agent_kubeconfig(&client, &dir).await;
    // Ten nodes, so one broken node is 10% of the fleet: within the shipped maxUnhealthy.
    let fleet = fleet(&client, 10).await;
    let mut names = fleet.node_names();
    names.sort();
    let (broken, blind, healthy) = (&names[0], &names[1], &names[2]);
    let mut agents = Vec::new();
    for name in [broken, blind, healthy] {
        let probe_file = dir.join(format!("{name}.json"));
        write_probe_file(&probe_file, &healthy_gpus(name));
        let agent = AgentProcess::start(name, &kubeconfig, &probe_file, &dir, &[]).await;
        wait_for_condition(
            &client,
            name,
            "True",
            gpu_reasons::HEALTHY,
            Duration::from_secs(60),
            &agent,
        )
        .await;
        agents.push((probe_file, agent));
    }
    let policy = shipped_replace_policy(fleet.name());
    Api::<GpuRemediationPolicy>::all(client.clone())
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();
    let controller = InProcessController::start(fleet.name()).await;

    // NVML fails on one node: Unknown, and well past the trigger's `for` nothing happens to it,
    // while the controller is running with its whole budget free.
    write_probe_file(&agents[1].0, &json!({"nvmlError": "Driver Not Loaded"}));
    wait_for_condition(
        &client,
        blind,
        "Unknown",
        gpu_reasons::NVML_UNAVAILABLE,
        Duration::from_secs(5),
        &agents[1].1,
    )
    .await;
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert!(
        remediation_of(&client, fleet.name(), blind).await.is_none(),
        "a broken detector started a remediation"
    );
    let node = Api::<Node>::all(client.clone()).get(blind).await.unwrap();
    assert_ne!(
        node.spec.and_then(|spec| spec.unschedulable),
        Some(true),
        "a broken detector cordoned the node"
    );

    // A GPU falls off another node: the agent says GpuMissing, the controller replaces the node.
    let mut fallen = healthy_gpus(broken);
    fallen["gpus"].as_array_mut().unwrap().remove(3);
    write_probe_file(&agents[0].0, &fallen);
    wait_for_condition(
        &client,
        broken,
        "False",
        gpu_reasons::GPU_MISSING,
        Duration::from_secs(5),
        &agents[0].1,
    )
    .await;
    let remediation = wait_until_succeeded(&client, fleet.name(), broken).await;
    assert_eq!(remediation.spec.trigger.reason, gpu_reasons::GPU_MISSING);
    assert!(
        remediation
            .spec
            .trigger
            .message
            .contains(&format!("GPU-{broken}-0003"))
    );
    let history: Vec<Phase> = remediation
        .status
        .as_ref()
        .unwrap()
        .phase_history
        .iter()
        .map(|step| step.phase)
        .collect();
    for phase in [
        Phase::Cordoned,
        Phase::Draining,
        Phase::Replacing,
        Phase::Succeeded,
    ] {
        assert!(history.contains(&phase), "{phase:?} missing from {history:?}");
    }
    assert!(
        Api::<Node>::all(client.clone())
            .get_opt(broken)
            .await
            .unwrap()
            .is_none(),
        "the shipped policy's DeleteNode replacement deleted the broken node"
    );
    for quiet in [blind, healthy] {
        assert!(
            remediation_of(&client, fleet.name(), quiet).await.is_none(),
            "{quiet} was remediated"
        );
    }

    controller.stop().await;
    drop(agents);
    fleet.stop().await.expect("stopping the fleet");
}

#[tokio::test]
async fn a_latched_fault_survives_an_agent_restart() {
    let cluster = common::cluster().await;
    let client = cluster.client();
    let dir = scratch("restart");
    let kubeconfig = agent_kubeconfig(&client, &dir).await;
    let fleet = fleet(&client, 1).await;
    let node = fleet.node_names().remove(0);
    let probe_file = dir.join(format!("{node}.json"));
    let mut faulty = healthy_gpus(&node);
    faulty["xidEvents"] = json!([{"id": 1, "xid": 79, "gpuUuid": format!("GPU-{node}-0001")}]);
    write_probe_file(&probe_file, &faulty);
    let agent = AgentProcess::start(&node, &kubeconfig, &probe_file, &dir, &[]).await;
    let latched = wait_for_condition(&client, &node, "False", "XID79", Duration::from_secs(60), &agent).await;
    assert!(
        latched
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("RESTART_BM"),
        "{latched:?}"
    );
    drop(agent);

    // A new agent finds no XID (events are not replayed) and healthy GPUs, yet keeps the latch.
    write_probe_file(&probe_file, &healthy_gpus(&node));
    let agent = AgentProcess::start(&node, &kubeconfig, &probe_file, &dir, &[]).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let after = gpu_condition(&Api::<Node>::all(client.clone()).get(&node).await.unwrap()).unwrap();
    assert_eq!(after.status, "False", "agent log:\n{}", agent.log_tail());
    assert_eq!(after.reason, latched.reason);
    assert_eq!(after.message, latched.message);
    assert_eq!(
        after.last_transition_time, latched.last_transition_time,
        "still dated from the fault"
    );
    assert!(
        agent.log_tail().contains("restoring latched fault"),
        "{}",
        agent.log_tail()
    );
    drop(agent);
    fleet.stop().await.expect("stopping the fleet");
}

/// A client authenticated as the agent, from the kubeconfig the agents use.
async fn client_from(kubeconfig: &Path) -> Client {
    let file = kube::config::Kubeconfig::read_from(kubeconfig).expect("agent kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
        .await
        .expect("agent client config");
    Client::try_from(config).expect("agent client")
}

fn is_forbidden<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> bool {
    matches!(result, Err(kube::Error::Api(status)) if status.code == 403)
}

#[tokio::test]
async fn the_agents_role_writes_node_status_and_nothing_else() {
    let cluster = common::cluster().await;
    let admin = cluster.client();
    let dir = scratch("rbac");
    let agent = client_from(&agent_kubeconfig(&admin, &dir).await).await;
    let fleet = fleet(&admin, 1).await;
    let node = fleet.node_names().remove(0);
    let nodes: Api<Node> = Api::all(agent.clone());

    nodes.get(&node).await.expect("the agent reads its node");
    let condition = json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": node},
        "status": {"conditions": [{"type": "GpuHealthy", "status": "True", "reason": "GpusHealthy", "message": "ok"}]},
    });
    nodes
        .patch_status(
            &node,
            &PatchParams::apply("gpu-health-agent").force(),
            &Patch::Apply(&condition),
        )
        .await
        .expect("the agent applies its condition");

    let cordon = Patch::Merge(json!({"spec": {"unschedulable": true}}));
    assert!(
        is_forbidden(nodes.patch(&node, &PatchParams::default(), &cordon).await),
        "cordon"
    );
    let relabel = Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}}));
    assert!(
        is_forbidden(nodes.patch(&node, &PatchParams::default(), &relabel).await),
        "node metadata"
    );
    assert!(
        is_forbidden(nodes.delete(&node, &kube::api::DeleteParams::default()).await),
        "delete node"
    );
    assert!(
        is_forbidden(nodes.list(&ListParams::default()).await),
        "list nodes"
    );
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::all(agent.clone());
    assert!(is_forbidden(pods.list(&ListParams::default()).await), "list pods");
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(agent, AGENT_NAMESPACE);
    assert!(
        is_forbidden(secrets.list(&ListParams::default()).await),
        "read secrets"
    );
    fleet.stop().await.expect("stopping the fleet");
}

#[tokio::test]
async fn the_agent_manifests_are_accepted_by_the_api_server() {
    let admin = common::cluster().await.client();
    agent_kubeconfig(&admin, &scratch("manifests")).await;
    let strict = PatchParams::apply("e2e")
        .dry_run()
        .validation(kube::api::ValidationDirective::Strict);
    for (file, yaml) in [
        (
            "daemonset.yaml",
            include_str!("../../manifests/agent/daemonset.yaml"),
        ),
        (
            "xid-catalog-override.yaml",
            include_str!("../../manifests/agent/xid-catalog-override.yaml"),
        ),
    ] {
        let object: Value = serde_yaml::from_str(yaml).unwrap_or_else(|e| panic!("{file}: {e}"));
        let name = object["metadata"]["name"].as_str().unwrap().to_owned();
        let result = match object["kind"].as_str() {
            Some("DaemonSet") => {
                let tolerations = &object["spec"]["template"]["spec"]["tolerations"];
                assert_eq!(
                    tolerations,
                    &json!([{"operator": "Exists"}]),
                    "tolerates every taint"
                );
                Api::<k8s_openapi::api::apps::v1::DaemonSet>::namespaced(admin.clone(), AGENT_NAMESPACE)
                    .patch(&name, &strict, &Patch::Apply(&object))
                    .await
                    .map(drop)
            }
            Some("ConfigMap") => {
                Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(admin.clone(), AGENT_NAMESPACE)
                    .patch(&name, &strict, &Patch::Apply(&object))
                    .await
                    .map(drop)
            }
            other => panic!("unexpected kind {other:?} in {file}"),
        };
        result.unwrap_or_else(|e| panic!("the API server refused {file}: {e}"));
    }
}

#[tokio::test]
async fn a_cluster_override_makes_an_application_xid_fatal() {
    let cluster = common::cluster().await;
    let client = cluster.client();
    let dir = scratch("override");
    let kubeconfig = agent_kubeconfig(&client, &dir).await;
    let fleet = fleet(&client, 2).await;
    let names = fleet.node_names();
    let override_file = dir.join("xid-override.yaml");
    std::fs::write(
        &override_file,
        "xids:\n  - {xid: 13, severity: fatal, action: RESET_GPU}\n",
    )
    .unwrap();
    let mut agents = Vec::new();
    for (name, extra) in names.iter().zip([
        vec!["--xid-catalog-override", override_file.to_str().unwrap()],
        vec![],
    ]) {
        let probe_file = dir.join(format!("{name}.json"));
        let mut gpus = healthy_gpus(name);
        gpus["xidEvents"] = json!([{"id": 1, "xid": 13, "gpuUuid": format!("GPU-{name}-0000")}]);
        write_probe_file(&probe_file, &gpus);
        agents.push(AgentProcess::start(name, &kubeconfig, &probe_file, &dir, &extra).await);
    }
    let fatal = wait_for_condition(
        &client,
        &names[0],
        "False",
        "XID13",
        Duration::from_secs(60),
        &agents[0],
    )
    .await;
    assert!(fatal.message.unwrap_or_default().contains("RESET_GPU"));
    // The same XID under the shipped catalog is an application fault: a warning, the node stays healthy.
    wait_for_condition(
        &client,
        &names[1],
        "True",
        gpu_reasons::HEALTHY,
        Duration::from_secs(60),
        &agents[1],
    )
    .await;
    drop(agents);
    fleet.stop().await.expect("stopping the fleet");
}
