//! The built stand-in library, for the tests that load it: this crate's and the agent's (which
//! includes this file by path). `libnvml_standin.so` is a `cdylib`, which `cargo test` does not
//! build for a test, so the first caller in a test process builds it.

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

/// The path of `libnvml_standin.so`, built once per test process.
pub fn standin_library() -> &'static Path {
    static LIBRARY: OnceLock<PathBuf> = OnceLock::new();
    LIBRARY.get_or_init(build)
}

fn build() -> PathBuf {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let status = Command::new(cargo)
        .args(["build", "--quiet", "-p", "nvml-standin"])
        .current_dir(&workspace)
        .status()
        .expect("running cargo build");
    assert!(status.success(), "cargo build -p nvml-standin failed");
    let library = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| workspace.join("target"), PathBuf::from)
        .join("debug/libnvml_standin.so");
    assert!(library.exists(), "{} not built", library.display());
    library
}
