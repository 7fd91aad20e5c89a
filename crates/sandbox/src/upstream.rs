//! Upstream controllers run as processes against the sandbox: Karpenter (with its KWOK provider)
//! and Cluster API's core manager, built from their pinned Go modules by `tools/build.sh` (which
//! copies each one's CRDs beside its binary) and cached outside the repository. This module finds
//! a binary, installs the CRDs next to it and starts the process so that it cannot outlive the
//! sandbox (see [`crate::controlplane::OwnedProcess`]).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::{Api, Client};

use crate::controlplane::{OwnedProcess, SpawnComponentError};

/// Failure to find, install or start an upstream controller.
#[derive(Debug, thiserror::Error)]
pub enum StartUpstreamError {
    /// `tools/build.sh` could not run or failed.
    #[error("building {tool} with tools/build.sh: {message}")]
    Build {
        /// The tool (`karpenter-kwok`, `capi-manager`).
        tool: String,
        /// What went wrong.
        message: String,
    },
    /// A file next to the binary could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file or directory.
        path: PathBuf,
        /// The IO error.
        source: std::io::Error,
    },
    /// A CRD file is not a CRD.
    #[error("parsing CRD {path}: {source}")]
    ParseCrd {
        /// The file.
        path: PathBuf,
        /// The YAML error.
        source: serde_yaml::Error,
    },
    /// A CRD could not be applied.
    #[error("applying CRD {name}: {source}")]
    ApplyCrd {
        /// The CRD.
        name: String,
        /// The API error.
        source: kube::Error,
    },
    /// A CRD was not established in time.
    #[error("CRD {name} not established within {waited:?}")]
    NotEstablished {
        /// The CRD.
        name: String,
        /// How long was waited.
        waited: Duration,
    },
    /// A file the controller reads could not be written.
    #[error("writing {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The IO error.
        source: std::io::Error,
    },
    /// The process could not start.
    #[error(transparent)]
    Spawn(#[from] SpawnComponentError),
    /// The process exited while starting.
    #[error("{name} exited while starting: {log_tail}")]
    Exited {
        /// The controller.
        name: String,
        /// The end of its log.
        log_tail: String,
    },
    /// The controller did not report ready in time.
    #[error("{what} not ready within {waited:?}; its log ends: {log_tail}")]
    NotReady {
        /// What was awaited.
        what: String,
        /// How long was waited.
        waited: Duration,
        /// The end of the controller's log.
        log_tail: String,
    },
    /// An object the controller needs could not be written.
    #[error("{action}: {source}")]
    Api {
        /// What was being done.
        action: String,
        /// The API error.
        source: kube::Error,
    },
}

/// The binary of `tool`: env `env_var` if set (the Makefile sets it), else `tools/build.sh tool`
/// (builds once into the cache, then only prints the path).
pub fn locate(tool: &str, env_var: &str) -> Result<PathBuf, StartUpstreamError> {
    if let Some(path) = std::env::var_os(env_var).filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(path));
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/build.sh");
    let output = Command::new(&script)
        .arg(tool)
        .output()
        .map_err(|e| StartUpstreamError::Build {
            tool: tool.to_owned(),
            message: e.to_string(),
        })?;
    if !output.status.success() {
        return Err(StartUpstreamError::Build {
            tool: tool.to_owned(),
            message: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let path = stdout.lines().last().unwrap_or_default().trim();
    Ok(PathBuf::from(path))
}

/// Applies (server-side) every `*.yaml` CRD beside `binary` and waits until each is established.
pub async fn install_crds(client: &Client, binary: &Path) -> Result<Vec<String>, StartUpstreamError> {
    let dir = binary.parent().unwrap_or(Path::new("."));
    let read_dir = |source| StartUpstreamError::Read {
        path: dir.to_owned(),
        source,
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(read_dir)?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut names = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path).map_err(|source| StartUpstreamError::Read {
            path: path.clone(),
            source,
        })?;
        let crd: CustomResourceDefinition =
            serde_yaml::from_str(&text).map_err(|source| StartUpstreamError::ParseCrd {
                path: path.clone(),
                source,
            })?;
        let name = crd.metadata.name.clone().unwrap_or_default();
        apply(&crds, &name, &crd).await?;
        names.push(name);
    }
    for name in &names {
        wait_established(&crds, name).await?;
    }
    Ok(names)
}

/// Applies (server-side) one CRD given as JSON and waits until it is established.
pub async fn apply_crd(client: &Client, crd: &serde_json::Value) -> Result<(), StartUpstreamError> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = crd["metadata"]["name"].as_str().unwrap_or_default().to_owned();
    apply(&crds, &name, crd).await?;
    wait_established(&crds, &name).await
}

async fn apply<T: serde::Serialize + std::fmt::Debug>(
    crds: &Api<CustomResourceDefinition>,
    name: &str,
    crd: &T,
) -> Result<(), StartUpstreamError> {
    crds.patch(
        name,
        &PatchParams::apply("gpu-sandbox").force(),
        &Patch::Apply(crd),
    )
    .await
    .map(|_| ())
    .map_err(|source| StartUpstreamError::ApplyCrd {
        name: name.to_owned(),
        source,
    })
}

async fn wait_established(
    crds: &Api<CustomResourceDefinition>,
    name: &str,
) -> Result<(), StartUpstreamError> {
    const WAIT: Duration = Duration::from_secs(30);
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let established = crds.get_opt(name).await.ok().flatten().is_some_and(|crd| {
            crd.status
                .and_then(|s| s.conditions)
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Established" && c.status == "True"))
        });
        if established {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(StartUpstreamError::NotEstablished {
                name: name.to_owned(),
                waited: WAIT,
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Starts `binary args...` with `env` added to its environment, logging to `log`; fails if it
/// exits within its first second (a bad flag, an unreachable API server).
pub async fn spawn(
    name: &str,
    binary: &Path,
    env: &[(&str, String)],
    args: &[String],
    log: &Path,
) -> Result<OwnedProcess, StartUpstreamError> {
    // `env` execs the binary in its own place, so the owned process is the controller itself.
    let mut command_line: Vec<String> = env.iter().map(|(key, value)| format!("{key}={value}")).collect();
    command_line.push(binary.display().to_string());
    command_line.extend(args.iter().cloned());
    let mut process = OwnedProcess::spawn(name, Path::new("env"), &command_line, log)?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    if process.exited().is_some() {
        return Err(StartUpstreamError::Exited {
            name: name.to_owned(),
            log_tail: process.log_tail(30),
        });
    }
    Ok(process)
}

/// Server-side applies `object` as the sandbox: in `namespace`, or cluster-scoped where `None`.
pub async fn apply_object(
    client: &Client,
    namespace: Option<&str>,
    resource: &ApiResource,
    object: &serde_json::Value,
) -> Result<(), StartUpstreamError> {
    let name = object["metadata"]["name"].as_str().unwrap_or_default().to_owned();
    let (api, shown) = match namespace {
        Some(namespace) => (
            Api::<DynamicObject>::namespaced_with(client.clone(), namespace, resource),
            format!("{namespace}/{name}"),
        ),
        None => (
            Api::<DynamicObject>::all_with(client.clone(), resource),
            name.clone(),
        ),
    };
    api.patch(
        &name,
        &PatchParams::apply("gpu-sandbox").force(),
        &Patch::Apply(object),
    )
    .await
    .map(|_| ())
    .map_err(|source| StartUpstreamError::Api {
        action: format!("applying {} {shown}", resource.kind),
        source,
    })
}
