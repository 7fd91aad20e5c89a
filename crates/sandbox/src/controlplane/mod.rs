//! The real local control plane: etcd, kube-apiserver (TLS with its own CA, token and client
//! certificate authentication, the Node authorizer and RBAC, `NodeRestriction`; a node's kubelet
//! credentials from [`node_credentials`]), kube-controller-manager and kube-scheduler, all on
//! 127.0.0.1 free ports, started in order, waited on until ready, and stopped in reverse order. See [`process`] for why no component
//! can outlive the process that started it.

mod binaries;
pub mod chaos;
mod dra;
mod layout;
pub mod node_credentials;
mod pki;
mod process;
pub mod start_error;
pub mod usage;

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Api;

pub use binaries::LocateBinariesError;
pub use dra::Dra;
pub use pki::{ClientCertificate, CreatePkiError};

use layout::{Layout, dir_error, display};
pub use process::{OwnedProcess, SpawnComponentError};
use start_error::StartControlPlaneError;

/// The kube-controller-manager controllers the sandbox runs: everything pods, workloads, PDBs,
/// nodes and namespaces need, and nothing that needs a cloud or volumes.
pub const DEFAULT_CONTROLLERS: &[&str] = &[
    "disruption-controller",
    "garbage-collector-controller",
    "pod-garbage-collector-controller",
    "node-lifecycle-controller",
    "taint-eviction-controller",
    "replicaset-controller",
    "deployment-controller",
    "statefulset-controller",
    "daemonset-controller",
    "job-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "clusterrole-aggregation-controller",
    "ttl-controller",
];

/// How to start a [`ControlPlane`].
#[derive(Debug, Clone)]
pub struct ControlPlaneOptions {
    /// Where the binaries are. `None`: env `GPU_REMEDIATOR_CONTROLPLANE`, else the output of
    /// `e2e/controlplane/build.sh` (which builds them once, cached).
    pub bin_dir: Option<PathBuf>,
    /// kube-controller-manager's `--controllers`.
    pub controllers: Vec<String>,
    /// Client QPS of kube-controller-manager and kube-scheduler. Their defaults (20 and 50) would
    /// take many minutes to create and schedule tens of thousands of pods.
    pub component_qps: u32,
    /// kube-controller-manager's `--node-monitor-grace-period`: how long a node may miss heartbeats
    /// before it is marked `Unknown`. `None` keeps the upstream default (50s).
    pub node_monitor_grace_period: Option<Duration>,
    /// Extra kube-apiserver flags (`--flag=value`).
    pub extra_apiserver_args: Vec<String>,
    /// Extra kube-controller-manager flags (`--flag=value`).
    pub extra_controller_manager_args: Vec<String>,
    /// How much of Dynamic Resource Allocation runs (see [`Dra`]).
    pub dra: Dra,
    /// How long to wait for every component to be ready.
    pub start_timeout: Duration,
    /// Keep the data directory (etcd data, logs, certificates) after `stop`, for debugging.
    pub keep_data_dir: bool,
}

impl Default for ControlPlaneOptions {
    fn default() -> Self {
        Self {
            bin_dir: None,
            controllers: DEFAULT_CONTROLLERS.iter().map(|&c| c.to_owned()).collect(),
            component_qps: 500,
            node_monitor_grace_period: None,
            extra_apiserver_args: Vec::new(),
            extra_controller_manager_args: Vec::new(),
            dra: Dra::Off,
            start_timeout: Duration::from_secs(120),
            keep_data_dir: false,
        }
    }
}

impl StartControlPlaneError {
    /// Whether a component exited because its port was already in use.
    #[must_use]
    pub fn is_port_taken(&self) -> bool {
        matches!(self, Self::ComponentExited { log_tail, .. } if log_tail.contains("address already in use"))
    }
}

/// A running control plane. Stop it with [`ControlPlane::stop`]; if it is dropped or leaked
/// instead (a static, a panic, a killed process), its components still terminate.
#[derive(Debug)]
pub struct ControlPlane {
    data_dir: PathBuf,
    bin_dir: PathBuf,
    server_url: String,
    kubeconfig_path: PathBuf,
    ca_cert_der: Vec<u8>,
    admin_token: String,
    /// The Kubernetes release its binaries are (`kube-apiserver --version`): which flags a feature
    /// needs depends on its minor.
    release: binaries::Release,
    /// In start order; stopped in reverse.
    processes: Vec<OwnedProcess>,
    keep_data_dir: bool,
}

impl ControlPlane {
    /// Starts etcd, kube-apiserver, kube-controller-manager and kube-scheduler and waits until the
    /// API answers `/readyz`, both controllers hold their leader leases, and the `default`
    /// service account exists (so pods can be created).
    ///
    /// Ports are picked free but released before the components bind them, so another process can
    /// take one in between; a start that fails that way is retried on new ports (twice at most).
    pub async fn start(options: ControlPlaneOptions) -> Result<Self, StartControlPlaneError> {
        let mut attempt = 1;
        loop {
            match Self::start_once(&options).await {
                Err(e) if attempt < 3 && e.is_port_taken() => {
                    tracing::warn!(attempt, error = %e, "a control plane port was taken; retrying");
                    attempt += 1;
                }
                result => return result,
            }
        }
    }

    async fn start_once(options: &ControlPlaneOptions) -> Result<Self, StartControlPlaneError> {
        let started = Instant::now();
        let deadline = started + options.start_timeout;
        let bin_dir = match &options.bin_dir {
            Some(dir) => binaries::check(dir)?,
            None => binaries::locate()?,
        };
        let release = binaries::release(&bin_dir)?;
        let layout = Layout::prepare()?;
        let ca_cert_der =
            std::fs::read(&layout.pki.ca_cert_der).map_err(dir_error(&layout.pki.ca_cert_der))?;
        let mut control_plane = Self {
            data_dir: layout.data_dir.clone(),
            bin_dir,
            server_url: layout.server_url.clone(),
            kubeconfig_path: layout.kubeconfig.clone(),
            ca_cert_der,
            admin_token: layout.admin_token.clone(),
            release,
            processes: Vec::new(),
            keep_data_dir: options.keep_data_dir,
        };
        if let Err(e) = control_plane
            .start_components(&layout, options, deadline, started)
            .await
        {
            // Terminates what already runs and removes the data directory.
            control_plane.stop().await;
            return Err(e);
        }
        tracing::info!(
            server = %layout.server_url,
            kubeconfig = %layout.kubeconfig.display(),
            elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            "control plane ready"
        );
        Ok(control_plane)
    }

    async fn start_components(
        &mut self,
        layout: &Layout,
        options: &ControlPlaneOptions,
        deadline: Instant,
        started: Instant,
    ) -> Result<(), StartControlPlaneError> {
        self.start_etcd(layout, deadline, started).await?;
        self.start_apiserver(layout, options, deadline, started).await?;
        self.start_controllers(layout, options)?;
        self.wait_for_controllers(deadline, started).await
    }

    async fn start_etcd(
        &mut self,
        layout: &Layout,
        deadline: Instant,
        started: Instant,
    ) -> Result<(), StartControlPlaneError> {
        let etcd_url = layout.etcd_url();
        let peer_url = format!("http://127.0.0.1:{}", layout.ports.etcd_peer);
        self.spawn(
            "etcd",
            &[
                "--name=sandbox".into(),
                format!("--data-dir={}", display(&layout.data_dir.join("etcd"))),
                format!("--listen-client-urls={etcd_url}"),
                format!("--advertise-client-urls={etcd_url}"),
                format!("--listen-peer-urls={peer_url}"),
                format!("--initial-advertise-peer-urls={peer_url}"),
                format!("--initial-cluster=sandbox={peer_url}"),
                // A throw-away cluster: durability buys nothing and fsync costs a lot.
                "--unsafe-no-fsync=true".into(),
                "--log-level=warn".into(),
            ],
        )?;
        let etcd_addr: SocketAddr = ([127, 0, 0, 1], layout.ports.etcd_client).into();
        self.wait_for("etcd", deadline, started, || async move {
            TcpStream::connect_timeout(&etcd_addr, Duration::from_millis(200))
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
        .await
    }

    async fn start_apiserver(
        &mut self,
        layout: &Layout,
        options: &ControlPlaneOptions,
        deadline: Instant,
        started: Instant,
    ) -> Result<(), StartControlPlaneError> {
        let pki = &layout.pki;
        let mut args = vec![
            format!("--etcd-servers={}", layout.etcd_url()),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--secure-port={}", layout.ports.apiserver),
            format!("--tls-cert-file={}", display(&pki.serving_cert)),
            format!("--tls-private-key-file={}", display(&pki.serving_key)),
            format!("--client-ca-file={}", display(&pki.ca_cert)),
            format!("--token-auth-file={}", display(&layout.token_file)),
            // As a kubeadm cluster: a kubelet's certificate may touch only its own Node and what
            // is bound to it (the attacker's reach in e2e/tests/attacker_node.rs).
            "--authorization-mode=Node,RBAC".into(),
            "--enable-admission-plugins=NodeRestriction".into(),
            "--anonymous-auth=false".into(),
            format!("--service-account-issuer={}", layout.server_url),
            format!("--service-account-key-file={}", display(&pki.service_account_pub)),
            format!(
                "--service-account-signing-key-file={}",
                display(&pki.service_account_key)
            ),
            "--service-cluster-ip-range=10.0.0.0/24".into(),
            "--allow-privileged=true".into(),
            // Without a front-proxy CA, kube-controller-manager and kube-scheduler log an error
            // about the missing request-header bundle every few seconds. Nothing here holds a
            // client certificate named front-proxy-client, so this trusts no one new.
            format!("--requestheader-client-ca-file={}", display(&pki.ca_cert)),
            "--requestheader-allowed-names=front-proxy-client".into(),
            "--requestheader-username-headers=X-Remote-User".into(),
            "--requestheader-group-headers=X-Remote-Group".into(),
            "--requestheader-extra-headers-prefix=X-Remote-Extra-".into(),
            // Nobody dials the advertised address, and a loopback endpoint only produces warnings.
            "--endpoint-reconciler-type=none".into(),
        ];
        let dra = options.dra;
        args.extend(
            dra.feature_gates(self.release.minor)
                .into_iter()
                .chain(dra.runtime_config(self.release.minor))
                .map(str::to_owned),
        );
        args.extend(options.extra_apiserver_args.iter().cloned());
        self.spawn("kube-apiserver", &args)?;
        self.wait_apiserver_ready("kube-apiserver /readyz", deadline, started)
            .await
    }

    fn start_controllers(
        &mut self,
        layout: &Layout,
        options: &ControlPlaneOptions,
    ) -> Result<(), StartControlPlaneError> {
        let pki = &layout.pki;
        let qps = options.component_qps;
        let mut kcm_args = component_args(layout, layout.ports.controller_manager, "kcm", qps);
        kcm_args.extend([
            "--use-service-account-credentials=true".into(),
            format!(
                "--service-account-private-key-file={}",
                display(&pki.service_account_key)
            ),
            format!("--root-ca-file={}", display(&pki.ca_cert)),
            format!(
                "--controllers={}",
                options
                    .controllers
                    .iter()
                    .map(String::as_str)
                    .chain(options.dra.controllers().iter().copied())
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        ]);
        if let Some(grace) = options.node_monitor_grace_period {
            kcm_args.push(format!("--node-monitor-grace-period={}ms", grace.as_millis()));
        }
        kcm_args.extend(options.dra.feature_gates(self.release.minor).map(str::to_owned));
        kcm_args.extend(options.extra_controller_manager_args.iter().cloned());
        self.spawn("kube-controller-manager", &kcm_args)?;
        let mut scheduler_args = component_args(layout, layout.ports.scheduler, "scheduler", qps);
        scheduler_args.extend(options.dra.feature_gates(self.release.minor).map(str::to_owned));
        self.spawn("kube-scheduler", &scheduler_args)?;
        Ok(())
    }

    /// Waits until the API server answers `/readyz` with `ok` (see [`Self::wait_for`]).
    async fn wait_apiserver_ready(
        &mut self,
        what: &'static str,
        deadline: Instant,
        started: Instant,
    ) -> Result<(), StartControlPlaneError> {
        let admin = self.try_client().map_err(StartControlPlaneError::Client)?;
        self.wait_for(what, deadline, started, || {
            let client = admin.clone();
            async move {
                let request = http::Request::get("/readyz")
                    .body(Vec::new())
                    .map_err(|e| e.to_string())?;
                match client.request_text(request).await {
                    Ok(body) if body.trim() == "ok" => Ok(()),
                    Ok(body) => Err(body),
                    Err(e) => Err(e.to_string()),
                }
            }
        })
        .await
    }

    /// Both hold their leader lease once their controllers run; the `default` service account
    /// proves the service account controller works (pods cannot be created without it).
    async fn wait_for_controllers(
        &mut self,
        deadline: Instant,
        started: Instant,
    ) -> Result<(), StartControlPlaneError> {
        let admin = self.try_client().map_err(StartControlPlaneError::Client)?;
        for (what, lease) in [
            ("kube-controller-manager leader lease", "kube-controller-manager"),
            ("kube-scheduler leader lease", "kube-scheduler"),
        ] {
            let leases: Api<Lease> = Api::namespaced(admin.clone(), "kube-system");
            self.wait_for(what, deadline, started, || {
                let leases = leases.clone();
                async move {
                    let holder = leases
                        .get_opt(lease)
                        .await
                        .map_err(|e| e.to_string())?
                        .and_then(|l| l.spec)
                        .and_then(|s| s.holder_identity);
                    holder.map(|_| ()).ok_or_else(|| "no holder yet".to_owned())
                }
            })
            .await?;
        }
        let service_accounts: Api<ServiceAccount> = Api::namespaced(admin, "default");
        self.wait_for("the default service account", deadline, started, || {
            let service_accounts = service_accounts.clone();
            async move {
                match service_accounts.get_opt("default").await {
                    Ok(Some(_)) => Ok(()),
                    Ok(None) => Err("not created yet".to_owned()),
                    Err(e) => Err(e.to_string()),
                }
            }
        })
        .await
    }

    fn spawn(&mut self, name: &str, args: &[String]) -> Result<(), SpawnComponentError> {
        let binary = self.bin_dir.join(name);
        let log = self.data_dir.join("logs").join(format!("{name}.log"));
        let process = OwnedProcess::spawn(name, &binary, args, &log)?;
        self.processes.push(process);
        Ok(())
    }

    /// Polls `probe` until it succeeds, failing early if any component has exited.
    async fn wait_for<F, Fut>(
        &mut self,
        what: &'static str,
        deadline: Instant,
        started: Instant,
        mut probe: F,
    ) -> Result<(), StartControlPlaneError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<(), String>>,
    {
        loop {
            for process in &mut self.processes {
                if let Some(status) = process.exited() {
                    return Err(StartControlPlaneError::ComponentExited {
                        name: process.name().to_owned(),
                        status,
                        log_tail: process.log_tail(30),
                    });
                }
            }
            let last_error = match probe().await {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            if Instant::now() >= deadline {
                return Err(StartControlPlaneError::NotReady {
                    what,
                    waited: started.elapsed(),
                    last_error,
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `https://127.0.0.1:<port>`.
    #[must_use]
    pub fn server_url(&self) -> &str {
        &self.server_url
    }

    /// A kubeconfig file for the admin user (group `system:masters`), for kubectl and binaries.
    #[must_use]
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig_path
    }

    /// The directory holding the control plane binaries, kubectl included.
    #[must_use]
    pub fn bin_dir(&self) -> &Path {
        &self.bin_dir
    }

    /// The Kubernetes minor it runs (`37` for v1.37.2).
    #[must_use]
    pub fn minor(&self) -> u32 {
        self.release.minor
    }

    /// The Kubernetes release it runs (`v1.37.2`).
    #[must_use]
    pub fn release(&self) -> &str {
        &self.release.name
    }

    /// The kubectl binary of the same release as the server.
    #[must_use]
    pub fn kubectl(&self) -> PathBuf {
        self.bin_dir.join("kubectl")
    }

    /// The data directory (etcd data, certificates, `logs/<component>.log`).
    #[must_use]
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// Process ids of the running components, in start order.
    #[must_use]
    pub fn component_pids(&self) -> Vec<(String, u32)> {
        self.processes
            .iter()
            .map(|p| (p.name().to_owned(), p.pid()))
            .collect()
    }

    /// Memory and CPU time of each running component, in start order.
    #[must_use]
    pub fn usage(&self) -> Vec<usage::ComponentUsage> {
        let ticks = usage::ticks_per_second();
        self.processes
            .iter()
            .filter_map(|p| usage::read(p.name(), p.pid(), ticks))
            .collect()
    }

    /// A client config for the admin user. Adjust it (e.g. `default_retry = false`, so 429s reach
    /// the caller) before turning it into a client.
    #[must_use]
    pub fn config(&self) -> kube::Config {
        self.config_with_token(&self.admin_token)
    }

    /// A client config that authenticates with `token` (e.g. a service account token).
    #[must_use]
    pub fn config_with_token(&self, token: &str) -> kube::Config {
        let url = self
            .server_url
            .parse()
            .expect("the server URL is built from a port number");
        let mut config = kube::Config::new(url);
        config.root_cert = Some(vec![self.ca_cert_der.clone()]);
        config.auth_info = serde_json::from_value(serde_json::json!({ "token": token }))
            .expect("an AuthInfo with a token deserialises");
        config
    }

    fn try_client(&self) -> Result<kube::Client, kube::Error> {
        kube::Client::try_from(self.config())
    }

    /// A new admin client. Each call builds its own connection pool, so a client never outlives
    /// the tokio runtime (e.g. one test's) that it was made in.
    ///
    /// # Panics
    /// Never in practice: the same config already built a client during start-up.
    #[must_use]
    pub fn client(&self) -> kube::Client {
        self.try_client()
            .expect("the admin config built a client during start-up")
    }

    /// A new admin client that never retries by itself: a 429 (an eviction a PDB refuses, a
    /// throttled request) reaches the caller at once instead of being retried for minutes.
    ///
    /// # Panics
    /// Never in practice: only the retry setting differs from the admin config.
    #[must_use]
    pub fn client_without_retry(&self) -> kube::Client {
        let mut config = self.config();
        config.default_retry = false;
        kube::Client::try_from(config).expect("only the retry setting differs from the admin config")
    }

    /// A new client that authenticates with `token`.
    ///
    /// # Panics
    /// Never in practice: only the token differs from the admin config.
    #[must_use]
    pub fn client_with_token(&self, token: &str) -> kube::Client {
        kube::Client::try_from(self.config_with_token(token))
            .expect("a token config differs from the admin config only in its token")
    }

    /// Stops the components in reverse start order, each with `SIGTERM` then `SIGKILL`, and removes
    /// the data directory unless asked to keep it.
    pub async fn stop(mut self) {
        while let Some(process) = self.processes.pop() {
            process.terminate().await;
        }
        if !self.keep_data_dir {
            let _ = std::fs::remove_dir_all(&self.data_dir);
        }
    }
}
/// The flags kube-controller-manager and kube-scheduler share: the admin kubeconfig for every
/// client, their secure port and certificate directory (`cert_dir` under the data directory), the
/// API rate limits and leader election.
fn component_args(layout: &Layout, port: u16, cert_dir: &str, qps: u32) -> Vec<String> {
    let kubeconfig = display(&layout.kubeconfig);
    vec![
        format!("--kubeconfig={kubeconfig}"),
        format!("--authentication-kubeconfig={kubeconfig}"),
        format!("--authorization-kubeconfig={kubeconfig}"),
        "--bind-address=127.0.0.1".into(),
        format!("--secure-port={port}"),
        format!("--cert-dir={}", display(&layout.data_dir.join(cert_dir))),
        format!("--kube-api-qps={qps}"),
        format!("--kube-api-burst={}", qps * 2),
        "--leader-elect=true".into(),
    ]
}
