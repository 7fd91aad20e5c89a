//! What a node sets cannot make the controller write records as fast as it likes, nor keep a
//! policy's slot: a node opens at most one episode (one record) per its trigger's `for` or
//! [`EPISODE_FLOOR`], whichever is longer, counted from its last record's creation (our clock, not
//! the node's); and a node whose record the API server refused waits
//! [`REFUSAL_BACKOFF_SECONDS`] before it is asked again, neither holding a slot nor in flight
//! meanwhile. The nodes held off this way wait, each with why. Pure.

use std::{collections::HashMap, sync::Arc};

use gpu_remediation_api::{
    GpuRemediation, GpuRemediationPolicySpec,
    constants::reasons,
    policy::{REFUSAL_BACKOFF_SECONDS, REFUSALS_LISTED_MAX, RecordRefusal, WaitingNode},
};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::candidates::Found;
use crate::{
    observe::NodeView,
    time::{plus, signed},
};

/// The least time between two episodes of one node under one policy. A node chooses its
/// condition's `lastTransitionTime` (or leaves it out, or sets it in the future, or flips the
/// condition every second); under `for: 0s` each new time was a new episode and a new record,
/// one a second. A minute is far below any real GPU fault's cadence and far above a pass's.
pub const EPISODE_FLOOR: SignedDuration = SignedDuration::from_secs(60);

/// The most of the server's words a refusal keeps: enough for the field and the rule it broke.
pub const REFUSAL_MESSAGE_MAX: usize = 1000;

/// Adds `refusal` to a status's list: the newest first, one per node, at most
/// [`REFUSALS_LISTED_MAX`].
pub fn add_refusal(listed: &mut Vec<RecordRefusal>, refusal: RecordRefusal) {
    listed.retain(|r| r.node != refusal.node);
    listed.insert(0, refusal);
    listed.truncate(REFUSALS_LISTED_MAX as usize);
}

/// The refusals still holding their node off at `now` (the others are asked again, and said
/// again if refused again).
pub(super) fn current_refusals(listed: &[RecordRefusal], now: Timestamp) -> Vec<RecordRefusal> {
    listed.iter().filter(|r| backoff_ends(r) > now).cloned().collect()
}

/// A candidate held off, and until when.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct HeldOff {
    /// How it waits, for the status.
    pub(super) waiting: WaitingNode,
    /// When it may start.
    pub(super) until: Timestamp,
}

/// Takes out of `found` the new candidates held off at `now` (a readmission after a person's
/// approval is no new episode: it stays), and returns them.
pub(super) fn hold_off<N: NodeView>(
    found: &mut Found<'_, '_, N>,
    policy: &str,
    spec: &GpuRemediationPolicySpec,
    refusals: &[RecordRefusal],
    remediations: &[Arc<GpuRemediation>],
    now: Timestamp,
) -> Vec<HeldOff> {
    let mut held = Vec::new();
    // Each node's latest record looked up, not searched for; built only when a new candidate may
    // need it.
    let latest = if found.candidates.iter().any(|c| !c.approved_past_attempts) {
        latest_records(policy, remediations)
    } else {
        HashMap::new()
    };
    found.candidates.retain(|candidate| {
        if candidate.approved_past_attempts {
            return true;
        }
        let Some((_, evidence)) = found.evidence_of.get(&candidate.node) else {
            return true;
        };
        let trigger_for = spec
            .triggers
            .get(evidence.trigger)
            .map_or(SignedDuration::ZERO, |t| signed(t.for_.as_std()));
        let why = latest_refusal(&candidate.node, refusals)
            .map(|refusal| (backoff_ends(refusal), refusal))
            .filter(|(until, _)| *until > now)
            .map(|(until, refusal)| (until, reasons::RECORD_REFUSED, refused_message(refusal, until)))
            .or_else(|| {
                latest
                    .get(candidate.node.as_str())
                    .map(|created| plus(*created, floor(trigger_for)))
                    .filter(|until| *until > now)
                    .map(|until| {
                        let message = format!(
                            "node {} opened an episode less than {} ago: the next may open at {until}",
                            candidate.node,
                            floor(trigger_for)
                        );
                        (until, reasons::EPISODE_HELD_OFF, message)
                    })
            });
        let Some((until, reason, message)) = why else {
            return true;
        };
        held.push(HeldOff {
            waiting: WaitingNode {
                node: candidate.node.clone(),
                unhealthy_since: Some(Time(candidate.since)),
                reason: reason.to_owned(),
                message,
            },
            until,
        });
        false
    });
    for off in &held {
        found.evidence_of.remove(&off.waiting.node);
    }
    held
}

/// The least time between two of a node's episodes under a trigger with this `for`.
fn floor(trigger_for: SignedDuration) -> SignedDuration {
    trigger_for.max(EPISODE_FLOOR)
}

/// When each node's latest record under `policy` was created: its next episode may open
/// [`floor`] after (a node with no record kept may open one now).
fn latest_records<'r>(policy: &str, remediations: &'r [Arc<GpuRemediation>]) -> HashMap<&'r str, Timestamp> {
    let mut latest: HashMap<&str, Timestamp> = HashMap::new();
    for record in remediations.iter().filter(|r| r.spec.policy_name == policy) {
        let Some(created) = record.metadata.creation_timestamp.as_ref().map(|t| t.0) else {
            continue;
        };
        latest
            .entry(record.spec.node_name.as_str())
            .and_modify(|at| *at = (*at).max(created))
            .or_insert(created);
    }
    latest
}

/// `node`'s latest refused record.
fn latest_refusal<'r>(node: &str, refusals: &'r [RecordRefusal]) -> Option<&'r RecordRefusal> {
    refusals.iter().filter(|r| r.node == node).max_by_key(|r| r.at.0)
}

/// Until when a refusal keeps its node off.
fn backoff_ends(refusal: &RecordRefusal) -> Timestamp {
    plus(refusal.at.0, SignedDuration::from_secs(REFUSAL_BACKOFF_SECONDS))
}

/// Why a refused node waits until `until`.
fn refused_message(refusal: &RecordRefusal, until: Timestamp) -> String {
    format!(
        "the API server refused node {}'s record at {} ({}): asked again at {until}",
        refusal.node, refusal.at.0, refusal.message
    )
}

#[cfg(test)]
mod tests {
    use gpu_remediation_api::GpuRemediationSpec;
    use k8s_openapi::api::core::v1::Node;

    use super::*;
    use crate::{
        budget::Candidate,
        detect::Evidence,
        test_fixtures::{at, node},
    };

    fn spec(for_secs: u64) -> GpuRemediationPolicySpec {
        serde_json::from_value(serde_json::json!({
            "triggers": [{"conditionType": "GpuHealthy", "status": "False", "for": format!("{for_secs}s")}],
        }))
        .unwrap()
    }

    fn record(node: &str, created: i64) -> Arc<GpuRemediation> {
        let spec: GpuRemediationSpec = serde_json::from_value(serde_json::json!({
            "nodeName": node, "policyName": "p", "action": "None",
            "trigger": {"conditionType": "GpuHealthy", "status": "False", "reason": "XID79"},
        }))
        .unwrap();
        let mut record = GpuRemediation::new(&format!("{node}-{created}"), spec);
        record.metadata.creation_timestamp = Some(Time(at(created)));
        Arc::new(record)
    }

    fn found(nodes: &[Node]) -> Found<'_, 'static, Node> {
        let mut found = Found {
            candidates: Vec::new(),
            evidence_of: std::collections::BTreeMap::new(),
            approved_records: std::collections::BTreeMap::new(),
        };
        for node in nodes {
            let name = node.metadata.name.clone().unwrap();
            found.candidates.push(Candidate {
                node: name.clone(),
                since: at(1000),
                approved_past_attempts: false,
            });
            let evidence = Evidence {
                trigger: 0,
                condition_type: "GpuHealthy".into(),
                reason: "XID79".into(),
                message: String::new(),
                since: at(1000),
            };
            found.evidence_of.insert(name, (node, evidence));
        }
        found
    }

    fn names<'f>(found: &'f Found<'_, '_, Node>) -> Vec<&'f str> {
        found.candidates.iter().map(|c| c.node.as_str()).collect()
    }

    #[test]
    fn a_node_opens_at_most_one_episode_a_minute_under_a_zero_toleration() {
        let nodes = [node("a", None), node("b", None)];
        let records = [record("a", 990)];
        let mut f = found(&nodes);
        let held = hold_off(&mut f, "p", &spec(0), &[], &records, at(1000));
        assert_eq!(names(&f), ["b"]);
        assert_eq!(held.len(), 1);
        assert_eq!(held[0].until, at(990 + 60));
        assert_eq!(held[0].waiting.reason, reasons::EPISODE_HELD_OFF);
        assert!(!f.evidence_of.contains_key("a"));

        let mut later = found(&nodes);
        assert!(hold_off(&mut later, "p", &spec(0), &[], &records, at(1050)).is_empty());
        assert_eq!(names(&later), ["a", "b"]);
    }

    #[test]
    fn a_longer_toleration_is_the_least_time_between_episodes() {
        let nodes = [node("a", None)];
        let records = [record("a", 500)];
        let mut f = found(&nodes);
        let held = hold_off(&mut f, "p", &spec(600), &[], &records, at(1000));
        assert_eq!(held[0].until, at(1100));
    }

    #[test]
    fn another_policys_record_does_not_hold_the_node_off() {
        let nodes = [node("a", None)];
        let mut other = (*record("a", 990)).clone();
        other.spec.policy_name = "q".into();
        let mut f = found(&nodes);
        assert!(hold_off(&mut f, "p", &spec(0), &[], &[Arc::new(other)], at(1000)).is_empty());
    }

    #[test]
    fn a_refused_node_waits_its_backoff_and_frees_the_slot() {
        let nodes = [node("a", None), node("b", None)];
        let refusals = [RecordRefusal {
            node: "a".into(),
            at: Time(at(900)),
            code: Some(422),
            message: "spec.trigger.reason: Too long".into(),
        }];
        let mut f = found(&nodes);
        let held = hold_off(&mut f, "p", &spec(0), &refusals, &[], at(1000));
        assert_eq!(names(&f), ["b"]);
        assert_eq!(held[0].waiting.reason, reasons::RECORD_REFUSED);
        assert!(held[0].waiting.message.contains("Too long"), "{:?}", held[0]);
        assert_eq!(held[0].until, at(900 + REFUSAL_BACKOFF_SECONDS));

        let mut after = found(&nodes);
        let past = at(900 + REFUSAL_BACKOFF_SECONDS);
        assert!(hold_off(&mut after, "p", &spec(0), &refusals, &[], past).is_empty());
    }

    #[test]
    fn refusals_are_listed_newest_first_once_per_node_and_forgotten_after_their_backoff() {
        let refusal = |node: &str, t: i64| RecordRefusal {
            node: node.into(),
            at: Time(at(t)),
            code: Some(422),
            message: "refused".into(),
        };
        let mut listed = Vec::new();
        for i in 0..20 {
            add_refusal(&mut listed, refusal(&format!("n{i}"), i));
        }
        add_refusal(&mut listed, refusal("n19", 30));
        assert_eq!(listed.len(), REFUSALS_LISTED_MAX as usize);
        assert_eq!((listed[0].node.as_str(), listed[0].at.0), ("n19", at(30)));
        assert_eq!(listed[1].node, "n18");
        let current = current_refusals(&listed, at(18 + REFUSAL_BACKOFF_SECONDS));
        let nodes: Vec<&str> = current.iter().map(|r| r.node.as_str()).collect();
        assert_eq!(nodes, ["n19"]);
    }

    #[test]
    fn an_approved_readmission_is_no_new_episode() {
        let nodes = [node("a", None)];
        let mut f = found(&nodes);
        f.candidates[0].approved_past_attempts = true;
        assert!(hold_off(&mut f, "p", &spec(0), &[], &[record("a", 999)], at(1000)).is_empty());
    }
}
