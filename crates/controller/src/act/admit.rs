//! Carries out the fleet plan for one policy: creates the admitted remediations, writes the
//! policy's status when it changed (a change of counts only is held briefly, see `policy_status`),
//! and publishes one Event per change (a remediation started, a node newly held back or held back
//! for another reason, the circuit breaker opening or closing, a failure domain held or resumed),
//! never one per pass; the changes of one pass with the same object and reason (ten remediations
//! started, four nodes held back) are said in one Event that names them all. Each admitted node is
//! read afresh right before its remediation is created (the plan was made from our cache; the read
//! is at least as fresh as it, from the API server's watch cache, see `read::node_read`): one
//! that recovered meanwhile is not remediated. A record for a node past `maxAttemptsPerNode` is
//! created silently: its one Event comes when it enters `ManualRequired`. A finished record past
//! `history.ttl` that still holds its node is not deleted: it is marked `AwaitingPerson`, with one
//! Event (see `fleet::expiry`). A record the API server
//! refuses for what it holds stops neither the policy's other records nor its status: the refusal
//! is said in the status (`recordRefusals`) and a Warning Event naming the node and the server's
//! words, and the node waits a backoff (`fleet::episodes`).

use std::sync::Arc;

use futures::{StreamExt as _, stream};
use gpu_remediation_api::{
    GpuRemediation, GpuRemediationPolicy, GpuRemediationStatus, constants::reasons, policy::RecordRefusal,
};
use k8s_openapi::{api::core::v1::ObjectReference, apimachinery::pkg::apis::meta::v1::Time};
use kube::{
    Resource, ResourceExt,
    runtime::events::{Event, EventType},
};

use crate::{
    context::Context,
    first_seen::FirstSeen,
    fleet,
    fleet::PolicyPlan,
    lifecycle::{Note, note},
    observe::NodeView,
    read::ReadNodeError,
    write::{self, CreateRemediationError, DeleteRemediationError, WriteError, WriteStatusError},
};

/// Why a policy's plan could not be carried out (it is planned again in the next pass).
#[derive(Debug, thiserror::Error)]
pub enum ApplyPolicyPlanError {
    /// Creating a remediation failed.
    #[error(transparent)]
    Create(#[from] CreateRemediationError),
    /// Reading an admitted node afresh, before creating its remediation, failed.
    #[error(transparent)]
    ReadNode(#[from] ReadNodeError),
    /// Bringing an approved `ManualRequired` remediation back to `Pending` failed.
    #[error("re-admitting remediation {name} failed: {source}")]
    Readmit {
        /// The remediation.
        name: String,
        /// What went wrong.
        #[source]
        source: WriteStatusError,
    },
    /// Saying on a record past `history.ttl` that it is kept for a person failed.
    #[error("marking remediation {name} as awaiting a person failed: {source}")]
    AwaitPerson {
        /// The remediation.
        name: String,
        /// What went wrong.
        #[source]
        source: WriteStatusError,
    },
    /// Writing the policy's status failed.
    #[error(transparent)]
    WriteStatus(#[from] WriteStatusError),
    /// Deleting an expired remediation failed.
    #[error(transparent)]
    DeleteExpired(#[from] DeleteRemediationError),
}

/// Events that carrying out the plans calls for, kept until the pass has started the advances:
/// a fault's cordon does not wait for the announcements of a hundred others.
#[derive(Default)]
pub struct Announcements(Vec<(ObjectReference, Event)>);

impl Announcements {
    fn add<K: Resource<DynamicType = ()>>(&mut self, object: &K, event: Event) {
        self.0.push((object.object_ref(&()), event));
    }

    /// Publishes them, one Event per object, reason and type (see [`aggregate`]), several at once
    /// (see `Writer::publish_all`).
    pub async fn publish(self, ctx: &Context) {
        ctx.writer.publish_all(aggregate(self.0)).await;
    }
}

/// Says the Events of one pass about one object with one reason and type in one Event: ten
/// remediations started together are one Event on the policy whose note lists them (cut to what
/// the server takes), one write, where the recorder would create the first and patch its series
/// nine times.
fn aggregate(events: Vec<(ObjectReference, Event)>) -> Vec<(ObjectReference, Event)> {
    write::series(events)
        .into_iter()
        .map(|(reference, mut events)| {
            if events.len() > 1 {
                let notes: Vec<String> = events
                    .iter()
                    .map(|e| e.note.clone().unwrap_or_default())
                    .collect();
                let text = format!("{} at once: {}", events.len(), notes.join("; "));
                events[0].note = Some(gpu_remediation_api::text::truncate(&text, note::NOTE_MAX));
            }
            (reference, events.swap_remove(0))
        })
        .collect()
}

/// Carries out one policy's plan, adding the Events it calls for to `announcements` (also those
/// of the writes made before a failure), and handing each remediation created to `created` as soon
/// as it exists (its cordon need not wait for the others' records, nor for the policy's status).
/// Returns until when a change of the policy's counts is held (see `policy_status`): the pass due
/// then writes it.
pub async fn apply(
    ctx: &Context,
    plan: PolicyPlan,
    first_seen: &FirstSeen,
    announcements: &mut Announcements,
    created: &mut (dyn FnMut(Arc<GpuRemediation>) + Send),
) -> Result<Option<jiff::Timestamp>, ApplyPolicyPlanError> {
    let policy = plan.policy.as_ref();
    let name = policy.name_any();
    set_metrics(ctx, &name, &plan.status);
    // Created as many at once as advance at once to their cordon (`starting_concurrency`): when
    // many nodes fail together, each waits for its record before its cordon, and one at a time
    // costs tens of milliseconds per node.
    // Futures built before they enter the stream (see `remediation::evict_all`).
    let starts: Vec<_> = plan
        .create
        .iter()
        .map(|r| start(ctx, policy, r, first_seen))
        .collect();
    let mut creating = stream::iter(starts).buffer_unordered(ctx.settings.starting_concurrency.max(1));
    let mut policy_status = plan.status.clone();
    let mut failed = None;
    let mut refusals = Vec::new();
    while let Some(result) = creating.next().await {
        match result {
            // Announced on the policy; the record's own first Event is its first phase change
            // (one write less per remediation).
            Ok(Start::Created { note, record }) => {
                announcements.add(policy, event(reasons::STARTED, &note, EventType::Normal));
                if let Some(untrusted) = record
                    .spec
                    .hardware
                    .as_ref()
                    .and_then(crate::hardware::trust::describe_untrusted)
                {
                    tracing::warn!(remediation = %record.name_any(), "{untrusted}");
                    announcements.add(
                        record.as_ref(),
                        event(reasons::HARDWARE_UNTRUSTED, &untrusted, EventType::Warning),
                    );
                }
                created(record);
                // The advance just started asks for the cordon at once: let it send that before
                // this pass's own writes (the policy's status, the ledger, Events), so that it
                // takes the client's idle connection and they wait for a new one (the client
                // speaks HTTP/1.1: a request with no idle connection opens one, tens of
                // milliseconds on a loaded server).
                tokio::task::yield_now().await;
            }
            Ok(Start::NoLongerDue(why)) => {
                tracing::info!(policy = %name, "{why}: no remediation started");
                fleet::not_started(&mut policy_status, policy.spec.mode);
            }
            Ok(Start::Refused(refusal)) => {
                fleet::not_started(&mut policy_status, policy.spec.mode);
                refusals.push(refusal);
            }
            Err(error) => failed = Some(error),
        }
    }
    if let Some(error) = failed {
        return Err(error);
    }
    for record in &plan.manual_required {
        match ctx.writer.create_remediation(record).await {
            Ok(created) => {
                tracing::info!(remediation = %created.name_any(), node = %created.spec.node_name, "node past maxAttemptsPerNode: a person must act");
            }
            Err(error) => refusals.push(refused(record, error)?),
        }
    }
    report_refusals(policy, refusals, &mut policy_status, announcements);
    readmit(ctx, &plan, &name, announcements).await?;
    let held_until = ctx
        .writer
        .write_policy_status_unless_held(policy, &policy_status)
        .await?;
    for waiting in &plan.newly_waiting {
        let note = format!("node {} waits: {}", waiting.node, waiting.message);
        tracing::info!(policy = %policy.name_any(), node = %waiting.node, reason = %waiting.reason, "node held back");
        announcements.add(policy, event(&waiting.reason, &note, EventType::Normal));
    }
    mark_awaiting_person(ctx, &plan, announcements).await?;
    for expired in &plan.expired {
        tracing::info!(policy = %name, remediation = %expired, "deleting a finished remediation past history.ttl");
        ctx.writer.delete_remediation(expired).await?;
    }
    match plan.circuit_change {
        Some(true) => {
            let note = format!(
                "{} of {} governed nodes are unhealthy, above {}: no new remediation starts",
                plan.status.unhealthy_nodes,
                plan.status.selected_nodes,
                policy.spec.safety.unhealthy_limit()
            );
            announcements.add(policy, event(reasons::CIRCUIT_OPEN, &note, EventType::Warning));
        }
        Some(false) => {
            let note = "the unhealthy share is back within maxUnhealthy: remediations may start again";
            announcements.add(policy, event("CircuitClosed", note, EventType::Normal));
        }
        None => {}
    }
    for held in &plan.domains_held {
        announcements.add(
            policy,
            event(reasons::DOMAIN_HELD, &held.message(), EventType::Warning),
        );
    }
    if let Some(suspect) = &plan.suspect_named {
        let hold = if suspect.holding {
            ": new remediations of nodes carrying it wait"
        } else {
            ""
        };
        let note = format!("suspect cause: {}{hold}", suspect.message);
        announcements.add(policy, event(reasons::SUSPECT_HELD, &note, EventType::Warning));
    }
    for resumed in &plan.domains_resumed {
        let note = format!(
            "failure domain {} is back within its limits: its nodes may start again",
            resumed.name()
        );
        announcements.add(policy, event(reasons::DOMAIN_RESUMED, &note, EventType::Normal));
    }
    Ok(held_until)
}

/// Writes the status of each record a person approved past `maxAttemptsPerNode` that the budget
/// now admits (back to `Pending`), with its Event.
async fn readmit(
    ctx: &Context,
    plan: &PolicyPlan,
    name: &str,
    announcements: &mut Announcements,
) -> Result<(), ApplyPolicyPlanError> {
    for (stored, status) in &plan.readmit {
        let note = format!(
            "remediation {} of node {}: approved past maxAttemptsPerNode and admitted by the budget; proceeding",
            stored.name_any(),
            stored.spec.node_name
        );
        let said = (reasons::STARTED, note.as_str(), EventType::Normal);
        let updated = write_record_status(ctx, stored, status, said, announcements)
            .await
            .map_err(|(name, source)| ApplyPolicyPlanError::Readmit { name, source })?;
        ctx.metrics.remediation_started(name, updated.spec.action);
        tracing::info!(remediation = %updated.name_any(), "approved past maxAttemptsPerNode: re-admitted");
    }
    Ok(())
}

/// Marks each record past `history.ttl` that still holds its node as awaiting a person (its
/// status and one Event), instead of deleting it (see `fleet::expiry`).
async fn mark_awaiting_person(
    ctx: &Context,
    plan: &PolicyPlan,
    announcements: &mut Announcements,
) -> Result<(), ApplyPolicyPlanError> {
    for awaiting in &plan.awaiting_person {
        let said = (
            reasons::HELD_PAST_TTL,
            awaiting.message.as_str(),
            EventType::Warning,
        );
        let updated = write_record_status(ctx, &awaiting.record, &awaiting.status, said, announcements)
            .await
            .map_err(|(name, source)| ApplyPolicyPlanError::AwaitPerson { name, source })?;
        tracing::warn!(remediation = %updated.name_any(), node = %updated.spec.node_name, "past history.ttl but still holding its node: kept for a person");
    }
    Ok(())
}

/// Writes a status the plan decided for a record, and announces it on the record (`said`: the
/// Event's reason, note and type). A failure names the record.
async fn write_record_status(
    ctx: &Context,
    stored: &GpuRemediation,
    status: &GpuRemediationStatus,
    (reason, note, kind): (&str, &str, EventType),
    announcements: &mut Announcements,
) -> Result<GpuRemediation, (String, WriteStatusError)> {
    let updated = ctx
        .writer
        .write_remediation_status(stored, status)
        .await
        .map_err(|source| (stored.name_any(), source))?;
    announcements.add(&updated, event(reason, note, kind));
    Ok(updated)
}

/// The policy's gauges, from the status its plan built.
fn set_metrics(ctx: &Context, name: &str, status: &gpu_remediation_api::policy::GpuRemediationPolicyStatus) {
    ctx.metrics.set_in_flight(name, status.in_flight);
    ctx.metrics
        .set_budget_remaining(name, status.budget.as_ref().map_or(0, |b| b.remaining));
    ctx.metrics.set_circuit_open(
        name,
        status.conditions.iter().any(|c| {
            c.type_ == gpu_remediation_api::constants::policy_conditions::CIRCUIT_OPEN && c.status == "True"
        }),
    );
}

/// What became of one admitted remediation.
enum Start {
    /// Created: the record as the server returned it, and the note of the Event announcing it (on
    /// its policy).
    Created {
        /// The record.
        record: Arc<GpuRemediation>,
        /// The Event's note.
        note: String,
    },
    /// Not created: a fresh read of its node found it no longer due (why).
    NoLongerDue(String),
    /// Not created: the API server refused the record (see [`refused`]).
    Refused(RecordRefusal),
}

/// A record's create the API server refused for what it holds (400, 422: a value its schema or an
/// admission policy does not take), as the policy's status keeps it: one node's data must not stop
/// the policy's pass. Any other failure (the fence, no answer, a conflict) stays an error: the
/// pass is made again.
fn refused(
    record: &GpuRemediation,
    error: CreateRemediationError,
) -> Result<RecordRefusal, CreateRemediationError> {
    if !error.source.is_invalid() {
        return Err(error);
    }
    Ok(RecordRefusal {
        node: record.spec.node_name.clone(),
        at: Time(jiff::Timestamp::now()),
        code: error.source.code(),
        message: gpu_remediation_api::text::truncate(
            &server_words(&error.source),
            fleet::episodes::REFUSAL_MESSAGE_MAX,
        ),
    })
}

/// The server's message of a refusal (the whole error when it gave none).
fn server_words(error: &WriteError) -> String {
    match error {
        WriteError::Api(kube::Error::Api(status)) if !status.message.is_empty() => status.message.clone(),
        other => other.to_string(),
    }
}

/// Says each refusal: in the policy's status and a Warning Event naming the node and the server's
/// words.
fn report_refusals(
    policy: &GpuRemediationPolicy,
    refusals: Vec<RecordRefusal>,
    status: &mut gpu_remediation_api::policy::GpuRemediationPolicyStatus,
    announcements: &mut Announcements,
) {
    for refusal in refusals {
        let note = format!(
            "the API server refused the record of node {}: {}",
            refusal.node, refusal.message
        );
        tracing::warn!(policy = %policy.name_any(), node = %refusal.node, code = ?refusal.code, message = %refusal.message, "record refused; the policy's other nodes proceed");
        announcements.add(policy, event(reasons::RECORD_REFUSED, &note, EventType::Warning));
        fleet::episodes::add_refusal(&mut status.record_refusals, refusal);
    }
}

/// Creates one admitted remediation, unless a fresh read of its node (the plan was made from the
/// cache) finds that it recovered, broke anew or left meanwhile (see `fleet::no_longer_due`).
async fn start(
    ctx: &Context,
    policy: &GpuRemediationPolicy,
    remediation: &GpuRemediation,
    first_seen: &FirstSeen,
) -> Result<Start, ApplyPolicyPlanError> {
    let node_name = &remediation.spec.node_name;
    let known = ctx
        .caches
        .node(node_name)
        .and_then(|seen| seen.version().map(str::to_owned));
    let fresh = ctx.reader.read_node(node_name, known.as_deref()).await?;
    if let Some(why) = fleet::no_longer_due(
        remediation,
        fresh.as_ref(),
        &policy.spec.triggers,
        first_seen,
        jiff::Timestamp::now(),
    ) {
        return Ok(Start::NoLongerDue(why));
    }
    let created = match ctx.writer.create_remediation(remediation).await {
        Ok(created) => created,
        Err(error) => return Ok(Start::Refused(refused(remediation, error)?)),
    };
    ctx.metrics
        .remediation_started(&policy.name_any(), created.spec.action);
    if let (Some(previous), Some(since)) = (&created.spec.previous_incident, &created.spec.trigger.since) {
        let between = std::time::Duration::try_from(since.0.duration_since(previous.0)).unwrap_or_default();
        ctx.metrics.time_between_incidents(&policy.name_any(), between);
    }
    let trigger = &created.spec.trigger;
    let note = format!(
        "node {} has had {}={} reason {} since {}: remediation {} started (action {:?}, mode {:?})",
        created.spec.node_name,
        trigger.condition_type,
        trigger.status.as_str(),
        trigger.reason,
        trigger
            .since
            .as_ref()
            .map_or_else(String::new, |t| t.0.to_string()),
        created.name_any(),
        created.spec.action,
        created.spec.mode,
    );
    tracing::info!(remediation = %created.name_any(), node = %created.spec.node_name, "remediation started");
    Ok(Start::Created {
        record: Arc::new(created),
        note,
    })
}

/// An admission Event (cut to what the server takes).
fn event(reason: &str, note: &str, type_: EventType) -> Event {
    Note::new(reason, type_, note).event("Admit")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn announced(policy: &str, reason: &str, note: &str) -> (ObjectReference, Event) {
        let reference = ObjectReference {
            name: Some(policy.to_owned()),
            ..ObjectReference::default()
        };
        (reference, event(reason, note, EventType::Normal))
    }

    #[test]
    fn remediations_started_together_are_said_in_one_event_per_policy() {
        let events = vec![
            announced("p", reasons::STARTED, "node a: remediation a-1 started"),
            announced("q", reasons::STARTED, "node c: remediation c-1 started"),
            announced("p", "NodeHeldBack", "node z held back"),
            announced("p", reasons::STARTED, "node b: remediation b-1 started"),
        ];
        let published = aggregate(events);
        let said: Vec<(Option<&str>, &str, Option<&str>)> = published
            .iter()
            .map(|(r, e)| (r.name.as_deref(), e.reason.as_str(), e.note.as_deref()))
            .collect();
        assert_eq!(
            said,
            [
                (
                    Some("p"),
                    reasons::STARTED,
                    Some("2 at once: node a: remediation a-1 started; node b: remediation b-1 started")
                ),
                (
                    Some("q"),
                    reasons::STARTED,
                    Some("node c: remediation c-1 started")
                ),
                (Some("p"), "NodeHeldBack", Some("node z held back")),
            ]
        );
    }

    #[test]
    fn a_hundred_notes_in_one_event_are_cut_to_what_the_server_takes() {
        let events = (0..100)
            .map(|i| {
                announced(
                    "p",
                    reasons::STARTED,
                    &format!("node gpu-{i:03}: remediation started"),
                )
            })
            .collect();
        let published = aggregate(events);
        assert_eq!(published.len(), 1);
        let note = published[0].1.note.as_deref().unwrap();
        assert!(note.starts_with("100 at once: node gpu-000"), "{note}");
        assert!(note.len() <= note::NOTE_MAX, "{}", note.len());
    }
}
