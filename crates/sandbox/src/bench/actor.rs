//! The processes a benchmark or fault scenario measures, each under an identity of its own so the
//! API server's audit log can tell their requests apart: the controller (`gpu-remediator run`,
//! a child process whose memory and CPU time are read from `/proc`) and `kubectl`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleRef, Subject};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tokio::process::Child;

use crate::ControlPlane;
use crate::controlplane::usage::{self, ComponentUsage};

/// Failure to create an identity.
#[derive(Debug, thiserror::Error)]
pub enum CreateIdentityError {
    /// An object could not be created.
    #[error("creating {what}: {source}")]
    Create {
        /// What.
        what: String,
        /// The API error.
        source: kube::Error,
    },
    /// The kubeconfig could not be written.
    #[error("writing kubeconfig {path}: {detail}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        detail: String,
    },
}

/// A service account with `cluster-admin`, and a kubeconfig that authenticates as it.
#[derive(Debug, Clone)]
pub struct Identity {
    /// `system:serviceaccount:<namespace>:<name>`, as the audit log names it.
    pub username: String,
    /// Its bearer token.
    pub token: String,
    /// A kubeconfig for it.
    pub kubeconfig: PathBuf,
}

/// Creates service account `namespace/name` (and the namespace if needed), binds it to
/// `cluster-admin`, and writes a kubeconfig for it into `dir` that points at `server` (the API
/// server, or a proxy in front of it).
pub async fn create_identity(
    control_plane: &ControlPlane,
    namespace: &str,
    name: &str,
    server: &str,
    dir: &Path,
) -> Result<Identity, CreateIdentityError> {
    let client = control_plane.client();
    let create_error = |what: String| move |source| CreateIdentityError::Create { what, source };
    let meta = |name: &str, namespace: Option<&str>| ObjectMeta {
        name: Some(name.to_owned()),
        namespace: namespace.map(str::to_owned),
        ..ObjectMeta::default()
    };
    let namespaces: Api<Namespace> = Api::all(client.clone());
    match namespaces
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: meta(namespace, None),
                ..Namespace::default()
            },
        )
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.is_already_exists() => {}
        Err(source) => return Err(create_error(format!("namespace {namespace}"))(source)),
    }
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    accounts
        .create(
            &PostParams::default(),
            &ServiceAccount {
                metadata: meta(name, Some(namespace)),
                ..ServiceAccount::default()
            },
        )
        .await
        .map_err(create_error(format!("service account {namespace}/{name}")))?;
    let binding = ClusterRoleBinding {
        metadata: meta(&format!("bench-{namespace}-{name}"), None),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".to_owned(),
            kind: "ClusterRole".to_owned(),
            name: "cluster-admin".to_owned(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".to_owned(),
            name: name.to_owned(),
            namespace: Some(namespace.to_owned()),
            ..Subject::default()
        }]),
    };
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(&PostParams::default(), &binding)
        .await
        .map_err(create_error(format!("cluster role binding for {name}")))?;
    let request = TokenRequest {
        spec: TokenRequestSpec {
            expiration_seconds: Some(24 * 3600),
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    let token = accounts
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .map_err(create_error(format!("a token for {name}")))?
        .status
        .map(|s| s.token)
        .unwrap_or_default();
    let kubeconfig = dir.join(format!("{namespace}-{name}.kubeconfig"));
    write_kubeconfig(control_plane, server, &token, &kubeconfig)?;
    Ok(Identity {
        username: format!("system:serviceaccount:{namespace}:{name}"),
        token,
        kubeconfig,
    })
}

/// Writes the admin kubeconfig with another server (e.g. a proxy) and token.
pub fn write_kubeconfig(
    control_plane: &ControlPlane,
    server: &str,
    token: &str,
    path: &Path,
) -> Result<(), CreateIdentityError> {
    let error = |detail: String| CreateIdentityError::Kubeconfig {
        path: path.to_owned(),
        detail,
    };
    let admin = std::fs::read_to_string(control_plane.kubeconfig_path()).map_err(|e| error(e.to_string()))?;
    let mut config: serde_yaml::Value = serde_yaml::from_str(&admin).map_err(|e| error(e.to_string()))?;
    config["users"][0]["user"]["token"] = serde_yaml::Value::from(token);
    config["clusters"][0]["cluster"]["server"] = serde_yaml::Value::from(server);
    let text = serde_yaml::to_string(&config).map_err(|e| error(e.to_string()))?;
    std::fs::write(path, text).map_err(|e| error(e.to_string()))
}

/// A client for `identity` straight to the API server.
///
/// # Panics
/// Never in practice: only the token differs from the admin config.
#[must_use]
pub fn client_for(control_plane: &ControlPlane, identity: &Identity) -> Client {
    control_plane.client_with_token(&identity.token)
}

/// Failure to start the controller.
#[derive(Debug, thiserror::Error)]
pub enum StartControllerError {
    /// The binary is not there.
    #[error(
        "the controller binary {0} does not exist (build it: cargo build --release -p gpu-remediator --bin gpu-remediator, or pass its path)"
    )]
    Missing(PathBuf),
    /// It could not be started.
    #[error("starting {binary}: {source}")]
    Spawn {
        /// The binary.
        binary: PathBuf,
        /// The IO error.
        source: std::io::Error,
    },
}

/// How to run one controller replica.
#[derive(Debug, Clone)]
pub struct ControllerOptions {
    /// The `gpu-remediator` binary.
    pub binary: PathBuf,
    /// The kubeconfig it uses (its identity, and the server or proxy it talks to).
    pub kubeconfig: PathBuf,
    /// `--policy-selector`.
    pub policy_selector: String,
    /// `--identity`, also the log file's name.
    pub identity: String,
    /// `--leader-elect` with this Lease namespace; `None`: the replica acts alone.
    pub lease_namespace: Option<String>,
    /// Where its log goes.
    pub log_dir: PathBuf,
    /// Extra arguments for `run`.
    pub extra_args: Vec<String>,
}

/// A controller replica as a child process (killed if dropped).
pub struct ControllerProcess {
    child: Child,
    pid: u32,
    /// Its `/metrics` address.
    pub listen: String,
    /// Its log.
    pub log: PathBuf,
}

impl ControllerProcess {
    /// Starts `gpu-remediator run` with `options`.
    pub fn start(options: &ControllerOptions) -> Result<Self, StartControllerError> {
        if !options.binary.exists() {
            return Err(StartControllerError::Missing(options.binary.clone()));
        }
        let spawn_error = |source| StartControllerError::Spawn {
            binary: options.binary.clone(),
            source,
        };
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(spawn_error)?
            .port();
        let listen = format!("127.0.0.1:{port}");
        let log = options.log_dir.join(format!("{}.log", options.identity));
        let log_file = std::fs::File::create(&log).map_err(spawn_error)?;
        let mut args = vec![
            "run".to_owned(),
            format!("--identity={}", options.identity),
            format!("--listen={listen}"),
            format!("--policy-selector={}", options.policy_selector),
        ];
        if let Some(namespace) = &options.lease_namespace {
            args.push("--leader-elect".to_owned());
            args.push(format!("--lease-namespace={namespace}"));
        }
        args.extend(options.extra_args.iter().cloned());
        let child = tokio::process::Command::new(&options.binary)
            .args(&args)
            .env("KUBECONFIG", &options.kubeconfig)
            .env(
                "RUST_LOG",
                std::env::var("GPU_BENCH_CONTROLLER_LOG").unwrap_or_else(|_| "info".to_owned()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::from(log_file.try_clone().map_err(spawn_error)?))
            .stderr(Stdio::from(log_file))
            .kill_on_drop(true)
            .spawn()
            .map_err(spawn_error)?;
        let pid = child.id().unwrap_or_default();
        Ok(Self {
            child,
            pid,
            listen,
            log,
        })
    }

    /// Its process id.
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Peak and current RSS and CPU seconds so far, or `None` if it exited.
    #[must_use]
    pub fn usage(&self) -> Option<ComponentUsage> {
        usage::read("gpu-remediator", self.pid, usage::ticks_per_second())
    }

    /// `SIGKILL`: no shutdown, no Lease release.
    pub async fn kill_9(&mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }

    /// `SIGTERM`, then waits up to 30 s for it to exit (then kills it).
    pub async fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status();
        if let Ok(status) = tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await {
            status.ok()
        } else {
            self.kill_9().await;
            None
        }
    }

    /// The exit status if it exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// The end of its log, for failure messages.
    #[must_use]
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}
