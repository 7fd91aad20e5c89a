//! `Template`: create the policy's template object for the remediation (rendered by
//! [`super::template::render`]) and follow what it reports. Resolving the kind by discovery
//! gives its plural and scope, so any kind works.

use futures::{FutureExt as _, TryFutureExt as _, future::BoxFuture};
use gpu_remediation_api::{GpuRemediation, object_reference::ObjectReference, policy::Replacement};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::{
    api::{ApiResource, DynamicObject},
    core::{GroupVersion, GroupVersionKind},
    discovery::Scope,
};

use crate::{
    read::{ReadApi, Scope as ReadScope},
    write::WriteError,
};

use super::{
    Kube, ObserveReplacementError, Replace, TriggerReplacementError, Triggered, node_presence, presence,
    template::{self, render},
    verify::{Observation, Presence, ReplacementNode, Reported},
};

/// The `Template` strategy.
pub struct CreateTemplate {
    kube: Kube,
}

/// The reads of the object: namespaced or not, as discovery says.
fn api_for(
    kube: &Kube,
    resource: &ApiResource,
    scope: &Scope,
    namespace: Option<&str>,
) -> ReadApi<DynamicObject> {
    match (scope, namespace) {
        (Scope::Namespaced, Some(namespace)) => kube.reader.api(ReadScope::Namespace(namespace), resource),
        _ => kube.reader.api(ReadScope::Cluster, resource),
    }
}

impl CreateTemplate {
    pub(crate) fn new(kube: Kube) -> Self {
        Self { kube }
    }

    async fn resolve(
        &self,
        api_version: &str,
        kind: &str,
    ) -> Result<Option<(ApiResource, Scope)>, kube::Error> {
        let Ok(group_version) = api_version.parse::<GroupVersion>() else {
            return Ok(None);
        };
        let gvk = GroupVersionKind::gvk(&group_version.group, &group_version.version, kind);
        match self.kube.reader.pinned_kind(&gvk).await {
            Ok((resource, capabilities)) => Ok(Some((resource, capabilities.scope))),
            Err(kube::Error::Discovery(_)) => Ok(None),
            Err(kube::Error::Api(status)) if status.is_not_found() => Ok(None),
            Err(error) => Err(error),
        }
    }

    async fn create(
        &self,
        remediation: &GpuRemediation,
        replacement: &Replacement,
    ) -> Result<ObjectReference, TriggerReplacementError> {
        let rendered = render(replacement.template.as_ref(), remediation)?;
        let not_served = || TriggerReplacementError::KindNotServed {
            group: rendered.api_version.clone(),
            kind: rendered.kind.clone(),
        };
        let (resource, scope) = self
            .resolve(&rendered.api_version, &rendered.kind)
            .await
            .map_err(|source| TriggerReplacementError::Api {
                action: format!("discovering {} {}", rendered.api_version, rendered.kind),
                source,
            })?
            .ok_or_else(not_served)?;
        match (&scope, &rendered.namespace) {
            (Scope::Namespaced, None) => {
                return Err(TriggerReplacementError::TemplateNeedsNamespace { kind: rendered.kind });
            }
            (Scope::Cluster, Some(_)) => {
                return Err(TriggerReplacementError::TemplateNamespaceNotAllowed { kind: rendered.kind });
            }
            _ => {}
        }
        let api = api_for(&self.kube, &resource, &scope, rendered.namespace.as_deref());
        let shown_name = match &rendered.namespace {
            Some(namespace) => format!("{namespace}/{}", rendered.name),
            None => rendered.name.clone(),
        };
        let mut object: DynamicObject = serde_json::from_value(rendered.object.clone())
            .map_err(|_| TriggerReplacementError::Template(template::RenderTemplateError::NotAnObject))?;
        object.metadata.namespace.clone_from(&rendered.namespace);
        let created = match self.kube.writer.create(&resource, &object).await {
            Ok(created) => created,
            Err(WriteError::Fenced(fenced)) => return Err(fenced.into()),
            Err(WriteError::Api(kube::Error::Api(status))) if status.is_already_exists() => {
                // A retry: the object is ours if its controlling owner is this remediation.
                let existing =
                    api.get(&rendered.name)
                        .await
                        .map_err(|source| TriggerReplacementError::Api {
                            action: format!("reading {} {shown_name}", rendered.kind),
                            source,
                        })?;
                let ours = existing.metadata.owner_references.iter().flatten().any(|owner| {
                    owner.controller == Some(true)
                        && owner.uid.as_str() == remediation.metadata.uid.as_deref().unwrap_or_default()
                });
                if !ours {
                    return Err(TriggerReplacementError::TemplateNameTaken {
                        kind: rendered.kind,
                        name: shown_name,
                    });
                }
                existing
            }
            Err(WriteError::Api(source)) => {
                return Err(TriggerReplacementError::Api {
                    action: format!("creating {} {shown_name}", rendered.kind),
                    source,
                });
            }
        };
        Ok(ObjectReference {
            api_version: rendered.api_version,
            kind: rendered.kind,
            name: rendered.name,
            namespace: rendered.namespace,
            uid: created.metadata.uid,
        })
    }

    async fn look(
        &self,
        remediation: &GpuRemediation,
        reference: &ObjectReference,
        triggered_at: Timestamp,
    ) -> Result<Observation, ObserveReplacementError> {
        let read_error = |action: String| move |source| ObserveReplacementError::Api { action, source };
        let nodes: ReadApi<Node> = self.kube.reader.api(ReadScope::Cluster, &());
        let node = nodes
            .get_opt(&remediation.spec.node_name)
            .await
            .map_err(read_error(format!("reading node {}", remediation.spec.node_name)))?;
        let node = node_presence(
            node.as_ref().map(|node| &node.metadata),
            remediation.spec.node_uid.as_deref(),
            triggered_at,
        );
        let (resource, scope) = self
            .resolve(&reference.api_version, &reference.kind)
            .await
            .map_err(read_error(format!(
                "discovering {} {}",
                reference.api_version, reference.kind
            )))?
            .ok_or_else(|| ObserveReplacementError::KindNotServed {
                api_version: reference.api_version.clone(),
                kind: reference.kind.clone(),
            })?;
        let api = api_for(&self.kube, &resource, &scope, reference.namespace.as_deref());
        let object = api.get_opt(&reference.name).await.map_err(read_error(format!(
            "reading {} {}",
            reference.kind, reference.name
        )))?;
        let target = presence(
            object.as_ref().map(|object| &object.metadata),
            reference.uid.as_deref(),
        );
        let reported = match (&object, target) {
            (Some(object), Presence::Present | Presence::Deleting) => {
                template::report(object.data.get("status"))
            }
            _ => Reported::InProgress,
        };
        Ok(Observation {
            target,
            node,
            reported,
            replacement: ReplacementNode::NotExpected,
        })
    }
}

impl Replace for CreateTemplate {
    fn trigger<'a>(
        &'a self,
        remediation: &'a GpuRemediation,
        replacement: &'a Replacement,
    ) -> BoxFuture<'a, Result<Triggered, TriggerReplacementError>> {
        self.create(remediation, replacement)
            .map_ok(Triggered::from)
            .boxed()
    }

    fn observe<'a>(
        &'a self,
        remediation: &'a GpuRemediation,
        reference: &'a ObjectReference,
        triggered_at: Timestamp,
    ) -> BoxFuture<'a, Result<Observation, ObserveReplacementError>> {
        self.look(remediation, reference, triggered_at).boxed()
    }
}
