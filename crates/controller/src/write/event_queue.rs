//! Events written behind the pass. The controller's pass hands its Events (the quarantines', the
//! lifted quarantines', admission's aggregated ones) to [`EventQueue::publish_all`] and goes on; one
//! writer task sends them, batch after batch in the order they were queued, the series of a batch
//! [`EVENT_CONCURRENCY`] at a time and the Events of one series one after the other.
//!
//! Why behind: an Event is a report. At 1,000 nodes and 20,000 pods, with the fault path in its own
//! priority level (`manifests/controller/flow-schemas.yaml`), a hundred `Quarantined` Events still
//! queued behind the drains' evictions in `workload-low` for up to 8.8 s each, and the pass, which
//! waited for them, admitted the hundred faults 10 s late (`docs/benchmarks-history.md`). Nothing is lost
//! for it: when the writer falls [`QUEUED_BATCHES`] behind, `publish_all` waits for it, as it did
//! before the queue; a write that fails or outlasts [`EVENT_DEADLINE`] is logged, as before; and
//! the fence is checked as each Event is sent, so a replica that lost the Lease while its Events
//! queued sends none of them.

use std::{
    sync::{Arc, OnceLock},
    time::Duration,
};

use futures::{StreamExt as _, stream};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, Recorder};
use tokio::sync::mpsc;

use crate::leader::Fence;

/// Series the writer sends at once.
pub const EVENT_CONCURRENCY: usize = 8;
/// Batches queued before [`EventQueue::publish_all`] waits for the writer: backpressure, not loss.
const QUEUED_BATCHES: usize = 64;
/// How long one Event write may take before it is given up (and logged).
const EVENT_DEADLINE: Duration = Duration::from_secs(10);

/// The longest note the API server takes (`events.k8s.io/v1`: 1 KiB, counted in bytes).
const NOTE_MAX_BYTES: usize = 1024;

/// `note` cut to [`NOTE_MAX_BYTES`] with the writer's marker (see `bounds::cut`), when longer: a
/// message that quotes a node's words must not make the Event fail with 422.
fn bounded_note(note: &str) -> Option<String> {
    if note.len() <= NOTE_MAX_BYTES {
        return None;
    }
    // Characters are at most 4 bytes: a quarter of the limit in characters always fits. An ASCII
    // note keeps all but two: the marker's ellipsis is one character of three bytes.
    let chars = if note.is_ascii() {
        NOTE_MAX_BYTES - 2
    } else {
        NOTE_MAX_BYTES / 4
    };
    super::bounds::cut(note, chars)
}

/// Events about objects, in the order they were decided.
type Batch = Vec<(ObjectReference, Event)>;

/// Writes one Event at a time, if this replica leads.
#[derive(Clone)]
pub(super) struct EventWriter {
    recorder: Recorder,
    fence: Fence,
}

impl EventWriter {
    pub(super) fn new(recorder: Recorder, fence: Fence) -> Self {
        Self { recorder, fence }
    }

    /// Writes `event` about `reference`. A failure is logged, not returned: an Event is a report,
    /// and a lost one must not stop a remediation.
    pub(super) async fn write(&self, reference: &ObjectReference, mut event: Event) {
        if let Some(note) = event.note.as_mut()
            && let Some(shorter) = bounded_note(note)
        {
            *note = shorter;
        }
        if let Err(error) = self.fence.check() {
            tracing::debug!(%error, reason = %event.reason, "event not published: not the leader");
            return;
        }
        match tokio::time::timeout(EVENT_DEADLINE, self.recorder.publish(&event, reference)).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                tracing::warn!(%error, reason = %event.reason, object = ?reference.name, "publishing an event failed");
            }
            Err(_) => tracing::warn!(
                reason = %event.reason,
                object = ?reference.name,
                deadline = ?EVENT_DEADLINE,
                "publishing an event took longer than its deadline; given up"
            ),
        }
    }

    /// Writes a batch: [`EVENT_CONCURRENCY`] series at a time, each series in order (the recorder
    /// folds a series into one Event, which concurrent writes would split).
    async fn write_batch(&self, batch: Batch) {
        let writing: Vec<_> = series(batch)
            .into_iter()
            .map(|(reference, events)| async move {
                for event in events {
                    self.write(&reference, event).await;
                }
            })
            .collect();
        stream::iter(writing)
            .buffer_unordered(EVENT_CONCURRENCY)
            .collect::<()>()
            .await;
    }

    /// Writes batches as they come, until every sender is gone.
    async fn run(self, mut batches: mpsc::Receiver<Batch>) {
        while let Some(batch) = batches.recv().await {
            self.write_batch(batch).await;
        }
    }
}

/// The queue in front of the writer; clones share it (and its one writer).
#[derive(Clone)]
pub(super) struct EventQueue {
    writer: EventWriter,
    /// Started on the first batch, on the runtime of whoever queues it.
    batches: Arc<OnceLock<mpsc::Sender<Batch>>>,
}

impl EventQueue {
    pub(super) fn new(writer: EventWriter) -> Self {
        Self {
            writer,
            batches: Arc::new(OnceLock::new()),
        }
    }

    /// The writer, for an Event its caller waits for.
    pub(super) fn writer(&self) -> &EventWriter {
        &self.writer
    }

    /// Queues `events` for the writer and returns; waits only while the writer is
    /// [`QUEUED_BATCHES`] behind.
    pub(super) async fn publish_all(&self, events: impl IntoIterator<Item = (ObjectReference, Event)>) {
        let batch: Batch = events.into_iter().collect();
        if batch.is_empty() {
            return;
        }
        let sender = self.batches.get_or_init(|| {
            let (sender, receiver) = mpsc::channel(QUEUED_BATCHES);
            tokio::spawn(self.writer.clone().run(receiver));
            sender
        });
        if let Err(lost) = sender.send(batch).await {
            // Only if the writer task is gone (it ends when every sender is dropped, and we hold one).
            tracing::error!(
                events = lost.0.len(),
                "the event writer is gone; events not published"
            );
        }
    }
}

/// `events` grouped by the series the recorder would fold them into (object, reason, action and
/// type), each group in its order, the groups in the order of their first Event.
#[must_use]
pub fn series(
    events: impl IntoIterator<Item = (ObjectReference, Event)>,
) -> Vec<(ObjectReference, Vec<Event>)> {
    let mut groups: Vec<(ObjectReference, Vec<Event>)> = Vec::new();
    for (reference, event) in events {
        let same = |(r, group): &&mut (ObjectReference, Vec<Event>)| {
            let first = &group[0];
            *r == reference
                && first.reason == event.reason
                && first.action == event.action
                && first.type_ == event.type_
        };
        match groups.iter_mut().find(same) {
            Some((_, group)) => group.push(event),
            None => groups.push((reference, vec![event])),
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_note_over_a_kibibyte_is_cut_to_fit_and_a_short_one_is_left_alone() {
        assert_eq!(super::bounded_note("the GPU fell off the bus"), None);
        let long = super::bounded_note(&"x".repeat(5_000)).unwrap();
        assert!(
            long.len() <= super::NOTE_MAX_BYTES && long.contains("…[cut"),
            "{}",
            long.len()
        );
        let wide = super::bounded_note(&"é".repeat(5_000)).unwrap();
        assert!(wide.len() <= super::NOTE_MAX_BYTES, "{}", wide.len());
    }

    use std::time::Duration;

    use super::super::tests::{held_at_once, ops, reply};
    use super::*;

    /// A `Quarantined` Event about node `gpu-{node}`.
    fn quarantined(node: usize) -> (ObjectReference, Event) {
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(format!("gpu-{node}")),
            ..ObjectReference::default()
        };
        let event = Event {
            type_: kube::runtime::events::EventType::Normal,
            reason: "Quarantined".into(),
            note: Some(format!("gpu-{node} quarantined")),
            action: "Quarantine".into(),
            secondary: None,
        };
        (reference, event)
    }

    /// Whether another request arrives within 300 ms.
    async fn sent_early(handle: &mut super::super::tests::Handle) -> bool {
        tokio::time::timeout(Duration::from_millis(300), handle.next_request())
            .await
            .is_ok()
    }

    /// Asserts that two Events are sent in turn: `second` only once the first is answered.
    async fn sent_in_turn(handle: &mut super::super::tests::Handle, second: &str) {
        let (_, respond) = handle.next_request().await.expect("the first Event");
        assert!(
            !sent_early(handle).await,
            "{second} was sent before the first was answered"
        );
        respond.send_response(reply(201, &serde_json::json!({})));
        let (_, respond) = handle.next_request().await.expect("the second Event");
        respond.send_response(reply(201, &serde_json::json!({})));
    }

    #[tokio::test]
    async fn a_pass_goes_on_before_its_events_are_answered() {
        let (ops, mut handle) = ops(Fence::standalone());
        tokio::time::timeout(Duration::from_secs(5), ops.publish_all((0..3).map(quarantined)))
            .await
            .expect("publish_all returns while no Event has been answered");
        for _ in 0..3 {
            let (request, respond) = tokio::time::timeout(Duration::from_secs(5), handle.next_request())
                .await
                .expect("the queued Events are sent")
                .expect("a request");
            assert!(request.uri().path().ends_with("/events"), "{}", request.uri());
            respond.send_response(reply(201, &serde_json::json!({})));
        }
    }

    #[tokio::test]
    async fn two_events_of_one_series_are_sent_one_after_the_other() {
        let (ops, mut handle) = ops(Fence::standalone());
        ops.publish_all(vec![quarantined(0), quarantined(0)]).await;
        sent_in_turn(&mut handle, "the second Event of the series").await;
    }

    #[tokio::test]
    async fn a_later_passs_event_of_a_series_waits_for_the_earlier_ones() {
        let (ops, mut handle) = ops(Fence::standalone());
        ops.publish_all(vec![quarantined(0)]).await;
        ops.publish_all(vec![quarantined(0)]).await;
        sent_in_turn(&mut handle, "the second pass's Event").await;
    }

    #[tokio::test]
    async fn a_passs_events_about_different_nodes_are_all_sent_before_the_first_is_answered() {
        let (ops, mut handle) = ops(Fence::standalone());
        ops.publish_all((0..3).map(quarantined)).await;
        // One after the other, the second would never arrive while the first waits for its answer.
        for (request, respond) in held_at_once(&mut handle, 3).await {
            assert!(request.uri().path().ends_with("/events"), "{}", request.uri());
            respond.send_response(reply(201, &serde_json::json!({})));
        }
    }

    #[tokio::test]
    async fn a_replica_that_lost_the_lease_while_its_events_queued_sends_none() {
        let (fence, keeper) = Fence::keeper(None);
        keeper.claimed_as("replica-a", 1);
        keeper.hold_until(tokio::time::Instant::now() + Duration::from_secs(60));
        let (ops, mut handle) = ops(fence);
        ops.publish_all(vec![quarantined(0), quarantined(0)]).await;
        let (_, respond) = handle.next_request().await.expect("the first Event");
        keeper.revoke();
        respond.send_response(reply(201, &serde_json::json!({})));
        assert!(
            !sent_early(&mut handle).await,
            "an Event was sent after the fence closed"
        );
    }
}
