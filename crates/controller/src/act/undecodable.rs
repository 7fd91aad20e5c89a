//! Reports what the watches could not decode ([`crate::observe::undecodable`]): a `Warning` Event
//! on each object, and on a policy its `Ready=False`/`Invalid=True` conditions, written while this
//! replica's fence holds (a follower reports what it found once it leads).

use gpu_remediation_api::{GpuRemediationPolicy, constants::policy_conditions, text::truncate};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{
    Resource as _,
    api::DynamicObject,
    runtime::events::{Event, EventType},
};

use crate::{
    lifecycle::note::NOTE_MAX,
    observe::undecodable::{Finding, Findings, REASON},
    write::Writer,
};

/// Reports each finding: a `Warning` Event on the object; on a policy, its conditions too.
pub async fn report(writer: Writer, mut findings: Findings) {
    while let Some(finding) = findings.recv().await {
        writer.fence().acquired().await;
        let name = finding.reference.name.clone().unwrap_or_default();
        let note = format!(
            "the controller cannot read this object and leaves it out until it is fixed or deleted: {}",
            finding.error
        );
        let event = Event {
            type_: EventType::Warning,
            reason: REASON.to_owned(),
            note: Some(truncate(&note, NOTE_MAX)),
            action: "Decode".to_owned(),
            secondary: None,
        };
        writer.publish_to(&finding.reference, event).await;
        if finding.reference.kind.as_deref() == Some(GpuRemediationPolicy::kind(&()).as_ref())
            && let Err(error) = mark_policy_invalid(&writer, &name, &finding, &note).await
        {
            tracing::warn!(%error, policy = %name, "marking the undecodable policy Invalid failed");
        }
    }
}

/// Sets `Ready=False` and `Invalid=True` (reason `Undecodable`) on the policy `name`, as the same
/// field manager as the controller's own status writes, which replace them once it decodes again.
async fn mark_policy_invalid(
    writer: &Writer,
    name: &str,
    finding: &Finding,
    message: &str,
) -> Result<(), crate::write::WriteError> {
    let generation = finding.generation;
    let now = Time(jiff::Timestamp::now());
    let condition = |type_: &str| Condition {
        type_: type_.to_owned(),
        status: if type_ == policy_conditions::INVALID {
            "True"
        } else {
            "False"
        }
        .to_owned(),
        reason: REASON.to_owned(),
        message: truncate(message, 32_768),
        last_transition_time: now.clone(),
        observed_generation: generation,
    };
    // Only over the version found (a fixed policy is the controller's again), under our claim. As
    // an untyped object: the stored policy is the one that does not decode.
    let status = serde_json::json!({
        "conditions": [condition(policy_conditions::READY), condition(policy_conditions::INVALID)],
    });
    writer
        .apply_status::<DynamicObject>(
            &kube::api::ApiResource::erase::<GpuRemediationPolicy>(&()),
            name,
            finding.resource_version.as_deref(),
            status,
        )
        .await?;
    Ok(())
}
