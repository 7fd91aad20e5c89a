//! `kubectl gpu approve NAME`: the decision whether a `GpuRemediation` can be approved, and the
//! patch that approves it. Pure: the record and the person's name come from the caller.
//!
//! Approval is the annotation `gpuremediation.dev/approved=true` plus
//! `gpuremediation.dev/approved-by=<username>`, the name the API server knows the caller by (a
//! `SelfSubjectReview`), so an admission policy that checks the name against
//! `request.userInfo.username` accepts it.

use gpu_remediation_api::{GpuRemediation, Phase, constants::APPROVED_ANNOTATION};
use kube::ResourceExt as _;
use serde_json::{Value, json};

/// Annotation naming the person who approved, as the API server authenticated them.
pub const APPROVED_BY_ANNOTATION: &str = "gpuremediation.dev/approved-by";

/// What `approve` does with a record.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// Apply this JSON merge patch.
    Patch(Value),
    /// Approved before (by the named person, when recorded): nothing to do.
    AlreadyApproved {
        /// `approved-by`, when the record carries it.
        by: Option<String>,
    },
}

/// Why a record cannot be approved.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{name} is {phase}: only a remediation awaiting approval (AwaitingApproval, ManualRequired, or Pending on \
     its way there) can be approved"
)]
pub struct NotAwaitingApproval {
    /// The record.
    pub name: String,
    /// Its phase.
    pub phase: Phase,
}

/// Whether `remediation` can be approved by `user`, and how.
///
/// # Errors
/// When the record is past the point where approval means anything.
pub fn decide(remediation: &GpuRemediation, user: &str) -> Result<Decision, NotAwaitingApproval> {
    let annotations = remediation.annotations();
    if crate::lifecycle::status::approved(remediation) {
        return Ok(Decision::AlreadyApproved {
            by: annotations.get(APPROVED_BY_ANNOTATION).cloned(),
        });
    }
    let phase = remediation.status.as_ref().map(|s| s.phase).unwrap_or_default();
    if !matches!(
        phase,
        Phase::Pending | Phase::AwaitingApproval | Phase::ManualRequired
    ) {
        return Err(NotAwaitingApproval {
            name: remediation.name_any(),
            phase,
        });
    }
    Ok(Decision::Patch(json!({
        "metadata": {"annotations": {APPROVED_ANNOTATION: "true", APPROVED_BY_ANNOTATION: user}}
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(phase: &str, annotations: &Value) -> GpuRemediation {
        serde_json::from_value(json!({
            "apiVersion": "gpuremediation.dev/v1alpha1", "kind": "GpuRemediation",
            "metadata": {"name": "n1-abc", "annotations": annotations},
            "spec": {"nodeName": "n1", "policyName": "p", "action": "Replace", "mode": "Manual",
                     "trigger": {"conditionType": "GpuHealthy", "status": "False"}},
            "status": {"phase": phase},
        }))
        .unwrap()
    }

    #[test]
    fn a_record_awaiting_approval_gets_both_annotations_with_the_users_name() {
        for phase in ["AwaitingApproval", "ManualRequired", "Pending"] {
            assert_eq!(
                decide(&record(phase, &json!({})), "alice@example.com"),
                Ok(Decision::Patch(json!({"metadata": {"annotations": {
                    "gpuremediation.dev/approved": "true",
                    "gpuremediation.dev/approved-by": "alice@example.com"
                }}}))),
                "{phase}"
            );
        }
    }

    #[test]
    fn an_approved_record_is_left_as_it_is_and_says_by_whom() {
        let approved = record(
            "Draining",
            &json!({"gpuremediation.dev/approved": "true", "gpuremediation.dev/approved-by": "bob"}),
        );
        assert_eq!(
            decide(&approved, "alice"),
            Ok(Decision::AlreadyApproved {
                by: Some("bob".to_owned())
            })
        );
    }

    #[test]
    fn a_record_past_approval_is_refused_naming_its_phase() {
        let error = decide(&record("Succeeded", &json!({})), "alice").unwrap_err();
        assert_eq!(error.phase, Phase::Succeeded);
        assert!(error.to_string().starts_with("n1-abc is Succeeded: "), "{error}");
    }
}
