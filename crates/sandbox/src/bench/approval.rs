//! The shipped approval policy in the bench (`gpu-bench --with-approval`): the API server checks
//! every create and update of a `GpuRemediation` against `manifests/approval/admission-policy.yaml`,
//! as shipped (it names no account or namespace, so nothing is moved). A probe, a dry-run create
//! whose approval names another user, shows the policy in force before anything is measured.

use gpu_remediation_api::constants::{APPROVED_ANNOTATION, APPROVED_BY_ANNOTATION};
use gpu_remediation_api::policy::{Action, ConditionStatus, Mode};
use gpu_remediation_api::remediation::{GpuRemediation, GpuRemediationSpec, TriggerRecord};
use kube::api::PostParams;
use kube::{Api, Client};

use super::setup::{BenchSetupError, api_error};
use crate::demo::install;

/// The shipped approval policy and its binding.
const SHIPPED: &str = include_str!("../../../../manifests/approval/admission-policy.yaml");

/// The words of the shipped policy's refusal of an approval naming someone else.
const NAMES_ITS_APPROVER: &str = "an approval names its approver";

/// Installs the shipped approval policy.
///
/// # Errors
/// The policy could not be parsed or applied.
pub async fn install(client: &Client) -> Result<(), BenchSetupError> {
    let objects = install::parse_documents(SHIPPED)
        .map_err(|e| BenchSetupError::Step(format!("parsing the approval policy: {e}")))?;
    install::apply(client, &objects)
        .await
        .map_err(|e| BenchSetupError::Step(format!("applying the approval policy: {e}")))
}

/// A remediation of `node` under `policy` whose approval names `approved_by`.
fn approved(node: &str, policy: &str, approved_by: &str) -> GpuRemediation {
    let mut record = GpuRemediation::new(
        &format!("gpu-bench-approval-probe-{node}"),
        GpuRemediationSpec {
            node_name: node.to_owned(),
            policy_name: policy.to_owned(),
            trigger: TriggerRecord {
                condition_type: "GpuHealthy".to_owned(),
                status: ConditionStatus::False,
                reason: "ApprovalProbe".to_owned(),
                message: "a dry-run create the approval policy must refuse".to_owned(),
                since: None,
            },
            action: Action::None,
            mode: Mode::Manual,
            node_uid: None,
            previous_incident: None,
            policy_snapshot: None,
            hardware: None,
        },
    );
    record.metadata.annotations = Some(
        [
            (APPROVED_ANNOTATION.to_owned(), "true".to_owned()),
            (APPROVED_BY_ANNOTATION.to_owned(), approved_by.to_owned()),
        ]
        .into(),
    );
    record
}

/// Proves the approval policy in force: `approver` (an identity that may approve: the bench binds
/// its identities to `cluster-admin`; not the controller's, which the fence would refuse first)
/// creates, as a dry run, a remediation of `node` under `policy` approved in another user's name,
/// and the API server must refuse it naming the policy's rule. The refusal's message.
///
/// # Errors
/// The create was admitted (the policy is not in force), or refused for another reason.
pub async fn probe(approver: &Client, node: &str, policy: &str) -> Result<String, BenchSetupError> {
    let params = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let record = approved(node, policy, "someone-else");
    match Api::<GpuRemediation>::all(approver.clone())
        .create(&params, &record)
        .await
    {
        Err(kube::Error::Api(status))
            if status.code == 403 && status.message.contains(NAMES_ITS_APPROVER) =>
        {
            Ok(status.message)
        }
        Ok(_) => Err(BenchSetupError::Step(format!(
            "the approval policy is not in force: a dry-run create of a remediation of {node} approved \
             in another user's name was admitted"
        ))),
        Err(source) => Err(api_error(format!("the approval probe on node {node}"))(source)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_approval_policy_is_installed_as_shipped_and_refuses_in_the_words_the_probe_expects() {
        let objects = install::parse_documents(SHIPPED).expect("YAML");
        let kinds: Vec<_> = objects.iter().filter_map(|o| o["kind"].as_str()).collect();
        assert_eq!(
            kinds,
            ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
        );
        assert!(SHIPPED.contains(NAMES_ITS_APPROVER), "{SHIPPED}");
        assert!(SHIPPED.contains("validationActions: [Deny]"), "{SHIPPED}");
    }

    #[test]
    fn the_probe_approves_in_another_users_name() {
        let record = approved("gpu-1", "scale", "someone-else");
        let annotations = record.metadata.annotations.expect("annotations");
        assert_eq!(annotations[APPROVED_ANNOTATION], "true");
        assert_eq!(annotations[APPROVED_BY_ANNOTATION], "someone-else");
        assert_eq!(record.spec.node_name, "gpu-1");
    }
}
