//! The harness the real-node tests share (the sandbox's own and e2e's): a control plane with real
//! nodes, Ready; a probe retried until a deadline; the binaries the environment names; the time
//! since the start, said as each step ends; and, when a test fails, the nodes' logs (each kubelet's,
//! containerd's and every container's), which the API server cannot fetch from a kubelet inside its
//! own network namespace.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use crate::{
    ControlPlane, ControlPlaneOptions,
    real_node::{Binaries, Layout, RealNode},
    workload::node_is_ready,
};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{Api, runtime::watcher};

/// The built file the environment variable `variable` names (`make real-node-test` and
/// `make e2e-real` set them).
///
/// # Panics
/// When the variable is unset or names no file: the test cannot run without it.
#[must_use]
pub fn built(variable: &str) -> PathBuf {
    std::env::var_os(variable)
        .map(PathBuf::from)
        .filter(|path| path.is_file())
        .unwrap_or_else(|| panic!("{variable} must name a built file (make real-node-test sets it)"))
}

/// Retries `probe` every 200 ms until it finds something; fails the test at `deadline`.
pub async fn eventually<T, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    deadline: Duration,
    mut probe: impl FnMut() -> F,
) -> T {
    let started = Instant::now();
    loop {
        if let Some(found) = probe().await {
            return found;
        }
        assert!(started.elapsed() < deadline, "{what}: not within {deadline:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The exit code of the pod's first container, once it terminated.
fn exit_code(pod: &Pod) -> Option<i32> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()?
        .state
        .as_ref()?
        .terminated
        .as_ref()
        .map(|terminated| terminated.exit_code)
}

/// The last exit code the pod's container reported before the pod was deleted (a watch, from now):
/// 0 for the pause image ended by SIGTERM, 137 for a container killed at its grace period's end.
#[must_use]
pub fn exit_code_at_deletion(pods: &Api<Pod>, name: &str) -> tokio::task::JoinHandle<Option<i32>> {
    let watch = watcher(
        pods.clone(),
        watcher::Config::default().fields(&format!("metadata.name={name}")),
    );
    tokio::spawn(async move {
        let mut watch = std::pin::pin!(watch);
        let mut exit = None;
        while let Some(event) = watch.next().await {
            match event {
                Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => {
                    exit = exit_code(&pod).or(exit);
                }
                Ok(watcher::Event::Delete(pod)) => return exit_code(&pod).or(exit),
                _ => {}
            }
        }
        exit
    })
}

/// A control plane and real nodes on it, Ready.
pub struct Cluster {
    // First: fields drop in order, and the control plane's drop removes the directory.
    _logs: LogsOnFailure,
    /// The control plane the nodes joined.
    pub control_plane: ControlPlane,
    /// The real nodes, in the order they were wanted.
    pub nodes: Vec<RealNode>,
    started: Instant,
}

/// A real node a test wants: its name, its index (its addresses) and whether it has GPUs
/// (`Layout::with_gpus`).
pub struct Wanted<'a> {
    /// The node's name.
    pub name: &'a str,
    /// Its index: its addresses (`Layout::index`).
    pub index: u8,
    /// Whether it registers as a GPU node.
    pub gpus: bool,
}

/// Prints the tail of every log under a node's directory when dropped while the test panics.
struct LogsOnFailure(PathBuf);

impl Drop for LogsOnFailure {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        for log in logs_under(&self.0) {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            eprintln!("==> {} (last {} lines)", log.display(), tail.len());
            for line in tail.iter().rev() {
                eprintln!("{line}");
            }
        }
    }
}

/// The `.log` files under `dir`, at any depth, sorted.
fn logs_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
        {
            let path = entry.path();
            if path.is_dir() && !path.is_symlink() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "log") {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

impl Cluster {
    /// Starts a control plane and the real node `name` (its addresses from `index`), and waits
    /// for the node to turn Ready.
    pub async fn with_a_ready_node(name: &str, index: u8) -> Self {
        Self::with_ready_nodes(&[Wanted {
            name,
            index,
            gpus: false,
        }])
        .await
    }

    /// Starts a control plane and the real nodes `wanted`, one after the other, and waits for
    /// every one to turn Ready.
    pub async fn with_ready_nodes(wanted: &[Wanted<'_>]) -> Self {
        let started = Instant::now();
        let control_plane = ControlPlane::start(ControlPlaneOptions::default())
            .await
            .expect("the control plane");
        let mut cluster = Self {
            _logs: LogsOnFailure(control_plane.data_dir().join("nodes")),
            control_plane,
            nodes: Vec::new(),
            started,
        };
        for wanted in wanted {
            cluster.start_node(wanted).await;
        }
        cluster.say("control plane up, real nodes started, pause image imported");
        for wanted in wanted {
            cluster.until_ready(wanted.name).await;
        }
        cluster.say("the nodes Ready");
        cluster
    }

    /// Starts the real node `wanted` (its kubelet registers the Node on its own) and adds it to the
    /// cluster; returns it.
    pub async fn start_node(&mut self, wanted: &Wanted<'_>) -> &RealNode {
        let binaries = Binaries::from_env().expect("the real node's binaries (make real-node-test)");
        let layout = Layout {
            name: wanted.name.into(),
            index: wanted.index,
            dir: self.control_plane.data_dir().join("nodes").join(wanted.name),
            labels: BTreeMap::new(),
        };
        let layout = if wanted.gpus { layout.with_gpus() } else { layout };
        let node = RealNode::start(&self.control_plane, layout, &binaries)
            .await
            .unwrap_or_else(|error| panic!("the real node {}: {error}", wanted.name));
        self.nodes.push(node);
        self.nodes.last().expect("just pushed")
    }

    /// Waits for the Node `name` to turn Ready.
    pub async fn until_ready(&self, name: &str) {
        let nodes = Api::<Node>::all(self.control_plane.client());
        eventually(&format!("{name} Ready"), Duration::from_secs(120), || async {
            nodes.get_opt(name).await.ok().flatten().filter(node_is_ready)
        })
        .await;
    }

    /// Stops the real node `name` and takes it out of the cluster: its machine powered off, as a
    /// node group terminates the instance behind a deleted Node.
    pub async fn stop_node(&mut self, name: &str) {
        let at = self
            .nodes
            .iter()
            .position(|node| node.name() == name)
            .unwrap_or_else(|| panic!("no real node {name}"));
        self.nodes.remove(at).stop().await;
    }

    /// The real node `name`.
    #[must_use]
    pub fn named(&self, name: &str) -> &RealNode {
        self.nodes
            .iter()
            .find(|node| node.name() == name)
            .unwrap_or_else(|| panic!("no real node {name}"))
    }

    /// The first node.
    #[must_use]
    pub fn node(&self) -> &RealNode {
        &self.nodes[0]
    }

    /// Says `what`, after the time since the start.
    pub fn say(&self, what: &str) {
        eprintln!("{:>7.1} s  {what}", self.started.elapsed().as_secs_f64());
    }

    /// Stops the nodes, then the control plane.
    pub async fn stop(self) {
        let Self {
            _logs,
            control_plane,
            nodes,
            started,
        } = self;
        for node in nodes {
            node.stop().await;
        }
        eprintln!("{:>7.1} s  the nodes stopped", started.elapsed().as_secs_f64());
        control_plane.stop().await;
        eprintln!(
            "{:>7.1} s  the control plane stopped",
            started.elapsed().as_secs_f64()
        );
    }
}
