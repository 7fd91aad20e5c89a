//! `modgraph [--advisory] <crate dir>…`: for each crate (each of its roots: `src/lib.rs`,
//! `src/main.rs`, `src/bin/*`), the graph of its modules (one node per module file; an edge where
//! a file's code names a path into another module: `use`, re-exports, `crate::`/`super::` paths in
//! code) and every cycle in it, with the import lines that form it. Exits 1 when any crate has a
//! cycle, unless `--advisory` (then it only reports). `make lint` runs it.

mod cycles;
mod refs;
mod tree;

#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;

use crate::tree::Disk;

fn main() -> ExitCode {
    let mut advisory = false;
    let mut crates = Vec::new();
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--advisory" => advisory = true,
            "-h" | "--help" => {
                println!("usage: modgraph [--advisory] <crate dir>...");
                return ExitCode::SUCCESS;
            }
            _ => crates.push(PathBuf::from(arg)),
        }
    }
    if crates.is_empty() {
        eprintln!("usage: modgraph [--advisory] <crate dir>...");
        return ExitCode::from(2);
    }
    let mut cyclic = 0;
    for dir in &crates {
        match check_crate(dir) {
            Ok(found) => cyclic += found,
            Err(error) => {
                eprintln!("modgraph: {}: {error:#}", dir.display());
                return ExitCode::from(2);
            }
        }
    }
    if cyclic > 0 && !advisory {
        eprintln!(
            "modgraph: {cyclic} import cycle(s); move the type to the module that owns it, or import from there instead of through a re-export"
        );
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// Checks every root of the crate in `dir`, prints what it finds, and returns the number of cycles.
fn check_crate(dir: &Path) -> anyhow::Result<usize> {
    let roots = crate_roots(dir)?;
    anyhow::ensure!(
        !roots.is_empty(),
        "no src/lib.rs, src/main.rs or src/bin/ in {}",
        dir.display()
    );
    let mut total = 0;
    for root in roots {
        let found = cycles::find(&Disk, &root)?;
        let modules = found.tree.files.len();
        if found.cycles.is_empty() {
            println!(
                "modgraph: {}: no import cycles ({modules} module files)",
                root.display()
            );
        } else {
            println!(
                "modgraph: {}: {} import cycle(s) among {modules} module files",
                root.display(),
                found.cycles.len()
            );
            print!("{}", found.report());
        }
        total += found.cycles.len();
    }
    Ok(total)
}

/// The crate roots under `dir/src`: the library, the main binary and the other binaries.
fn crate_roots(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let src = dir.join("src");
    let mut roots: Vec<PathBuf> = ["lib.rs", "main.rs"]
        .iter()
        .map(|name| src.join(name))
        .filter(|path| path.is_file())
        .collect();
    let bin = src.join("bin");
    if bin.is_dir() {
        let mut binaries = Vec::new();
        for entry in std::fs::read_dir(&bin).with_context(|| format!("cannot list {}", bin.display()))? {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "rs") {
                binaries.push(path);
            } else if path.join("main.rs").is_file() {
                binaries.push(path.join("main.rs"));
            }
        }
        binaries.sort();
        roots.extend(binaries);
    }
    Ok(roots)
}
