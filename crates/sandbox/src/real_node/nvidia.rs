//! NVIDIA's side of a real node with GPUs (`docs/plans/real-node.md` S5–S7): the NVML stand-in
//! installed in the node's driver root with the scenario it serves ([`install_standin`],
//! [`Scenario`]), and NVIDIA's device plugin as the `DaemonSet` NVIDIA ships
//! ([`device_plugin_daemonset`]). Builders are pure; the two writers only write files.

use std::path::{Path, PathBuf};

use gpu_remediation_api::constants::GPU_PRESENT_LABEL;
use k8s_openapi::api::apps::v1::DaemonSet;

use super::{DRIVER_LIBRARY_DIR, built_image, image};

/// The image the device plugin runs from (built here, `built_image::of_binary`).
pub const PLUGIN_IMAGE: &str = "nvcr.io/nvidia/k8s-device-plugin:sandbox";

/// What the stand-in reports on one node: H100s with the node's own UUIDs, and the XIDs delivered
/// so far.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Tells this node's GPUs from another's (`GPU-<serial>-0000-0000-0000-00000000000<i>`).
    serial: String,
    gpus: u32,
    xids: Vec<(u32, u32)>,
}

impl Scenario {
    /// `gpus` healthy H100s whose UUIDs carry `serial` (8 hex digits).
    #[must_use]
    pub fn new(serial: &str, gpus: u32) -> Self {
        Self {
            serial: serial.to_owned(),
            gpus,
            xids: Vec::new(),
        }
    }

    /// GPU `index`'s UUID.
    #[must_use]
    pub fn uuid(&self, index: u32) -> String {
        format!("GPU-{}-0000-0000-0000-{index:012}", self.serial)
    }

    /// The same, after an XID `xid` on GPU `index`.
    #[must_use]
    pub fn with_xid(mut self, xid: u32, index: u32) -> Self {
        self.xids.push((xid, index));
        self
    }

    /// The stand-in's `scenario.json`.
    #[must_use]
    pub fn json(&self) -> String {
        let gpus: Vec<_> = (0..self.gpus)
            .map(|index| {
                serde_json::json!({"index": index, "uuid": self.uuid(index),
                    "pciBusId": format!("00000000:{:02X}:00.0", 0x18 + 0x12 * index),
                    "name": "NVIDIA H100 80GB HBM3"})
            })
            .collect();
        let xids: Vec<_> = self
            .xids
            .iter()
            .map(|(xid, index)| serde_json::json!({"xid": xid, "gpuUuid": self.uuid(*index)}))
            .collect();
        serde_json::json!({"gpus": gpus, "xidEvents": xids}).to_string()
    }

    /// Writes this scenario beside the stand-in in `driver_root`, by rename, as the stand-in
    /// expects of its writers.
    ///
    /// # Errors
    /// When a file cannot be written.
    pub fn write(&self, driver_root: &Path) -> std::io::Result<()> {
        let dir = driver_root.join(DRIVER_LIBRARY_DIR);
        let temporary = dir.join("scenario.json.tmp");
        std::fs::write(&temporary, self.json())?;
        std::fs::rename(&temporary, dir.join("scenario.json"))
    }
}

/// Installs the NVML stand-in (`libnvml_standin.so`) as the driver's `libnvidia-ml.so.1` in
/// `driver_root`, serving `scenario`.
///
/// # Errors
/// When a file cannot be written.
pub fn install_standin(standin: &Path, driver_root: &Path, scenario: &Scenario) -> std::io::Result<()> {
    std::fs::copy(
        standin,
        driver_root.join(DRIVER_LIBRARY_DIR).join("libnvidia-ml.so.1"),
    )?;
    scenario.write(driver_root)
}

/// NVIDIA's device plugin's image (`plugin`, the binary built from its pinned module), as an OCI
/// layout tar under `dir`: on the stand-in base, with what the stand-in (`standin`) links, as
/// NVIDIA's image holds what its driver's NVML links. Returns the tar's path.
///
/// # Errors
/// When the image cannot be built or written.
pub fn plugin_image_tar(plugin: &Path, standin: &Path, dir: &Path) -> std::io::Result<PathBuf> {
    let image = built_image::of_binary(
        plugin,
        "/usr/bin/nvidia-device-plugin",
        PLUGIN_IMAGE,
        &[],
        &[standin],
    )
    .map_err(std::io::Error::other)?;
    let tar = dir.join("device-plugin.tar");
    std::fs::write(&tar, image::layout_tar(&image)?)?;
    Ok(tar)
}

/// NVIDIA's static `DaemonSet` (`deployments/static/nvidia-device-plugin.yml` of the pinned
/// release), with the driver root its Helm chart mounts (`driver_root`, a path as the node sees
/// it), on the nodes its Helm chart selects (labelled `nvidia.com/gpu.present=true`), and the
/// loader's path the container toolkit would give its `libnvidia-ml.so.1` lookup by name.
///
/// # Panics
/// Never: the object is a literal.
#[must_use]
pub fn device_plugin_daemonset(driver_root: &Path) -> DaemonSet {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "nvidia-device-plugin-daemonset", "namespace": "kube-system"},
        "spec": {
            "selector": {"matchLabels": {"name": "nvidia-device-plugin-ds"}},
            "template": {
                "metadata": {"labels": {"name": "nvidia-device-plugin-ds"}},
                "spec": {
                    "nodeSelector": {GPU_PRESENT_LABEL: "true"},
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                    "priorityClassName": "system-node-critical",
                    "containers": [{
                        "name": "nvidia-device-plugin-ctr",
                        "image": PLUGIN_IMAGE,
                        "imagePullPolicy": "Never",
                        "env": [
                            {"name": "FAIL_ON_INIT_ERROR", "value": "false"},
                            {"name": "LD_LIBRARY_PATH", "value": format!("/driver-root/{DRIVER_LIBRARY_DIR}")},
                        ],
                        "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}},
                        "volumeMounts": [
                            {"name": "kubelet-device-plugins-dir", "mountPath": "/var/lib/kubelet/device-plugins"},
                            {"name": "driver-root", "mountPath": "/driver-root", "readOnly": true},
                        ],
                    }],
                    "volumes": [
                        {"name": "kubelet-device-plugins-dir",
                         "hostPath": {"path": "/var/lib/kubelet/device-plugins", "type": "Directory"}},
                        {"name": "driver-root", "hostPath": {"path": driver_root, "type": "Directory"}},
                    ],
                },
            },
        },
    }))
    .expect("a literal DaemonSet")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scenario_names_each_gpu_by_the_nodes_serial_and_delivers_xids_by_uuid() {
        let scenario = Scenario::new("22222222", 2).with_xid(79, 1);
        let json: serde_json::Value = serde_json::from_str(&scenario.json()).unwrap();
        assert_eq!(
            json["gpus"][0]["uuid"],
            "GPU-22222222-0000-0000-0000-000000000000"
        );
        assert_eq!(
            json["gpus"][1]["uuid"],
            "GPU-22222222-0000-0000-0000-000000000001"
        );
        assert_eq!(json["gpus"][0]["pciBusId"], "00000000:18:00.0");
        assert_eq!(json["gpus"][1]["pciBusId"], "00000000:2A:00.0");
        assert_eq!(json["xidEvents"][0]["xid"], 79);
        assert_eq!(json["xidEvents"][0]["gpuUuid"], scenario.uuid(1));
    }

    #[test]
    fn the_plugin_mounts_the_driver_root_read_only_and_the_kubelets_socket_directory() {
        let daemonset =
            serde_json::to_value(device_plugin_daemonset(Path::new("/run/nvidia/driver"))).unwrap();
        let pod = &daemonset["spec"]["template"]["spec"];
        assert_eq!(pod["volumes"][1]["hostPath"]["path"], "/run/nvidia/driver");
        assert_eq!(pod["containers"][0]["volumeMounts"][1]["readOnly"], true);
        assert_eq!(pod["containers"][0]["image"], PLUGIN_IMAGE);
        assert_eq!(pod["nodeSelector"][GPU_PRESENT_LABEL], "true", "GPU nodes only");
    }
}
