//! What validation and diagnostics share, pure: a policy's Job rendered to run on the node
//! ([`job_object`]: pinned, tolerating every taint, bounded, kept a day after it finished), the
//! record of a run as it starts and ends, and what the Job as observed says ([`reading`]).

use gpu_remediation_api::{
    node_job::{JobRecord, MESSAGE_MAX},
    object_reference::ObjectReference,
    text::truncate,
};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};

use super::Words;
use crate::replace::{Observation, Presence, Reported};

/// The longest a node Job's name may be (its pods carry it in the `job-name` label).
pub const JOB_NAME_MAX: usize = 63;

/// How long a finished Job (and its pod, with its log while the node stands) stays for a person
/// to read before the Job controller removes it (`ttlSecondsAfterFinished`): the record keeps its
/// outcome, and the lifecycle has read it long before (a Job gone before its outcome was read
/// counts as failed, never as a pass).
pub const FINISHED_JOB_KEPT: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// The policy's `job` for `remediation`, named `<remediation><suffix>` unless it names itself,
/// its pod pinned to the node (`nodeName: {{nodeName}}`, rendered with the template), tolerating
/// every taint (the node is cordoned and tainted by us), never restarted, one try unless the Job
/// says otherwise, bounded by `timeout`, removed by the Job controller [`FINISHED_JOB_KEPT`] after
/// it finished unless it says otherwise, and its pods labelled `label=true`.
#[must_use]
pub fn job_object(
    job: &Value,
    timeout: std::time::Duration,
    remediation: &str,
    suffix: &str,
    label: &str,
) -> Value {
    let mut job = job.clone();
    let unnamed = job
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty);
    if unnamed {
        let room = JOB_NAME_MAX.saturating_sub(suffix.len());
        let stem: String = remediation.chars().take(room).collect();
        job["metadata"]["name"] = json!(format!("{}{suffix}", stem.trim_end_matches(['-', '.'])));
    }
    let spec = &mut job["spec"];
    if spec.get("backoffLimit").is_none() {
        spec["backoffLimit"] = json!(0);
    }
    if spec.get("activeDeadlineSeconds").is_none() {
        spec["activeDeadlineSeconds"] = json!(timeout.as_secs().max(1));
    }
    if spec.get("ttlSecondsAfterFinished").is_none() {
        spec["ttlSecondsAfterFinished"] = json!(FINISHED_JOB_KEPT.as_secs());
    }
    let template = &mut spec["template"];
    template["metadata"]["labels"][label] = json!("true");
    let pod = &mut template["spec"];
    pod["nodeName"] = json!(gpu_remediation_api::constants::template_placeholders::NODE_NAME);
    pod["restartPolicy"] = json!("Never");
    let tolerations = &mut pod["tolerations"];
    if !tolerations.is_array() {
        *tolerations = json!([]);
    }
    if let Value::Array(list) = tolerations {
        list.push(json!({"operator": "Exists"}));
    }
    job
}

/// The record of a run whose Job the server just created.
#[must_use]
pub fn started<O>(reference: &ObjectReference, now: Timestamp) -> JobRecord<O> {
    JobRecord {
        namespace: reference.namespace.clone().unwrap_or_default(),
        job: reference.name.clone(),
        uid: reference.uid.clone(),
        start: Time(now),
        end: None,
        outcome: None,
        duration_seconds: None,
        message: None,
    }
}

/// `record` ended now with `outcome`, for the reason `what`.
#[must_use]
pub fn ended<O>(record: &JobRecord<O>, outcome: O, what: &str, now: Timestamp) -> JobRecord<O> {
    JobRecord {
        namespace: record.namespace.clone(),
        job: record.job.clone(),
        uid: record.uid.clone(),
        start: record.start.clone(),
        end: Some(Time(now)),
        outcome: Some(outcome),
        duration_seconds: u32::try_from(now.duration_since(record.start.0).as_secs()).ok(),
        message: Some(truncate(what, MESSAGE_MAX)),
    }
}

/// What the Job as observed this pass says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reading {
    /// It reported `Complete` (the condition's words).
    Complete(String),
    /// It reported `Failed`, or was deleted before it reported (why).
    Failed(String),
    /// It runs, or was not read this pass.
    Running,
}

/// What `observed` (the Job read this pass, or the refusal of the read) says.
#[must_use]
pub fn reading(observed: Option<&Result<Observation, Words>>) -> Reading {
    let Some(Ok(observation)) = observed else {
        return Reading::Running;
    };
    match &observation.reported {
        Reported::Done(what) => Reading::Complete(format!("reported {what}")),
        Reported::Failed(what) => Reading::Failed(format!("reported {what}")),
        Reported::Nothing | Reported::InProgress if observation.target == Presence::Gone => {
            Reading::Failed("was deleted before it reported".to_owned())
        }
        Reported::Nothing | Reported::InProgress => Reading::Running,
    }
}

/// The reference to look at the Job `record` names.
#[must_use]
pub fn reference<O>(record: &JobRecord<O>) -> ObjectReference {
    ObjectReference {
        api_version: "batch/v1".to_owned(),
        kind: "Job".to_owned(),
        name: record.job.clone(),
        namespace: Some(record.namespace.clone()),
        uid: record.uid.clone(),
    }
}
