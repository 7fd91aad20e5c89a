//! NVIDIA's device plugin itself against the stand-in (docs/plans/real-node.md §6, S2's smoke): the
//! upstream binary that `tools/build.sh nvidia-device-plugin` builds from its pinned module, run
//! with no kubelet (`--kubelet-socket ""`: it serves its socket but registers nowhere) and a driver
//! root holding the stand-in as `libnvidia-ml.so.1` with a `scenario.json` beside it, as a real GPU
//! node will give it. The scenario's XID 79 on GPU 1 must reach the plugin's health check, which
//! logs that it marks that device unhealthy; and no NVML function the plugin calls on the way may
//! be missing (go-nvml binds lazily: a missing one kills the plugin with `symbol lookup error`).
//!
//! `#[ignore]`d: it needs the built plugin, whose path `GPU_REMEDIATOR_DEVICE_PLUGIN` gives, root
//! and `unshare` (the plugin's socket directory is hard-coded to /var/lib/kubelet/device-plugins,
//! so it runs in a mount namespace of its own with a tmpfs on /var/lib). `make real-node-smoke`
//! builds the plugin and runs it.

use std::{
    fs::File,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

#[path = "support/built.rs"]
mod support;

/// The variable naming the built `nvidia-device-plugin`.
const PLUGIN_VARIABLE: &str = "GPU_REMEDIATOR_DEVICE_PLUGIN";

/// Two GPUs; one XID 79 (fallen off the bus) on the second.
const SCENARIO: &str = r#"{"gpus": [
    {"index": 0, "uuid": "GPU-11111111-0000-0000-0000-000000000000", "pciBusId": "00000000:18:00.0",
     "name": "NVIDIA H100 80GB HBM3"},
    {"index": 1, "uuid": "GPU-11111111-0000-0000-0000-000000000001", "pciBusId": "00000000:2A:00.0",
     "name": "NVIDIA H100 80GB HBM3"}],
  "xidEvents": [{"xid": 79, "gpuUuid": "GPU-11111111-0000-0000-0000-000000000001"}]}"#;

/// What the plugin's health check logs for it (internal/rm/health.go).
const MARKED: &str = "XidCriticalError: Xid=79 on Device=GPU-11111111-0000-0000-0000-000000000001; \
                      marking device as unhealthy.";

/// How long the plugin may take to start and see the XID (its event wait polls every 5 s).
const DEADLINE: Duration = Duration::from_secs(60);

/// The running plugin, killed when dropped; its directory removed.
struct Plugin {
    child: Child,
    dir: PathBuf,
}

impl Plugin {
    fn start(binary: &Path) -> Self {
        let dir = std::env::temp_dir().join(format!("device-plugin-smoke-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        // Where the plugin looks for the library under its driver root (cmd/nvidia-device-plugin/root.go).
        let lib_dir = dir.join("driver/usr/lib/x86_64-linux-gnu");
        std::fs::create_dir_all(&lib_dir).unwrap();
        std::fs::copy(support::standin_library(), lib_dir.join("libnvidia-ml.so.1")).unwrap();
        std::fs::write(lib_dir.join("scenario.json"), SCENARIO).unwrap();
        let log = File::create(dir.join("plugin.log")).unwrap();
        let child = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg("mount -t tmpfs tmpfs /var/lib && mkdir -p /var/lib/kubelet/device-plugins && exec \"$@\"")
            .arg("sh")
            .arg(binary)
            .args(["--kubelet-socket", "", "--container-driver-root"])
            .arg(dir.join("driver"))
            // Its platform check (go-nvlib, `auto` discovery) dlopens `libnvidia-ml.so.1` by name,
            // which NVIDIA's container toolkit makes resolve on a GPU node; the loader's path here.
            .env("LD_LIBRARY_PATH", &lib_dir)
            // With no kubelet socket the plugin watches the directory of "" (the working one).
            .current_dir(&dir)
            .env_remove("GPU_STANDIN_SCENARIO")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting the device plugin under unshare");
        Self { child, dir }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("plugin.log")).unwrap_or_default()
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
#[ignore = "needs the built device plugin (GPU_REMEDIATOR_DEVICE_PLUGIN), root and unshare: make real-node-smoke"]
fn the_device_plugin_marks_the_gpu_of_an_xid_79_unhealthy() {
    let binary = std::env::var_os(PLUGIN_VARIABLE).map_or_else(
        || {
            panic!(
                "{PLUGIN_VARIABLE} must name the built nvidia-device-plugin (make real-node-smoke sets it)"
            )
        },
        PathBuf::from,
    );
    assert!(
        binary.is_file(),
        "{PLUGIN_VARIABLE}={} is no file",
        binary.display()
    );
    let mut plugin = Plugin::start(&binary);
    let started = Instant::now();
    let exited = loop {
        if plugin.log().contains(MARKED) {
            break None;
        }
        if let Some(status) = plugin.child.try_wait().unwrap() {
            break Some(status);
        }
        assert!(
            started.elapsed() < DEADLINE,
            "no `{MARKED}` within {DEADLINE:?}; the plugin's log:\n{}",
            plugin.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let log = plugin.log();
    assert!(
        exited.is_none(),
        "the plugin exited ({exited:?}); its log:\n{log}"
    );
    for line in log.lines().filter(|line| {
        [
            "Starting to serve",
            "Skipping registration",
            "Ignoring the following XIDs",
            "XidCriticalError",
        ]
        .iter()
        .any(|wanted| line.contains(wanted))
    }) {
        println!("{line}");
    }
    for broken in [
        "symbol lookup error",
        "undefined symbol",
        "Failed to start health check",
    ] {
        assert!(!log.contains(broken), "`{broken}` in the plugin's log:\n{log}");
    }
    assert!(
        !log.contains("device marked unhealthy: GPU-11111111-0000-0000-0000-000000000000")
            && !log.contains("Xid=79 on Device=GPU-11111111-0000-0000-0000-000000000000"),
        "GPU 0 is healthy; the plugin's log:\n{log}"
    );
}
