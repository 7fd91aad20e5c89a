//! The sandbox's control plane: it serves the real API with TLS, token authentication and RBAC,
//! confines a node's kubelet certificate to its own Node (Node authorizer, `NodeRestriction`),
//! runs the pinned release, and leaves no process behind however its owner ends.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpu_sandbox::{ControlPlane, ControlPlaneOptions};
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Namespace, Node, ServiceAccount};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};

/// Set in a child test process to make `owner_process_for_orphan_tests` start a control plane.
const OWNER_MODE_ENV: &str = "GPU_SANDBOX_OWNER_MODE";

fn is_gone(pid: u32) -> bool {
    // Gone, or a zombie waiting for a reaper: either way it no longer runs.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X"),
    }
}

async fn wait_until_gone(pids: &[(String, u32)], within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let alive: Vec<_> = pids.iter().filter(|(_, pid)| !is_gone(*pid)).collect();
        if alive.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "still running after {within:?}: {alive:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn the_shared_control_plane_serves_the_api_to_the_admin() {
    let cluster = common::cluster().await;
    let namespaces: Api<Namespace> = Api::all(cluster.client());
    let names: Vec<String> = namespaces
        .list(&ListParams::default())
        .await
        .expect("listing namespaces")
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    for expected in ["default", "kube-system", "kube-node-lease"] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} missing from {names:?}"
        );
    }
}

#[tokio::test]
async fn the_built_kubectl_and_server_report_the_pinned_release() {
    let cluster = common::cluster().await;
    let output = Command::new(cluster.kubectl())
        .arg("--kubeconfig")
        .arg(cluster.kubeconfig_path())
        .args(["version", "-o", "json"])
        .output()
        .expect("running kubectl");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let version: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json");
    let pinned = include_str!("../controlplane/versions.env")
        .lines()
        .find_map(|line| line.strip_prefix("KUBERNETES_VERSION="))
        .expect("versions.env pins KUBERNETES_VERSION");
    assert_eq!(version["serverVersion"]["gitVersion"], pinned);
    assert_eq!(version["clientVersion"]["gitVersion"], pinned);
}

#[tokio::test]
async fn a_service_account_without_roles_is_forbidden_by_rbac() {
    let cluster = common::cluster().await;
    let namespace = common::namespace().await;
    let client = cluster.client();
    let service_accounts: Api<ServiceAccount> = Api::namespaced(client, &namespace);
    let token = service_accounts
        .create_token_request("default", &PostParams::default(), &TokenRequest::default())
        .await
        .expect("requesting a token")
        .status
        .expect("token status")
        .token;
    let as_service_account: Api<Namespace> = Api::all(cluster.client_with_token(&token));
    let error = as_service_account
        .list(&ListParams::default())
        .await
        .expect_err("a service account without roles must not list namespaces");
    assert!(
        matches!(&error, kube::Error::Api(status) if status.code == 403),
        "expected 403, got {error:?}"
    );
    let anonymous: Api<Namespace> = Api::all(cluster.client_with_token("not-a-token"));
    let error = anonymous
        .list(&ListParams::default())
        .await
        .expect_err("an unknown token must be refused");
    assert!(
        matches!(&error, kube::Error::Api(status) if status.code == 401),
        "expected 401, got {error:?}"
    );
}

/// A kubelet's certificate names its node and group; with it the node may label its own Node and
/// is refused another's by `NodeRestriction`, with the plugin's message.
#[tokio::test]
async fn a_nodes_certificate_is_confined_to_its_own_node_by_node_restriction() {
    let cluster = common::cluster().await;
    let fleet = common::fleet(2).await;
    let names = fleet.node_names();
    let (own, other) = (&names[0], &names[1]);
    let as_node = cluster
        .node_client(own)
        .expect("a client with the node's certificate");
    let review = Api::<SelfSubjectReview>::all(as_node.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .expect("the node may review itself");
    let user = review
        .status
        .and_then(|s| s.user_info)
        .expect("the reviewed user");
    assert_eq!(
        user.username.as_deref(),
        Some(format!("system:node:{own}").as_str())
    );
    assert!(
        user.groups
            .unwrap_or_default()
            .contains(&"system:nodes".to_owned())
    );

    let nodes: Api<Node> = Api::all(as_node);
    let label =
        |value: &str| Patch::Merge(serde_json::json!({"metadata": {"labels": {"e2e-touched": value}}}));
    nodes
        .patch(own, &PatchParams::default(), &label("own"))
        .await
        .expect("a node may label its own Node");
    let error = nodes
        .patch(other, &PatchParams::default(), &label("other"))
        .await
        .expect_err("a node must not patch another node");
    assert!(
        matches!(&error, kube::Error::Api(status) if status.code == 403 && status.message.contains(&format!("node \"{own}\" is not allowed to modify node \"{other}\""))),
        "expected NodeRestriction's refusal, got {error:?}"
    );
    fleet.stop().await.expect("stopping the fleet");
}

#[tokio::test]
async fn a_stopped_control_plane_leaves_no_process_behind() {
    let control_plane = ControlPlane::start(ControlPlaneOptions::default())
        .await
        .expect("starting a second control plane");
    let pids = control_plane.component_pids();
    let names: Vec<&str> = pids.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler"
        ]
    );
    assert!(pids.iter().all(|(_, pid)| !is_gone(*pid)));
    let data_dir = control_plane.data_dir().to_owned();
    control_plane.stop().await;
    wait_until_gone(&pids, Duration::from_secs(1)).await;
    assert!(!data_dir.exists(), "{} was not removed", data_dir.display());
}

/// Runs this test binary again as an owner process in `mode`, reads the pids it reports, and
/// returns them with the child.
fn start_owner_process(mode: &str) -> (std::process::Child, Vec<(String, u32)>) {
    let mut child = Command::new(std::env::current_exe().expect("test binary path"))
        .args([
            "--ignored",
            "--exact",
            "owner_process_for_orphan_tests",
            "--nocapture",
        ])
        .env(OWNER_MODE_ENV, mode)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting the owner process");
    let stdout = child.stdout.take().expect("piped stdout");
    let line = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .find(|l| l.starts_with("PIDS "))
        .expect("the owner process reports its component pids");
    let pids = line["PIDS ".len()..]
        .split_whitespace()
        .map(|pair| {
            let (name, pid) = pair.split_once('=').expect("name=pid");
            (name.to_owned(), pid.parse().expect("a pid"))
        })
        .collect::<Vec<_>>();
    assert_eq!(pids.len(), 4, "{line}");
    (child, pids)
}

#[tokio::test]
async fn no_component_survives_its_owner_being_killed() {
    let (mut owner, pids) = start_owner_process("sleep");
    assert!(pids.iter().all(|(_, pid)| !is_gone(*pid)));
    owner.kill().expect("SIGKILL to the owner");
    owner.wait().expect("reaping the owner");
    // The watchdog sends SIGTERM at once and SIGKILL after 10s.
    wait_until_gone(&pids, Duration::from_secs(15)).await;
}

#[tokio::test]
async fn no_component_survives_a_test_that_panics_with_its_control_plane_in_a_static() {
    let (mut owner, pids) = start_owner_process("panic");
    let status = owner.wait().expect("waiting for the owner");
    assert!(!status.success(), "the owner's test panicked, so it fails");
    wait_until_gone(&pids, Duration::from_secs(15)).await;
}

/// Not a test on its own: the owner process the two tests above start and then kill or let panic.
#[tokio::test]
#[ignore = "run only as a child process by the orphan tests"]
async fn owner_process_for_orphan_tests() {
    static LEAKED: tokio::sync::OnceCell<ControlPlane> = tokio::sync::OnceCell::const_new();
    let mode = std::env::var(OWNER_MODE_ENV).expect("run by the orphan tests only");
    let control_plane = LEAKED
        .get_or_init(|| async {
            ControlPlane::start(ControlPlaneOptions::default())
                .await
                .expect("starting the owner's control plane")
        })
        .await;
    let pids: Vec<String> = control_plane
        .component_pids()
        .into_iter()
        .map(|(name, pid)| format!("{name}={pid}"))
        .collect();
    println!("PIDS {}", pids.join(" "));
    match mode.as_str() {
        "panic" => panic!("a test failing while its control plane lives in a static"),
        _ => tokio::time::sleep(Duration::from_secs(600)).await,
    }
}

/// Command lines of running processes that mention `needle`.
fn processes_mentioning(needle: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|raw| String::from_utf8_lossy(&raw).replace('\0', " "))
        .filter(|cmdline| cmdline.contains(needle))
        .collect()
}

#[tokio::test]
async fn a_component_that_cannot_start_fails_the_start_with_its_log_and_leaves_nothing_behind() {
    // A flag no kube-apiserver knows, carrying a marker to find stray processes by.
    let marker = format!("--gpu-sandbox-test-marker-{}", std::process::id());
    let error = ControlPlane::start(ControlPlaneOptions {
        extra_apiserver_args: vec![format!("{marker}=1")],
        ..ControlPlaneOptions::default()
    })
    .await
    .expect_err("an unknown flag must fail the start");
    match &error {
        gpu_sandbox::StartControlPlaneError::ComponentExited { name, log_tail, .. } => {
            assert_eq!(name, "kube-apiserver");
            assert!(log_tail.contains("unknown flag"), "{log_tail}");
        }
        other => panic!("expected kube-apiserver to exit, got {other}"),
    }
    // etcd started before the API server failed; the failed start stopped it again. The API
    // server's own watchdog (a `bash -c` whose command line carries the same flags) leaves once
    // its pipe is closed, which a loaded machine may take a moment to run: checked below, with
    // the others'.
    let components: Vec<String> = processes_mentioning(&marker)
        .into_iter()
        .filter(|cmdline| !cmdline.starts_with("bash"))
        .collect();
    assert!(components.is_empty(), "components left running: {components:?}");
    // Other tests' control planes may run meanwhile, but a stop removes the data directory only
    // after every component has exited: a component whose directory is gone was left behind.
    // Their watchdogs (`bash -c`) notice within a second that there is nothing left to guard.
    let root = std::env::temp_dir().join("gpu-sandbox");
    let mine = format!("{}/cp-{}-", root.display(), std::process::id());
    let orphaned = || {
        processes_mentioning(&mine)
            .into_iter()
            .filter(|cmdline| {
                let start = cmdline.find(&mine).expect("mentions the prefix") + mine.len();
                let sequence: String = cmdline[start..]
                    .chars()
                    .take_while(char::is_ascii_digit)
                    .collect();
                !std::path::Path::new(&format!("{mine}{sequence}")).exists()
            })
            .collect::<Vec<String>>()
    };
    let components: Vec<String> = orphaned()
        .into_iter()
        .filter(|cmdline| !cmdline.starts_with("bash"))
        .collect();
    assert!(components.is_empty(), "components left running: {components:?}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let strays = orphaned();
    assert!(strays.is_empty(), "left running: {strays:?}");
    let watchdogs = processes_mentioning(&marker);
    assert!(watchdogs.is_empty(), "watchdogs left running: {watchdogs:?}");
}
