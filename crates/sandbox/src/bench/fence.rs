//! The shipped fence in the bench (`gpu-bench --with-fence`): the controller runs as an
//! installation runs it, elected on a Lease in the bench namespace, and the API server refuses any
//! write of its service account that does not carry its current claim
//! (`manifests/controller/fence-policy.yaml`, moved to the bench's account and Lease). A probe, a
//! dry-run write without a claim, shows the fence in force before anything is measured.

use kube::api::{Patch, PatchParams};
use kube::{Api, Client};

use super::setup::{BenchSetupError, api_error};
use crate::demo::install;

/// The shipped fence policy and its binding.
const SHIPPED: &str = include_str!("../../../../manifests/controller/fence-policy.yaml");

/// The account the shipped policy names, and the namespace of the Lease its binding reads.
const SHIPPED_USER: &str =
    "request.userInfo.username == 'system:serviceaccount:gpu-remediation:gpu-remediator'";
const SHIPPED_LEASE_NAMESPACE: &str = "    namespace: gpu-remediation\n";
/// The fail-closed binding's selector: objects labelled with the Lease's namespace.
const SHIPPED_FENCED_LABEL: &str = "gpuremediation.dev/fenced: gpu-remediation\n";

/// The shipped policy moved to the controller account `username` and its Lease in `namespace`
/// (the Lease keeps its shipped name, `gpu-remediator`, the controller's default).
///
/// # Errors
/// The shipped policy no longer names the account or the Lease namespace as this expects.
pub fn adapted(username: &str, namespace: &str) -> Result<String, BenchSetupError> {
    let moved_from = |what: &str| {
        BenchSetupError::Step(format!(
            "manifests/controller/fence-policy.yaml no longer holds {what}: adapt bench::fence"
        ))
    };
    if !SHIPPED.contains(SHIPPED_USER) {
        return Err(moved_from(SHIPPED_USER));
    }
    // Two bindings, one paramRef each.
    if SHIPPED.matches(SHIPPED_LEASE_NAMESPACE).count() != 2 {
        return Err(moved_from("exactly two paramRef namespaces"));
    }
    Ok(SHIPPED
        .replace(
            SHIPPED_USER,
            &format!("request.userInfo.username == '{username}'"),
        )
        .replace(SHIPPED_LEASE_NAMESPACE, &format!("    namespace: {namespace}\n"))
        .replace(
            SHIPPED_FENCED_LABEL,
            &format!("gpuremediation.dev/fenced: {namespace}\n"),
        ))
}

/// Installs the fence for `username`, whose Lease is in `namespace`.
///
/// # Errors
/// The policy could not be adapted, parsed or applied.
pub async fn install(client: &Client, username: &str, namespace: &str) -> Result<(), BenchSetupError> {
    let policy = adapted(username, namespace)?;
    let objects = install::parse_documents(&policy)
        .map_err(|e| BenchSetupError::Step(format!("parsing the fence policy: {e}")))?;
    install::apply(client, &objects)
        .await
        .map_err(|e| BenchSetupError::Step(format!("applying the fence policy: {e}")))
}

/// Proves the fence in force: `controller` (the controller's identity) asks for a dry-run label
/// on `node` without a claim, and the API server must refuse it naming the fence. The refusal's
/// message.
///
/// # Errors
/// The write was admitted (the fence is not in force), or refused for another reason.
pub async fn probe(controller: &Client, node: &str) -> Result<String, BenchSetupError> {
    let params = PatchParams {
        dry_run: true,
        ..PatchParams::default()
    };
    let patch = Patch::Merge(serde_json::json!({"metadata": {"labels": {"gpu-bench/fence-probe": "1"}}}));
    match Api::<k8s_openapi::api::core::v1::Node>::all(controller.clone())
        .patch(node, &params, &patch)
        .await
    {
        Err(kube::Error::Api(status)) if status.code == 403 && status.message.contains("fenced") => {
            Ok(status.message)
        }
        Ok(_) => Err(BenchSetupError::Step(format!(
            "the fence is not in force: a dry-run write of node {node} without a claim was admitted"
        ))),
        Err(source) => Err(api_error(format!("the fence probe on node {node}"))(source)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_fence_is_moved_to_the_benchs_account_and_lease_and_nothing_else() {
        let user = "system:serviceaccount:gpu-bench:gpu-remediator";
        let policy = adapted(user, "gpu-bench").expect("adapted");
        assert!(
            policy.contains(&format!("request.userInfo.username == '{user}'")),
            "{policy}"
        );
        assert!(!policy.contains("gpu-remediation:gpu-remediator"), "{policy}");
        assert!(
            policy.contains("    name: gpu-remediator\n    namespace: gpu-bench\n"),
            "{policy}"
        );
        let objects = install::parse_documents(&policy).expect("YAML");
        let kinds: Vec<_> = objects.iter().filter_map(|o| o["kind"].as_str()).collect();
        assert_eq!(
            kinds,
            [
                "ValidatingAdmissionPolicy",
                "ValidatingAdmissionPolicyBinding",
                "ValidatingAdmissionPolicyBinding"
            ]
        );
        // Everything else as shipped: the validations, the exceptions, Deny and Audit.
        assert_eq!(
            policy.lines().count(),
            SHIPPED.lines().count(),
            "only lines were replaced"
        );
        assert!(policy.contains("validationActions: [Deny, Audit]"), "{policy}");
    }
}
