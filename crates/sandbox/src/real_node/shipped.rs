//! Our two images on real nodes, as a user runs them (issue 43, `docs/plans/real-node.md` S6):
//! each built from its Dockerfile around the binary `make` built ([`Shipped::image_tar`]), and the
//! Helm values a user of such a cluster would set for them ([`chart_values`]): the images by name
//! at the tag [`TAG`], pulled only when absent (each node's containerd has them imported, and there
//! is no registry), and the agent's host library directory where the NVIDIA GPU Operator's driver
//! root puts it ([`super::config::DRIVER_ROOT_IN_NODE`]).

use std::path::{Path, PathBuf};

use super::{
    built_image::{self, BuildImageError},
    config::DRIVER_ROOT_IN_NODE,
    image,
};

/// The tag the images built here carry.
pub const TAG: &str = "sandbox";

/// One of our images: its Dockerfile, where its `COPY` finds the binary for amd64, its repository
/// (the chart's `image.repository`), and the environment variable naming the built binary (`make
/// real-node-test` sets it).
#[derive(Debug, Clone, Copy)]
pub struct Shipped {
    /// The Dockerfile's text.
    pub dockerfile: &'static str,
    /// The binary's path in the build context.
    pub copied_as: &'static str,
    /// The image's repository.
    pub repository: &'static str,
    /// The variable naming the binary to put in it.
    pub binary_env: &'static str,
}

/// The agent's image (`crates/agent/Dockerfile`).
pub const AGENT: Shipped = Shipped {
    dockerfile: include_str!("../../../agent/Dockerfile"),
    copied_as: "amd64/gpu-health-agent",
    repository: "gpu-health-agent",
    binary_env: "GPU_REMEDIATOR_AGENT_BINARY",
};

/// The controller's image (`crates/controller/Dockerfile`).
pub const CONTROLLER: Shipped = Shipped {
    dockerfile: include_str!("../../../controller/Dockerfile"),
    copied_as: "amd64/gpu-remediator",
    repository: "gpu-remediator",
    binary_env: "GPU_REMEDIATOR_CONTROLLER_BINARY",
};

/// Why one of our images could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ShipError {
    /// The build context or the tar could not be written.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The failure.
        source: std::io::Error,
    },
    /// The image could not be built.
    #[error("{reference}: {source}")]
    Build {
        /// The image.
        reference: String,
        /// The failure.
        source: BuildImageError,
    },
}

impl Shipped {
    /// The image's full name, as containerd's CRI names an image the chart calls
    /// `repository:sandbox`.
    #[must_use]
    pub fn reference(&self) -> String {
        format!("docker.io/library/{}:{TAG}", self.repository)
    }

    /// Builds the image around `binary`, in a build context under `dir`, and writes it as an OCI
    /// layout tar there (what `RealNode::import` takes); returns the tar's path.
    ///
    /// # Errors
    /// See [`ShipError`].
    pub fn image_tar(&self, binary: &Path, dir: &Path) -> Result<PathBuf, ShipError> {
        let io = |what: String| move |source| ShipError::Io { what, source };
        let context = dir.join(format!("context-{}", self.repository));
        let copied = context.join(self.copied_as);
        let parent = copied.parent().unwrap_or(&context);
        std::fs::create_dir_all(parent).map_err(io(format!("creating {}", parent.display())))?;
        std::fs::copy(binary, &copied).map_err(io(format!("copying {}", binary.display())))?;
        let image = built_image::from_dockerfile(self.dockerfile, "amd64", &context, &self.reference())
            .map_err(|source| ShipError::Build {
                reference: self.reference(),
                source,
            })?;
        let tar = dir.join(format!("{}.tar", self.repository));
        let bytes =
            image::layout_tar(&image).map_err(io(format!("writing {}'s layout", self.reference())))?;
        std::fs::write(&tar, bytes).map_err(io(format!("writing {}", tar.display())))?;
        Ok(tar)
    }
}

/// The chart's values for the images built here, on nodes whose driver root is where the GPU
/// Operator puts it: what a user of such a cluster writes in a values file (YAML is a superset of
/// JSON, so `helm install --values` takes this text).
#[must_use]
pub fn chart_values() -> serde_json::Value {
    let image = |shipped: Shipped| serde_json::json!({"repository": shipped.repository, "tag": TAG, "pullPolicy": "IfNotPresent"});
    serde_json::json!({
        "controller": {"image": image(CONTROLLER)},
        "agent": {"image": image(AGENT), "hostLibDir": format!("{DRIVER_ROOT_IN_NODE}/usr/lib")},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_values_name_the_built_images_and_the_operators_driver_root() {
        let values = chart_values();
        for (component, shipped) in [("controller", CONTROLLER), ("agent", AGENT)] {
            let image = &values[component]["image"];
            let named = format!(
                "docker.io/library/{}:{}",
                image["repository"].as_str().unwrap(),
                image["tag"].as_str().unwrap()
            );
            assert_eq!(named, shipped.reference());
            assert_eq!(image["pullPolicy"], "IfNotPresent", "imported, never pulled");
        }
        assert_eq!(values["agent"]["hostLibDir"], "/run/nvidia/driver/usr/lib");
    }

    #[test]
    fn each_image_builds_from_its_dockerfile_with_the_binary_where_its_copy_looks() {
        let dir = std::env::temp_dir().join(format!("shipped-{}", std::process::id()));
        for shipped in [AGENT, CONTROLLER] {
            let tar = shipped
                .image_tar(Path::new("/bin/true"), &dir)
                .unwrap_or_else(|error| panic!("{error}"));
            let size = std::fs::metadata(&tar).unwrap().len();
            assert!(size > 10_000, "{}: a {size}-byte tar", tar.display());
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A runtime makes the termination message's mountpoint inside the container; under a
    /// read-only `/dev` it cannot, and the container never starts (found on a real node). The
    /// chart renders the same `DaemonSet` (`make chart-test`).
    #[test]
    fn no_container_keeps_its_termination_message_on_a_read_only_dev() {
        let daemonset: serde_json::Value =
            serde_yaml::from_str(include_str!("../../../../manifests/agent/daemonset.yaml")).unwrap();
        for container in daemonset["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
        {
            let dev_read_only = container["volumeMounts"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|mount| mount["mountPath"] == "/dev" && mount["readOnly"] == true);
            let message = container["terminationMessagePath"]
                .as_str()
                .unwrap_or("/dev/termination-log");
            assert!(
                !dev_read_only || !message.starts_with("/dev/"),
                "{}: its termination message at {message}, under a read-only /dev",
                container["name"]
            );
        }
    }

    /// As UID 65532 the agent gets no effective capabilities (Kubernetes sets no ambient ones),
    /// and reads neither `/dev/kmsg` under `kernel.dmesg_restrict=1` nor the kubelet's root-only
    /// pod-resources socket (found on a real node).
    #[test]
    fn the_agent_runs_as_root_to_read_the_kernel_log_and_the_pod_resources_socket() {
        let daemonset: serde_json::Value =
            serde_yaml::from_str(include_str!("../../../../manifests/agent/daemonset.yaml")).unwrap();
        let container = &daemonset["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(container["name"], "gpu-health-agent");
        assert_eq!(container["securityContext"]["runAsUser"], 0);
        assert_eq!(container["securityContext"]["runAsNonRoot"], false);
    }
}
