//! What validation and diagnostics share: a `batch/v1` Job the policy names, run on the node
//! (its pod pinned there), bounded by a timeout, and the record a remediation keeps of each run
//! ([`JobRecord`], generic over how the run ended). The pure checks of such a Job, and its schema
//! (an embedded resource whose kind and timeout the API server checks with CEL).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::violation::Violation;

/// The most characters a run's record keeps of its message.
pub const MESSAGE_MAX: usize = 512;

/// One run of a node Job a remediation made; `O` says how it ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", bound(deserialize = "O: Deserialize<'de>"))]
pub struct JobRecord<O> {
    /// The Job's namespace.
    #[schemars(length(max = 63))]
    pub namespace: String,
    /// The Job's name.
    #[schemars(length(max = 253))]
    pub job: String,
    /// The Job's UID, once created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub uid: Option<String>,
    /// When the Job was created.
    pub start: Time,
    /// When its outcome was seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<Time>,
    /// How it ended (unset while it runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<O>,
    /// From creation to outcome, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 86_400))]
    pub duration_seconds: Option<u32>,
    /// What the Job reported, for a person.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    pub message: Option<String>,
}

/// The schema of a section's `job`: an embedded object the controller checks further.
pub(crate) fn job_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
        "x-kubernetes-embedded-resource": true,
    })
}

/// The CEL rules of a section with `job` and `timeout`: the timeout from 1s to `max` (a CEL
/// duration such as `6h`), the job a `batch/v1` Job.
pub(crate) fn section_rules(
    schema: &mut schemars::Schema,
    max: &str,
    timeout_message: &str,
    job_message: &str,
) {
    use crate::schema::{add_rules, duration_ok, property, rule};
    add_rules(
        property(schema, "timeout"),
        [rule(
            format!(
                "!{} || (duration(self) >= duration('1s') && duration(self) <= duration('{max}'))",
                duration_ok("self")
            ),
            timeout_message,
        )],
    );
    add_rules(
        property(schema, "job"),
        // An embedded resource's CEL type knows its apiVersion, kind and metadata.name only; the
        // namespace and the spec are checked by `check` (the controller's validation).
        [rule(
            "self.apiVersion == 'batch/v1' && self.kind == 'Job'",
            job_message,
        )],
    );
}

/// The rules a section's `job` and `timeout` break (`field` is where the section sits, e.g.
/// `spec.validation`; `max` the longest timeout).
#[must_use]
pub fn check(
    field: &str,
    job: &Value,
    timeout: std::time::Duration,
    max: std::time::Duration,
    (timeout_message, job_message): (&str, &str),
) -> Vec<Violation> {
    let mut out = Vec::new();
    if timeout < std::time::Duration::from_secs(1) || timeout > max {
        out.push(Violation::new(format!("{field}.timeout"), timeout_message));
    }
    let namespaced = job
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .is_some_and(|n| !n.is_empty());
    let is_job = job["apiVersion"] == "batch/v1" && job["kind"] == "Job" && namespaced;
    let spec = job
        .get("spec")
        .map(|spec| serde_json::from_value::<k8s_openapi::api::batch::v1::JobSpec>(spec.clone()));
    match spec {
        Some(Ok(_)) if is_job => {}
        Some(Err(error)) if is_job => out.push(Violation::new(
            format!("{field}.job.spec"),
            format!("not a Job spec: {error}"),
        )),
        _ => out.push(Violation::new(format!("{field}.job"), job_message)),
    }
    out
}
