//! Finding the control plane binaries: an explicit directory, env `GPU_REMEDIATOR_CONTROLPLANE`
//! (set by the Makefile), or `e2e/controlplane/build.sh`, which builds them once into a cache.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The environment variable naming the binary directory.
pub const BIN_DIR_ENV: &str = "GPU_REMEDIATOR_CONTROLPLANE";

/// Every binary the sandbox needs.
pub const BINARIES: &[&str] = &[
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
];

/// Failure to find the control plane binaries.
#[derive(Debug, thiserror::Error)]
pub enum LocateBinariesError {
    /// A binary is missing from the directory.
    #[error("{binary} not found in {dir} (run `make controlplane`)")]
    Missing {
        /// The directory.
        dir: PathBuf,
        /// The missing binary.
        binary: &'static str,
    },
    /// `kube-apiserver --version` could not be run or did not name a release.
    #[error("{binary} --version: {message}")]
    Version {
        /// The binary.
        binary: PathBuf,
        /// What went wrong, or what it printed.
        message: String,
    },
    /// The build script could not be run or failed.
    #[error("running {script}: {message}")]
    Build {
        /// The script.
        script: PathBuf,
        /// What went wrong.
        message: String,
    },
}

/// Checks that `dir` holds every binary.
pub fn check(dir: &Path) -> Result<PathBuf, LocateBinariesError> {
    for &binary in BINARIES {
        if !dir.join(binary).is_file() {
            return Err(LocateBinariesError::Missing {
                dir: dir.to_owned(),
                binary,
            });
        }
    }
    Ok(dir.to_owned())
}

/// A Kubernetes release, as its binaries print it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    /// `v1.37.2`.
    pub name: String,
    /// `37`.
    pub minor: u32,
}

/// The release of the binaries in `dir`: `kube-apiserver --version` prints `Kubernetes v1.37.2`
/// (the build sets the release, see `e2e/controlplane/build.sh`).
pub fn release(dir: &Path) -> Result<Release, LocateBinariesError> {
    let binary = dir.join("kube-apiserver");
    let failed = |message: String| LocateBinariesError::Version {
        binary: binary.clone(),
        message,
    };
    let output = Command::new(&binary)
        .arg("--version")
        .output()
        .map_err(|e| failed(e.to_string()))?;
    let printed = String::from_utf8_lossy(&output.stdout);
    release_of(&printed).ok_or_else(|| failed(format!("no release in {:?}", printed.trim())))
}

/// The release in a `--version` line (`Kubernetes v1.37.2` → v1.37.2, minor 37).
fn release_of(printed: &str) -> Option<Release> {
    let name = printed.split_whitespace().find(|word| word.starts_with("v1."))?;
    let minor = name.strip_prefix("v1.")?.split('.').next()?.parse().ok()?;
    Some(Release {
        name: name.to_owned(),
        minor,
    })
}

/// The directory from the environment, or from the build script.
pub fn locate() -> Result<PathBuf, LocateBinariesError> {
    if let Some(dir) = std::env::var_os(BIN_DIR_ENV).filter(|d| !d.is_empty()) {
        return check(Path::new(&dir));
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../e2e/controlplane/build.sh");
    let output = Command::new(&script)
        .output()
        .map_err(|e| LocateBinariesError::Build {
            script: script.clone(),
            message: e.to_string(),
        })?;
    if !output.status.success() {
        return Err(LocateBinariesError::Build {
            script,
            message: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let dir = stdout.lines().last().unwrap_or_default().trim();
    check(Path::new(dir))
}

#[cfg(test)]
mod tests {
    use super::{Release, release_of};

    #[test]
    fn the_release_and_its_minor_are_read_from_the_version_line() {
        let release = |name: &str, minor| {
            Some(Release {
                name: name.to_owned(),
                minor,
            })
        };
        assert_eq!(release_of("Kubernetes v1.37.2\n"), release("v1.37.2", 37));
        assert_eq!(release_of("Kubernetes v1.35.4"), release("v1.35.4", 35));
        assert_eq!(release_of("Kubernetes v0.0.0-master+$Format:%H$"), None);
    }
}
