//! The replacement's acting half: the reads each strategy's builder needs (the remediated node
//! once, whatever the strategy; then its Machine, its claims or its template's kind), the builder
//! called, and its [`Plan`] handed to the one writer. Observing reads the node once too and hands
//! what was read to the strategy's pure `observe`.

use gpu_remediation_api::{
    GpuRemediation,
    object_reference::ObjectReference,
    policy::{Replacement, Strategy},
};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::{
    api::{ApiResource, DeleteParams, DynamicObject, ListParams},
    core::{GroupVersion, GroupVersionKind},
    discovery,
};
use serde_json::json;

use crate::{
    read::{Reader, Scope},
    replace::{
        ObserveReplacementError, TriggerReplacementError, Triggered, create_template, delete_machine,
        delete_node, delete_node_claim, deletion_observed, node_presence, node_reference_observed,
        plan::{Plan, Write},
        template,
        verify::{Observation, ReplacementNode},
    },
    write::{DeleteStampedError, WriteError, Writer},
};

/// The strategies' acting half, writing through the one writer.
#[derive(Clone)]
pub struct Replacers {
    writer: Writer,
    reader: Reader,
}

/// One strategy of [`Replacers`].
pub struct Replacing<'a> {
    replacers: &'a Replacers,
    strategy: Strategy,
}

impl Replacers {
    /// All strategies, writing through `writer` (and reading through its reader).
    #[must_use]
    pub fn new(writer: Writer) -> Self {
        Self {
            reader: writer.reader(),
            writer,
        }
    }

    /// The strategy `strategy`.
    #[must_use]
    pub fn for_strategy(&self, strategy: Strategy) -> Replacing<'_> {
        Replacing {
            replacers: self,
            strategy,
        }
    }
}

impl Replacing<'_> {
    /// Starts the replacement of `remediation`'s node under the policy's `replacement` settings
    /// and returns the object that carries it out (for `status.replacement`). Idempotent: a retry
    /// after a crash finds the same object, or finds it gone.
    pub async fn trigger(
        &self,
        remediation: &GpuRemediation,
        replacement: &Replacement,
    ) -> Result<Triggered, TriggerReplacementError> {
        let kube = self.replacers;
        let plan = match self.strategy {
            Strategy::DeleteNode => delete_node::plan(remediation, kube.node(remediation).await?.as_ref()),
            Strategy::DeleteMachine => {
                let node = kube.node(remediation).await?;
                match delete_machine::machine_named(remediation, node.as_ref())? {
                    delete_machine::Lookup::Done(plan) => plan,
                    delete_machine::Lookup::Machine(named, node) => {
                        let resource = kube.served_resource(delete_machine::GROUP, "Machine").await?;
                        let machine = kube
                            .reader
                            .get_opt::<DynamicObject>(
                                Scope::Namespace(&named.namespace),
                                &resource,
                                &named.name,
                            )
                            .await
                            .map_err(|source| TriggerReplacementError::Api {
                                action: format!("reading Machine {}/{}", named.namespace, named.name),
                                source,
                            })?;
                        delete_machine::plan(remediation, node, &named, &resource, machine.as_ref())?
                    }
                }
            }
            Strategy::DeleteNodeClaim => {
                let resource = kube
                    .served_resource(delete_node_claim::GROUP, "NodeClaim")
                    .await?;
                // NodeClaims offer no field selector on status.nodeName; their number is the
                // number of Karpenter nodes, and this runs once per replacement.
                let claims = kube
                    .reader
                    .list::<DynamicObject>(Scope::Cluster, &resource, &ListParams::default())
                    .await
                    .map_err(|source| TriggerReplacementError::Api {
                        action: "listing NodeClaims".to_owned(),
                        source,
                    })?;
                let node = kube.node(remediation).await?;
                delete_node_claim::plan(remediation, node.as_ref(), &resource, &claims.items)?
            }
            Strategy::Template => {
                let rendered = template::render(replacement.template.as_ref(), remediation)?;
                let (resource, scope) = kube
                    .resolve(&rendered.api_version, &rendered.kind)
                    .await
                    .map_err(|source| TriggerReplacementError::Api {
                        action: format!("discovering {} {}", rendered.api_version, rendered.kind),
                        source,
                    })?
                    .ok_or_else(|| TriggerReplacementError::KindNotServed {
                        group: rendered.api_version.clone(),
                        kind: rendered.kind.clone(),
                    })?;
                create_template::plan(rendered, &resource, &scope)?
            }
        };
        kube.apply(remediation, plan).await
    }

    /// Looks at a triggered replacement. `remediation` must be current (its annotations are read);
    /// `triggered_at` is when `Replacing` was entered.
    pub async fn observe(
        &self,
        remediation: &GpuRemediation,
        reference: &ObjectReference,
        triggered_at: Timestamp,
    ) -> Result<Observation, ObserveReplacementError> {
        let kube = self.replacers;
        let read_error = |action: String| move |source| ObserveReplacementError::Api { action, source };
        // The one read of the remediated node, whatever the strategy.
        let node_name = &remediation.spec.node_name;
        let node: Option<Node> = kube
            .reader
            .get_opt(Scope::Cluster, &(), node_name)
            .await
            .map_err(read_error(format!("reading node {node_name}")))?;
        let found = node.as_ref().map(|node| &node.metadata);
        let presence = node_presence(found, remediation.spec.node_uid.as_deref(), triggered_at);
        match self.strategy {
            // A deleted Node is replaced by whatever joins: one is always awaited (which one joined
            // is the caller's to find, in its node cache: `replace::verify::replacement_seen`).
            Strategy::DeleteNode => Ok(deletion_observed(
                found,
                reference,
                presence,
                ReplacementNode::Awaited,
            )),
            // The node was already gone when the replacement was triggered.
            Strategy::DeleteMachine | Strategy::DeleteNodeClaim if reference.kind == "Node" => {
                Ok(node_reference_observed(presence))
            }
            Strategy::DeleteMachine => {
                let resource = delete_machine::resource_of(reference);
                let namespace = reference.namespace.clone().unwrap_or_default();
                let scope = Scope::Namespace(&namespace);
                let machine: Option<DynamicObject> = kube
                    .reader
                    .get_opt(scope, &resource, &reference.name)
                    .await
                    .map_err(read_error(format!(
                        "reading Machine {namespace}/{}",
                        reference.name
                    )))?;
                let replacement = match delete_machine::selector(remediation) {
                    None => ReplacementNode::NotExpected,
                    Some(selector) => {
                        let listed = kube
                            .reader
                            .list::<DynamicObject>(scope, &resource, &ListParams::default().labels(selector))
                            .await
                            .map_err(read_error(format!("listing Machines {selector} in {namespace}")))?;
                        let seen: Vec<_> = listed.items.iter().map(delete_machine::machine_seen).collect();
                        let names =
                            delete_machine::replacement_nodes(&seen, reference.uid.as_deref(), triggered_at);
                        let mut read = Vec::new();
                        for name in names.unwrap_or_default() {
                            let new_node: Option<Node> = kube
                                .reader
                                .get_opt(Scope::Cluster, &(), &name)
                                .await
                                .map_err(read_error(format!("reading replacement node {name}")))?;
                            read.push((name, new_node));
                        }
                        delete_machine::joined(&read)
                    }
                };
                let found = machine.as_ref().map(|machine| &machine.metadata);
                Ok(deletion_observed(found, reference, presence, replacement))
            }
            Strategy::DeleteNodeClaim => {
                let resource = delete_node_claim::resource_of(reference);
                let claim: Option<DynamicObject> = kube
                    .reader
                    .get_opt(Scope::Cluster, &resource, &reference.name)
                    .await
                    .map_err(read_error(format!("reading NodeClaim {}", reference.name)))?;
                let found = claim.as_ref().map(|claim| &claim.metadata);
                Ok(deletion_observed(
                    found,
                    reference,
                    presence,
                    ReplacementNode::NotExpected,
                ))
            }
            Strategy::Template => {
                let (resource, scope) = kube
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
                let object: Option<DynamicObject> = kube
                    .reader
                    .get_opt(
                        placed(&scope, reference.namespace.as_deref()),
                        &resource,
                        &reference.name,
                    )
                    .await
                    .map_err(read_error(format!(
                        "reading {} {}",
                        reference.kind, reference.name
                    )))?;
                Ok(create_template::observe(object.as_ref(), reference, presence))
            }
        }
    }
}

/// Where an object of a kind of `scope` lives: in `namespace` if the kind is namespaced.
fn placed<'a>(scope: &discovery::Scope, namespace: Option<&'a str>) -> Scope<'a> {
    match (scope, namespace) {
        (discovery::Scope::Namespaced, Some(namespace)) => Scope::Namespace(namespace),
        _ => Scope::Cluster,
    }
}

impl Replacers {
    /// The one read of the remediated node a trigger makes (`None`: it is gone).
    async fn node(&self, remediation: &GpuRemediation) -> Result<Option<Node>, TriggerReplacementError> {
        let name = &remediation.spec.node_name;
        self.reader
            .get_opt(Scope::Cluster, &(), name)
            .await
            .map_err(|source| TriggerReplacementError::Api {
                action: format!("reading node {name}"),
                source,
            })
    }

    /// Makes `plan`'s writes in order, through the writer.
    async fn apply(
        &self,
        remediation: &GpuRemediation,
        plan: Plan,
    ) -> Result<Triggered, TriggerReplacementError> {
        let Plan {
            mut reference,
            writes,
        } = plan;
        let mut rewritten = None;
        for write in writes {
            match write {
                Write::Nothing { reason } => {
                    tracing::info!(node = %remediation.spec.node_name, %reason, "the replacement has nothing to write");
                }
                Write::AnnotateRemediation {
                    name,
                    resource_version,
                    key,
                    value,
                } => {
                    // Over the version read: the status write that follows is made over this one.
                    let patch = json!({"metadata": {
                        "annotations": {key: value},
                        "resourceVersion": resource_version,
                    }});
                    let written = self
                        .writer
                        .patch::<GpuRemediation>(&(), Scope::Cluster, &name, patch)
                        .await
                        .map_err(|error| match error {
                            WriteError::Fenced(fenced) => TriggerReplacementError::Fenced(fenced),
                            WriteError::Api(source) => TriggerReplacementError::Api {
                                action: format!("annotating GpuRemediation {name}"),
                                source,
                            },
                        })?;
                    rewritten = Some(written);
                }
                Write::DeleteWithUid {
                    resource,
                    namespace,
                    name,
                    uid,
                } => {
                    let shown = match &namespace {
                        Some(namespace) => format!("{namespace}/{name}"),
                        None => name.clone(),
                    };
                    // Nodes are spelt as they always were in the words the lifecycle records.
                    let kind = if resource.kind == "Node" {
                        "node"
                    } else {
                        resource.kind.as_str()
                    };
                    self.writer
                        .delete_stamped::<DynamicObject>(
                            &resource,
                            Scope::of(namespace.as_deref()),
                            &name,
                            Some(&uid),
                            &DeleteParams::default(),
                        )
                        .await
                        .map_err(|error| during(error, format!("deleting {kind} {shown}")))?;
                }
                Write::Create { resource, object } => {
                    reference.uid = self.create(remediation, &reference, &resource, &object).await?;
                }
            }
        }
        Ok(Triggered { reference, rewritten })
    }

    /// Creates a template's object; the UID to record (of the object created, or of ours found).
    async fn create(
        &self,
        remediation: &GpuRemediation,
        reference: &ObjectReference,
        resource: &ApiResource,
        object: &DynamicObject,
    ) -> Result<Option<String>, TriggerReplacementError> {
        let shown = create_template::shown(reference);
        match self.writer.create(resource, object).await {
            Ok(created) => Ok(created.metadata.uid),
            Err(WriteError::Fenced(fenced)) => Err(fenced.into()),
            Err(WriteError::Api(kube::Error::Api(status))) if status.is_already_exists() => {
                // A retry: the object is ours if its controlling owner is this remediation.
                let existing = self
                    .reader
                    .api::<DynamicObject>(Scope::of(object.metadata.namespace.as_deref()), resource)
                    .get(&reference.name)
                    .await
                    .map_err(|source| TriggerReplacementError::Api {
                        action: format!("reading {} {shown}", reference.kind),
                        source,
                    })?;
                match create_template::previous_attempt(remediation, &existing) {
                    Some((owner, uid)) => {
                        self.remove_previous_attempt(reference, resource, object, &owner, &uid)
                            .await
                    }
                    None => create_template::adopt(remediation, reference, &existing),
                }
            }
            Err(WriteError::Api(source)) => Err(TriggerReplacementError::Api {
                action: format!("creating {} {shown}", reference.kind),
                source,
            }),
        }
    }

    /// Deletes the previous attempt's object under the template's name (pinned to its `uid`), unless
    /// its remediation `owner` is still under way (then the name is taken); the create is asked
    /// again once it is gone.
    async fn remove_previous_attempt(
        &self,
        reference: &ObjectReference,
        resource: &ApiResource,
        object: &DynamicObject,
        owner: &str,
        uid: &str,
    ) -> Result<Option<String>, TriggerReplacementError> {
        let shown = create_template::shown(reference);
        let running = self
            .reader
            .get_opt::<GpuRemediation>(Scope::Cluster, &(), owner)
            .await
            .map_err(|source| TriggerReplacementError::Api {
                action: format!("reading GpuRemediation {owner}"),
                source,
            })?
            .is_some_and(|r| !r.status.as_ref().is_some_and(|s| s.phase.is_terminal()));
        if running {
            return Err(TriggerReplacementError::TemplateNameTaken {
                kind: reference.kind.clone(),
                name: format!("{shown} (remediation {owner} is still under way)"),
            });
        }
        tracing::info!(object = %shown, previous = %owner, "deleting the previous attempt's object that holds the template's name");
        self.writer
            .delete_stamped::<DynamicObject>(
                resource,
                Scope::of(object.metadata.namespace.as_deref()),
                &reference.name,
                Some(uid),
                &DeleteParams::background(),
            )
            .await
            .map_err(|error| during(error, format!("deleting {} {shown}", reference.kind)))?;
        Err(TriggerReplacementError::PreviousAttemptGoing {
            kind: reference.kind.clone(),
            name: shown,
            owner: owner.to_owned(),
        })
    }

    /// The version of `group`'s `kind` the API server prefers, found by discovery: the
    /// Cluster API and Karpenter CRDs move between versions, so none is hard-coded. A group or
    /// kind the server does not serve is `KindNotServed`, any other failure an API error.
    async fn served_resource(&self, group: &str, kind: &str) -> Result<ApiResource, TriggerReplacementError> {
        let not_served = || TriggerReplacementError::KindNotServed {
            group: group.to_owned(),
            kind: kind.to_owned(),
        };
        let served = match self.reader.group(group).await {
            Ok(served) => served,
            Err(kube::Error::Discovery(_)) => return Err(not_served()),
            Err(source) => {
                return Err(TriggerReplacementError::Api {
                    action: format!("discovering API group {group}"),
                    source,
                });
            }
        };
        served
            .recommended_kind(kind)
            .map(|(resource, _)| resource)
            .ok_or_else(not_served)
    }

    /// The resource and scope of `api_version`'s `kind`, pinned (a template names its version);
    /// `None` when the server does not serve it.
    async fn resolve(
        &self,
        api_version: &str,
        kind: &str,
    ) -> Result<Option<(ApiResource, discovery::Scope)>, kube::Error> {
        let Ok(group_version) = api_version.parse::<GroupVersion>() else {
            return Ok(None);
        };
        let gvk = GroupVersionKind::gvk(&group_version.group, &group_version.version, kind);
        match self.reader.pinned_kind(&gvk).await {
            Ok((resource, capabilities)) => Ok(Some((resource, capabilities.scope))),
            Err(kube::Error::Discovery(_)) => Ok(None),
            Err(kube::Error::Api(status)) if status.is_not_found() => Ok(None),
            Err(error) => Err(error),
        }
    }
}

/// A stamped delete's failure as a [`TriggerReplacementError`] of the step `action` (e.g.
/// `deleting node n1`).
fn during(error: DeleteStampedError, action: String) -> TriggerReplacementError {
    match error {
        DeleteStampedError::Write(WriteError::Fenced(fenced)) => TriggerReplacementError::Fenced(fenced),
        DeleteStampedError::Write(WriteError::Api(source)) => TriggerReplacementError::Api { action, source },
        DeleteStampedError::KeptConflicting => TriggerReplacementError::KeptConflicting { action },
    }
}

#[cfg(test)]
#[path = "replace_tests.rs"]
mod tests;
