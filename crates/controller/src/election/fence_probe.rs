//! Whether the API server enforces the fence, judged from a probe (pure). A new leader, before its
//! first write, sends two dry-run creates through [`crate::write::fence_probe`]: one carrying a
//! stale claim, which the fence admission policy (`manifests/controller/fence-policy.yaml`) must
//! refuse, and one carrying this replica's own claim, which it must admit. Only both together
//! prove that the policy and its binding are installed, match this replica's writes and read its
//! Lease; the fence in this process ([`crate::leader::Fence`]) cannot see any of that.

/// How many unproven probes in a row a new leader takes as the answer (a fresh Lease may be
/// missing from the policy's cache for a moment, and the fence then refuses our own claim too).
pub const PATIENCE: u32 = 4;

use crate::write::fence_probe::Answer;

/// What a probe proves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The fence refused the stale claim and admitted ours.
    Enforced,
    /// Not proven, and why.
    Unproven(String),
}

/// The verdict on a probe whose stale-claim write got `stale` and own-claim write got `own`.
#[must_use]
pub fn verdict(stale: &Answer, own: &Answer) -> Verdict {
    match (stale, own) {
        (Answer::Fenced(_), Answer::Admitted) => Verdict::Enforced,
        (Answer::Admitted, _) => Verdict::Unproven(
            "a dry-run write carrying a stale claim was admitted: no fence admission policy and \
             binding act on this replica's writes (is manifests/controller/fence-policy.yaml \
             installed, for this service account and this Lease?)"
                .to_owned(),
        ),
        (Answer::Failed(why), _) | (_, Answer::Failed(why)) => {
            Verdict::Unproven(format!("the probe write failed: {why}"))
        }
        (Answer::Fenced(_), Answer::Fenced(why)) => Verdict::Unproven(format!(
            "the fence refused this replica's own claim (does the binding name another Lease?): {why}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REFUSAL: &str = "gpuremediations.gpuremediation.dev \"gpu-remediator-fence-probe\" is forbidden: \
        ValidatingAdmissionPolicy 'gpu-remediator-fence' with binding 'gpu-remediator-fence' denied \
        request: fenced: this write carries the claim a/0-stale on the leader Lease, whose current claim is a/0";

    #[test]
    fn a_fence_that_refuses_the_stale_claim_and_admits_ours_is_enforced() {
        let fenced = Answer::refused(403, REFUSAL);
        assert!(matches!(fenced, Answer::Fenced(_)));
        assert_eq!(verdict(&fenced, &Answer::Admitted), Verdict::Enforced);
    }

    #[test]
    fn a_missing_lease_refusal_is_the_fence_refusing() {
        let missing = Answer::refused(
            422,
            "gpuremediations.gpuremediation.dev \"gpu-remediator-fence-probe\" is forbidden: \
             ValidatingAdmissionPolicy 'gpu-remediator-fence' with binding \
             'gpu-remediator-fence-missing-lease' denied request: failed to configure binding: no \
             params found for policy binding with `Deny` parameterNotFoundAction",
        );
        assert!(matches!(missing, Answer::Fenced(_)));
        assert!(matches!(
            Answer::refused(422, "spec.nodeName: Required value"),
            Answer::Failed(_)
        ));
    }

    #[test]
    fn an_admitted_stale_claim_means_no_fence() {
        let Verdict::Unproven(why) = verdict(&Answer::Admitted, &Answer::Admitted) else {
            panic!("proven without a fence");
        };
        assert!(why.contains("stale claim was admitted"), "{why}");
    }

    #[test]
    fn a_refusal_by_anything_but_the_fence_proves_nothing() {
        let rbac = Answer::refused(
            403,
            "gpuremediations.gpuremediation.dev is forbidden: User cannot create",
        );
        assert!(matches!(rbac, Answer::Failed(_)));
        assert!(matches!(
            verdict(&rbac, &Answer::Admitted),
            Verdict::Unproven(why) if why.contains("cannot create")
        ));
        let other_policy = Answer::refused(403, "ValidatingAdmissionPolicy 'someone-else' denied request");
        assert!(matches!(other_policy, Answer::Failed(_)));
    }

    #[test]
    fn a_fence_that_refuses_our_own_claim_is_not_proven() {
        let fenced = Answer::refused(403, REFUSAL);
        assert!(matches!(
            verdict(&fenced, &fenced),
            Verdict::Unproven(why) if why.contains("own claim")
        ));
    }
}
