//! Faults of the control plane itself, for the fault suite and the benchmarks: pausing a component
//! (`SIGSTOP`/`SIGCONT`, e.g. etcd freezing) and killing one with `SIGKILL` and starting it again
//! on the same port, certificates and data (e.g. an API server restart).
//!
//! A restarted component is started from the command line the kernel recorded for the old process
//! (`/proc/<pid>/cmdline`), so it comes back exactly as `ControlPlane::start` made it, and it keeps
//! its place in the stop order.

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use super::start_error::StartControlPlaneError;
use super::{ControlPlane, process::OwnedProcess};

/// Failure to signal a component.
#[derive(Debug, thiserror::Error)]
pub enum SignalComponentError {
    /// No running component has this name.
    #[error("no running component named {0}")]
    Unknown(String),
    /// `kill` could not be run or refused.
    #[error("sending {signal} to {name} (pid {pid}): {detail}")]
    Kill {
        /// The signal.
        signal: &'static str,
        /// The component.
        name: String,
        /// Its pid.
        pid: u32,
        /// What went wrong.
        detail: String,
    },
}

/// Failure to restart a component.
#[derive(Debug, thiserror::Error)]
pub enum RestartComponentError {
    /// It could not be killed.
    #[error(transparent)]
    Signal(#[from] SignalComponentError),
    /// Its command line could not be read.
    #[error("reading the command line of {name} (pid {pid}): {source}")]
    CommandLine {
        /// The component.
        name: String,
        /// Its pid.
        pid: u32,
        /// The IO error.
        source: std::io::Error,
    },
    /// The new process could not be started.
    #[error(transparent)]
    Spawn(#[from] super::SpawnComponentError),
    /// The new process did not become ready.
    #[error(transparent)]
    NotReady(#[from] StartControlPlaneError),
}

/// Each component's binary and arguments, by name (see [`ControlPlane::command_lines`]).
#[derive(Debug, Clone)]
pub struct CommandLines(Vec<(String, (String, Vec<String>))>);

/// The binary and arguments of process `pid` (component `name`) as the kernel recorded them.
fn read_command_line(name: &str, pid: u32) -> Result<(String, Vec<String>), RestartComponentError> {
    let command_line = std::fs::read(format!("/proc/{pid}/cmdline")).map_err(|source| {
        RestartComponentError::CommandLine {
            name: name.to_owned(),
            pid,
            source,
        }
    })?;
    let mut words = command_line
        .split(|b| *b == 0)
        .filter(|w| !w.is_empty())
        .map(|w| String::from_utf8_lossy(w).into_owned());
    let binary = words.next().ok_or_else(|| RestartComponentError::CommandLine {
        name: name.to_owned(),
        pid,
        source: std::io::Error::other("empty command line (the process has exited)"),
    })?;
    Ok((binary, words.collect()))
}

impl ControlPlane {
    /// Freezes component `name` (`SIGSTOP`): it holds its connections open and answers nothing,
    /// as a hung etcd does. Undo with [`ControlPlane::resume`].
    pub fn pause(&self, name: &str) -> Result<(), SignalComponentError> {
        self.signal(name, "STOP")
    }

    /// Lets a paused component run again (`SIGCONT`).
    pub fn resume(&self, name: &str) -> Result<(), SignalComponentError> {
        self.signal(name, "CONT")
    }

    /// Kills component `name` with `SIGKILL`, waits `down_for`, starts it again with the same
    /// command line and, for the API server, waits until it answers `/readyz` again.
    pub async fn restart(&mut self, name: &str, down_for: Duration) -> Result<(), RestartComponentError> {
        let index = self
            .processes
            .iter()
            .position(|p| p.name() == name)
            .ok_or_else(|| SignalComponentError::Unknown(name.to_owned()))?;
        let pid = self.processes[index].pid();
        let (binary, args) = read_command_line(name, pid)?;
        self.signal(name, "KILL")?;
        // Already gone: `terminate` only reaps it and closes its watchdog, so the port is free.
        self.processes.remove(index).terminate().await;
        tokio::time::sleep(down_for).await;
        let restarted = self.respawn(name, &binary, &args)?;
        self.processes.insert(index, restarted);
        if name == "kube-apiserver" {
            let started = Instant::now();
            self.wait_apiserver_ready(
                "kube-apiserver /readyz after a restart",
                started + Duration::from_secs(120),
                started,
            )
            .await?;
        }
        Ok(())
    }

    /// The command line of every running component, so that one that exits (kube-controller-manager
    /// and kube-scheduler exit when they lose their leader lease, e.g. while etcd is frozen) can be
    /// started again with [`ControlPlane::respawn_exited`]: once a process has exited, the kernel
    /// no longer knows its command line.
    pub fn command_lines(&self) -> Result<CommandLines, RestartComponentError> {
        self.processes
            .iter()
            .map(|p| Ok((p.name().to_owned(), read_command_line(p.name(), p.pid())?)))
            .collect::<Result<_, _>>()
            .map(CommandLines)
    }

    /// Starts again, from `saved`, every component that has exited, as a kubelet restarts a
    /// crashed static pod; returns their names.
    pub async fn respawn_exited(
        &mut self,
        saved: &CommandLines,
    ) -> Result<Vec<String>, RestartComponentError> {
        let mut restarted = Vec::new();
        for index in 0..self.processes.len() {
            if self.processes[index].exited().is_none() {
                continue;
            }
            let name = self.processes[index].name().to_owned();
            let Some((_, (binary, args))) = saved.0.iter().find(|(n, _)| *n == name) else {
                continue;
            };
            let replacement = self.respawn(&name, binary, args)?;
            // The old one has exited: this only reaps it and closes its watchdog's pipe.
            std::mem::replace(&mut self.processes[index], replacement)
                .terminate()
                .await;
            restarted.push(name);
        }
        Ok(restarted)
    }

    /// Starts `binary args` as component `name`, logging to a file of its own per restart.
    fn respawn(
        &self,
        name: &str,
        binary: &str,
        args: &[String],
    ) -> Result<OwnedProcess, super::SpawnComponentError> {
        static RESTARTS: AtomicU32 = AtomicU32::new(0);
        let n = RESTARTS.fetch_add(1, Ordering::Relaxed);
        let log = self.data_dir.join("logs").join(format!("{name}.restart-{n}.log"));
        OwnedProcess::spawn(name, Path::new(binary), args, &log)
    }

    fn signal(&self, name: &str, signal: &'static str) -> Result<(), SignalComponentError> {
        let process = self
            .processes
            .iter()
            .find(|p| p.name() == name)
            .ok_or_else(|| SignalComponentError::Unknown(name.to_owned()))?;
        let pid = process.pid();
        let error = |detail: String| SignalComponentError::Kill {
            signal,
            name: name.to_owned(),
            pid,
            detail,
        };
        let status = std::process::Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .map_err(|e| error(e.to_string()))?;
        if status.success() {
            Ok(())
        } else {
            Err(error(format!("kill exited with {status}")))
        }
    }
}
