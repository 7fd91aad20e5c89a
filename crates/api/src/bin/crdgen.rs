//! Prints the `CustomResourceDefinitions` as YAML (`crdgen`) or writes them into a directory
//! (`crdgen DIR`); `make crds` runs the latter for `crds/`.

use std::{env, fs, path::Path, process::ExitCode};

fn main() -> ExitCode {
    let rendered = gpu_remediation_api::crds::render_all();
    match env::args().nth(1) {
        None => {
            for (_, yaml) in &rendered {
                print!("---\n{yaml}");
            }
            ExitCode::SUCCESS
        }
        Some(dir) => {
            for (file, yaml) in &rendered {
                let path = Path::new(&dir).join(file);
                if let Err(err) = fs::write(&path, yaml) {
                    eprintln!("crdgen: cannot write {}: {err}", path.display());
                    return ExitCode::FAILURE;
                }
            }
            ExitCode::SUCCESS
        }
    }
}
