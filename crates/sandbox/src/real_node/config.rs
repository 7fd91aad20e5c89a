//! What a real node runs with (issue 43, `docs/plans/real-node.md` S3): the files its containerd,
//! kubelet and CNI plugins read, and the script that sets up its namespaces before starting them.
//! Pure: each is built from the node's [`Layout`] and tested from its text.
//!
//! A node lives in namespaces of its own (mount, network, PID, UTS): its state directories are
//! tmpfs mounts there, its addresses (the node's, its pods' bridge, and the API server's
//! `10.0.0.1`) exist only in its network namespace, and the four kernel settings a kubelet insists
//! on are files bound over `/proc/sys` in its mount namespace, so the host's are never written.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use gpu_remediation_api::constants::GPU_PRESENT_LABEL;

/// The address the node reaches the API server at, inside its network namespace: the first
/// address of the service range, which the API server's serving certificate names (`pki`), and
/// which every pod's `KUBERNETES_SERVICE_HOST` names too.
pub const API_ADDRESS: &str = "10.0.0.1";

/// Where a node's driver root (`RealNode::driver_root`, a directory on the host) appears inside
/// the node: where the NVIDIA GPU Operator's containerised driver puts it, so the chart's
/// `agent.hostLibDir` is `/run/nvidia/driver/usr/lib` on every real node, as on such a cluster.
pub const DRIVER_ROOT_IN_NODE: &str = "/run/nvidia/driver";

/// The pause image each pod sandbox runs (pinned in containerd's config, imported by the node).
pub const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10.1";

/// The kernel settings the kubelet checks (and would write when they differ: k8s
/// `pkg/kubelet/cm/container_manager_linux.go`, `setupKernelTunables`), with the values it wants.
pub const KERNEL_TUNABLES: [(&str, &str); 4] = [
    ("vm/overcommit_memory", "1"),
    ("vm/panic_on_oom", "0"),
    ("kernel/panic", "10"),
    ("kernel/panic_on_oops", "1"),
];

/// Where one real node keeps its files, and the addresses it takes.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The node's name (its hostname, and the Node it registers).
    pub name: String,
    /// 1 to 254: the node's address is `198.18.0.<index>`, its pods' `198.18.<index>.0/24`.
    pub index: u8,
    /// Its directory on the host: configuration, credentials and logs.
    pub dir: PathBuf,
    /// The labels its kubelet registers it with (`--node-labels`).
    pub labels: BTreeMap<String, String>,
}

/// What a real node runs: binaries built from pinned modules (`tools/build.sh`,
/// `e2e/controlplane/build.sh --kubelet`).
#[derive(Debug, Clone)]
pub struct Binaries {
    /// `kubelet`.
    pub kubelet: PathBuf,
    /// The directory holding `containerd`, `containerd-shim-runc-v2` and `ctr`.
    pub containerd_dir: PathBuf,
    /// `runc`.
    pub runc: PathBuf,
    /// The directory holding the CNI plugins `bridge`, `host-local` and `loopback`.
    pub cni_dir: PathBuf,
    /// The static `pause` binary (its image is built on the node's start).
    pub pause: PathBuf,
}

impl Layout {
    /// The node's own address.
    #[must_use]
    pub fn node_address(&self) -> String {
        format!("198.18.0.{}", self.index)
    }

    /// Its pods' subnet.
    #[must_use]
    pub fn pod_subnet(&self) -> String {
        format!("198.18.{}.0/24", self.index)
    }

    /// Its cgroup under every hierarchy (cgroup v1: `cgroupfs`, one tree per controller).
    #[must_use]
    pub fn cgroup_root(&self) -> String {
        format!("/gpu-sandbox-{}", self.name)
    }

    /// `dir`/`name`.
    #[must_use]
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// A node with GPUs: labelled [`GPU_PRESENT_LABEL`]` = true`, as GPU feature discovery would.
    #[must_use]
    pub fn with_gpus(mut self) -> Self {
        self.labels.insert(GPU_PRESENT_LABEL.into(), "true".into());
        self
    }

    /// Its labels as the kubelet's `--node-labels` takes them (`key=value,...`; empty: none).
    #[must_use]
    pub fn node_labels(&self) -> String {
        self.labels
            .iter()
            .map(|(key, value)| format!("{key}={value}"))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// containerd's configuration (version 3): state under the node's own `/var/lib` and `/run`, the
/// native snapshotter (no overlay mounts to leak), runc without systemd, and CNI from `conf_dir`
/// in the node's directory. `restrict_oom_score_adj`: root here lacks `CAP_SYS_RESOURCE`, so runc
/// may only raise a container's OOM score, never lower it below its own.
#[must_use]
pub fn containerd(layout: &Layout, binaries: &Binaries) -> String {
    format!(
        r#"version = 3
root = "/var/lib/containerd"
state = "/run/containerd"

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "native"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{PAUSE_IMAGE}"

[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      BinaryName = "{runc}"
      SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{cni}"]
    conf_dir = "{conf}"
"#,
        runc = binaries.runc.display(),
        cni = binaries.cni_dir.display(),
        conf = layout.path("cni").display(),
    )
}

/// The CNI network: a bridge that is its pods' gateway (no masquerade: nothing leaves the
/// namespace), addresses from the node's subnet.
#[must_use]
pub fn cni(layout: &Layout) -> String {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "gpu-sandbox",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": true,
                "ipMasq": false,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": layout.pod_subnet()}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "loopback"},
        ],
    })
    .to_string()
}

/// The kubelet's configuration: cgroup v1 allowed (this machine has no v2), cgroups under the
/// node's own root, clients authenticated by the control plane's CA, eviction thresholds low
/// enough that a shared test machine does not evict the node's pods; the pods' logs in the node's
/// directory (`pod-logs`), where a test reads them, not in the host's `/var/log/pods`.
#[must_use]
pub fn kubelet(layout: &Layout, ca: &Path) -> String {
    format!(
        "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: {root}
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}
  x509: {{clientCAFile: {ca}}}
authorization: {{mode: AlwaysAllow}}
failSwapOn: false
resolvConf: /etc/resolv.conf
registerNode: true
serializeImagePulls: false
evictionHard: {{memory.available: 1Mi, nodefs.available: 1%, imagefs.available: 1%}}
podLogsDir: {logs}
",
        root = layout.cgroup_root(),
        logs = layout.path("pod-logs").display(),
        ca = ca.display(),
    )
}

/// The kubelet's kubeconfig: the API server at [`API_ADDRESS`], the node's own certificate.
#[must_use]
pub fn kubeconfig(ca: &Path, cert: &Path, key: &Path) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: sandbox
  cluster: {{server: \"https://{API_ADDRESS}:443\", certificate-authority: {ca}}}
users:
- name: node
  user: {{client-certificate: {cert}, client-key: {key}}}
contexts:
- name: node
  context: {{cluster: sandbox, user: node}}
current-context: node
",
        ca = ca.display(),
        cert = cert.display(),
        key = key.display(),
    )
}

/// The script run as the node's first process, inside its new namespaces (`unshare`, which has
/// mounted the namespace's own `/proc`): it mounts the node's state directories and kernel
/// settings (containerd's on a file system of its own: the native snapshotter unpacks an image
/// through bind mounts of its directories, and a bind mount of the kubelet's file system seen by
/// the kubelet's start, while an image is imported, makes it fail with "failed to get rootfs
/// info: cannot find filesystem info for device .../tmpmounts/containerd-mount..."), raises its
/// network, says so (the file `network-ready`: the sandbox then listens at [`API_ADDRESS`] in this
/// namespace), starts containerd and becomes the kubelet.
/// Arguments: the node's directory, name, address, the containerd directory, the kubelet, and
/// its labels (`Layout::node_labels`: no spaces, so the unquoted expansion is one word or none).
pub const SETUP: &str = r#"set -eu
dir=$1 name=$2 address=$3 containerd_dir=$4 kubelet=$5 labels=$6
hostname "$name"
mount -t tmpfs tmpfs /var/lib
mkdir -p /var/lib/kubelet /var/lib/containerd /var/lib/cni
mount -t tmpfs tmpfs /var/lib/containerd
mount -t tmpfs tmpfs /run
mkdir -p /run/containerd /run/nvidia/driver
mount --bind "$dir/driver-root" /run/nvidia/driver
mount -t tmpfs tmpfs /opt
mount -t tmpfs tmpfs /var/log
for tunable in vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops; do
  mount --bind "$dir/proc-sys/${tunable#*/}" "/proc/sys/$tunable"
done
ip link set lo up
ip link add node0 type bridge
ip link set node0 up
ip addr add "$address/32" dev node0
ip addr add 10.0.0.1/32 dev node0
ip route add default dev node0
touch "$dir/network-ready"
PATH="$containerd_dir:$PATH" containerd --config "$dir/containerd.toml" > "$dir/logs/containerd.log" 2>&1 &
exec "$kubelet" --config "$dir/kubelet.yaml" --kubeconfig "$dir/kubeconfig" --node-ip "$address" \
  --hostname-override "$name" --root-dir /var/lib/kubelet ${labels:+--node-labels=$labels} --v 2 \
  > "$dir/logs/kubelet.log" 2>&1
"#;

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> Layout {
        Layout {
            name: "real-1".into(),
            index: 7,
            dir: "/tmp/nodes/real-1".into(),
            labels: BTreeMap::new(),
        }
    }

    fn binaries() -> Binaries {
        Binaries {
            kubelet: "/cache/kubelet".into(),
            containerd_dir: "/cache/containerd".into(),
            runc: "/cache/runc/runc".into(),
            cni_dir: "/cache/cni".into(),
            pause: "/cache/pause".into(),
        }
    }

    #[test]
    fn the_kubelet_config_is_yaml_with_the_nodes_cgroup_root_and_the_control_planes_ca() {
        let config: serde_json::Value =
            serde_yaml::from_str(&kubelet(&layout(), Path::new("/cp/pki/ca.crt"))).unwrap();
        assert_eq!(config["kind"], "KubeletConfiguration");
        assert_eq!(config["failCgroupV1"], false);
        assert_eq!(config["cgroupRoot"], "/gpu-sandbox-real-1");
        assert_eq!(config["authentication"]["x509"]["clientCAFile"], "/cp/pki/ca.crt");
        assert_eq!(config["authentication"]["anonymous"]["enabled"], false);
        assert_eq!(config["evictionHard"]["memory.available"], "1Mi");
        assert_eq!(config["podLogsDir"], "/tmp/nodes/real-1/pod-logs");
    }

    #[test]
    fn the_kubeconfig_names_the_api_address_inside_the_namespace_and_the_nodes_certificate() {
        let config: serde_json::Value = serde_yaml::from_str(&kubeconfig(
            Path::new("/cp/ca.crt"),
            Path::new("/n/node.crt"),
            Path::new("/n/node.key"),
        ))
        .unwrap();
        assert_eq!(config["clusters"][0]["cluster"]["server"], "https://10.0.0.1:443");
        assert_eq!(config["users"][0]["user"]["client-certificate"], "/n/node.crt");
        assert_eq!(config["users"][0]["user"]["client-key"], "/n/node.key");
    }

    #[test]
    fn the_cni_network_gives_pods_the_nodes_subnet_without_masquerade() {
        let network: serde_json::Value = serde_json::from_str(&cni(&layout())).unwrap();
        let bridge = &network["plugins"][0];
        assert_eq!(bridge["type"], "bridge");
        assert_eq!(bridge["ipMasq"], false);
        assert_eq!(bridge["ipam"]["ranges"][0][0]["subnet"], "198.18.7.0/24");
    }

    #[test]
    fn containerd_runs_the_built_runc_and_reads_cni_from_the_nodes_directory() {
        let config = containerd(&layout(), &binaries());
        assert!(config.starts_with("version = 3\n"), "{config}");
        for line in [
            r#"BinaryName = "/cache/runc/runc""#,
            "SystemdCgroup = false",
            "restrict_oom_score_adj = true",
            r#"bin_dirs = ["/cache/cni"]"#,
            r#"conf_dir = "/tmp/nodes/real-1/cni""#,
            r#"sandbox = "registry.k8s.io/pause:3.10.1""#,
        ] {
            assert!(config.lines().any(|l| l.trim() == line), "{line} in {config}");
        }
    }

    #[test]
    fn the_setup_binds_every_tunable_the_kubelet_checks_and_writes_none() {
        for (tunable, _) in KERNEL_TUNABLES {
            assert!(SETUP.contains(tunable), "{tunable}");
        }
        assert!(!SETUP.contains("sysctl"), "no host setting is written");
        // The kubelet's links to container logs (`/var/log/containers`, not configurable) stay in
        // the node's mount namespace.
        assert!(SETUP.contains("mount -t tmpfs tmpfs /var/log\n"));
        assert!(SETUP.contains(&format!("{API_ADDRESS}/32")));
        // containerd's state on a file system apart from the kubelet's: an image imported while the
        // kubelet starts must not show it a bind mount of its own file system (seen in CI).
        let containerd = SETUP
            .find("mount -t tmpfs tmpfs /var/lib/containerd\n")
            .expect("its own");
        assert!(containerd > SETUP.find("mount -t tmpfs tmpfs /var/lib\n").unwrap());
        assert!(containerd < SETUP.find("containerd --config").unwrap());
    }

    #[test]
    fn a_gpu_node_registers_with_the_gpu_label_and_sees_its_driver_root_where_the_operator_puts_it() {
        assert_eq!(layout().node_labels(), "");
        let gpu = layout().with_gpus();
        assert_eq!(gpu.node_labels(), "nvidia.com/gpu.present=true");
        let mut labelled = gpu;
        labelled
            .labels
            .insert("nvidia.com/gpu.product".into(), "NVIDIA-H100-80GB-HBM3".into());
        assert_eq!(
            labelled.node_labels(),
            "nvidia.com/gpu.present=true,nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3"
        );
        assert!(SETUP.contains("${labels:+--node-labels=$labels}"));
        assert!(SETUP.contains(&format!(
            "mount --bind \"$dir/driver-root\" {DRIVER_ROOT_IN_NODE}\n"
        )));
    }
}
