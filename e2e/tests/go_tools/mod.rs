//! The Go tools `make test` uses (helm, promql-names, ...), built from their pinned modules under
//! `tools/` by `tools/build.sh` and cached outside the repository: the path of one, building it on
//! first use.
#![allow(dead_code, reason = "each test binary uses a different part")]

use std::path::{Path, PathBuf};

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The cached binary of `tools/<name>` (`tools/build.sh <name>` prints its path last).
///
/// # Panics
/// If the tool does not build: the test cannot run without it.
pub fn tool(name: &str) -> PathBuf {
    let output = std::process::Command::new(repo().join("tools/build.sh"))
        .arg(name)
        .output()
        .unwrap_or_else(|e| panic!("running tools/build.sh {name}: {e}"));
    assert!(
        output.status.success(),
        "tools/build.sh {name} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    PathBuf::from(stdout.lines().last().expect("a path").trim())
}

/// Runs `program args` in the repository root and returns its stdout.
///
/// # Panics
/// If it cannot start or exits non-zero.
pub fn run(program: &Path, args: &[&str]) -> String {
    let output = std::process::Command::new(program)
        .args(args)
        .current_dir(repo())
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", program.display()));
    assert!(
        output.status.success(),
        "{} {args:?} failed:\n{}",
        program.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8 output")
}
