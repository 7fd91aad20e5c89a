//! The writes to pods a drain makes: the checkpoint notice (one annotation, on the pod of that
//! UID), an eviction (a typed `policy/v1` Eviction, so its delete options are honoured, on the
//! client that does not retry 429) and, only under `onTimeout: ForceDelete`, a direct delete.

use k8s_openapi::{
    api::{core::v1::Pod, policy::v1::Eviction},
    apimachinery::pkg::apis::meta::v1::{DeleteOptions, Preconditions},
};
use kube::api::{DeleteParams, ObjectMeta, PostParams};

use super::{DeleteStampedError, Verb, WriteError, Writer};
use crate::{
    drain::Leaving,
    lifecycle::{EvictionAnswer, Words},
    read::{Scope, api},
};

/// Why an eviction could not even be asked (a refusal by a budget is an [`EvictionAnswer`], not
/// an error).
#[derive(Debug, thiserror::Error)]
#[error("evicting pod {pod} failed: {source}")]
pub struct EvictPodError {
    /// The pod, `namespace/name`.
    pub pod: String,
    /// What went wrong.
    #[source]
    pub source: WriteError,
}

/// Why force-deleting a pod failed.
#[derive(Debug, thiserror::Error)]
#[error("deleting pod {pod} failed: {source}")]
pub struct DeletePodError {
    /// The pod, `namespace/name`.
    pub pod: String,
    /// What went wrong.
    #[source]
    pub source: WriteError,
}

impl Writer {
    /// Gives `pod` the checkpoint notice: the `gpuremediation.dev/evict-at` annotation, the time
    /// its eviction comes (whole seconds, RFC 3339), by a merge patch that carries the pod's UID
    /// (a precondition: a new pod that took the name is never touched). `Ok(false)`: the pod is
    /// gone.
    pub async fn notice(&self, pod: &Leaving, evict_at: jiff::Timestamp) -> Result<bool, WriteError> {
        let at = jiff::Timestamp::from_second(evict_at.as_second()).unwrap_or(evict_at);
        let patch = serde_json::json!({"metadata": {
            "uid": pod.uid,
            "annotations": {gpu_remediation_api::constants::EVICT_AT_ANNOTATION: at.to_string()},
        }});
        match self
            .patch::<Pod>(&(), Scope::Namespace(&pod.namespace), &pod.name, patch)
            .await
        {
            Ok(_) => Ok(true),
            Err(error) if error.code() == Some(404) => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// Asks the server to evict a pod through a typed `policy/v1` Eviction (so the delete options
    /// are honoured), on the client that does not retry 429. `dry_run` asks the server to check
    /// the disruption budgets without evicting. Every answer is an outcome the lifecycle records
    /// (a blocker in the server's words): 429 and the two-budget 500 are expected, and so are a
    /// webhook's or a terminating namespace's 403, a 422, or no answer at all.
    pub async fn evict(
        &self,
        pod: &Leaving,
        grace_period_seconds: Option<i64>,
        dry_run: bool,
    ) -> Result<EvictionAnswer, EvictPodError> {
        let pods = api::<Pod>(&self.eviction_client, Scope::Namespace(&pod.namespace), &());
        let params = PostParams {
            dry_run,
            field_manager: None,
        };
        let answer = self
            .send(Verb::Evict, "pods", |stamp| {
                let mut eviction = Eviction {
                    metadata: ObjectMeta {
                        name: Some(pod.name.clone()),
                        namespace: Some(pod.namespace.clone()),
                        ..ObjectMeta::default()
                    },
                    delete_options: Some(DeleteOptions {
                        grace_period_seconds,
                        preconditions: Some(Preconditions {
                            uid: Some(pod.uid.clone()),
                            resource_version: None,
                        }),
                        dry_run: dry_run.then(|| vec!["All".to_owned()]),
                        ..DeleteOptions::default()
                    }),
                };
                // The claim the fence admission policy checks (issue 13), and the label that has
                // it refuse the eviction while the Lease is missing.
                stamp.annotate(&mut eviction);
                async move {
                    pods.create_subresource::<_, serde_json::Value>("eviction", &pod.name, &params, &eviction)
                        .await
                }
            })
            .await;
        Ok(match answer {
            Ok(_) => EvictionAnswer::Accepted,
            Err(WriteError::Api(kube::Error::Api(status)))
                if status.is_not_found() || status.is_conflict() =>
            {
                EvictionAnswer::Gone
            }
            Err(WriteError::Api(kube::Error::Api(status))) => EvictionAnswer::Refused(status),
            Err(WriteError::Api(error)) => EvictionAnswer::Unanswered(error.to_string()),
            Err(source @ WriteError::Fenced(_)) => {
                return Err(EvictPodError {
                    pod: pod.key(),
                    source,
                });
            }
        })
    }

    /// Deletes a pod directly, bypassing its budgets: only for `onTimeout: ForceDelete`. A
    /// refusal (403 without the optional force-delete role) is an answer in the server's words.
    pub async fn force_delete(
        &self,
        pod: &Leaving,
        grace_period_seconds: Option<i64>,
    ) -> Result<Result<(), Words>, DeletePodError> {
        let params = DeleteParams {
            grace_period_seconds: grace_period_seconds.and_then(|g| u32::try_from(g).ok()),
            ..DeleteParams::default()
        };
        let deleted = self
            .delete_stamped::<Pod>(
                &(),
                Scope::Namespace(&pod.namespace),
                &pod.name,
                Some(&pod.uid),
                &params,
            )
            .await;
        match deleted {
            Ok(_) => Ok(Ok(())),
            Err(DeleteStampedError::Write(WriteError::Api(kube::Error::Api(status)))) => Ok(Err(
                Words::answered(format!("deleting pod {}", pod.key()), status.code, status.message),
            )),
            Err(DeleteStampedError::KeptConflicting) => Ok(Err(Words::answered(
                format!("deleting pod {}", pod.key()),
                409,
                "the pod kept changing between our read and our delete".to_owned(),
            ))),
            Err(DeleteStampedError::Write(source)) => Err(DeletePodError {
                pod: pod.key(),
                source,
            }),
        }
    }
}
