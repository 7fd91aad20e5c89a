//! Where one control plane's files and ports live: its data directory (and the clean-up of those
//! whose owner is gone), its CA and tokens, the admin kubeconfig, and the free ports its components
//! bind. Prepared before any process starts.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use super::pki;
use super::start_error::StartControlPlaneError;

/// Root of every control plane's data directory. Each is named `cp-<owner pid>-<n>`, so a start
/// can remove the directories of owners that are gone.
fn data_root() -> PathBuf {
    std::env::temp_dir().join("gpu-sandbox")
}

/// The files and ports of one control plane, prepared before any process starts.
pub(super) struct Layout {
    pub(super) data_dir: PathBuf,
    pub(super) pki: pki::Pki,
    pub(super) ports: Ports,
    pub(super) server_url: String,
    pub(super) admin_token: String,
    pub(super) token_file: PathBuf,
    pub(super) kubeconfig: PathBuf,
}

pub(super) struct Ports {
    pub(super) etcd_client: u16,
    pub(super) etcd_peer: u16,
    pub(super) apiserver: u16,
    pub(super) controller_manager: u16,
    pub(super) scheduler: u16,
}

impl Layout {
    pub(super) fn prepare() -> Result<Self, StartControlPlaneError> {
        let data_dir = new_data_dir()?;
        for sub in ["pki", "etcd", "logs", "kcm", "scheduler"] {
            let path = data_dir.join(sub);
            std::fs::create_dir_all(&path).map_err(dir_error(&path))?;
        }
        let pki = pki::create(&data_dir.join("pki"))?;
        let [etcd_client, etcd_peer, apiserver, controller_manager, scheduler] = free_ports()?;
        let ports = Ports {
            etcd_client,
            etcd_peer,
            apiserver,
            controller_manager,
            scheduler,
        };
        let server_url = format!("https://127.0.0.1:{apiserver}");
        let admin_token = random_token()?;
        let token_file = data_dir.join("pki/tokens.csv");
        std::fs::write(
            &token_file,
            format!("{admin_token},gpu-sandbox-admin,gpu-sandbox-admin,\"system:masters\"\n"),
        )
        .map_err(dir_error(&token_file))?;
        let kubeconfig = data_dir.join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            kubeconfig_yaml(&server_url, &pki.ca_cert, &admin_token),
        )
        .map_err(dir_error(&kubeconfig))?;
        Ok(Self {
            data_dir,
            pki,
            ports,
            server_url,
            admin_token,
            token_file,
            kubeconfig,
        })
    }

    pub(super) fn etcd_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.ports.etcd_client)
    }
}

pub(super) fn dir_error(path: &Path) -> impl FnOnce(std::io::Error) -> StartControlPlaneError + use<> {
    let path = path.to_owned();
    move |source| StartControlPlaneError::DataDir { path, source }
}

pub(super) fn display(path: &Path) -> String {
    path.display().to_string()
}

/// Creates a fresh data directory and removes those left by owners that no longer run.
fn new_data_dir() -> Result<PathBuf, StartControlPlaneError> {
    static SEQUENCE: AtomicU32 = AtomicU32::new(0);
    let root = data_root();
    if let Ok(entries) = std::fs::read_dir(&root) {
        for entry in entries.flatten() {
            let name = entry.file_name();
            let owner = name
                .to_str()
                .and_then(|n| n.strip_prefix("cp-"))
                .and_then(|n| n.split('-').next())
                .and_then(|pid| pid.parse::<u32>().ok());
            if let Some(pid) = owner
                && !Path::new(&format!("/proc/{pid}")).exists()
            {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    let dir = root.join(format!(
        "cp-{}-{}",
        std::process::id(),
        SEQUENCE.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|source| StartControlPlaneError::DataDir {
        path: dir.clone(),
        source,
    })?;
    Ok(dir)
}

/// Reserves distinct free ports by binding them all at once, then releases them for the
/// components. Another process could take one in between; the start then fails loudly.
fn free_ports<const N: usize>() -> Result<[u16; N], StartControlPlaneError> {
    let listeners = (0..N)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .map_err(StartControlPlaneError::Port)?;
    let mut ports = [0; N];
    for (port, listener) in ports.iter_mut().zip(&listeners) {
        *port = listener
            .local_addr()
            .map_err(StartControlPlaneError::Port)?
            .port();
    }
    Ok(ports)
}

/// 32 hex characters from the kernel's random source.
fn random_token() -> Result<String, StartControlPlaneError> {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|source| StartControlPlaneError::DataDir {
            path: "/dev/urandom".into(),
            source,
        })?;
    Ok(bytes.iter().fold(String::new(), |mut hex, b| {
        use std::fmt::Write;
        let _ = write!(hex, "{b:02x}");
        hex
    }))
}

fn kubeconfig_yaml(server_url: &str, ca_cert: &Path, token: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: gpu-sandbox
  cluster:
    server: {server_url}
    certificate-authority: {ca}
users:
- name: gpu-sandbox-admin
  user:
    token: {token}
contexts:
- name: gpu-sandbox
  context:
    cluster: gpu-sandbox
    user: gpu-sandbox-admin
    namespace: default
current-context: gpu-sandbox
",
        ca = ca_cert.display()
    )
}
