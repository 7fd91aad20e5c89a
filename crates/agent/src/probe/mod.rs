//! Where readings come from. A [`Probe`] reads every GPU once; [`deadline::DeadlineReader`] runs
//! each read on its own thread under a timeout, because a hung NVML must surface as a detector
//! fault instead of freezing the agent.
//!
//! - [`nvml`]: the real GPUs, through NVML loaded at run time (a host without the library or the
//!   driver gets a read error, never a crash).
//! - [`file`]: a JSON file describing GPUs and events, for the sandbox and e2e tests.

pub mod deadline;
pub mod file;
pub mod nvml;

use crate::readings::Snapshot;

/// Reads every GPU of the host once.
pub trait Probe: Send + Sync + 'static {
    /// Short name for logs: `nvml`, `file`.
    fn name(&self) -> &'static str;

    /// One snapshot, including the XID events that arrived since the previous call. An error means
    /// the detector cannot tell (never that a GPU is broken).
    fn read(&self) -> Result<Snapshot, ReadGpusError>;
}

/// Why a probe could not read the GPUs at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadGpusError {
    /// NVML could not be loaded or initialised, or a call every read needs failed.
    #[error("NVML unavailable: {0}")]
    NvmlUnavailable(String),
    /// The probe file could not be read or parsed.
    #[error("probe file {path}: {message}")]
    ProbeFile {
        /// The file.
        path: String,
        /// What went wrong.
        message: String,
    },
    /// The file describes a failing NVML (the sandbox's way to inject a detector fault).
    #[error("NVML unavailable (simulated): {0}")]
    Simulated(String),
    /// The read did not finish within its deadline.
    #[error("NVML read hung for more than {0:?}")]
    Hung(std::time::Duration),
    /// An earlier read is still stuck, so no new one was started.
    #[error("NVML read still hung after {0:?}")]
    StillHung(std::time::Duration),
    /// The reading thread died.
    #[error("probe thread failed: {0}")]
    ThreadFailed(String),
}
