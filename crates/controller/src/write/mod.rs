//! The one writer: every change the controller makes to the cluster goes through [`Writer`], the
//! only type in the crate that holds a client able to mutate the API. It owns the write protocol,
//! once, in one private path ([`Writer::send`]):
//!
//! 1. the fence: a replica whose claim on the leader Lease is not current sends nothing;
//! 2. the claim: creates, updates and patches carry it as the `gpuremediation.dev/claim`
//!    annotation, status writes as `status.claim`, deletes stamp it first ([`claim`]), so that the
//!    API server's fence policy refuses a deposed leader's late write;
//! 3. the field manager (`gpu-remediator`);
//! 4. the bounds: what we write to our own CRDs is cut to the limits their schemas declare
//!    ([`bounds`]), so no string a node reports can make a write fail with 422;
//! 5. the request, on a client whose retry layer is off (a retry could land after the claim's
//!    deadline; the next pass retries, fence checked again);
//! 6. `managedFields` cleared on what comes back, and the object recorded in the overlay of our
//!    own writes ([`Overlays`]) so that the next pass sees it before the watch delivers it;
//! 7. the outcome counted by verb, resource and kind (`gpu_remediator_writes_total`).
//!
//! Typed verbs ([`Writer::create`], [`Writer::replace`], [`Writer::patch`],
//! [`Writer::apply_status`], [`Writer::delete_stamped`]) cover every kind; the records' and
//! pods' verbs (`records`, `pods`), node edits ([`node_edit`]) and Events ([`event_queue`]) are
//! built on them. Reads go through [`Reader`], which cannot write; the elector's Lease writes
//! ([`lease`]) and a person's approval from the CLI ([`person`]) are the two writes made without
//! a claim, by nature, and live here too so that no other module holds a mutating client; so do
//! the elector's dry-run probes of the fence ([`fence_probe`]), which carry a claim of their own.
//!
//! A node is changed over one version of it, never blindly: `spec.taints` is an atomic list, so a
//! patch that carries our taint without a precondition would overwrite taints others added
//! meanwhile (see [`node_edit`] and [`crate::node_patch`]).

use std::future::Future;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams},
    runtime::events::{Event, Recorder, Reporter},
};
use serde_json::{Value, json};

use crate::{
    leader::Fence,
    observe::overlay::Overlays,
    read::{Reader, Scope, api},
    telemetry::Metrics,
};

pub mod bounds;
pub mod claim;
mod event_queue;
pub mod fence_probe;
pub mod lease;
mod node_edit;
pub mod person;
mod pods;
mod policy_status;
#[cfg(test)]
pub(crate) mod recording;
mod records;
mod warm;
mod writable;

pub use claim::{DeleteStampedError, Deleted};
pub use event_queue::{EVENT_CONCURRENCY, series};
use event_queue::{EventQueue, EventWriter};
pub use node_edit::{EditNodeError, NodeEdit};
pub use pods::{DeletePodError, EvictPodError};
pub use records::{CreateRemediationError, DeleteRemediationError, DropFinalizerError, WriteStatusError};
pub use warm::keep_warm;
pub use writable::Writable;

/// The clients, the fence, the overlays and the counts every write goes through.
#[derive(Clone)]
pub struct Writer {
    client: Client,
    eviction_client: Client,
    fence: Fence,
    events: EventQueue,
    overlays: Overlays,
    metrics: Metrics,
    policy_status: policy_status::PolicyStatusMemory,
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

    /// Whether the API server refused the write for what it holds (400, 422: a value its schema
    /// or an admission policy does not take).
    #[must_use]
    pub fn is_invalid(&self) -> bool {
        matches!(self.code(), Some(400 | 422))
    }

    /// The HTTP status the server answered, if it did.
    #[must_use]
    pub fn code(&self) -> Option<u16> {
        match self {
            Self::Api(kube::Error::Api(status)) => Some(status.code),
            _ => None,
        }
    }

    /// What kind of failure this is, as the metrics' `kind` label: `fenced` (our fence stopped
    /// it), `conflict` (409), `not_found` (404), `forbidden` (401/403, the fence policy or RBAC),
    /// `invalid` (400/422), `throttled` (429), `timeout` (504, or no answer in time),
    /// `server` (other 5xx), `refused` (any other answer), `unreachable` (no answer).
    #[must_use]
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Fenced(_) => "fenced",
            Self::Api(error) => error_kind(error),
        }
    }
}

/// The metrics' `kind` label of a client error (see [`WriteError::metric_label`]).
#[must_use]
pub fn error_kind(error: &kube::Error) -> &'static str {
    match error {
        kube::Error::Api(status) => match status.code {
            409 => "conflict",
            404 => "not_found",
            401 | 403 => "forbidden",
            400 | 422 => "invalid",
            429 => "throttled",
            504 => "timeout",
            500..=599 => "server",
            _ => "refused",
        },
        kube::Error::SerdeError(_) | kube::Error::BuildRequest(_) => "internal",
        // No answer: the connection, TLS, the service stack.
        _ => "unreachable",
    }
}

/// The metrics' `kind` label of any error the controller counts (controller-rs's
/// `metric_label`): the first write, client, fence or timeout error along its chain of sources
/// decides; an error with none of them is `internal`.
#[must_use]
pub fn metric_label(error: &(dyn std::error::Error + 'static)) -> &'static str {
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(write) = error.downcast_ref::<WriteError>() {
            return write.metric_label();
        }
        if let Some(client) = error.downcast_ref::<kube::Error>() {
            return error_kind(client);
        }
        if error.is::<crate::leader::FenceError>() {
            return "fenced";
        }
        if error.is::<tokio::time::error::Elapsed>() {
            return "timeout";
        }
        if matches!(
            error.downcast_ref::<DeleteStampedError>(),
            Some(DeleteStampedError::KeptConflicting)
        ) || matches!(
            error.downcast_ref::<EditNodeError>(),
            Some(EditNodeError::KeptConflicting { .. })
        ) {
            return "conflict";
        }
        next = error.source();
    }
    "internal"
}

/// A write's verb, for the freeze hook, the log and the counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verb {
    Create,
    Replace,
    Patch,
    Status,
    Delete,
    Evict,
}

impl Verb {
    fn label(self) -> &'static str {
        match self {
            Self::Create => "create",
            Self::Replace => "replace",
            Self::Patch => "patch",
            Self::Status => "status",
            Self::Delete => "delete",
            Self::Evict => "evict",
        }
    }
}

fn post_params() -> PostParams {
    PostParams {
        dry_run: false,
        field_manager: Some(gpu_remediation_api::constants::field_managers::CONTROLLER.into()),
    }
}

fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(gpu_remediation_api::constants::field_managers::CONTROLLER.into()),
        ..PatchParams::default()
    }
}

fn apply_params() -> PatchParams {
    PatchParams::apply(gpu_remediation_api::constants::field_managers::CONTROLLER).force()
}

/// The server-side apply parameters of one of the controller's own field managers (see
/// [`Writer::apply_status_as`]).
#[must_use]
pub fn apply_params_of(manager: &str) -> PatchParams {
    PatchParams::apply(manager).force()
}

impl Writer {
    /// Builds the two clients from one configuration; `overlays` are the caches' (see
    /// [`crate::observe::Caches::start`]), `metrics` where the outcomes are counted.
    pub fn new(
        config: &kube::Config,
        fence: Fence,
        reporter: Reporter,
        overlays: Overlays,
        metrics: Metrics,
    ) -> Result<Self, kube::Error> {
        let mut no_retry = config.clone();
        no_retry.default_retry = false;
        // No client-side retries on any write: a retry (up to 3 on 429/503/504, ~2 s) could land
        // after the claim's deadline; a failed write is retried by the next pass, which checks the
        // fence again (issue 13). The eviction client is separate so that its 429s (a budget's
        // refusal) come back at once, to be recorded as blockers.
        let client = Client::try_from(no_retry.clone())?;
        let eviction_client = Client::try_from(no_retry)?;
        writable::warm_schemas();
        Ok(Self::from_clients(client, eviction_client, fence, reporter).with(overlays, metrics))
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
            overlays: Overlays::default(),
            metrics: Metrics::new(),
            policy_status: policy_status::PolicyStatusMemory::default(),
        }
    }

    /// A writer over one client that does not retry (tools and tests), reporting Events as
    /// `gpu-remediator`.
    #[must_use]
    pub fn over(client: Client, fence: Fence) -> Self {
        let reporter = Reporter {
            controller: gpu_remediation_api::constants::field_managers::CONTROLLER.to_owned(),
            instance: None,
        };
        Self::from_clients(client.clone(), client, fence, reporter)
    }

    /// This writer, recording into `overlays` and counting into `metrics`.
    #[must_use]
    pub fn with(mut self, overlays: Overlays, metrics: Metrics) -> Self {
        self.overlays = overlays;
        self.metrics = metrics;
        self
    }

    /// A read-only handle on the same server.
    #[must_use]
    pub fn reader(&self) -> Reader {
        Reader::new(self.client.clone())
    }

    /// The fence.
    #[must_use]
    pub fn fence(&self) -> &Fence {
        &self.fence
    }

    /// The overlays our writes are recorded in.
    #[must_use]
    pub fn overlays(&self) -> &Overlays {
        &self.overlays
    }

    /// The one path every write takes: the fence, the claim put on the request, the freeze hook
    /// (tests: a replica stopped here sends, once continued, the claim it held), the request, the
    /// outcome counted.
    async fn send<T, F, Fut>(&self, verb: Verb, resource: &str, request: F) -> Result<T, WriteError>
    where
        F: FnOnce(claim::Stamp) -> Fut,
        Fut: Future<Output = Result<T, kube::Error>>,
    {
        let outcome = if let Err(fenced) = self.fence.check() {
            Err(WriteError::Fenced(fenced))
        } else {
            let stamp = claim::Stamp {
                claim: self.fence.claim(),
                fenced: self
                    .fence
                    .lease_namespace()
                    .filter(|_| !shared_with_others(verb, resource)),
            };
            crate::leader::freeze::before_write(&freeze_name(verb, resource));
            request(stamp).await.map_err(WriteError::Api)
        };
        let kind = outcome.as_ref().err().map_or("ok", WriteError::metric_label);
        self.metrics.write(verb.label(), resource, kind);
        outcome
    }

    /// What the server returned, as we keep it: `managedFields` cleared, recorded in its overlay.
    fn keep<K: Writable>(written: &mut K) {
        written.meta_mut().managed_fields = None;
    }

    fn record<K: Writable>(&self, written: &K) {
        K::record_in(&self.overlays, written);
    }

    /// `object` cut to its CRD's bounds (see [`bounds`]); a kind that is not ours is left as it is.
    fn bounded<K: Writable>(kind: &K::DynamicType, object: &K) -> Result<K, WriteError> {
        let Some(schema) = K::schema() else {
            return Ok(object.clone());
        };
        let mut value = serde_json::to_value(object).map_err(kube::Error::SerdeError)?;
        let cuts = bounds::enforce(&mut value, schema);
        if cuts.is_empty() {
            return Ok(object.clone());
        }
        log_cuts(&K::kind(kind), &object.name_any(), &cuts);
        Ok(serde_json::from_value(value).map_err(kube::Error::SerdeError)?)
    }

    /// Creates `object` (in its namespace, if any) under our claim and field manager.
    pub async fn create<K: Writable>(&self, kind: &K::DynamicType, object: &K) -> Result<K, WriteError> {
        let api: Api<K> = api(&self.client, Scope::of(object.meta().namespace.as_deref()), kind);
        let mut object = Self::bounded(kind, object)?;
        let resource = K::plural(kind).into_owned();
        let mut created = self
            .send(Verb::Create, &resource, |stamp| {
                stamp.annotate(&mut object);
                async move { api.create(&post_params(), &object).await }
            })
            .await?;
        Self::keep(&mut created);
        self.record(&created);
        Ok(created)
    }

    /// Replaces `object` under our claim; its resourceVersion is the precondition.
    pub async fn replace<K: Writable>(&self, kind: &K::DynamicType, object: &K) -> Result<K, WriteError> {
        let api: Api<K> = api(&self.client, Scope::of(object.meta().namespace.as_deref()), kind);
        let mut object = Self::bounded(kind, object)?;
        let name = object.name_any();
        let resource = K::plural(kind).into_owned();
        let mut replaced = self
            .send(Verb::Replace, &resource, |stamp| {
                stamp.annotate(&mut object);
                async move { api.replace(&name, &post_params(), &object).await }
            })
            .await?;
        Self::keep(&mut replaced);
        self.record(&replaced);
        Ok(replaced)
    }

    /// Merge-patches object `name` under our claim (added to the patch's annotations). A patch
    /// carrying `metadata.resourceVersion` is preconditioned on it.
    pub async fn patch<K: Writable>(
        &self,
        kind: &K::DynamicType,
        scope: Scope<'_>,
        name: &str,
        mut patch: Value,
    ) -> Result<K, WriteError> {
        let api: Api<K> = api(&self.client, scope, kind);
        let resource = K::plural(kind).into_owned();
        let mut patched = self
            .send(Verb::Patch, &resource, |stamp| {
                stamp.annotate_patch(&mut patch);
                async move { api.patch(name, &patch_params(), &Patch::Merge(&patch)).await }
            })
            .await?;
        Self::keep(&mut patched);
        self.record(&patched);
        Ok(patched)
    }

    /// Sets the status of object `name` by server-side apply (fields left out are removed), under
    /// our claim (`status.claim`, on the kinds that carry it: [`Writable::CLAIM_IN_STATUS`]) and
    /// cut to the CRD's bounds; with `resource_version`, only over that version.
    pub async fn apply_status<K: Writable>(
        &self,
        kind: &K::DynamicType,
        name: &str,
        resource_version: Option<&str>,
        status: Value,
    ) -> Result<K, WriteError> {
        self.apply_status_as(kind, name, resource_version, status, &apply_params())
            .await
    }

    /// [`Self::apply_status`] under `manager`'s field manager instead of the controller's: for a
    /// part of a status the controller applies on its own (one node condition), so that applying
    /// it never drops the fields the controller's other applies own.
    pub async fn apply_status_as<K: Writable>(
        &self,
        kind: &K::DynamicType,
        name: &str,
        resource_version: Option<&str>,
        status: Value,
        params: &PatchParams,
    ) -> Result<K, WriteError> {
        let api: Api<K> = api(&self.client, Scope::Cluster, kind);
        let resource = K::plural(kind).into_owned();
        let mut status = status;
        if let Some(schema) = K::schema().and_then(|s| s.pointer("/properties/status")) {
            let cuts = bounds::enforce(&mut status, schema);
            if !cuts.is_empty() {
                log_cuts(&K::kind(kind), name, &cuts);
            }
        }
        let mut applied = self
            .send(Verb::Status, &resource, |stamp| {
                if K::CLAIM_IN_STATUS
                    && let Some(fields) = status.as_object_mut()
                {
                    match stamp.claim {
                        Some(claim) => fields.insert("claim".to_owned(), json!(claim.as_ref())),
                        None => fields.remove("claim"),
                    };
                }
                let mut patch = json!({
                    "apiVersion": K::api_version(kind),
                    "kind": K::kind(kind),
                    "status": status,
                });
                if let Some(version) = resource_version {
                    patch["metadata"] = json!({"resourceVersion": version});
                }
                async move { api.patch_status(name, params, &Patch::Apply(&patch)).await }
            })
            .await?;
        Self::keep(&mut applied);
        self.record(&applied);
        Ok(applied)
    }

    /// Deletes object `name` (only the one of `uid`, when given) so that the fence policy sees our
    /// claim: see [`claim::delete_stamped`].
    pub async fn delete_stamped<K: Writable>(
        &self,
        kind: &K::DynamicType,
        scope: Scope<'_>,
        name: &str,
        uid: Option<&str>,
        params: &DeleteParams,
    ) -> Result<Deleted, DeleteStampedError> {
        let api: Api<K> = api(&self.client, scope, kind);
        claim::delete_stamped(self, &api, name, uid, params).await
    }

    /// [`Writer::delete_stamped`] of an object read through `read` (its kind and scope).
    pub async fn delete_stamped_in<K: Writable>(
        &self,
        read: &crate::read::ReadApi<K>,
        name: &str,
        uid: Option<&str>,
        params: &DeleteParams,
    ) -> Result<Deleted, DeleteStampedError> {
        claim::delete_stamped(self, read.api(), name, uid, params).await
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

    /// [`Writer::publish`], about the object `reference` names.
    pub async fn publish_to(&self, reference: &ObjectReference, event: Event) {
        self.events.writer().write(reference, event).await;
    }
}

/// The freeze hook's name of a write (`leader::freeze`): `status` for a remediation's status,
/// `eviction`, `delete <resource>`, else `<verb> <resource>`.
/// Whether the object this write lands on is one other actors must always be able to write:
/// Nodes (the node-lifecycle controller's taints, a person's uncordon, the kubelet) and Pods (the
/// kubelet, the pod garbage collector). Those carry our claim but never the fail-closed
/// `gpuremediation.dev/fenced` label: the binding that label selects refuses every user's write
/// while the Lease is missing, so a labelled Node would stay locked, even against the
/// node-lifecycle controller, after an uninstall that left the bindings. An eviction names a Pod
/// but is an object of its own, never stored: it keeps the label, so a missing Lease still stops
/// the controller's evictions.
fn shared_with_others(verb: Verb, resource: &str) -> bool {
    verb != Verb::Evict && matches!(resource, "nodes" | "pods")
}

fn freeze_name(verb: Verb, resource: &str) -> String {
    match (verb, resource) {
        (Verb::Status, "gpuremediations") => "status".to_owned(),
        (Verb::Evict, _) => "eviction".to_owned(),
        (verb, resource) => format!("{} {resource}", verb.label()),
    }
}

fn log_cuts(kind: &str, name: &str, cuts: &[bounds::Cut]) {
    for cut in cuts {
        tracing::warn!(
            kind,
            name,
            field = %cut.path,
            was = cut.was,
            limit = cut.limit,
            "a value longer than its schema allows was cut before writing"
        );
    }
}
#[cfg(test)]
pub(crate) mod tests;
