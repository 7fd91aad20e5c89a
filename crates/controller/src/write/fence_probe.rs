//! The fence probe's writes (see `election::fence_probe`): dry-run creates of a `GpuRemediation`
//! carrying a given claim. Dry run (`dryRun=All`): the API server runs admission, the fence policy
//! included, and stores nothing, so the probe changes nothing in the cluster. Like the Lease's
//! writes (`write::lease`) they are the elector's, made before this replica may act: they carry a
//! claim chosen by the probe, not the fence's.

use std::sync::Arc;

use gpu_remediation_api::{
    GpuRemediationSpec,
    policy::{Action, ConditionStatus, Mode},
    remediation::{GpuRemediation, TriggerRecord},
};
use kube::{Api, Client, api::PostParams};

use super::claim::Stamp;

/// The name every refusal by the fence policy starts with (`ValidatingAdmissionPolicy
/// 'gpu-remediator-fence…' with binding … denied request: …`).
const FENCE_POLICY_NAME: &str = "ValidatingAdmissionPolicy 'gpu-remediator-fence";

/// The name of the probe's object (never stored).
pub const PROBE_NAME: &str = "gpu-remediator-fence-probe";

/// The probe's writes.
#[derive(Clone, Debug)]
pub struct FenceProbes {
    api: Api<GpuRemediation>,
    lease_namespace: Arc<str>,
}

impl FenceProbes {
    /// Probes through `client`, for claims on the Lease in `lease_namespace` (labelled as the
    /// writer labels what it writes, so that the fail-closed binding selects the probe too).
    #[must_use]
    pub fn new(client: Client, lease_namespace: &str) -> Self {
        Self {
            api: Api::all(client),
            lease_namespace: lease_namespace.into(),
        }
    }

    /// Sends a dry-run create carrying `claim`; says how the API server answered.
    pub async fn dry_run_create(&self, claim: &str) -> Answer {
        let mut object = GpuRemediation::new(
            PROBE_NAME,
            GpuRemediationSpec {
                node_name: PROBE_NAME.to_owned(),
                policy_name: PROBE_NAME.to_owned(),
                trigger: TriggerRecord {
                    condition_type: "FenceProbe".to_owned(),
                    status: ConditionStatus::Unknown,
                    reason: String::new(),
                    message: String::new(),
                    since: None,
                },
                action: Action::None,
                mode: Mode::Enforce,
                node_uid: None,
                previous_incident: None,
                policy_snapshot: None,
                hardware: None,
            },
        );
        // Stamped as the writer stamps what it writes (so the fail-closed binding selects the
        // probe too), with the probe's claim.
        Stamp {
            claim: Some(claim.into()),
            fenced: Some(self.lease_namespace.clone()),
        }
        .annotate(&mut object);
        let params = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        match self.api.create(&params, &object).await {
            Ok(_) => Answer::Admitted,
            Err(kube::Error::Api(status)) => Answer::refused(status.code, &status.message),
            Err(error) => Answer::Failed(error.to_string()),
        }
    }
}

/// How the API server answered one probe write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Admitted (dry run: nothing was stored).
    Admitted,
    /// Refused by the fence policy, with its message.
    Fenced(String),
    /// Failed otherwise (no permission, no such resource, a timeout), with why.
    Failed(String),
}

impl Answer {
    /// The answer an API error with `code` and `message` stands for.
    #[must_use]
    pub fn refused(code: u16, message: &str) -> Self {
        // 403 for the policy's validation; 422 when its binding cannot find the Lease (a
        // configuration error under `failurePolicy: Fail`).
        if matches!(code, 403 | 422) && message.contains(FENCE_POLICY_NAME) {
            Self::Fenced(message.to_owned())
        } else {
            Self::Failed(format!("{code}: {message}"))
        }
    }
}
