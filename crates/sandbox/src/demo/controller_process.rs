//! The real `gpu-remediator` binary as a child process, authenticated as the manifests' service
//! account: `run --leader-elect` with a kubeconfig that holds that account's token and nothing
//! else, as the Deployment would run it.
//!
//! The child never outlives the demo: it runs under a small shell that holds our pipe as its
//! stdin and sends the controller SIGTERM when that pipe closes, which happens however the demo
//! ends (return, panic, or SIGKILL). It is never killed from here (that would kill only the
//! shell and orphan the controller): closing the pipe is the one way to stop it.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    process::{Child, Command},
};

/// Why the controller could not be started.
#[derive(Debug, thiserror::Error)]
pub enum StartControllerError {
    /// The binary is not there.
    #[error("the controller binary {0} does not exist (build it with `cargo build -p gpu-remediator`)")]
    Missing(PathBuf),
    /// The kubeconfig or log file could not be written.
    #[error("writing {path}: {source}")]
    File {
        /// The file.
        path: PathBuf,
        /// The IO error.
        source: std::io::Error,
    },
    /// The process could not be spawned.
    #[error("starting {binary}: {source}")]
    Spawn {
        /// The binary.
        binary: PathBuf,
        /// The IO error.
        source: std::io::Error,
    },
    /// No free port for its metrics server.
    #[error("reserving a port for /metrics: {0}")]
    Port(std::io::Error),
}

/// A running controller process.
#[derive(Debug)]
pub struct ControllerProcess {
    child: Child,
    /// Where its `/metrics`, `/healthz` and `/readyz` answer.
    pub listen: SocketAddr,
    /// Its JSON log.
    pub log: PathBuf,
}

/// Runs `binary run --leader-elect ...` with `kubeconfig`, logging to `log`.
pub fn start(
    binary: &Path,
    kubeconfig: &Path,
    lease_namespace: &str,
    log: &Path,
) -> Result<ControllerProcess, StartControllerError> {
    if !binary.is_file() {
        return Err(StartControllerError::Missing(binary.to_owned()));
    }
    let listen = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(StartControllerError::Port)?;
    let file_error = |source| StartControllerError::File {
        path: log.to_owned(),
        source,
    };
    let out = std::fs::File::create(log).map_err(file_error)?;
    let err = out.try_clone().map_err(file_error)?;
    // `read` returns when our end of the pipe closes; the controller then gets SIGTERM and the
    // shell waits for it to release its Lease and exit.
    let lifeline = r#""$@" </dev/null & child=$!; read -r _; kill -TERM "$child" 2>/dev/null; wait "$child""#;
    let child = Command::new("sh")
        .arg("-c")
        .arg(lifeline)
        .arg("gpu-remediator")
        .arg(binary)
        .args([
            "run",
            "--leader-elect",
            &format!("--lease-namespace={lease_namespace}"),
            "--identity=demo",
            &format!("--listen={listen}"),
        ])
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "info")
        .stdin(Stdio::piped())
        .stdout(out)
        .stderr(err)
        // Its own process group: a Ctrl-C in the terminal reaches the demo, which then stops the
        // controller in order, rather than the shell, which would orphan the controller.
        .process_group(0)
        .spawn()
        .map_err(|source| StartControllerError::Spawn {
            binary: binary.to_owned(),
            source,
        })?;
    Ok(ControllerProcess {
        child,
        listen,
        log: log.to_owned(),
    })
}

impl ControllerProcess {
    /// The process id of the wrapping shell.
    #[must_use]
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// The body of `GET /metrics`, or `None` if it cannot be read. A plain HTTP/1.1 request: the
    /// demo needs nothing more, and no HTTP client is worth a dependency for it.
    pub async fn metrics(&self) -> Option<String> {
        let read = async {
            let mut stream = tokio::net::TcpStream::connect(self.listen).await.ok()?;
            stream
                .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                .await
                .ok()?;
            let mut response = String::new();
            stream.read_to_string(&mut response).await.ok()?;
            let (head, body) = response.split_once("\r\n\r\n")?;
            let ok = head.split_whitespace().nth(1) == Some("200");
            let chunked = head.to_ascii_lowercase().contains("transfer-encoding: chunked");
            ok.then(|| if chunked { dechunk(body) } else { body.to_owned() })
        };
        tokio::time::timeout(Duration::from_secs(5), read)
            .await
            .ok()
            .flatten()
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Closes the lifeline (the controller gets SIGTERM, releases its Lease and exits) and waits
    /// at most `grace`. Returns whether it exited within it.
    pub async fn stop(mut self, grace: Duration) -> bool {
        drop(self.child.stdin.take());
        tokio::time::timeout(grace, self.child.wait()).await.is_ok()
    }
}

/// The body of a chunked HTTP/1.1 response.
fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if size == 0 || after.len() < size {
            break;
        }
        out.push_str(&after[..size]);
        rest = after[size..].trim_start_matches("\r\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::dechunk;

    #[test]
    fn a_chunked_body_is_joined_and_its_sizes_dropped() {
        assert_eq!(dechunk("5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"), "hello world");
    }
}
