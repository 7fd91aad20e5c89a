//! Every mutating API call the controller makes, each behind the leader fence: a replica whose
//! claim on the Lease is not current makes no write at all, and each write carries the claim for
//! the API server's fence policy to check (see [`crate::claim`]). Status writes are
//! preconditioned on the resourceVersion they were decided from.
//!
//! Two clients: the ordinary one, and one whose config has the default retry layer disabled, used
//! for evictions so that a 429 from a disruption budget comes back to us at once (to be recorded
//! as a blocker and retried when the budget changes) instead of being retried silently for minutes.
//!
//! A node is changed over one version of it, never blindly: `spec.taints` is an atomic list, so a
//! patch that carries our taint without a precondition would overwrite taints others added
//! meanwhile (and server-side apply would take the list's ownership). The edit is first made
//! over the node as the watch last delivered it and sent as a merge patch preconditioned on that
//! resourceVersion (see [`crate::node_patch`]): one request, no read. When the cache is behind
//! (409), or the edit is not one a patch carries, the node is read and replaced with the read's
//! resourceVersion; a conflict there means someone else wrote first, and we read again and redo
//! the edit.

use gpu_remediation_api::{
    GpuRemediation, GpuRemediationPolicy, GpuRemediationStatus,
    constants::{CLAIM_ANNOTATION, REMEDIATION_FINALIZER, field_managers},
    policy::GpuRemediationPolicyStatus,
};
use k8s_openapi::{
    api::{
        core::v1::{ObjectReference, Pod},
        policy::v1::Eviction,
    },
    apimachinery::pkg::apis::meta::v1::{DeleteOptions, Preconditions},
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams},
    runtime::events::{Event, Recorder, Reporter},
};
use serde_json::json;

use crate::{
    claim::{self, DeleteStampedError},
    drain::Leaving,
    leader::Fence,
    lifecycle::{EvictionAnswer, Words},
};

mod event_queue;
mod node_edit;
mod node_read;
mod warm;

pub use event_queue::{EVENT_CONCURRENCY, series};
use event_queue::{EventQueue, EventWriter};
pub use node_edit::{EditNodeError, NodeEdit};
pub use node_read::ReadNodeError;
pub use warm::keep_warm;

/// The clients and the fence every write goes through.
#[derive(Clone)]
pub struct KubeOps {
    client: Client,
    eviction_client: Client,
    fence: Fence,
    events: EventQueue,
}

/// A write refused by the fence or the API server.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// This replica is not (or no longer) the leader.
    #[error("not acting: {0}")]
    Fenced(#[from] crate::leader::FenceError),
    /// The API server refused or could not be reached.
    #[error(transparent)]
    Api(#[from] kube::Error),
}

impl WriteError {
    /// Whether the API server answered with a refusal (a status of its own), as opposed to the
    /// fence stopping the write or no answer at all.
    #[must_use]
    pub fn is_refusal(&self) -> bool {
        matches!(self, Self::Api(kube::Error::Api(_)))
    }

    /// The HTTP status the server answered, if it did.
    #[must_use]
    pub fn code(&self) -> Option<u16> {
        match self {
            Self::Api(kube::Error::Api(status)) => Some(status.code),
            _ => None,
        }
    }
}

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

/// Why an eviction could not even be asked (a refusal by a budget is an [`Eviction`] outcome, not
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

impl KubeOps {
    /// Builds the two clients from one configuration.
    pub fn new(config: &kube::Config, fence: Fence, reporter: Reporter) -> Result<Self, kube::Error> {
        let mut no_retry = config.clone();
        no_retry.default_retry = false;
        // No client-side retries on any write either: a retry (up to 3 on 429/503/504, ~2 s) could
        // land after the claim's deadline; a failed write is retried by the next pass, which checks
        // the fence again (issue 13).
        let client = Client::try_from(no_retry.clone())?;
        let eviction_client = Client::try_from(no_retry)?;
        let events = EventQueue::new(EventWriter::new(
            Recorder::new(client.clone(), reporter),
            fence.clone(),
        ));
        Ok(Self {
            client,
            eviction_client,
            fence,
            events,
        })
    }

    /// From two clients built elsewhere (tests use mocks); `eviction_client` must not retry 429.
    #[must_use]
    pub fn from_clients(client: Client, eviction_client: Client, fence: Fence, reporter: Reporter) -> Self {
        let events = EventQueue::new(EventWriter::new(
            Recorder::new(client.clone(), reporter),
            fence.clone(),
        ));
        Self {
            client,
            eviction_client,
            fence,
            events,
        }
    }

    /// The ordinary client, for reads.
    #[must_use]
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The fence.
    #[must_use]
    pub fn fence(&self) -> &Fence {
        &self.fence
    }

    /// Creates a remediation; an existing one of the same name (a repeated pass) is returned as is.
    pub async fn create_remediation(
        &self,
        remediation: &GpuRemediation,
    ) -> Result<GpuRemediation, CreateRemediationError> {
        let name = remediation.name_any();
        let api = Api::<GpuRemediation>::all(self.client.clone());
        let mut remediation = remediation.clone();
        let remediation = &mut remediation;
        let attempt = async {
            self.fence.check()?;
            claim::annotate(remediation, self.fence.claim().as_deref());
            match api
                .create(
                    &PostParams {
                        field_manager: Some(field_managers::CONTROLLER.into()),
                        ..PostParams::default()
                    },
                    remediation,
                )
                .await
            {
                Ok(created) => Ok(created),
                Err(kube::Error::Api(status)) if status.is_already_exists() => Ok(api.get(&name).await?),
                Err(error) => Err(WriteError::from(error)),
            }
        };
        attempt
            .await
            .map_err(|source| CreateRemediationError { name, source })
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
        let name = &stored.name_any();
        let api = Api::<GpuRemediation>::all(self.client.clone());
        let attempt = async {
            self.fence.check()?;
            let mut status = status.clone();
            status.claim = self.fence.claim().map(|claim| claim.to_string());
            let patch = json!({
                "apiVersion": GpuRemediation::api_version(&()),
                "kind": GpuRemediation::kind(&()),
                "metadata": {"resourceVersion": stored.resource_version()},
                "status": status,
            });
            crate::leader::freeze::before_write("status");
            Ok(api
                .patch_status(name, &apply_params(), &Patch::Apply(&patch))
                .await?)
        };
        attempt.await.map_err(|source| WriteStatusError {
            kind: "GpuRemediation",
            name: name.to_owned(),
            source,
        })
    }

    /// Sets a policy's status under the current claim (`status.claim`, checked by the fence policy).
    pub async fn write_policy_status(
        &self,
        policy: &GpuRemediationPolicy,
        status: &GpuRemediationPolicyStatus,
    ) -> Result<(), WriteStatusError> {
        let name = &policy.name_any();
        let api = Api::<GpuRemediationPolicy>::all(self.client.clone());
        let attempt = async {
            self.fence.check()?;
            let mut status = status.clone();
            status.claim = self.fence.claim().map(|claim| claim.to_string());
            // No resourceVersion precondition, unlike a remediation's status: the policy's status is
            // a summary the leader recomputes in full every pass, so the last current-claim write is
            // the right one, and a precondition only made the pass after each write fail with 409
            // until the watch caught up. A deposed leader's write is still refused: the fence
            // policy checks `status.claim`.
            let patch = json!({
                "apiVersion": GpuRemediationPolicy::api_version(&()),
                "kind": GpuRemediationPolicy::kind(&()),
                "status": status,
            });
            api.patch_status(name, &apply_params(), &Patch::Apply(&patch))
                .await?;
            Ok(())
        };
        attempt.await.map_err(|source| WriteStatusError {
            kind: "GpuRemediationPolicy",
            name: name.to_owned(),
            source,
        })
    }

    /// Deletes a finished remediation whose history has expired (gone already is fine), after
    /// stamping our claim on it (see [`claim::delete_stamped`]).
    pub async fn delete_remediation(&self, name: &str) -> Result<(), DeleteRemediationError> {
        let api = Api::<GpuRemediation>::all(self.client.clone());
        claim::delete_stamped(&api, name, None, &self.fence, &DeleteParams::default())
            .await
            .map(|_| ())
            .map_err(|source| DeleteRemediationError {
                name: name.to_owned(),
                source,
            })
    }

    /// Removes our finalizer from a remediation, keeping any others.
    pub async fn drop_finalizer(
        &self,
        remediation: &GpuRemediation,
    ) -> Result<Option<GpuRemediation>, DropFinalizerError> {
        let name = remediation.name_any();
        let api = Api::<GpuRemediation>::all(self.client.clone());
        let kept: Vec<&String> = remediation
            .finalizers()
            .iter()
            .filter(|f| *f != REMEDIATION_FINALIZER)
            .collect();
        let attempt = async {
            self.fence.check()?;
            // The resourceVersion makes this a compare-and-swap: a finalizer another party added
            // meanwhile is never dropped by our stale list.
            let mut metadata = json!({"finalizers": kept, "resourceVersion": remediation.resource_version()});
            if let Some(claim) = self.fence.claim() {
                metadata["annotations"] = json!({CLAIM_ANNOTATION: claim.as_ref()});
            }
            let patch = json!({"metadata": metadata});
            match api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(updated) => Ok(Some(updated)),
                Err(kube::Error::Api(status)) if status.is_not_found() => Ok(None),
                Err(error) => Err(WriteError::from(error)),
            }
        };
        attempt
            .await
            .map_err(|source| DropFinalizerError { name, source })
    }

    /// Asks the server to evict a pod through a typed `policy/v1` Eviction (so the delete options
    /// are honoured), on the client that does not retry 429. `dry_run` asks the server to check
    /// the disruption budgets without evicting.
    pub async fn evict(
        &self,
        pod: &Leaving,
        grace_period_seconds: Option<i64>,
        dry_run: bool,
    ) -> Result<EvictionAnswer, EvictPodError> {
        let api = Api::<Pod>::namespaced(self.eviction_client.clone(), &pod.namespace);
        let eviction = Eviction {
            metadata: ObjectMeta {
                name: Some(pod.name.clone()),
                namespace: Some(pod.namespace.clone()),
                // The claim the fence admission policy checks (issue 13).
                annotations: self
                    .fence
                    .claim()
                    .map(|claim| [(CLAIM_ANNOTATION.to_owned(), claim.to_string())].into()),
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
        let params = PostParams {
            dry_run,
            field_manager: None,
        };
        let attempt = async {
            self.fence.check()?;
            crate::leader::freeze::before_write("eviction");
            let answer: Result<serde_json::Value, kube::Error> = api
                .create_subresource("eviction", &pod.name, &params, &eviction)
                .await;
            // Every answer is an outcome the lifecycle records (a blocker in the server's words):
            // 429 and the two-budget 500 are expected, and so are a webhook's or a terminating
            // namespace's 403, a 422, or no answer at all.
            Ok(match answer {
                Ok(_) => EvictionAnswer::Accepted,
                Err(kube::Error::Api(status)) if status.is_not_found() || status.is_conflict() => {
                    EvictionAnswer::Gone
                }
                Err(kube::Error::Api(status)) => EvictionAnswer::Refused(status),
                Err(error) => EvictionAnswer::Unanswered(error.to_string()),
            })
        };
        attempt.await.map_err(|source| EvictPodError {
            pod: pod.key(),
            source,
        })
    }

    /// Deletes a pod directly, bypassing its budgets: only for `onTimeout: ForceDelete`. A
    /// refusal (403 without the optional force-delete role) is an answer in the server's words.
    pub async fn force_delete(
        &self,
        pod: &Leaving,
        grace_period_seconds: Option<i64>,
    ) -> Result<Result<(), Words>, DeletePodError> {
        let api = Api::<Pod>::namespaced(self.client.clone(), &pod.namespace);
        let params = DeleteParams {
            grace_period_seconds: grace_period_seconds.and_then(|g| u32::try_from(g).ok()),
            ..DeleteParams::default()
        };
        let attempt = async {
            match claim::delete_stamped(&api, &pod.name, Some(&pod.uid), &self.fence, &params).await {
                Ok(_) => Ok(Ok(())),
                Err(DeleteStampedError::Write(WriteError::Api(kube::Error::Api(status)))) => Ok(Err(Words {
                    action: format!("deleting pod {}", pod.key()),
                    code: Some(status.code),
                    message: status.message,
                })),
                Err(DeleteStampedError::KeptConflicting) => Ok(Err(Words {
                    action: format!("deleting pod {}", pod.key()),
                    code: Some(409),
                    message: "the pod kept changing between our read and our delete".to_owned(),
                })),
                Err(DeleteStampedError::Write(error)) => Err(error),
            }
        };
        attempt.await.map_err(|source| DeletePodError {
            pod: pod.key(),
            source,
        })
    }

    /// Publishes an Event about `object`. A failure is logged, not returned: an Event is a report,
    /// and a lost one must not stop a remediation.
    pub async fn publish<K: Resource<DynamicType = ()>>(&self, object: &K, event: Event) {
        self.publish_to(&object.object_ref(&()), event).await;
    }

    /// Queues `events` to be written behind the caller (see [`event_queue`]): the pass does not
    /// wait for its reports. The Events of one series go in order.
    pub async fn publish_all(&self, events: impl IntoIterator<Item = (ObjectReference, Event)>) {
        self.events.publish_all(events).await;
    }

    /// [`KubeOps::publish`], about the object `reference` names.
    pub async fn publish_to(&self, reference: &ObjectReference, event: Event) {
        self.events.writer().write(reference, event).await;
    }
}

fn apply_params() -> PatchParams {
    PatchParams::apply(field_managers::CONTROLLER).force()
}

fn post_params() -> PostParams {
    PostParams {
        dry_run: false,
        field_manager: Some(field_managers::CONTROLLER.into()),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http::{Request, Response};
    use kube::client::Body;

    use super::*;

    pub(super) type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

    pub(super) fn ops(fence: Fence) -> (KubeOps, Handle) {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(service, "default");
        let reporter = Reporter {
            controller: "test".into(),
            instance: None,
        };
        (
            KubeOps::from_clients(client.clone(), client, fence, reporter),
            handle,
        )
    }

    fn pod() -> Leaving {
        Leaving {
            namespace: "work".into(),
            name: "train-0".into(),
            uid: "uid-1".into(),
            terminating: false,
            gone_by: None,
            labels: std::collections::BTreeMap::new(),
            readiness: crate::drain::Readiness::Ready,
        }
    }

    pub(super) async fn body_json(request: Request<Body>) -> serde_json::Value {
        let bytes = request.into_body().collect_bytes().await.unwrap();
        serde_json::from_slice(&bytes).unwrap()
    }

    /// The next `count` requests, each taken before any is answered (a request sent only after an
    /// answer never comes, and the wait fails): the caller answers them.
    pub(super) async fn held_at_once(
        handle: &mut Handle,
        count: usize,
    ) -> Vec<(Request<Body>, tower_test::mock::SendResponse<Response<Body>>)> {
        let mut held = Vec::new();
        for _ in 0..count {
            let request = tokio::time::timeout(Duration::from_secs(5), handle.next_request())
                .await
                .expect("every request is sent before the first is answered")
                .expect("the client is alive");
            held.push(request);
        }
        held
    }

    pub(super) fn reply(code: u16, body: &serde_json::Value) -> Response<Body> {
        Response::builder()
            .status(code)
            .body(Body::from(serde_json::to_vec(body).unwrap()))
            .unwrap()
    }

    #[tokio::test]
    async fn a_replica_that_is_not_the_leader_sends_no_eviction() {
        let (fence, _keeper) = Fence::keeper();
        let (ops, mut handle) = ops(fence);
        let outcome = ops.evict(&pod(), None, false).await;
        assert!(
            matches!(
                outcome,
                Err(EvictPodError {
                    source: WriteError::Fenced(_),
                    ..
                })
            ),
            "{outcome:?}"
        );
        let request = tokio::time::timeout(Duration::from_millis(50), handle.next_request()).await;
        assert!(request.is_err(), "no request may reach the server");
    }

    #[tokio::test]
    async fn an_eviction_is_a_typed_policy_v1_eviction_carrying_its_delete_options() {
        let (ops, mut handle) = ops(Fence::standalone());
        let server = tokio::spawn(async move {
            let (request, respond) = handle.next_request().await.expect("one request");
            let uri = request.uri().to_string();
            let method = request.method().clone();
            let body = body_json(request).await;
            respond.send_response(reply(
                201,
                &serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}),
            ));
            (method, uri, body)
        });
        let outcome = ops.evict(&pod(), Some(15), true).await.unwrap();
        assert!(matches!(outcome, EvictionAnswer::Accepted));
        let (method, uri, body) = server.await.unwrap();
        assert_eq!(method, http::Method::POST);
        assert!(
            uri.starts_with("/api/v1/namespaces/work/pods/train-0/eviction"),
            "{uri}"
        );
        assert!(uri.contains("dryRun=All"), "{uri}");
        assert_eq!(body["apiVersion"], "policy/v1");
        assert_eq!(body["kind"], "Eviction");
        assert_eq!(body["deleteOptions"]["gracePeriodSeconds"], 15);
        assert_eq!(body["deleteOptions"]["preconditions"]["uid"], "uid-1");
        assert_eq!(body["deleteOptions"]["dryRun"], serde_json::json!(["All"]));
    }

    #[tokio::test]
    async fn a_refusal_by_a_budget_comes_back_at_once_with_the_servers_words() {
        let (ops, mut handle) = ops(Fence::standalone());
        let refusal = serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 429, "reason": "TooManyRequests",
            "message": "Cannot evict pod as it would violate the pod's disruption budget.",
            "details": {"causes": [{"reason": "DisruptionBudget", "message": "The disruption budget web needs 3 healthy pods and has 3 currently"}]},
        });
        let server = tokio::spawn(async move {
            let (_, respond) = handle.next_request().await.expect("one request");
            respond.send_response(reply(429, &refusal));
            // The refusal is the caller's to record: nothing here asks again (the real eviction client
            // also has kube's retry layer off; the e2e Blocked test shows 429s arrive at once).
            tokio::time::timeout(Duration::from_millis(300), handle.next_request())
                .await
                .is_err()
        });
        let outcome = ops.evict(&pod(), None, false).await.unwrap();
        let EvictionAnswer::Refused(status) = outcome else {
            panic!("expected a refusal, got {outcome:?}")
        };
        assert_eq!(status.code, 429);
        assert_eq!(crate::drain::budget_named_in(&status).as_deref(), Some("web"));
        assert!(server.await.unwrap(), "the refused eviction was asked only once");
    }
}
