//! Where a drain's time goes when every Deployment sits behind `maxUnavailable: 1`: its pods leave
//! one at a time, and each link of that chain has two parts the audit log tells apart.
//!
//! - **The budget's part**: from one eviction of a Deployment granted to its budget written with
//!   room again (`disruptionsAllowed ≥ 1`, by the disruption controller): the evicted pod leaving,
//!   its `ReplicaSet` creating a replacement, the scheduler placing it, the node reporting it Ready,
//!   the disruption controller recomputing the budget. No drainer that keeps the budget can skip it.
//! - **The drainer's part**: from that budget write to the drainer's next eviction of the same
//!   Deployment received by the server: its watch (or its retry timer), its decision, its request;
//!   of it, the time the drainer still had earlier evictions of its own unanswered (a drainer that
//!   sends in rounds decides again only when a round is answered).
//!
//! The longest Deployment's sum of budget parts is what the budgets alone took in this drain; it
//! depends on how many replacements run at once, so it is this drain's figure, not a floor for
//! every drain. Pure: reads audit-log text.

use std::collections::BTreeMap;

use jiff::Timestamp;

use super::report::percentile;

/// The audit policy's rule for budget status writes (every writer, with their bodies): the
/// disruption controller's room, and the API server's own write when it grants an eviction.
pub const AUDIT_RULE: &str = "  - level: Request
    verbs: [\"update\", \"patch\"]
    resources:
      - group: policy
        resources: [\"poddisruptionbudgets/status\"]
";

/// p50, p99 and max of one part, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Spread {
    /// Median.
    pub p50_ms: f64,
    /// 99th percentile (nearest rank).
    pub p99_ms: f64,
    /// Largest.
    pub max_ms: f64,
}

impl Spread {
    fn of(values: &[f64]) -> Self {
        Self {
            p50_ms: percentile(values, 50.0).unwrap_or(0.0),
            p99_ms: percentile(values, 99.0).unwrap_or(0.0),
            max_ms: percentile(values, 100.0).unwrap_or(0.0),
        }
    }
}

/// One drain's links, split into the budget's part and the drainer's.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct DrainLinks {
    /// Links measured: a granted eviction that followed an earlier grant of the same Deployment
    /// and a budget write showing room in between.
    pub links: usize,
    /// Grants after an earlier one with no room written in between (a budget whose room the
    /// server had already counted, e.g. `maxUnavailable` above 1): not split.
    pub unattributed: usize,
    /// Earlier grant answered → budget written with room.
    pub budget: Spread,
    /// Budget written with room → the drainer's next eviction received.
    pub drainer: Spread,
    /// Of the drainer's part, how long it still had earlier evictions unanswered after the room
    /// was written (the last of them answered, at most the whole part).
    pub drainer_behind_own_requests: Spread,
    /// The Deployment whose budget parts add up to the most, and that sum in seconds.
    pub longest_chain: Option<(String, f64)>,
}

/// A granted eviction: when the server received it and when it answered.
struct Grant {
    received: Timestamp,
    answered: Timestamp,
}

/// Splits the drain links of `username`'s evictions in `namespace`, from the audit log `log`
/// (which must hold the budget status writes: [`AUDIT_RULE`]).
#[must_use]
pub fn measure(log: &str, username: &str, namespace: &str) -> DrainLinks {
    let mut grants: BTreeMap<String, Vec<Grant>> = BTreeMap::new();
    // Every eviction the drainer sent, whatever its answer: (received, answered).
    let mut sent: Vec<(Timestamp, Timestamp)> = Vec::new();
    let mut rooms: BTreeMap<String, Vec<Timestamp>> = BTreeMap::new();
    for line in log.lines() {
        let Ok(event) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let text = |pointer: &str| event.pointer(pointer).and_then(serde_json::Value::as_str);
        if text("/stage") != Some("ResponseComplete") || text("/objectRef/namespace") != Some(namespace) {
            continue;
        }
        let (Some(name), Some(answered)) = (
            text("/objectRef/name"),
            text("/stageTimestamp").and_then(|t| t.parse::<Timestamp>().ok()),
        ) else {
            continue;
        };
        let code = event
            .pointer("/responseStatus/code")
            .and_then(serde_json::Value::as_u64);
        match (text("/objectRef/resource"), text("/objectRef/subresource")) {
            (Some("pods"), Some("eviction")) if text("/user/username") == Some(username) => {
                let Some(received) = text("/requestReceivedTimestamp").and_then(|t| t.parse().ok()) else {
                    continue;
                };
                sent.push((received, answered));
                if code != Some(201) {
                    continue;
                }
                grants
                    .entry(deployment_of(name))
                    .or_default()
                    .push(Grant { received, answered });
            }
            (Some("poddisruptionbudgets"), Some("status"))
                if code.is_some_and(|c| c < 300)
                    && event
                        .pointer("/requestObject/status/disruptionsAllowed")
                        .and_then(serde_json::Value::as_i64)
                        .is_some_and(|allowed| allowed >= 1) =>
            {
                rooms.entry(name.to_owned()).or_default().push(answered);
            }
            _ => {}
        }
    }
    split(&grants, &rooms, &sent)
}

fn split(
    grants: &BTreeMap<String, Vec<Grant>>,
    rooms: &BTreeMap<String, Vec<Timestamp>>,
    sent: &[(Timestamp, Timestamp)],
) -> DrainLinks {
    let mut budget_parts = Vec::new();
    let mut drainer_parts = Vec::new();
    let mut behind_parts = Vec::new();
    let mut unattributed = 0;
    let mut longest_chain: Option<(String, f64)> = None;
    let no_rooms = Vec::new();
    for (deployment, granted) in grants {
        let mut granted: Vec<&Grant> = granted.iter().collect();
        granted.sort_by_key(|g| g.received);
        let rooms = rooms.get(deployment).unwrap_or(&no_rooms);
        let mut chain_ms = 0.0;
        for pair in granted.windows(2) {
            let (earlier, next) = (pair[0], pair[1]);
            // The first room written after the earlier grant was answered and before the next
            // eviction was received: from then on the drainer could have sent it.
            let room = rooms
                .iter()
                .filter(|&&room| room >= earlier.answered && room <= next.received)
                .min();
            let Some(&room) = room else {
                unattributed += 1;
                continue;
            };
            let budget_ms = millis(earlier.answered, room);
            chain_ms += budget_ms;
            budget_parts.push(budget_ms);
            let drainer_ms = millis(room, next.received);
            drainer_parts.push(drainer_ms);
            let last_unanswered = sent
                .iter()
                .filter(|&&(received, answered)| received < room && answered > room)
                .map(|&(_, answered)| answered)
                .max();
            behind_parts.push(last_unanswered.map_or(0.0, |answered| millis(room, answered).min(drainer_ms)));
        }
        if longest_chain
            .as_ref()
            .is_none_or(|(_, longest)| chain_ms / 1000.0 > *longest)
        {
            longest_chain = Some((deployment.clone(), chain_ms / 1000.0));
        }
    }
    DrainLinks {
        links: budget_parts.len(),
        unattributed,
        budget: Spread::of(&budget_parts),
        drainer: Spread::of(&drainer_parts),
        drainer_behind_own_requests: Spread::of(&behind_parts),
        longest_chain,
    }
}

fn millis(from: Timestamp, to: Timestamp) -> f64 {
    to.duration_since(from).as_secs_f64() * 1000.0
}

/// `app-03` for the pod `app-03-7d9f8b6c4d-x2k9p`: a Deployment's pod name less its
/// `ReplicaSet`'s hash and its own suffix.
fn deployment_of(pod: &str) -> String {
    pod.rsplitn(3, '-').nth(2).unwrap_or(pod).to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: &str = "system:serviceaccount:bench:gpu-remediator";

    /// `ms` milliseconds after 10:00 on the day of the fixtures, as the audit log writes times.
    fn at(ms: u32) -> String {
        format!("2026-12-02T10:00:{:02}.{:03}Z", ms / 1000, ms % 1000)
    }

    fn eviction(pod: &str, received_ms: u32, answered_ms: u32, code: u64) -> String {
        serde_json::json!({
            "stage": "ResponseComplete", "verb": "create", "user": {"username": ME},
            "objectRef": {"resource": "pods", "subresource": "eviction", "namespace": "drain", "name": pod},
            "requestReceivedTimestamp": at(received_ms), "stageTimestamp": at(answered_ms),
            "responseStatus": {"code": code},
        })
        .to_string()
    }

    fn budget_written(pdb: &str, answered_ms: u32, allowed: i64) -> String {
        serde_json::json!({
            "stage": "ResponseComplete", "verb": "update",
            "user": {"username": "system:serviceaccount:kube-system:disruption-controller"},
            "objectRef": {"resource": "poddisruptionbudgets", "subresource": "status", "namespace": "drain", "name": pdb},
            "requestReceivedTimestamp": at(answered_ms), "stageTimestamp": at(answered_ms),
            "requestObject": {"status": {"disruptionsAllowed": allowed}},
            "responseStatus": {"code": 200},
        })
        .to_string()
    }

    #[test]
    fn a_pod_name_gives_its_deployment() {
        assert_eq!(deployment_of("app-03-7d9f8b6c4d-x2k9p"), "app-03");
        assert_eq!(deployment_of("lonely"), "lonely");
    }

    #[test]
    fn each_link_splits_at_the_budget_write_that_showed_room() {
        let log = [
            eviction("app-00-abc-1", 0, 10, 201),
            // The server's own write when it grants: no room.
            budget_written("app-00", 8, 0),
            // Refused while the budget has no room: not a link.
            eviction("app-00-abc-2", 100, 105, 429),
            budget_written("app-00", 1_010, 1),
            // Room written again before the drainer acted: the link counts from the first.
            budget_written("app-00", 1_020, 1),
            eviction("app-00-abc-2", 1_030, 1_040, 201),
            budget_written("app-00", 3_040, 1),
            eviction("app-00-abc-3", 3_100, 3_110, 201),
            // Another Deployment, one link.
            eviction("app-01-def-1", 0, 20, 201),
            // An eviction of another Deployment still unanswered when app-01's room is written:
            // the drainer's next eviction of app-01 waits for it (6 of its 10 ms).
            eviction("app-02-ghi-1", 500, 526, 429),
            // Another namespace's budget of the same name: not this drain's room.
            budget_written("app-01", 510, 1).replace("\"namespace\":\"drain\"", "\"namespace\":\"other\""),
            budget_written("app-01", 520, 1),
            eviction("app-01-def-2", 530, 540, 201),
            // Someone else's eviction is not ours.
            eviction("app-01-def-3", 600, 610, 201).replace(ME, "someone-else"),
            "not json".to_owned(),
        ]
        .join("\n");
        let links = measure(&log, ME, "drain");
        assert_eq!(links.links, 3);
        assert_eq!(links.unattributed, 0);
        // Budget parts: 1000, 2000 (app-00) and 500 ms (app-01).
        assert!((links.budget.p50_ms - 1000.0).abs() < 0.01, "{links:?}");
        assert!((links.budget.max_ms - 2000.0).abs() < 0.01, "{links:?}");
        // Drainer parts: 20, 60, 10 ms.
        assert!((links.drainer.p50_ms - 20.0).abs() < 0.01, "{links:?}");
        assert!((links.drainer.max_ms - 60.0).abs() < 0.01, "{links:?}");
        // Behind its own requests: 0, 0 and 6 ms.
        assert!(
            (links.drainer_behind_own_requests.max_ms - 6.0).abs() < 0.01,
            "{links:?}"
        );
        assert!(links.drainer_behind_own_requests.p50_ms.abs() < 0.01, "{links:?}");
        let (longest, seconds) = links.longest_chain.expect("a chain");
        assert_eq!(longest, "app-00");
        assert!((seconds - 3.0).abs() < 1e-6, "{seconds}");
    }

    #[test]
    fn a_grant_with_no_room_written_since_the_last_one_is_counted_apart() {
        let log = [
            eviction("app-00-abc-1", 0, 10, 201),
            eviction("app-00-abc-2", 20, 30, 201),
        ]
        .join("\n");
        let links = measure(&log, ME, "drain");
        assert_eq!((links.links, links.unattributed), (0, 1));
    }
}
