//! `Template`: create the policy's template object for the remediation (rendered by
//! [`super::template::render`]) and follow what it reports. Resolving the kind by discovery
//! gives its plural and scope, so any kind works.
//!
//! Pure: [`plan`] (the create, given the rendered object and its kind as served), [`adopt`] (a
//! retry's create that found an object of that name: ours only if the remediation controls it) and
//! [`observe`] (the object read, as the verification's inputs).

use gpu_remediation_api::{GpuRemediation, object_reference::ObjectReference};
use kube::{
    api::{ApiResource, DynamicObject},
    discovery::Scope,
};

use super::{
    TriggerReplacementError,
    plan::{Plan, Write},
    presence,
    template::{self, Rendered},
    verify::{Observation, Presence, ReplacementNode, Reported},
};

/// What creating the template's object writes, given it `rendered` for the remediation and its
/// kind as the server serves it (`resource`, `scope`): the create, with the namespace the template
/// names. A refusal when the template's namespace does not fit the kind's scope.
pub fn plan(
    rendered: Rendered,
    resource: &ApiResource,
    scope: &Scope,
) -> Result<Plan, TriggerReplacementError> {
    match (scope, &rendered.namespace) {
        (Scope::Namespaced, None) => {
            return Err(TriggerReplacementError::TemplateNeedsNamespace { kind: rendered.kind });
        }
        (Scope::Cluster, Some(_)) => {
            return Err(TriggerReplacementError::TemplateNamespaceNotAllowed { kind: rendered.kind });
        }
        _ => {}
    }
    let mut object: DynamicObject = serde_json::from_value(rendered.object)
        .map_err(|_| TriggerReplacementError::Template(template::RenderTemplateError::NotAnObject))?;
    object.metadata.namespace.clone_from(&rendered.namespace);
    Ok(Plan {
        reference: ObjectReference {
            api_version: rendered.api_version,
            kind: rendered.kind,
            name: rendered.name,
            namespace: rendered.namespace,
            uid: None,
        },
        writes: vec![Write::Create {
            resource: resource.clone(),
            object: Box::new(object),
        }],
    })
}

/// The object `reference` names, for a person: `namespace/name`, or `name`.
#[must_use]
pub fn shown(reference: &ObjectReference) -> String {
    match &reference.namespace {
        Some(namespace) => format!("{namespace}/{}", reference.name),
        None => reference.name.clone(),
    }
}

/// A retried create found `existing` under the name it creates: the UID to record when the
/// remediation is its controlling owner (the first try created it), else a refusal (someone
/// else's object is never taken over).
pub fn adopt(
    remediation: &GpuRemediation,
    reference: &ObjectReference,
    existing: &DynamicObject,
) -> Result<Option<String>, TriggerReplacementError> {
    let ours = existing.metadata.owner_references.iter().flatten().any(|owner| {
        owner.controller == Some(true)
            && owner.uid.as_str() == remediation.metadata.uid.as_deref().unwrap_or_default()
    });
    if !ours {
        return Err(TriggerReplacementError::TemplateNameTaken {
            kind: reference.kind.clone(),
            name: shown(reference),
        });
    }
    Ok(existing.metadata.uid.clone())
}

/// An object found under the name the template creates that a previous attempt left: its
/// controlling owner is another `GpuRemediation` (a kind that must be named after the node, such
/// as Self Node Remediation's, gets the same name on every attempt, and the object outlives its
/// remediation until the record is deleted). Ours to remove before the next attempt's create:
/// the owner's name and the object's UID (the delete is pinned to it). `None` for anyone else's
/// object, which is never touched.
#[must_use]
pub fn previous_attempt(remediation: &GpuRemediation, existing: &DynamicObject) -> Option<(String, String)> {
    let this = remediation.metadata.uid.as_deref().unwrap_or_default();
    let owner = existing
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|owner| {
            owner.controller == Some(true)
                && owner.kind == "GpuRemediation"
                && owner.api_version.starts_with("gpuremediation.dev/")
                && owner.uid != this
        })?;
    Some((owner.name.clone(), existing.metadata.uid.clone()?))
}

/// The observation of a template's object (`found`, read by the recorded reference): whether it is
/// the object of the recorded UID, and what it reports while it is; `node` the remediated node's
/// presence.
#[must_use]
pub fn observe(found: Option<&DynamicObject>, reference: &ObjectReference, node: Presence) -> Observation {
    let target = presence(found.map(|object| &object.metadata), reference.uid.as_deref());
    let reported = match (found, target) {
        (Some(object), Presence::Present | Presence::Deleting) => template::report(object.data.get("status")),
        _ => Reported::InProgress,
    };
    Observation {
        target,
        node,
        reported,
        replacement: ReplacementNode::NotExpected,
    }
}

#[cfg(test)]
mod tests {
    use kube::core::GroupVersionKind;
    use serde_json::json;

    use super::*;
    use crate::replace::{
        fixtures::{remediation, template_replacement},
        template::render,
    };

    fn served() -> ApiResource {
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(
                "self-node-remediation.medik8s.io",
                "v1alpha1",
                "SelfNodeRemediation",
            ),
            "selfnoderemediations",
        )
    }

    fn rendered() -> Rendered {
        render(
            template_replacement().template.as_ref(),
            &remediation(Some("uid-gpu-1")),
        )
        .expect("renders")
    }

    #[test]
    fn the_template_is_created_named_after_the_node_in_its_namespace_owned_by_the_remediation() {
        let planned = plan(rendered(), &served(), &Scope::Namespaced).expect("fits its kind");
        let [Write::Create { resource, object }] = planned.writes.as_slice() else {
            panic!("one create: {:?}", planned.writes)
        };
        assert_eq!(resource, &served());
        assert_eq!(
            serde_json::to_value(object).expect("an object"),
            json!({
                "apiVersion": "self-node-remediation.medik8s.io/v1alpha1",
                "kind": "SelfNodeRemediation",
                "metadata": {
                    "name": "gpu-1",
                    "namespace": "openshift-workload-availability",
                    "ownerReferences": [{
                        "apiVersion": "gpuremediation.dev/v1alpha1", "kind": "GpuRemediation",
                        "name": "gpu-1-1a2b3c", "uid": "uid-remediation-1", "controller": true,
                    }],
                },
                "spec": {"remediationStrategy": "Automatic"},
            })
        );
        assert_eq!(
            planned.reference,
            ObjectReference {
                api_version: "self-node-remediation.medik8s.io/v1alpha1".to_owned(),
                kind: "SelfNodeRemediation".to_owned(),
                name: "gpu-1".to_owned(),
                namespace: Some("openshift-workload-availability".to_owned()),
                uid: None,
            }
        );
    }

    #[test]
    fn a_namespace_that_does_not_fit_the_kinds_scope_is_refused() {
        let refused = plan(rendered(), &served(), &Scope::Cluster).expect_err("refused");
        assert!(matches!(
            refused,
            TriggerReplacementError::TemplateNamespaceNotAllowed { .. }
        ));
        let mut unplaced = rendered();
        unplaced.namespace = None;
        let refused = plan(unplaced, &served(), &Scope::Namespaced).expect_err("refused");
        assert!(matches!(
            refused,
            TriggerReplacementError::TemplateNeedsNamespace { .. }
        ));
    }

    #[test]
    fn a_retry_adopts_the_object_it_created_and_no_one_elses() {
        let planned = plan(rendered(), &served(), &Scope::Namespaced).expect("fits its kind");
        let [Write::Create { object, .. }] = planned.writes.as_slice() else {
            panic!("one create")
        };
        let mut ours = object.clone();
        ours.metadata.uid = Some("uid-snr".to_owned());
        let owner = remediation(Some("uid-gpu-1"));
        assert_eq!(
            adopt(&owner, &planned.reference, &ours).expect("ours"),
            Some("uid-snr".to_owned())
        );
        let mut theirs = ours;
        theirs.metadata.owner_references = None;
        assert_eq!(
            adopt(&owner, &planned.reference, &theirs)
                .expect_err("not ours")
                .to_string(),
            "SelfNodeRemediation openshift-workload-availability/gpu-1 already exists and is not owned by this remediation"
        );
    }

    #[test]
    fn a_previous_attempts_object_is_ours_to_remove_and_no_one_elses() {
        let planned = plan(rendered(), &served(), &Scope::Namespaced).expect("fits its kind");
        let [Write::Create { object, .. }] = planned.writes.as_slice() else {
            panic!("one create")
        };
        let mut previous = object.clone();
        previous.metadata.uid = Some("uid-snr-1".to_owned());
        let mut second = remediation(Some("uid-gpu-1"));
        second.metadata.uid = Some("uid-second-attempt".to_owned());
        second.metadata.name = Some("gpu-1-second".to_owned());
        // The first attempt's remediation controls it: remove it, pinned to its UID.
        let first_owner = previous.metadata.owner_references.as_ref().unwrap()[0]
            .name
            .clone();
        assert_eq!(
            previous_attempt(&second, &previous),
            Some((first_owner, "uid-snr-1".to_owned()))
        );
        // This attempt's own object is adopted, not removed.
        let first = remediation(Some("uid-gpu-1"));
        assert_eq!(previous_attempt(&first, &previous), None);
        // Someone else's (no owner, or another kind owning it) is never touched.
        let mut theirs = previous.clone();
        theirs.metadata.owner_references = None;
        assert_eq!(previous_attempt(&second, &theirs), None);
        let mut other_kind = previous;
        other_kind.metadata.owner_references.as_mut().unwrap()[0].kind = "Deployment".into();
        assert_eq!(previous_attempt(&second, &other_kind), None);
    }

    #[test]
    fn the_object_of_the_recorded_uid_reports_and_another_is_gone() {
        let mut object = DynamicObject::new("gpu-1", &served());
        object.metadata.uid = Some("uid-snr".to_owned());
        object.data = json!({"status": {"conditions": [{"type": "Succeeded", "status": "True"}]}});
        let mut reference = plan(rendered(), &served(), &Scope::Namespaced)
            .expect("fits")
            .reference;
        reference.uid = Some("uid-snr".to_owned());
        let observed = observe(Some(&object), &reference, Presence::Present);
        assert_eq!(
            (observed.target, observed.reported),
            (
                Presence::Present,
                Reported::Done("condition Succeeded=True".to_owned())
            )
        );
        reference.uid = Some("uid-earlier".to_owned());
        let observed = observe(Some(&object), &reference, Presence::Present);
        assert_eq!(
            (observed.target, observed.reported),
            (Presence::Gone, Reported::InProgress)
        );
    }
}
