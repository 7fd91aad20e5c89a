//! What the process-level leader tests share: a control plane that writes an audit log (so every
//! mutating request can be attributed to the replica that made it, by its service account), the
//! controller binary, replicas run as child processes under their own tokens, and the audit log
//! reader; [`fleet`] is what the replicas act on.
#![allow(dead_code, reason = "each test binary uses a different part of the support")]

use std::{
    net::TcpListener,
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use gpu_sandbox::{ControlPlane, ControlPlaneOptions};
use k8s_openapi::{
    api::{
        authentication::v1::TokenRequest,
        core::v1::{Namespace, ServiceAccount},
        rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding, RoleRef, Subject},
    },
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    jiff::Timestamp,
};
use kube::{
    Api, Client, ResourceExt as _,
    api::{ObjectMeta, PostParams},
};
use tokio::{process::Child, sync::OnceCell};

use e2e::WORKSPACE;

pub mod fleet;

/// Every mutating verb, recorded with its request body (`Request` level, so the claim a write
/// carries can be read) once the response is complete.
const AUDIT_POLICY: &str = r#"
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted", "Panic"]
rules:
  - level: Request
    verbs: ["create", "update", "patch", "delete", "deletecollection"]
  - level: None
"#;

/// A control plane of this test binary's own, with an audit log.
pub struct AuditedCluster {
    /// The control plane.
    pub control_plane: ControlPlane,
    /// Its audit log (JSON lines).
    pub audit_log: PathBuf,
    /// Where per-test files (kubeconfigs, replica logs) go.
    pub scratch: PathBuf,
}

/// The test binary's audited control plane, started (and the project's CRDs installed) on first use.
pub async fn cluster() -> &'static AuditedCluster {
    static CLUSTER: OnceCell<AuditedCluster> = OnceCell::const_new();
    CLUSTER
        .get_or_init(|| async {
            let scratch =
                std::env::temp_dir().join(format!("gpu-remediator-leader-e2e-{}", std::process::id()));
            std::fs::create_dir_all(&scratch).expect("scratch directory");
            let policy = scratch.join("audit-policy.yaml");
            std::fs::write(&policy, AUDIT_POLICY).expect("audit policy");
            let audit_log = scratch.join("audit.log");
            let options = ControlPlaneOptions {
                extra_apiserver_args: vec![
                    format!("--audit-policy-file={}", policy.display()),
                    format!("--audit-log-path={}", audit_log.display()),
                    // Written before the response is sent, so the log is complete when a test reads it.
                    "--audit-log-mode=blocking".to_owned(),
                ],
                ..ControlPlaneOptions::default()
            };
            let control_plane = ControlPlane::start(options)
                .await
                .unwrap_or_else(|e| panic!("starting the control plane: {e}"));
            let client = control_plane.client();
            for crd in [
                "gpuremediationpolicies.yaml",
                "gpuremediations.yaml",
                "gpuremediation-hardwarerecords.yaml",
            ] {
                install_crd(&client, &format!("{WORKSPACE}/crds/{crd}")).await;
            }
            AuditedCluster {
                control_plane,
                audit_log,
                scratch,
            }
        })
        .await
}

async fn install_crd(client: &Client, path: &str) {
    let yaml = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    let crd: CustomResourceDefinition =
        serde_yaml::from_str(&yaml).unwrap_or_else(|e| panic!("parsing {path}: {e}"));
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = crd.name_any();
    crds.create(&PostParams::default(), &crd)
        .await
        .unwrap_or_else(|e| panic!("installing {name}: {e}"));
    for _ in 0..300 {
        let established = crds
            .get(&name)
            .await
            .ok()
            .and_then(|crd| crd.status)
            .and_then(|status| status.conditions);
        if established.is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        }) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("CRD {name} was not established");
}

/// Creates namespace `name`.
pub async fn create_namespace(client: &Client, name: &str) {
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .expect("namespace");
}

/// Installs the shipped fence policy (`manifests/controller/fence-policy.yaml`) for controllers
/// running as service accounts of `namespace` with their Lease there: as shipped for the
/// manifests' own namespace, otherwise under a name of its own, matching that namespace's
/// accounts and Lease. Once per namespace.
pub async fn install_fence(client: &Client, namespace: &str) {
    let shipped = std::fs::read_to_string(format!("{WORKSPACE}/manifests/controller/fence-policy.yaml"))
        .expect("the fence policy");
    let policy = if namespace == "gpu-remediation" {
        shipped
    } else {
        shipped
            .replace(
                "request.userInfo.username == 'system:serviceaccount:gpu-remediation:gpu-remediator'",
                &format!("request.userInfo.username.startsWith('system:serviceaccount:{namespace}:')"),
            )
            .replace(
                "namespace: gpu-remediation\n",
                &format!("namespace: {namespace}\n"),
            )
            .replace(
                "gpuremediation.dev/fenced: gpu-remediation\n",
                &format!("gpuremediation.dev/fenced: {namespace}\n"),
            )
            .replace(
                "name: gpu-remediator-fence\n",
                &format!("name: gpu-remediator-fence-{namespace}\n"),
            )
            .replace(
                "policyName: gpu-remediator-fence\n",
                &format!("policyName: gpu-remediator-fence-{namespace}\n"),
            )
            .replace(
                "name: gpu-remediator-fence-missing-lease\n",
                &format!("name: gpu-remediator-fence-missing-lease-{namespace}\n"),
            )
    };
    assert!(policy.contains(namespace), "the policy was adapted: {policy}");
    let objects = gpu_sandbox::demo::install::parse_documents(&policy).expect("fence policy YAML");
    gpu_sandbox::demo::install::apply(client, &objects)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}

/// Grants service account `namespace/account` the controller's real RBAC (the `ClusterRole` of
/// `manifests/controller/rbac.yaml`, and its namespaced Roles' rules in `namespace`), puts the shipped fence policy on
/// `namespace`'s controllers ([`install_fence`]), and returns a token for the account.
pub async fn controller_account(client: &Client, namespace: &str, account: &str) -> String {
    install_fence(client, namespace).await;
    unfenced_controller_account(client, namespace, account).await
}

/// [`controller_account`] without the fence: the controller's RBAC and a token, no fence policy.
pub async fn unfenced_controller_account(client: &Client, namespace: &str, account: &str) -> String {
    let manifests = std::fs::read_to_string(format!("{WORKSPACE}/manifests/controller/rbac.yaml"))
        .expect("RBAC manifest");
    let mut cluster_role = None;
    let mut lease_role = None;
    for document in manifests.split("\n---") {
        let value: serde_yaml::Value = serde_yaml::from_str(document).expect("a YAML document");
        match value.get("kind").and_then(serde_yaml::Value::as_str) {
            Some("ClusterRole") => {
                cluster_role = Some(serde_yaml::from_value::<ClusterRole>(value).expect("ClusterRole"));
            }
            // Every namespaced Role of the manifest (leader election, validation Jobs) as one.
            Some("Role") => {
                let role = serde_yaml::from_value::<Role>(value).expect("Role");
                match &mut lease_role {
                    None => lease_role = Some(role),
                    Some(all) => all
                        .rules
                        .get_or_insert_with(Vec::new)
                        .extend(role.rules.unwrap_or_default()),
                }
            }
            _ => {}
        }
    }
    let mut cluster_role = cluster_role.expect("the manifest's ClusterRole");
    let role_name = format!("{}-{namespace}-{account}", cluster_role.name_any());
    cluster_role.metadata = ObjectMeta {
        name: Some(role_name.clone()),
        ..ObjectMeta::default()
    };
    Api::<ClusterRole>::all(client.clone())
        .create(&PostParams::default(), &cluster_role)
        .await
        .expect("cluster role");
    let mut lease_role = lease_role.expect("the manifest's leader election Role");
    lease_role.metadata = ObjectMeta {
        name: Some(account.to_owned()),
        namespace: Some(namespace.to_owned()),
        ..ObjectMeta::default()
    };
    Api::<Role>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &lease_role)
        .await
        .expect("role");
    let subject = Subject {
        kind: "ServiceAccount".to_owned(),
        name: account.to_owned(),
        namespace: Some(namespace.to_owned()),
        ..Subject::default()
    };
    let reference = |kind: &str, name: &str| RoleRef {
        api_group: "rbac.authorization.k8s.io".to_owned(),
        kind: kind.to_owned(),
        name: name.to_owned(),
    };
    let cluster_binding = ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(role_name.clone()),
            ..ObjectMeta::default()
        },
        role_ref: reference("ClusterRole", &role_name),
        subjects: Some(vec![subject.clone()]),
    };
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(&PostParams::default(), &cluster_binding)
        .await
        .expect("binding");
    let binding = RoleBinding {
        metadata: ObjectMeta {
            name: Some(account.to_owned()),
            namespace: Some(namespace.to_owned()),
            ..ObjectMeta::default()
        },
        role_ref: reference("Role", account),
        subjects: Some(vec![subject]),
    };
    Api::<RoleBinding>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &binding)
        .await
        .expect("binding");
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let account_object = ServiceAccount {
        metadata: ObjectMeta {
            name: Some(account.to_owned()),
            ..ObjectMeta::default()
        },
        ..ServiceAccount::default()
    };
    accounts
        .create(&PostParams::default(), &account_object)
        .await
        .expect("service account");
    let request = TokenRequest {
        spec: k8s_openapi::api::authentication::v1::TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..Default::default()
        },
        ..TokenRequest::default()
    };
    accounts
        .create_token_request(account, &PostParams::default(), &request)
        .await
        .expect("token")
        .status
        .expect("token status")
        .token
}

/// The username the API server gives service account `namespace/account`.
pub fn username(namespace: &str, account: &str) -> String {
    format!("system:serviceaccount:{namespace}:{account}")
}

/// Writes a kubeconfig like the admin's but authenticating with `token`.
pub fn kubeconfig_with_token(cluster: &AuditedCluster, name: &str, token: &str) -> PathBuf {
    let admin = std::fs::read_to_string(cluster.control_plane.kubeconfig_path()).expect("admin kubeconfig");
    let mut config: serde_yaml::Value = serde_yaml::from_str(&admin).expect("kubeconfig YAML");
    config["users"][0]["user"] = serde_yaml::from_str(&format!("token: {token}")).expect("user");
    let path = cluster.scratch.join(format!("{name}.kubeconfig"));
    std::fs::write(&path, serde_yaml::to_string(&config).expect("kubeconfig")).expect("writing kubeconfig");
    path
}

/// The controller binary (`e2e::controller_binary`), built off the runtime's thread.
pub async fn controller_binary() -> &'static Path {
    tokio::task::spawn_blocking(e2e::controller_binary)
        .await
        .expect("building the controller binary")
}

/// The Lease's holder. The binary makes its identity unique per process (`<--identity>_<nonce>`,
/// `<--identity>_<POD_UID>_<nonce>` in a pod), so tests compare prefixes.
pub async fn lease_holder(client: &Client, namespace: &str) -> Option<String> {
    let lease = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(client.clone(), namespace)
        .get_opt("gpu-remediator")
        .await
        .ok()??;
    lease.spec?.holder_identity.filter(|holder| !holder.is_empty())
}

/// A free port on 127.0.0.1.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("binding a free port")
        .local_addr()
        .expect("address")
        .port()
}

/// A controller replica running as a child process.
pub struct ReplicaProcess {
    /// Its identity on the Lease.
    pub identity: String,
    /// Its `/metrics`, `/healthz`, `/readyz` address.
    pub listen: String,
    /// Its log (stdout and stderr).
    pub log: PathBuf,
    child: Child,
}

/// How to run one replica.
pub struct ReplicaOptions<'a> {
    /// Identity on the Lease (and Event instance).
    pub identity: &'a str,
    /// Namespace of the Lease.
    pub lease_namespace: &'a str,
    /// Kubeconfig to use.
    pub kubeconfig: &'a Path,
    /// Only policies with this label selector.
    pub policy_selector: &'a str,
    /// Extra arguments.
    pub extra_args: Vec<String>,
}

impl ReplicaProcess {
    /// Starts a replica with leader election on.
    pub async fn start(cluster: &AuditedCluster, options: ReplicaOptions<'_>) -> Self {
        Self::spawn(cluster, options, &[]).await
    }

    async fn spawn(cluster: &AuditedCluster, options: ReplicaOptions<'_>, env: &[(&str, &str)]) -> Self {
        let listen = format!("127.0.0.1:{}", free_port());
        let log = cluster.scratch.join(format!(
            "{}-{}.log",
            options.identity,
            listen.rsplit(':').next().unwrap_or_default()
        ));
        let log_file = std::fs::File::create(&log).expect("replica log");
        let mut args = vec![
            "run".to_owned(),
            "--leader-elect".to_owned(),
            format!("--lease-namespace={}", options.lease_namespace),
            format!("--identity={}", options.identity),
            format!("--listen={listen}"),
            format!("--policy-selector={}", options.policy_selector),
        ];
        args.extend(options.extra_args);
        let child = tokio::process::Command::new(controller_binary().await)
            .args(&args)
            .env("KUBECONFIG", options.kubeconfig)
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdout(Stdio::from(log_file.try_clone().expect("log handle")))
            .stderr(Stdio::from(log_file))
            .kill_on_drop(true)
            .spawn()
            .expect("starting the controller");
        Self {
            identity: options.identity.to_owned(),
            listen,
            log,
            child,
        }
    }

    /// Starts a replica with leader election on and `env` added to its environment.
    pub async fn start_with_env(
        cluster: &AuditedCluster,
        options: ReplicaOptions<'_>,
        env: &[(&str, &str)],
    ) -> Self {
        Self::spawn(cluster, options, env).await
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id().expect("running")
    }

    /// Whether the process is stopped (SIGSTOP): state `T` in `/proc/<pid>/stat`.
    pub fn is_stopped(&self) -> bool {
        let Some(pid) = self.child.id() else { return false };
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|stat| stat.rsplit_once(") ").map(|(_, rest)| rest.starts_with('T')))
            .unwrap_or(false)
    }

    /// SIGCONT: a stopped replica runs on.
    pub fn resume(&self) {
        let status = std::process::Command::new("kill")
            .args(["-CONT", &self.pid().to_string()])
            .status()
            .expect("kill -CONT");
        assert!(status.success());
    }

    /// Waits up to `within` for the process to exit; its status.
    pub async fn exit_within(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        tokio::time::timeout(within, self.child.wait())
            .await
            .ok()
            .map(|status| status.expect("wait"))
    }

    /// SIGKILL: no shutdown, no release.
    pub async fn kill_9(&mut self) {
        self.child.start_kill().expect("kill -9");
        self.child.wait().await.expect("reaping");
    }

    /// SIGTERM, then the exit status.
    pub async fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = self.child.id().expect("running");
        let status = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("kill -TERM");
        assert!(status.success());
        tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("exit after SIGTERM")
            .expect("wait")
    }

    /// The exit status if it exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().expect("try_wait")
    }

    /// Its whole log.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The end of its log, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// GET `path` on its HTTP server: status and body, or `None` if it does not answer.
    pub async fn get(&self, path: &str) -> Option<(u16, String)> {
        http_get(&self.listen, path).await
    }
}

/// A minimal HTTP/1.1 GET (no client library is needed for three plain-text endpoints).
pub async fn http_get(address: &str, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(address).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    let status = response.split(' ').nth(1)?.parse().ok()?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    Some((status, body))
}

/// One audited request.
#[derive(Debug, Clone)]
pub struct AuditEvent {
    /// The verb.
    pub verb: String,
    /// Who made it.
    pub username: String,
    /// Resource, e.g. `pods`.
    pub resource: String,
    /// Subresource, e.g. `eviction`.
    pub subresource: Option<String>,
    /// Namespace.
    pub namespace: Option<String>,
    /// Name.
    pub name: Option<String>,
    /// When the server received it.
    pub request_received_timestamp: Timestamp,
    /// When the response was complete.
    pub stage_timestamp: Timestamp,
    /// The response's HTTP code.
    pub code: u16,
    /// The line as logged (the request body included).
    pub line: String,
}

impl AuditEvent {
    /// Parses one line of the audit log.
    pub fn parse(line: &str) -> Option<Self> {
        let event: serde_json::Value = serde_json::from_str(line).ok()?;
        let text = |pointer: &str| {
            event
                .pointer(pointer)
                .and_then(serde_json::Value::as_str)
                .map(str::to_owned)
        };
        Some(Self {
            verb: text("/verb")?,
            username: text("/user/username")?,
            resource: text("/objectRef/resource").unwrap_or_default(),
            subresource: text("/objectRef/subresource"),
            namespace: text("/objectRef/namespace"),
            name: text("/objectRef/name"),
            request_received_timestamp: text("/requestReceivedTimestamp")?.parse().ok()?,
            stage_timestamp: text("/stageTimestamp")?.parse().ok()?,
            code: event
                .pointer("/responseStatus/code")
                .and_then(serde_json::Value::as_u64)
                .and_then(|code| u16::try_from(code).ok())
                .unwrap_or(0),
            line: line.to_owned(),
        })
    }
}

impl AuditEvent {
    /// `verb resource[/subresource] namespace/name (code)`, for messages.
    pub fn describe(&self) -> String {
        format!(
            "{} {} {}{} {}/{} ({}) at {}",
            self.username,
            self.verb,
            self.resource,
            self.subresource
                .as_deref()
                .map(|s| format!("/{s}"))
                .unwrap_or_default(),
            self.namespace.as_deref().unwrap_or(""),
            self.name.as_deref().unwrap_or(""),
            self.code,
            self.request_received_timestamp,
        )
    }

    /// The refusal an admission policy recorded (`validation.policy.admission.k8s.io/
    /// validation_failure`, present when its binding's actions include `Audit`), if any.
    pub fn policy_denial(&self) -> Option<String> {
        let event: serde_json::Value = serde_json::from_str(&self.line).ok()?;
        event
            .pointer("/annotations/validation.policy.admission.k8s.io~1validation_failure")
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned)
    }

    /// Whether this was a dry run (`dryRun=All`): admitted or not, it changed nothing.
    pub fn is_dry_run(&self) -> bool {
        let event: Option<serde_json::Value> = serde_json::from_str(&self.line).ok();
        event
            .as_ref()
            .and_then(|event| event.pointer("/requestURI"))
            .and_then(serde_json::Value::as_str)
            .is_some_and(|uri| uri.contains("dryRun=All"))
    }

    /// Whether this is a write of the leader Lease (the election itself, not acting).
    pub fn is_lease_write(&self) -> bool {
        self.resource == "leases"
    }
}

/// Every mutating request `username` made, in order; dry runs (a new leader's probes of the
/// fence, which change nothing) left out.
pub fn mutating_requests(cluster: &AuditedCluster, username: &str) -> Vec<AuditEvent> {
    requests_of(cluster, username)
        .into_iter()
        .filter(|event| !event.is_dry_run())
        .collect()
}

/// Every mutating request `username` made, in order, dry runs included.
pub fn requests_of(cluster: &AuditedCluster, username: &str) -> Vec<AuditEvent> {
    let text = std::fs::read_to_string(&cluster.audit_log).expect("reading the audit log");
    let mut events: Vec<AuditEvent> = text
        .lines()
        .filter_map(AuditEvent::parse)
        .filter(|event| event.username == username)
        .collect();
    events.sort_by_key(|event| event.request_received_timestamp);
    events
}
