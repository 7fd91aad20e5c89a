//! Real nodes beside the simulated fleet (issue 43, `docs/plans/real-node.md` S3): a kubelet,
//! containerd and runc built from pinned modules, run in namespaces of their own, join the
//! sandbox's control plane as a node that runs pods.
//!
//! What a node takes from the host, and how it is given back: its processes live in a PID
//! namespace whose first process dies with `unshare` (`--kill-child`), which dies with the process
//! that started it (`setpriv --pdeathsig`), so a dead test takes its nodes with it; its mounts and
//! addresses exist only in its own mount and network namespaces; its cgroups (a directory in every
//! v1 hierarchy) are removed when it stops, and a node started under the same name first removes
//! whatever a killed run left (processes and cgroups). The host's kernel settings are never
//! written ([`config::KERNEL_TUNABLES`]).
//!
//! The node reaches the API server at `10.0.0.1:443` inside its network namespace: the sandbox
//! listens there (a socket opened by a thread that entered the namespace) and forwards each
//! connection to the API server's loopback port on the host.

pub mod built_image;
pub mod chart;
pub mod cluster;
pub mod config;
pub mod dockerfile;
pub mod image;
pub mod nvidia;
pub mod shipped;

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use tokio::{net::TcpStream, process::Child, task::JoinHandle};

pub use config::{Binaries, Layout};

use crate::ControlPlane;

/// Where, under a node's [`RealNode::driver_root`], the driver's `libnvidia-ml.so.1` lies (Debian's
/// multiarch directory, where NVIDIA's device plugin looks first).
pub const DRIVER_LIBRARY_DIR: &str = "usr/lib/x86_64-linux-gnu";

/// How long a node may take to raise its network, and its containerd to take an image.
const START_DEADLINE: Duration = Duration::from_secs(60);

/// The environment variables naming the built binaries (`make real-node-test` sets them).
const BINARY_VARIABLES: [&str; 5] = [
    "GPU_REMEDIATOR_KUBELET",
    "GPU_REMEDIATOR_CONTAINERD",
    "GPU_REMEDIATOR_RUNC",
    "GPU_REMEDIATOR_CNI_PLUGINS",
    "GPU_REMEDIATOR_PAUSE",
];

impl Binaries {
    /// The binaries the environment names: `GPU_REMEDIATOR_KUBELET` (the directory
    /// `e2e/controlplane/build.sh --kubelet` prints), `GPU_REMEDIATOR_CONTAINERD` and
    /// `GPU_REMEDIATOR_CNI_PLUGINS` (the directories `tools/build.sh containerd` and `cni-plugins`
    /// print), `GPU_REMEDIATOR_RUNC` (`tools/build.sh runc`) and `GPU_REMEDIATOR_PAUSE` (the
    /// directory `build.sh --pause` prints).
    ///
    /// # Errors
    /// The first variable unset, or naming nothing.
    pub fn from_env() -> Result<Self, StartRealNodeError> {
        let [kubelet, containerd, runc, cni, pause] = BINARY_VARIABLES.map(|name| {
            std::env::var_os(name)
                .map(PathBuf::from)
                .filter(|path| path.exists())
                .ok_or(StartRealNodeError::Binary(name))
        });
        Ok(Self {
            kubelet: kubelet?.join("kubelet"),
            containerd_dir: containerd?,
            runc: runc?,
            cni_dir: cni?,
            pause: pause?.join("pause"),
        })
    }
}

/// A real node, running. Stop it with [`RealNode::stop`]; dropped, its processes are killed and
/// its cgroups are left for the next start under its name to remove.
pub struct RealNode {
    layout: Layout,
    binaries: Binaries,
    /// `setpriv`, which became `unshare`: the node's processes die with it.
    unshare: Child,
    /// The node's first process, as the host numbers it (the kubelet, once set up).
    init: u32,
    bridge: JoinHandle<()>,
}

/// Why a real node did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartRealNodeError {
    /// A binary's variable is unset or names nothing.
    #[error("{0} does not name a built binary (make real-node-test sets it)")]
    Binary(&'static str),
    /// A file or directory could not be written or read.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The failure.
        source: std::io::Error,
    },
    /// The node's certificate could not be made.
    #[error("the node's client certificate: {0}")]
    Certificate(#[from] crate::controlplane::CreatePkiError),
    /// The node's setup ended or did not raise its network in time.
    #[error("the node's setup did not raise its network: {log}")]
    Setup {
        /// The tail of its log.
        log: String,
    },
    /// The node's containerd did not import an image in time.
    #[error("importing {image} on the node: {output}")]
    Import {
        /// The image's tar.
        image: PathBuf,
        /// `ctr`'s last words.
        output: String,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> StartRealNodeError {
    let what = what.into();
    move |source| StartRealNodeError::Io { what, source }
}

impl RealNode {
    /// Starts node `layout.name` against `control_plane` and imports the pause image into its
    /// containerd; returns once it can run pods (the kubelet registers the Node on its own).
    ///
    /// # Errors
    /// See [`StartRealNodeError`].
    pub async fn start(
        control_plane: &ControlPlane,
        layout: Layout,
        binaries: &Binaries,
    ) -> Result<Self, StartRealNodeError> {
        remove_leftovers(&layout).await;
        write_files(control_plane, &layout, binaries)?;
        let unshare = spawn(&layout, binaries)?;
        let pid = unshare.id().ok_or_else(|| StartRealNodeError::Setup {
            log: "unshare exited at once".into(),
        })?;
        let mut node = Self {
            layout,
            binaries: binaries.clone(),
            unshare,
            init: 0,
            bridge: tokio::spawn(async {}),
        };
        node.init = node.wait_for_network(pid).await?;
        let upstream = api_port(control_plane.server_url());
        let listener = listen_in_namespace(node.init)
            .map_err(io("listening at 10.0.0.1:443 in the node's network namespace"))?;
        node.bridge = tokio::spawn(forward(listener, upstream));
        let pause = node.layout.path("pause.tar");
        let tar =
            image::layout_tar(&pause_image(&node.binaries.pause)?).map_err(io("building the pause image"))?;
        std::fs::write(&pause, tar).map_err(io(format!("writing {}", pause.display())))?;
        node.import(&pause).await?;
        Ok(node)
    }

    /// The node's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.layout.name
    }

    /// Where this node's GPU driver would be installed (its `/` for the driver, as NVIDIA's tools
    /// call it): the NVML stand-in goes under [`DRIVER_LIBRARY_DIR`], with its `scenario.json`
    /// beside it. A host path, which the node's pods mount as a `hostPath`, and which appears
    /// inside the node at [`config::DRIVER_ROOT_IN_NODE`] too.
    #[must_use]
    pub fn driver_root(&self) -> PathBuf {
        self.layout.path("driver-root")
    }

    /// Imports an OCI layout tar into the node's containerd (namespace `k8s.io`, where the CRI
    /// finds images), retrying while containerd starts.
    ///
    /// # Errors
    /// When `ctr` still fails at the deadline.
    pub async fn import(&self, image_tar: &Path) -> Result<(), StartRealNodeError> {
        let started = Instant::now();
        loop {
            let output = tokio::process::Command::new("nsenter")
                .args(["-t", &self.init.to_string(), "-m", "-n", "--"])
                .arg(self.binaries.containerd_dir.join("ctr"))
                .args(["-n", "k8s.io", "images", "import"])
                .arg(image_tar)
                .output()
                .await
                .map_err(io("running ctr in the node's namespaces"))?;
            if output.status.success() {
                return Ok(());
            }
            if started.elapsed() > START_DEADLINE {
                return Err(StartRealNodeError::Import {
                    image: image_tar.to_owned(),
                    output: String::from_utf8_lossy(&output.stderr).into_owned(),
                });
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Stops the node (every process in its namespaces is killed: a powered-off machine) and
    /// removes its cgroups.
    pub async fn stop(mut self) {
        self.bridge.abort();
        let _ = self.unshare.kill().await;
        remove_leftovers(&self.layout).await;
    }

    /// Waits until the setup script has raised the node's network; returns the node's first
    /// process as the host numbers it.
    async fn wait_for_network(&mut self, unshare: u32) -> Result<u32, StartRealNodeError> {
        let started = Instant::now();
        let ready = self.layout.path("network-ready");
        loop {
            if ready.exists() {
                let children = format!("/proc/{unshare}/task/{unshare}/children");
                let init = std::fs::read_to_string(&children).unwrap_or_default();
                if let Some(init) = init.split_whitespace().next().and_then(|pid| pid.parse().ok()) {
                    return Ok(init);
                }
            }
            let exited = matches!(self.unshare.try_wait(), Ok(Some(_)));
            if exited || started.elapsed() > START_DEADLINE {
                let log = std::fs::read_to_string(self.layout.path("logs/setup.log")).unwrap_or_default();
                return Err(StartRealNodeError::Setup { log });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        self.bridge.abort();
        // `kill_on_drop`: the child is killed as it drops; its cgroups wait for the next start.
    }
}

/// The node's directory, configuration, credentials and the kernel settings' files; its cgroups.
fn write_files(
    control_plane: &ControlPlane,
    layout: &Layout,
    binaries: &Binaries,
) -> Result<(), StartRealNodeError> {
    let _ = std::fs::remove_dir_all(&layout.dir);
    let driver = format!("driver-root/{DRIVER_LIBRARY_DIR}");
    for dir in ["cni", "logs", "proc-sys", driver.as_str()] {
        let path = layout.path(dir);
        std::fs::create_dir_all(&path).map_err(io(format!("creating {}", path.display())))?;
    }
    let certificate = control_plane.node_certificate(&layout.name)?;
    let ca = control_plane.ca_certificate();
    let mut files = vec![
        ("containerd.toml".to_owned(), config::containerd(layout, binaries)),
        ("cni/10-gpu-sandbox.conflist".to_owned(), config::cni(layout)),
        ("kubelet.yaml".to_owned(), config::kubelet(layout, &ca)),
        (
            "kubeconfig".to_owned(),
            config::kubeconfig(&ca, &certificate.cert, &certificate.key),
        ),
    ];
    for (tunable, value) in config::KERNEL_TUNABLES {
        let name = tunable.rsplit('/').next().unwrap_or(tunable);
        files.push((format!("proc-sys/{name}"), value.to_owned()));
    }
    for (name, content) in files {
        let path = layout.path(&name);
        std::fs::write(&path, content).map_err(io(format!("writing {}", path.display())))?;
    }
    for hierarchy in cgroup_hierarchies() {
        let path = hierarchy.join(layout.cgroup_root().trim_start_matches('/'));
        std::fs::create_dir_all(&path).map_err(io(format!("creating cgroup {}", path.display())))?;
    }
    Ok(())
}

/// `setpriv --pdeathsig KILL unshare ... sh -c SETUP`: the node's first process in new
/// namespaces, dying with this process (the signal follows the thread that spawned it: the
/// runtime's, which lives as long as the test).
fn spawn(layout: &Layout, binaries: &Binaries) -> Result<Child, StartRealNodeError> {
    let log = layout.path("logs/setup.log");
    let log = std::fs::File::create(&log).map_err(io(format!("creating {}", log.display())))?;
    let err = log.try_clone().map_err(io("sharing the setup log"))?;
    tokio::process::Command::new("setpriv")
        .args(["--pdeathsig", "KILL", "--", "unshare"])
        .args([
            "--mount",
            "--net",
            "--pid",
            "--uts",
            "--fork",
            "--kill-child",
            "--mount-proc",
        ])
        .args(["--", "sh", "-c", config::SETUP, "sh"])
        .arg(&layout.dir)
        .arg(&layout.name)
        .arg(layout.node_address())
        .arg(&binaries.containerd_dir)
        .arg(&binaries.kubelet)
        .arg(layout.node_labels())
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err)
        .kill_on_drop(true)
        .spawn()
        .map_err(io("starting the node under setpriv and unshare"))
}

/// Every cgroup v1 hierarchy mounted under `/sys/fs/cgroup`.
fn cgroup_hierarchies() -> Vec<PathBuf> {
    std::fs::read_dir("/sys/fs/cgroup")
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|entry| entry.path())
                .filter(|path| path.is_dir() && !path.is_symlink())
                .collect()
        })
        .unwrap_or_default()
}

/// Kills what a previous node of this name left running (its setup's command line names the
/// node's directory) and removes its cgroups, deepest first, once their processes are gone.
async fn remove_leftovers(layout: &Layout) {
    let marker = layout.dir.to_string_lossy().into_owned();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.filter_map(Result::ok) {
            let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse::<i32>().ok()) else {
                continue;
            };
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline);
            let ours = cmdline.starts_with("setpriv") || cmdline.starts_with("unshare");
            if ours && cmdline.contains(&marker) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
    let root = layout.cgroup_root();
    let started = Instant::now();
    loop {
        let mut left = 0;
        for hierarchy in cgroup_hierarchies() {
            left += remove_cgroup(&hierarchy.join(root.trim_start_matches('/')));
        }
        if left == 0 || started.elapsed() > Duration::from_secs(10) {
            if left > 0 {
                tracing::warn!(node = %layout.name, left, "cgroups of a stopped real node are still busy");
            }
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Removes a cgroup directory and those below it (a cgroup's files cannot be unlinked; only its
/// directories removed); returns how many remain.
fn remove_cgroup(path: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(path) else {
        return 0;
    };
    let below: usize = entries
        .filter_map(Result::ok)
        .filter(|entry| entry.file_type().is_ok_and(|t| t.is_dir()))
        .map(|entry| remove_cgroup(&entry.path()))
        .sum();
    below + usize::from(std::fs::remove_dir(path).is_err())
}

/// The API server's port on the host's loopback.
fn api_port(server_url: &str) -> u16 {
    server_url
        .rsplit(':')
        .next()
        .and_then(|port| port.trim_end_matches('/').parse().ok())
        .unwrap_or(443)
}

/// A listener at `10.0.0.1:443` in the network namespace of process `pid`, opened by a thread
/// that entered it (a socket stays in the namespace it was made in).
fn listen_in_namespace(pid: u32) -> std::io::Result<tokio::net::TcpListener> {
    let namespace = std::fs::File::open(format!("/proc/{pid}/ns/net"))?;
    let listener = std::thread::spawn(move || {
        nix::sched::setns(&namespace, nix::sched::CloneFlags::CLONE_NEWNET).map_err(std::io::Error::from)?;
        std::net::TcpListener::bind((config::API_ADDRESS, 443))
    })
    .join()
    .map_err(|_| std::io::Error::other("the namespace thread panicked"))??;
    listener.set_nonblocking(true)?;
    tokio::net::TcpListener::from_std(listener)
}

/// Forwards each connection the node makes to the API server's loopback port on the host.
async fn forward(listener: tokio::net::TcpListener, port: u16) {
    loop {
        let Ok((mut inside, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        tokio::spawn(async move {
            if let Ok(mut server) = TcpStream::connect(("127.0.0.1", port)).await {
                let _ = tokio::io::copy_bidirectional(&mut inside, &mut server).await;
            }
        });
    }
}

/// The pause image: the static binary built from the Kubernetes module's `pause.c`.
fn pause_image(pause: &Path) -> Result<image::Image, StartRealNodeError> {
    let content = std::fs::read(pause).map_err(io(format!("reading {}", pause.display())))?;
    Ok(image::Image {
        reference: config::PAUSE_IMAGE.to_owned(),
        files: vec![image::File {
            path: "pause".into(),
            content,
            mode: 0o755,
        }],
        entrypoint: vec!["/pause".into()],
        cmd: Vec::new(),
        env: Vec::new(),
        exposed: Vec::new(),
        user: "65535:65535".into(),
    })
}
