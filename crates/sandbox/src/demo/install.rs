//! Installing the project's own kustomize base (`manifests/`) on a sandbox, as `kubectl apply -k`
//! would, and acting as one of its service accounts: what `make demo` and the RBAC e2e test use
//! so that the controller runs under exactly the permissions a real installation grants it.
//!
//! Workloads (`Deployment`, `DaemonSet`) are left out: in the sandbox the controller runs as a
//! local process and no real kubelet exists to run its container. Every other object (namespace,
//! CRDs, service accounts, roles and bindings, Service, PDB, `ConfigMap`) is applied.

use std::path::{Path, PathBuf};

use k8s_openapi::api::{
    authentication::v1::{TokenRequest, TokenRequestSpec},
    core::v1::ServiceAccount,
};
use kube::{
    Api, Client,
    api::{DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams, ValidationDirective},
    discovery::{self, Scope},
};
use serde_json::Value;

/// The field manager of objects this module applies.
const FIELD_MANAGER: &str = "gpu-sandbox";

/// Kinds that run containers: not applied in the sandbox (see the module docs).
const WORKLOAD_KINDS: &[&str] = &["Deployment", "DaemonSet", "StatefulSet", "Job", "Pod"];

/// Why `kubectl kustomize` did not give the manifests.
#[derive(Debug, thiserror::Error)]
pub enum RenderManifestsError {
    /// kubectl could not be run.
    #[error("running {kubectl} kustomize {dir}: {source}")]
    Spawn {
        /// The kubectl binary.
        kubectl: PathBuf,
        /// The kustomization directory.
        dir: PathBuf,
        /// The IO error.
        source: std::io::Error,
    },
    /// kubectl refused the kustomization.
    #[error("kubectl kustomize {dir} failed: {stderr}")]
    Refused {
        /// The kustomization directory.
        dir: PathBuf,
        /// What kubectl said.
        stderr: String,
    },
    /// The output is not YAML objects.
    #[error("parsing the output of kubectl kustomize {dir}: {source}")]
    Parse {
        /// The kustomization directory.
        dir: PathBuf,
        /// The parse error.
        source: serde_yaml::Error,
    },
}

/// Why applying one object failed.
#[derive(Debug, thiserror::Error)]
pub enum ApplyManifestsError {
    /// The object has no apiVersion, kind or name.
    #[error("an object without apiVersion, kind or metadata.name: {0}")]
    Malformed(String),
    /// The server does not serve the object's kind.
    #[error("discovering {kind}: {source}")]
    Discover {
        /// `apiVersion/kind`.
        kind: String,
        /// The API error.
        source: kube::Error,
    },
    /// The server refused the object.
    #[error("applying {kind} {name}: {source}")]
    Apply {
        /// `apiVersion/kind`.
        kind: String,
        /// The object's name.
        name: String,
        /// The API error.
        source: kube::Error,
    },
}

/// Why a service account token could not be had.
#[derive(Debug, thiserror::Error)]
#[error("requesting a token for service account {namespace}/{name}: {source}")]
pub struct RequestTokenError {
    /// The account's namespace.
    pub namespace: String,
    /// The account's name.
    pub name: String,
    /// The API error (or a response without a token).
    pub source: kube::Error,
}

/// Renders a kustomization with `kubectl kustomize`, as `kubectl apply -k` would.
pub async fn render(kubectl: &Path, dir: &Path) -> Result<Vec<Value>, RenderManifestsError> {
    let output = tokio::process::Command::new(kubectl)
        .arg("kustomize")
        .arg(dir)
        .output()
        .await
        .map_err(|source| RenderManifestsError::Spawn {
            kubectl: kubectl.to_owned(),
            dir: dir.to_owned(),
            source,
        })?;
    if !output.status.success() {
        return Err(RenderManifestsError::Refused {
            dir: dir.to_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        });
    }
    parse_documents(&String::from_utf8_lossy(&output.stdout)).map_err(|source| RenderManifestsError::Parse {
        dir: dir.to_owned(),
        source,
    })
}

/// Every non-empty YAML document of a multi-document stream.
pub fn parse_documents(yaml: &str) -> Result<Vec<Value>, serde_yaml::Error> {
    let mut objects = Vec::new();
    for document in serde_yaml::Deserializer::from_str(yaml) {
        let value: Value = serde::Deserialize::deserialize(document)?;
        if !value.is_null() {
            objects.push(value);
        }
    }
    Ok(objects)
}

/// Whether the sandbox applies `object` (everything but workloads, see the module docs).
#[must_use]
pub fn is_applied_in_sandbox(object: &Value) -> bool {
    object["kind"]
        .as_str()
        .is_some_and(|kind| !WORKLOAD_KINDS.contains(&kind))
}

/// `kind name` of an object, for messages.
#[must_use]
pub fn describe(object: &Value) -> String {
    format!(
        "{} {}",
        object["kind"].as_str().unwrap_or("?"),
        object["metadata"]["name"].as_str().unwrap_or("?")
    )
}

/// Server-side applies each object in order (namespaces and CRDs come first in kustomize's
/// output). A CRD is applied but not waited for: callers that create its kinds wait themselves.
pub async fn apply(client: &Client, objects: &[Value]) -> Result<(), ApplyManifestsError> {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    for object in objects {
        apply_one(client, object, &params).await?;
    }
    Ok(())
}

/// Asks the server to apply each object with strict field validation as a dry run: what
/// `kubectl apply --server-side --dry-run=server` checks (schema, unknown fields, admission),
/// without changing anything. The namespaces the objects live in must exist.
pub async fn check_strictly(client: &Client, objects: &[Value]) -> Result<(), ApplyManifestsError> {
    let params = PatchParams::apply(FIELD_MANAGER)
        .force()
        .dry_run()
        .validation(ValidationDirective::Strict);
    for object in objects {
        apply_one(client, object, &params).await?;
    }
    Ok(())
}

async fn apply_one(client: &Client, object: &Value, params: &PatchParams) -> Result<(), ApplyManifestsError> {
    let malformed = || ApplyManifestsError::Malformed(object.to_string());
    let api_version = object["apiVersion"].as_str().ok_or_else(malformed)?;
    let kind = object["kind"].as_str().ok_or_else(malformed)?;
    let name = object["metadata"]["name"].as_str().ok_or_else(malformed)?;
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let described = format!("{api_version}/{kind}");
    let (resource, capabilities) =
        discovery::pinned_kind(client, &gvk)
            .await
            .map_err(|source| ApplyManifestsError::Discover {
                kind: described.clone(),
                source,
            })?;
    let api: Api<DynamicObject> = if capabilities.scope == Scope::Namespaced {
        let namespace = object["metadata"]["namespace"].as_str().unwrap_or("default");
        Api::namespaced_with(client.clone(), namespace, &resource)
    } else {
        Api::all_with(client.clone(), &resource)
    };
    api.patch(name, params, &Patch::Apply(object))
        .await
        .map_err(|source| ApplyManifestsError::Apply {
            kind: described,
            name: name.to_owned(),
            source,
        })?;
    Ok(())
}

/// A bound token of a service account (`TokenRequest`), valid for `seconds`.
pub async fn service_account_token(
    client: &Client,
    namespace: &str,
    name: &str,
    seconds: i64,
) -> Result<String, RequestTokenError> {
    let request = TokenRequest {
        spec: TokenRequestSpec {
            expiration_seconds: Some(seconds),
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    let error = |source| RequestTokenError {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        source,
    };
    let answer = Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .map_err(error)?;
    answer.status.map(|s| s.token).ok_or_else(|| {
        error(kube::Error::Service(
            "the TokenRequest answer has no status".into(),
        ))
    })
}

/// The admin kubeconfig `admin` with its user's token replaced by `token`: same server and CA,
/// another identity.
#[must_use]
pub fn kubeconfig_with_token(admin: &str, token: &str) -> Option<String> {
    let mut replaced = false;
    let lines: Vec<String> = admin
        .lines()
        .map(|line| match line.split_once("token:") {
            Some((indent, _)) if indent.trim().is_empty() => {
                replaced = true;
                format!("{indent}token: {token}")
            }
            _ => line.to_owned(),
        })
        .collect();
    replaced.then(|| lines.join("\n") + "\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workloads_are_left_out_and_everything_else_is_applied() {
        let objects = parse_documents(
            "kind: Namespace\nmetadata: {name: a}\n---\nkind: Deployment\nmetadata: {name: b}\n---\n\
             kind: ClusterRole\nmetadata: {name: c}\n---\nkind: DaemonSet\nmetadata: {name: d}\n",
        )
        .unwrap();
        let applied: Vec<String> = objects
            .iter()
            .filter(|o| is_applied_in_sandbox(o))
            .map(describe)
            .collect();
        assert_eq!(applied, ["Namespace a", "ClusterRole c"]);
    }

    #[test]
    fn empty_documents_between_separators_are_skipped() {
        let objects = parse_documents("---\nkind: A\n---\n---\nkind: B\n").unwrap();
        assert_eq!(objects.len(), 2);
    }

    #[test]
    fn the_token_of_the_kubeconfig_user_is_replaced_and_nothing_else() {
        let admin = "clusters:\n- cluster:\n    server: https://127.0.0.1:1\nusers:\n- name: admin\n  user:\n    token: secret\n";
        let replaced = kubeconfig_with_token(admin, "sa-token").unwrap();
        assert!(replaced.contains("    token: sa-token\n"), "{replaced}");
        assert!(!replaced.contains("secret"));
        assert!(replaced.contains("server: https://127.0.0.1:1"));
    }

    #[test]
    fn a_kubeconfig_without_a_token_line_is_not_rewritten() {
        assert_eq!(kubeconfig_with_token("users: []\n", "t"), None);
    }
}
