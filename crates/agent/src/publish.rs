//! The agent's only API server traffic: read its Node (and, on a DRA-only node, its GPU driver's
//! `ResourceSlice`s), apply the `GpuHealthy` condition on `nodes/status` by server-side apply under
//! the agent's own field manager, and publish warnings as Events regarding the Node. Thin IO; every
//! decision is made before this is called.

use gpu_remediation_api::{constants::field_managers, text::truncate};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams},
    core::GroupVersionKind,
    runtime::events::{Event, EventType, Recorder, Reporter},
};

use crate::{condition::PublishedCondition, health::WarningEvent};

/// Reading the node failed.
#[derive(Debug, thiserror::Error)]
#[error("reading node {node}: {source}")]
pub struct FetchNodeError {
    node: String,
    source: kube::Error,
}

/// Listing the node's `ResourceSlice`s failed.
#[derive(Debug, thiserror::Error)]
#[error("listing the ResourceSlices of driver {driver} on node {node}: {source}")]
pub struct FetchSlicesError {
    node: String,
    driver: String,
    source: kube::Error,
}

/// Applying the condition failed.
#[derive(Debug, thiserror::Error)]
#[error("applying condition GpuHealthy on node {node}: {source}")]
pub struct ApplyConditionError {
    node: String,
    source: kube::Error,
}

/// Publishing a warning Event failed.
#[derive(Debug, thiserror::Error)]
#[error("publishing event {reason} for node {node}: {source}")]
pub struct PublishEventError {
    node: String,
    reason: String,
    source: kube::Error,
}

/// Writes one node's condition and Events.
pub struct NodePublisher {
    nodes: Api<Node>,
    /// `resource.k8s.io/v1` `ResourceSlice`s and the DRA driver whose devices are the node's GPUs.
    slices: Option<(Api<DynamicObject>, String)>,
    node_name: String,
    recorder: Recorder,
    reference: ObjectReference,
}

impl NodePublisher {
    /// A publisher for `node_name`; `instance` names this agent in Events (its pod name).
    #[must_use]
    pub fn new(client: Client, node_name: &str, instance: Option<String>) -> Self {
        let reporter = Reporter {
            controller: field_managers::AGENT.to_owned(),
            instance,
        };
        // Events about a Node are found by kind and name, and by uid: the kubelet uses the node
        // name as the uid of its references, and so do we.
        let reference = ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some("Node".to_owned()),
            name: Some(node_name.to_owned()),
            uid: Some(node_name.to_owned()),
            ..ObjectReference::default()
        };
        Self {
            nodes: Api::all(client.clone()),
            slices: None,
            node_name: node_name.to_owned(),
            recorder: Recorder::new(client, reporter),
            reference,
        }
    }

    /// Reads the node's `ResourceSlice`s of DRA driver `driver` ([`Self::fetch_gpu_slices`]).
    #[must_use]
    pub fn with_dra_driver(mut self, driver: &str) -> Self {
        let resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("resource.k8s.io", "v1", "ResourceSlice"),
            "resourceslices",
        );
        let api = Api::all_with(self.nodes.clone().into_client(), &resource);
        self.slices = Some((api, driver.to_owned()));
        self
    }

    /// The whole GPUs the node's `ResourceSlice`s of its DRA driver list (`dra_slices::count`):
    /// `None` where no driver is configured; an error where the list failed or the slices give no
    /// trustworthy count. The server selects them by node and driver; the count checks both again.
    pub async fn count_gpu_slices(&self) -> Option<Result<Option<u32>, String>> {
        let (api, driver) = self.slices.as_ref()?;
        let params =
            ListParams::default().fields(&format!("spec.nodeName={},spec.driver={driver}", self.node_name));
        let listed = api.list(&params).await.map_err(|source| FetchSlicesError {
            node: self.node_name.clone(),
            driver: driver.clone(),
            source,
        });
        Some(match listed {
            Ok(list) => {
                let slices: Vec<serde_json::Value> = list
                    .items
                    .into_iter()
                    .filter_map(|slice| serde_json::to_value(slice).ok())
                    .collect();
                crate::dra_slices::count(&slices, &self.node_name, driver)
            }
            Err(err) => Err(err.to_string()),
        })
    }

    /// The node, as it is now.
    pub async fn fetch(&self) -> Result<Node, FetchNodeError> {
        self.nodes
            .get(&self.node_name)
            .await
            .map_err(|source| FetchNodeError {
                node: self.node_name.clone(),
                source,
            })
    }

    /// Writes the condition. `force`: the agent owns `GpuHealthy` on its node, even if another
    /// writer set it before.
    pub async fn apply(
        &self,
        condition: &PublishedCondition,
        now: Timestamp,
    ) -> Result<(), ApplyConditionError> {
        let body = condition.apply_body(&self.node_name, now);
        let params = PatchParams::apply(field_managers::AGENT).force();
        self.nodes
            .patch_status(&self.node_name, &params, &Patch::Apply(&body))
            .await
            .map(drop)
            .map_err(|source| ApplyConditionError {
                node: self.node_name.clone(),
                source,
            })
    }

    /// Publishes a warning as a `Warning` Event on the node.
    pub async fn warn(&self, warning: &WarningEvent) -> Result<(), PublishEventError> {
        self.publish(EventType::Warning, &warning.reason, &warning.message, "ProbeGpus")
            .await
    }

    /// Records a change of the condition's status as an Event on the node, so `kubectl describe
    /// node` shows when the GPUs failed or recovered: `Warning` unless the new status is `True`.
    pub async fn status_changed(&self, condition: &PublishedCondition) -> Result<(), PublishEventError> {
        let type_ = if condition.status == "True" {
            EventType::Normal
        } else {
            EventType::Warning
        };
        let note = format!("GpuHealthy={}: {}", condition.status, condition.message);
        self.publish(type_, &condition.reason, &note, "PublishCondition")
            .await
    }

    async fn publish(
        &self,
        type_: EventType,
        reason: &str,
        note: &str,
        action: &str,
    ) -> Result<(), PublishEventError> {
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(truncate(note, 1000)),
            action: action.to_owned(),
            secondary: None,
        };
        self.recorder
            .publish(&event, &self.reference)
            .await
            .map_err(|source| PublishEventError {
                node: self.node_name.clone(),
                reason: reason.to_owned(),
                source,
            })
    }
}
