//! One control plane component as a child process that cannot outlive its owner.
//!
//! Statics are never dropped when a test binary exits, and a panicking or killed test never runs
//! `stop`, so cleanup cannot rely on Rust code running. Instead each component is started by a tiny
//! bash prologue that forks a watchdog and then `exec`s the component in its own place (so the
//! child pid *is* the component). The watchdog blocks on a pipe whose only write end lives in
//! this process: when the owner closes it (an orderly `stop`) or dies in any way (exit, panic,
//! `SIGKILL`), the kernel closes it, the watchdog reads end-of-file and terminates the component:
//! `SIGTERM`, then `SIGKILL` after a grace period. No unsafe code, no polling of the owner's pid.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long the watchdog waits after `SIGTERM` before it sends `SIGKILL`.
const TERMINATION_GRACE: Duration = Duration::from_secs(10);

/// The bash prologue. fd 3 is the owner's pipe; the watchdog subshell keeps it and the component
/// gets neither it nor the pipe as stdin. `$$` stays the pid of this shell in the subshell, and
/// after `exec` that pid is the component's.
const WATCHDOG_PROLOGUE: &str = r#"
exec 3<&0
(
  trap '' INT
  while kill -0 $$ 2>/dev/null; do
    read -r -t 1 _ <&3
    if [ $? -le 128 ]; then
      kill -TERM $$ 2>/dev/null
      for _ in $(seq 1 GRACE_TENTHS); do
        kill -0 $$ 2>/dev/null || exit 0
        sleep 0.1
      done
      kill -KILL $$ 2>/dev/null
      exit 0
    fi
  done
) &
exec "$@" </dev/null 3<&-
"#;

/// Failure to start a component process.
#[derive(Debug, thiserror::Error)]
pub enum SpawnComponentError {
    /// Its log file could not be created.
    #[error("creating log file {path}: {source}")]
    Log {
        /// The log file.
        path: PathBuf,
        /// The IO error.
        source: std::io::Error,
    },
    /// The process could not be started.
    #[error("starting {binary}: {source}")]
    Spawn {
        /// The binary that failed to start.
        binary: PathBuf,
        /// The IO error.
        source: std::io::Error,
    },
}

/// A running component. Dropping it closes the watchdog pipe, which terminates the component.
#[derive(Debug)]
pub struct OwnedProcess {
    name: String,
    child: Child,
    lifeline: Option<ChildStdin>,
    log_path: PathBuf,
}

impl OwnedProcess {
    /// Starts `binary args...` with stdout and stderr appended to `log_path`.
    pub fn spawn(
        name: &str,
        binary: &Path,
        args: &[String],
        log_path: &Path,
    ) -> Result<Self, SpawnComponentError> {
        let log = File::create(log_path).map_err(|source| SpawnComponentError::Log {
            path: log_path.to_owned(),
            source,
        })?;
        let log_err = log.try_clone().map_err(|source| SpawnComponentError::Log {
            path: log_path.to_owned(),
            source,
        })?;
        let grace_tenths = TERMINATION_GRACE.as_millis() / 100;
        let prologue = WATCHDOG_PROLOGUE.replace("GRACE_TENTHS", &grace_tenths.to_string());
        let mut child = Command::new("bash")
            .arg("-c")
            .arg(prologue)
            .arg(name)
            .arg(binary)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .map_err(|source| SpawnComponentError::Spawn {
                binary: binary.to_owned(),
                source,
            })?;
        let lifeline = child.stdin.take();
        Ok(Self {
            name: name.to_owned(),
            child,
            lifeline,
            log_path: log_path.to_owned(),
        })
    }

    /// The component's name (`etcd`, `kube-apiserver`, ...).
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The component's process id.
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The exit status if the component has already exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// The last `lines` lines of the component's log, for error messages.
    #[must_use]
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Asks the watchdog to terminate the component and waits until it has exited (the watchdog
    /// escalates to `SIGKILL` after its grace period; this waits a little longer, then kills).
    pub async fn terminate(mut self) {
        drop(self.lifeline.take());
        let deadline = Instant::now() + TERMINATION_GRACE + Duration::from_secs(5);
        while Instant::now() < deadline {
            if self.exited().is_some() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // The watchdog itself is gone (someone killed it): finish the job directly.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
