//! How starting the control plane fails: every module of `crate::controlplane` returns it.

use std::path::PathBuf;
use std::time::Duration;

use super::binaries::LocateBinariesError;
use super::pki::CreatePkiError;
use super::process::SpawnComponentError;

/// Failure to start the control plane.
#[derive(Debug, thiserror::Error)]
pub enum StartControlPlaneError {
    /// The binaries were not found or could not be built.
    #[error(transparent)]
    LocateBinaries(#[from] LocateBinariesError),
    /// The data directory could not be prepared.
    #[error("preparing data directory {path}: {source}")]
    DataDir {
        /// The directory or file.
        path: PathBuf,
        /// The IO error.
        source: std::io::Error,
    },
    /// Keys or certificates could not be created.
    #[error(transparent)]
    Pki(#[from] CreatePkiError),
    /// No free port could be reserved.
    #[error("reserving a free port on 127.0.0.1: {0}")]
    Port(std::io::Error),
    /// A component could not be started.
    #[error(transparent)]
    Spawn(#[from] SpawnComponentError),
    /// A component exited while the control plane was starting.
    #[error("{name} exited during start-up ({status}); last log lines:\n{log_tail}")]
    ComponentExited {
        /// The component.
        name: String,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// The end of its log.
        log_tail: String,
    },
    /// A component did not become ready in time.
    #[error("{what} was not ready after {waited:?}: {last_error}")]
    NotReady {
        /// What was waited for.
        what: &'static str,
        /// How long.
        waited: Duration,
        /// The last probe's answer.
        last_error: String,
    },
    /// The admin client could not be built.
    #[error("building the admin client: {0}")]
    Client(#[source] kube::Error),
}
