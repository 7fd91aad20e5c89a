//! The control plane's keys and certificates, made with the `openssl` command line tool: a CA, the
//! kube-apiserver's serving certificate (for 127.0.0.1 and the in-cluster names), the service
//! account token signing key pair, and on demand a node's kubelet client certificate
//! ([`node_client_certificate`]). ECDSA P-256 keys, because they are generated in milliseconds.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Failure to create the control plane's keys and certificates.
#[derive(Debug, thiserror::Error)]
pub enum CreatePkiError {
    /// A file could not be written.
    #[error("writing {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The IO error.
        source: std::io::Error,
    },
    /// `openssl` could not be run (is it installed?).
    #[error("running openssl {step}: {source}")]
    Run {
        /// What openssl was asked to do.
        step: &'static str,
        /// The IO error.
        source: std::io::Error,
    },
    /// `openssl` ran and failed.
    #[error("openssl {step} failed: {stderr}")]
    Failed {
        /// What openssl was asked to do.
        step: &'static str,
        /// What it printed on stderr.
        stderr: String,
    },
}

/// Paths of the files [`create`] wrote.
#[derive(Debug, Clone)]
pub struct Pki {
    /// The CA certificate (PEM): trusted by clients, and the apiserver's client CA.
    pub ca_cert: PathBuf,
    /// The CA certificate (DER), as kube clients take it.
    pub ca_cert_der: PathBuf,
    /// The CA key (PEM): lets kube-controller-manager sign CSRs.
    pub ca_key: PathBuf,
    /// The kube-apiserver's serving certificate (PEM).
    pub serving_cert: PathBuf,
    /// The kube-apiserver's serving key (PEM).
    pub serving_key: PathBuf,
    /// The service account token signing key (PEM, private).
    pub service_account_key: PathBuf,
    /// The service account token verification key (PEM, public).
    pub service_account_pub: PathBuf,
}

/// The minimal OpenSSL configuration, so the system's default `openssl.cnf` (which may add its own
/// extensions) plays no part.
const CA_CONFIG: &str = "\
[req]
distinguished_name = dn
prompt = no
x509_extensions = ca
[dn]
CN = gpu-sandbox-ca
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign, digitalSignature
subjectKeyIdentifier = hash
";

const SERVING_REQ_CONFIG: &str = "\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = kube-apiserver
";

const SERVING_EXTENSIONS: &str = "\
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1, IP:10.0.0.1, DNS:localhost, DNS:kubernetes, DNS:kubernetes.default, DNS:kubernetes.default.svc, DNS:kubernetes.default.svc.cluster.local
authorityKeyIdentifier = keyid
";

/// Creates every key and certificate under `dir`.
pub fn create(dir: &Path) -> Result<Pki, CreatePkiError> {
    let pki = Pki {
        ca_cert: dir.join("ca.crt"),
        ca_cert_der: dir.join("ca.der"),
        ca_key: dir.join("ca.key"),
        serving_cert: dir.join("apiserver.crt"),
        serving_key: dir.join("apiserver.key"),
        service_account_key: dir.join("sa.key"),
        service_account_pub: dir.join("sa.pub"),
    };
    let ca_config = write(dir, "ca.cnf", CA_CONFIG)?;
    let req_config = write(dir, "apiserver-req.cnf", SERVING_REQ_CONFIG)?;
    let extensions = write(dir, "apiserver-ext.cnf", SERVING_EXTENSIONS)?;
    let csr = dir.join("apiserver.csr");

    openssl(
        "create CA",
        &[
            "req",
            "-x509",
            "-new",
            "-nodes",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-days",
            "3650",
            "-config",
            p(&ca_config),
            "-keyout",
            p(&pki.ca_key),
            "-out",
            p(&pki.ca_cert),
        ],
    )?;
    openssl(
        "convert CA to DER",
        &[
            "x509",
            "-in",
            p(&pki.ca_cert),
            "-outform",
            "der",
            "-out",
            p(&pki.ca_cert_der),
        ],
    )?;
    sign_leaf(&Leaf {
        steps: ("create serving key and request", "sign serving certificate"),
        subject: ["-config", p(&req_config)],
        extensions: &extensions,
        ca_cert: &pki.ca_cert,
        ca_key: &pki.ca_key,
        serial: None,
        days: "3650",
        key: &pki.serving_key,
        csr: &csr,
        cert: &pki.serving_cert,
    })?;
    openssl(
        "create service account key",
        &[
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-out",
            p(&pki.service_account_key),
        ],
    )?;
    openssl(
        "derive service account public key",
        &[
            "pkey",
            "-in",
            p(&pki.service_account_key),
            "-pubout",
            "-out",
            p(&pki.service_account_pub),
        ],
    )?;
    Ok(pki)
}

const CLIENT_EXTENSIONS: &str = "\
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = clientAuth
authorityKeyIdentifier = keyid
";

/// A kubelet's client certificate and key files.
#[derive(Debug, Clone)]
pub struct ClientCertificate {
    /// The certificate (PEM), signed by the control plane's CA.
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
}

/// Signs, with the CA under `pki_dir`, a client certificate for user `system:node:<node>` in group
/// `system:nodes`: the identity a kubelet's bootstrapped certificate carries, which the Node
/// authorizer and the `NodeRestriction` admission plugin confine to that node. Written under
/// `pki_dir/nodes/`.
pub fn node_client_certificate(pki_dir: &Path, node: &str) -> Result<ClientCertificate, CreatePkiError> {
    let dir = pki_dir.join("nodes");
    std::fs::create_dir_all(&dir).map_err(|source| CreatePkiError::Write {
        path: dir.clone(),
        source,
    })?;
    // Per node, so certificates minted at once (tests running in parallel) share no file.
    let extensions = write(&dir, &format!("{node}-ext.cnf"), CLIENT_EXTENSIONS)?;
    let serial = dir.join(format!("{node}.srl"));
    let certificate = ClientCertificate {
        cert: dir.join(format!("{node}.crt")),
        key: dir.join(format!("{node}.key")),
    };
    let csr = dir.join(format!("{node}.csr"));
    let subject = format!("/O=system:nodes/CN=system:node:{node}");
    sign_leaf(&Leaf {
        steps: (
            "create node client key and request",
            "sign node client certificate",
        ),
        subject: ["-subj", &subject],
        extensions: &extensions,
        ca_cert: &pki_dir.join("ca.crt"),
        ca_key: &pki_dir.join("ca.key"),
        serial: Some(&serial),
        days: "30",
        key: &certificate.key,
        csr: &csr,
        cert: &certificate.cert,
    })?;
    Ok(certificate)
}

/// A certificate signed by the CA: a fresh P-256 key and request, then the CA's signature.
struct Leaf<'a> {
    /// The two openssl steps' names, for errors: the key and request, the signature.
    steps: (&'static str, &'static str),
    /// How the request gets its subject: `-config <file>` or `-subj <name>`.
    subject: [&'a str; 2],
    /// The certificate's extensions (an `-extfile`).
    extensions: &'a Path,
    ca_cert: &'a Path,
    ca_key: &'a Path,
    /// The CA's serial file; `None`: openssl's default next to the CA certificate.
    serial: Option<&'a Path>,
    days: &'a str,
    key: &'a Path,
    csr: &'a Path,
    cert: &'a Path,
}

fn sign_leaf(leaf: &Leaf<'_>) -> Result<(), CreatePkiError> {
    let mut request = vec![
        "req",
        "-new",
        "-nodes",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
    ];
    request.extend(leaf.subject);
    request.extend(["-keyout", p(leaf.key), "-out", p(leaf.csr)]);
    openssl(leaf.steps.0, &request)?;
    let mut sign = vec![
        "x509",
        "-req",
        "-in",
        p(leaf.csr),
        "-CA",
        p(leaf.ca_cert),
        "-CAkey",
        p(leaf.ca_key),
    ];
    if let Some(serial) = leaf.serial {
        sign.extend(["-CAserial", p(serial)]);
    }
    sign.extend([
        "-CAcreateserial",
        "-days",
        leaf.days,
        "-extfile",
        p(leaf.extensions),
        "-out",
        p(leaf.cert),
    ]);
    openssl(leaf.steps.1, &sign)
}

fn p(path: &Path) -> &str {
    // Every path here is built from a UTF-8 temporary directory and ASCII names.
    path.to_str().expect("control plane paths are UTF-8")
}

fn write(dir: &Path, name: &str, text: &str) -> Result<PathBuf, CreatePkiError> {
    let path = dir.join(name);
    std::fs::write(&path, text).map_err(|source| CreatePkiError::Write {
        path: path.clone(),
        source,
    })?;
    Ok(path)
}

fn openssl(step: &'static str, args: &[&str]) -> Result<(), CreatePkiError> {
    let output = Command::new("openssl")
        .args(args)
        .output()
        .map_err(|source| CreatePkiError::Run { step, source })?;
    if output.status.success() {
        Ok(())
    } else {
        Err(CreatePkiError::Failed {
            step,
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verify(ca: &Path, cert: &Path, purpose: &str) -> String {
        let output = Command::new("openssl")
            .args(["verify", "-purpose", purpose, "-CAfile", p(ca), p(cert)])
            .output()
            .expect("openssl runs");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let subject = Command::new("openssl")
            .args(["x509", "-noout", "-subject", "-in", p(cert)])
            .output()
            .expect("openssl runs");
        String::from_utf8_lossy(&subject.stdout).into_owned()
    }

    #[test]
    fn the_serving_and_node_certificates_are_signed_by_the_ca() {
        let dir = std::env::temp_dir().join(format!("gpu-sandbox-pki-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temporary directory");
        let pki = create(&dir).expect("pki");
        let serving = verify(&pki.ca_cert, &pki.serving_cert, "sslserver");
        assert!(serving.contains("kube-apiserver"), "{serving}");
        let node = node_client_certificate(&dir, "gpu-1").expect("node certificate");
        let subject = verify(&pki.ca_cert, &node.cert, "sslclient");
        assert!(subject.contains("system:node:gpu-1"), "{subject}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
