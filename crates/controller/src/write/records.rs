//! The writes of our own records: a remediation created, its status set, its finalizer dropped,
//! an expired one deleted; a policy's status set. Each is one of the writer's verbs with the
//! record's own rules (an existing remediation of the same name is the one a repeated pass
//! created; a remediation's status only over the version it was decided from).

use gpu_remediation_api::{
    GpuRemediation, GpuRemediationPolicy, GpuRemediationStatus, constants::REMEDIATION_FINALIZER,
    policy::GpuRemediationPolicyStatus,
};
use kube::{ResourceExt, api::DeleteParams};
use serde_json::json;

use super::{DeleteStampedError, WriteError, Writer};
use crate::read::Scope;

/// Why creating a remediation failed.
#[derive(Debug, thiserror::Error)]
#[error("creating remediation {name} failed: {source}")]
pub struct CreateRemediationError {
    /// The remediation's name.
    pub name: String,
    /// What went wrong.
    #[source]
    pub source: WriteError,
}

/// Why writing a status failed.
#[derive(Debug, thiserror::Error)]
#[error("writing the status of {kind} {name} failed: {source}")]
pub struct WriteStatusError {
    /// `GpuRemediation` or `GpuRemediationPolicy`.
    pub kind: &'static str,
    /// The object's name.
    pub name: String,
    /// What went wrong.
    #[source]
    pub source: WriteError,
}

/// Why deleting an expired remediation failed.
#[derive(Debug, thiserror::Error)]
#[error("deleting expired remediation {name} failed: {source}")]
pub struct DeleteRemediationError {
    /// The remediation.
    pub name: String,
    /// What went wrong.
    #[source]
    pub source: DeleteStampedError,
}

/// Why removing our finalizer failed.
#[derive(Debug, thiserror::Error)]
#[error("removing the finalizer of remediation {name} failed: {source}")]
pub struct DropFinalizerError {
    /// The remediation.
    pub name: String,
    /// What went wrong.
    #[source]
    pub source: WriteError,
}

impl Writer {
    /// Creates a remediation; an existing one of the same name (a repeated pass) is returned as is.
    pub async fn create_remediation(
        &self,
        remediation: &GpuRemediation,
    ) -> Result<GpuRemediation, CreateRemediationError> {
        let name = remediation.name_any();
        let failed = |source| CreateRemediationError {
            name: name.clone(),
            source,
        };
        match self.create(&(), remediation).await {
            Ok(created) => Ok(created),
            Err(WriteError::Api(kube::Error::Api(status))) if status.is_already_exists() => {
                let mut existing = self
                    .reader()
                    .get_opt::<GpuRemediation>(Scope::Cluster, &(), &name)
                    .await
                    .map_err(|error| failed(error.into()))?
                    .ok_or_else(|| failed(WriteError::Api(kube::Error::Api(status))))?;
                // Ours from an earlier pass whose answer was lost: laid over the cache as if just
                // written.
                Self::keep(&mut existing);
                self.record(&existing);
                Ok(existing)
            }
            Err(error) => Err(failed(error)),
        }
    }

    /// Sets the status of `stored` (server-side apply: fields we leave out are removed), only if
    /// the remediation is still the version read (its resourceVersion is the precondition): a
    /// status decided from an older version must not overwrite a newer one, such as a successor
    /// leader's phase. A conflict is an error; the next pass reads again and decides again.
    pub async fn write_remediation_status(
        &self,
        stored: &GpuRemediation,
        status: &GpuRemediationStatus,
    ) -> Result<GpuRemediation, WriteStatusError> {
        let name = stored.name_any();
        let failed = |source| WriteStatusError {
            kind: "GpuRemediation",
            name: name.clone(),
            source,
        };
        let status = serde_json::to_value(status).map_err(|e| failed(kube::Error::SerdeError(e).into()))?;
        self.apply_status(&(), &name, stored.resource_version().as_deref(), status)
            .await
            .map_err(failed)
    }

    /// Sets a policy's status under the current claim (`status.claim`, checked by the fence policy).
    pub async fn write_policy_status(
        &self,
        policy: &GpuRemediationPolicy,
        status: &GpuRemediationPolicyStatus,
    ) -> Result<(), WriteStatusError> {
        let name = policy.name_any();
        let failed = |source| WriteStatusError {
            kind: "GpuRemediationPolicy",
            name: name.clone(),
            source,
        };
        let status = serde_json::to_value(status).map_err(|e| failed(kube::Error::SerdeError(e).into()))?;
        // No resourceVersion precondition, unlike a remediation's status: the policy's status is a
        // summary the leader recomputes in full every pass, so the last current-claim write is the
        // right one, and a precondition only made the pass after each write fail with 409 until
        // the watch caught up. A deposed leader's write is still refused: the fence policy checks
        // `status.claim`.
        self.apply_status::<GpuRemediationPolicy>(&(), &name, None, status)
            .await
            .map(|_| ())
            .map_err(failed)
    }

    /// Deletes a finished remediation whose history has expired (gone already is fine), after
    /// stamping our claim on it (see [`super::claim::delete_stamped`]).
    pub async fn delete_remediation(&self, name: &str) -> Result<(), DeleteRemediationError> {
        self.delete_stamped::<GpuRemediation>(&(), Scope::Cluster, name, None, &DeleteParams::default())
            .await
            .map(|_| ())
            .map_err(|source| DeleteRemediationError {
                name: name.to_owned(),
                source,
            })
    }

    /// Removes our finalizer from a remediation, keeping any others (`None`: it is gone). A record
    /// being deleted goes once its last finalizer is dropped: it is never laid over the cache, or
    /// it would linger in the view.
    pub async fn drop_finalizer(
        &self,
        remediation: &GpuRemediation,
    ) -> Result<Option<GpuRemediation>, DropFinalizerError> {
        let name = remediation.name_any();
        let kept: Vec<&String> = remediation
            .finalizers()
            .iter()
            .filter(|f| *f != REMEDIATION_FINALIZER)
            .collect();
        // The resourceVersion makes this a compare-and-swap: a finalizer another party added
        // meanwhile is never dropped by our stale list.
        let patch =
            json!({"metadata": {"finalizers": kept, "resourceVersion": remediation.resource_version()}});
        match self
            .patch::<GpuRemediation>(&(), Scope::Cluster, &name, patch)
            .await
        {
            Ok(updated) => {
                if updated.metadata.deletion_timestamp.is_some() && updated.finalizers().is_empty() {
                    self.overlays.remediations.forget(&name);
                }
                Ok(Some(updated))
            }
            Err(WriteError::Api(kube::Error::Api(status))) if status.is_not_found() => {
                self.overlays.remediations.forget(&name);
                Ok(None)
            }
            Err(source) => Err(DropFinalizerError { name, source }),
        }
    }
}
