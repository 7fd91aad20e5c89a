//! End-to-end tests against a real local control plane live in `tests/`; this library holds what
//! several of them share and that needs no control plane: building the binaries they run, waiting
//! for a condition, reading a sample of the metrics, and merging a JSON spec over a base.
#![forbid(unsafe_code)]

use std::{
    future::Future,
    path::{Path, PathBuf},
    sync::OnceLock,
    time::Duration,
};

/// The workspace root.
pub const WORKSPACE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

/// Builds `binaries` (each `(package, binary)`, debug) and returns the directory they are in. A
/// test has `CARGO_BIN_EXE_` only for its own package's binaries, so other packages' are built.
///
/// # Panics
/// When cargo cannot run or the build fails.
#[must_use]
pub fn build_binaries(binaries: &[(&str, &str)]) -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut args = vec!["build", "--quiet"];
    for (package, binary) in binaries {
        args.extend(["-p", package, "--bin", binary]);
    }
    let status = std::process::Command::new(cargo)
        .args(&args)
        .current_dir(WORKSPACE)
        .status()
        .expect("running cargo build");
    assert!(status.success(), "cargo {} failed", args.join(" "));
    std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| Path::new(WORKSPACE).join("target"), PathBuf::from)
        .join("debug")
}

/// The controller binary: `GPU_REMEDIATOR_BIN` if set, else built (debug) on first use.
///
/// # Panics
/// When the build fails.
#[must_use]
pub fn controller_binary() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        if let Some(path) = std::env::var_os("GPU_REMEDIATOR_BIN") {
            return PathBuf::from(path);
        }
        let binary = build_binaries(&[("gpu-remediator", "gpu-remediator")]).join("gpu-remediator");
        assert!(binary.exists(), "{} not built", binary.display());
        binary
    })
}

/// Polls `probe` every 100 ms until it returns `Some`.
///
/// # Panics
/// When `timeout` passes first.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The value of the sample `series` (name with labels, as `/metrics` prints it), if present.
#[must_use]
pub fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find(|line| {
            line.strip_prefix(series)
                .is_some_and(|rest| rest.starts_with(' '))
        })
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
}

/// Merges `over` into `base`, object by object (a JSON merge patch without deletions): a test's
/// policy spec over its harness's base.
pub fn merge(base: &mut serde_json::Value, over: serde_json::Value) {
    match (base, over) {
        (serde_json::Value::Object(base), serde_json::Value::Object(over)) => {
            for (key, value) in over {
                merge(base.entry(key).or_insert(serde_json::Value::Null), value);
            }
        }
        (base, over) => *base = over,
    }
}
