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
//! The budget's part splits again at the replacement's Ready (the simulated kubelet's status write):
//! **the workload's part** (grant → a pod of the Deployment reported Ready) and **the disruption
//! controller's** (Ready → the budget written with room). kube-controller-manager's disruption
//! controller syncs budgets one at a time (one worker, `pkg/controller/disruption`), so its budget
//! writes for every drain in the cluster queue behind each other: how many it made while the
//! drainer evicted, whether any two were ever in flight at once, each one's time in the server and
//! the time between one answered and the next received tell how busy that one worker was. (The
//! API server's own budget write when it grants an eviction, as `system:apiserver`, is not its.)
//!
//! The longest Deployment's sum of budget parts is what the budgets alone took in this drain; it
//! depends on how many replacements run at once, so it is this drain's figure, not a floor for
//! every drain. Pure: reads audit-log text.

use std::collections::BTreeMap;

use jiff::Timestamp;

use super::percentile::percentile;

/// The two fleets' namespaces: the controller's, then `kubectl drain`'s (the audit policy keeps
/// their pods' status writes, see [`audit_rules`]).
pub const NAMESPACES: [&str; 2] = ["drain-ctl", "drain-kubectl"];

/// The audit policy's rules for budget status writes (every writer, with their bodies: the
/// disruption controller's room) and for pod status writes in `namespaces` (with their bodies: the
/// simulated kubelet reporting a replacement Ready).
#[must_use]
pub fn audit_rules(namespaces: &[&str]) -> String {
    let namespaces = super::audit::flow_list(namespaces);
    format!(
        "  - level: Request
    verbs: [\"update\", \"patch\"]
    resources:
      - group: policy
        resources: [\"poddisruptionbudgets/status\"]
  - level: Request
    verbs: [\"update\", \"patch\"]
    namespaces: [{namespaces}]
    resources:
      - group: \"\"
        resources: [\"pods/status\"]
"
    )
}

/// The disruption controller's identity (kube-controller-manager with
/// `--use-service-account-credentials`, as the sandbox runs it).
pub const DISRUPTION_CONTROLLER: &str = "system:serviceaccount:kube-system:disruption-controller";

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
    /// The spread of `values` (all zero when there are none).
    #[must_use]
    pub fn of(values: &[f64]) -> Self {
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
    /// The Deployment whose server-side parts add up to the most (its budget parts and its granted
    /// evictions' time in the server, received → answered: the eviction checks the budget, counts
    /// the disruption and deletes the pod before any replacement can start), and that sum in
    /// seconds. What is left of the drain is the drainer's: its start, its part of each link, and
    /// the end.
    pub longest_server_chain: Option<(String, f64)>,
    /// Of the budget's part, the workload's: grant answered → a pod of the Deployment reported
    /// Ready (its replacement: created, scheduled, started).
    pub workload: Spread,
    /// Of the budget's part, the disruption controller's: that Ready → the budget written with room.
    pub disruption_controller: Spread,
    /// Links whose budget's part showed no Ready in between (not split further).
    pub ready_not_seen: usize,
    /// The disruption controller's budget status writes in the namespace from the drainer's first
    /// eviction received to its last answered.
    pub budget_writes: usize,
    /// Of them, received while an earlier one was still unanswered (0: one at a time).
    pub budget_writes_overlapping: usize,
    /// Each one's time in the server (received → answered).
    pub budget_write: Spread,
    /// Between one answered and the next received: the disruption controller's own time (its
    /// sync, its wait for work).
    pub between_budget_writes: Spread,
}

/// A granted eviction: when the server received it and when it answered.
struct Grant {
    received: Timestamp,
    answered: Timestamp,
}

/// Splits the drain links of `username`'s evictions in `namespace`, from the audit log `log`
/// (which must hold the budget and pod status writes: [`audit_rules`]).
#[must_use]
pub fn measure(log: &str, username: &str, namespace: &str) -> DrainLinks {
    let mut grants: BTreeMap<String, Vec<Grant>> = BTreeMap::new();
    // Every eviction the drainer sent, whatever its answer: (received, answered).
    let mut sent: Vec<(Timestamp, Timestamp)> = Vec::new();
    let mut rooms: BTreeMap<String, Vec<Timestamp>> = BTreeMap::new();
    let mut readies: BTreeMap<String, Vec<Timestamp>> = BTreeMap::new();
    // Every budget status write: (received, answered).
    let mut budget_writes: Vec<(Timestamp, Timestamp)> = Vec::new();
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
        let Some(received) = text("/requestReceivedTimestamp").and_then(|t| t.parse::<Timestamp>().ok())
        else {
            continue;
        };
        let written = code.is_some_and(|c| c < 300);
        match (text("/objectRef/resource"), text("/objectRef/subresource")) {
            (Some("pods"), Some("eviction")) if text("/user/username") == Some(username) => {
                sent.push((received, answered));
                if code != Some(201) {
                    continue;
                }
                grants
                    .entry(deployment_of(name))
                    .or_default()
                    .push(Grant { received, answered });
            }
            (Some("poddisruptionbudgets"), Some("status")) if written => {
                if text("/user/username") == Some(DISRUPTION_CONTROLLER) {
                    budget_writes.push((received, answered));
                }
                if event
                    .pointer("/requestObject/status/disruptionsAllowed")
                    .and_then(serde_json::Value::as_i64)
                    .is_some_and(|allowed| allowed >= 1)
                {
                    rooms.entry(name.to_owned()).or_default().push(answered);
                }
            }
            (Some("pods"), Some("status")) if written && reports_ready(&event) => {
                readies.entry(deployment_of(name)).or_default().push(answered);
            }
            _ => {}
        }
    }
    let mut links = split(&grants, &rooms, &readies, &sent);
    let first = sent.iter().map(|&(received, _)| received).min();
    let last = sent.iter().map(|&(_, answered)| answered).max();
    if let (Some(first), Some(last)) = (first, last) {
        budget_writes.retain(|&(received, _)| received >= first && received <= last);
    }
    let durations: Vec<f64> = budget_writes
        .iter()
        .map(|&(received, answered)| millis(received, answered))
        .collect();
    links.budget_writes = budget_writes.len();
    let (overlapping, between) = writer_pace(budget_writes);
    links.budget_writes_overlapping = overlapping;
    links.budget_write = Spread::of(&durations);
    links.between_budget_writes = between;
    links
}

/// Whether a pod status write sets the pod's `Ready` condition to `True`.
fn reports_ready(event: &serde_json::Value) -> bool {
    event
        .pointer("/requestObject/status/conditions")
        .and_then(serde_json::Value::as_array)
        .is_some_and(|conditions| {
            conditions.iter().any(|c| {
                c.get("type").and_then(serde_json::Value::as_str) == Some("Ready")
                    && c.get("status").and_then(serde_json::Value::as_str) == Some("True")
            })
        })
}

/// How one writer paced its writes `(received, answered)`: how many were received while an
/// earlier one was unanswered, and the gaps from one answered to the next received.
fn writer_pace(mut writes: Vec<(Timestamp, Timestamp)>) -> (usize, Spread) {
    writes.sort();
    let mut overlapping = 0;
    let mut gaps = Vec::new();
    let mut last_answered: Option<Timestamp> = None;
    for (received, answered) in writes {
        match last_answered {
            Some(last) if received < last => overlapping += 1,
            Some(last) => gaps.push(millis(last, received)),
            None => {}
        }
        last_answered = Some(last_answered.map_or(answered, |last| last.max(answered)));
    }
    (overlapping, Spread::of(&gaps))
}

fn split(
    grants: &BTreeMap<String, Vec<Grant>>,
    rooms: &BTreeMap<String, Vec<Timestamp>>,
    readies: &BTreeMap<String, Vec<Timestamp>>,
    sent: &[(Timestamp, Timestamp)],
) -> DrainLinks {
    let mut budget_parts = Vec::new();
    let mut workload_parts = Vec::new();
    let mut controller_parts = Vec::new();
    let mut ready_not_seen = 0;
    let mut drainer_parts = Vec::new();
    let mut behind_parts = Vec::new();
    let mut unattributed = 0;
    let mut longest_chain: Option<(String, f64)> = None;
    let mut longest_server_chain: Option<(String, f64)> = None;
    let none = Vec::new();
    for (deployment, granted) in grants {
        let mut granted: Vec<&Grant> = granted.iter().collect();
        granted.sort_by_key(|g| g.received);
        let rooms = rooms.get(deployment).unwrap_or(&none);
        let readies = readies.get(deployment).unwrap_or(&none);
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
            // The first pod of the Deployment reported Ready since the grant: its replacement.
            match readies
                .iter()
                .filter(|&&ready| ready >= earlier.answered && ready <= room)
                .min()
            {
                Some(&ready) => {
                    workload_parts.push(millis(earlier.answered, ready));
                    controller_parts.push(millis(ready, room));
                }
                None => ready_not_seen += 1,
            }
            let drainer_ms = millis(room, next.received);
            drainer_parts.push(drainer_ms);
            let last_unanswered = sent
                .iter()
                .filter(|&&(received, answered)| received < room && answered > room)
                .map(|&(_, answered)| answered)
                .max();
            behind_parts.push(last_unanswered.map_or(0.0, |answered| millis(room, answered).min(drainer_ms)));
        }
        let evicting_ms: f64 = granted.iter().map(|g| millis(g.received, g.answered)).sum();
        for (longest, ms) in [
            (&mut longest_chain, chain_ms),
            (&mut longest_server_chain, chain_ms + evicting_ms),
        ] {
            if longest.as_ref().is_none_or(|(_, seconds)| ms / 1000.0 > *seconds) {
                *longest = Some((deployment.clone(), ms / 1000.0));
            }
        }
    }
    DrainLinks {
        links: budget_parts.len(),
        unattributed,
        budget: Spread::of(&budget_parts),
        drainer: Spread::of(&drainer_parts),
        drainer_behind_own_requests: Spread::of(&behind_parts),
        longest_chain,
        longest_server_chain,
        workload: Spread::of(&workload_parts),
        disruption_controller: Spread::of(&controller_parts),
        ready_not_seen,
        ..DrainLinks::default()
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

    /// The simulated kubelet reporting `pod` Ready (or, with `ready` false, only Running).
    fn pod_status(pod: &str, answered_ms: u32, ready: bool) -> String {
        let status = if ready { "True" } else { "False" };
        serde_json::json!({
            "stage": "ResponseComplete", "verb": "patch", "user": {"username": "system:admin"},
            "objectRef": {"resource": "pods", "subresource": "status", "namespace": "drain", "name": pod},
            "requestReceivedTimestamp": at(answered_ms), "stageTimestamp": at(answered_ms),
            "requestObject": {"status": {"phase": "Running", "conditions": [
                {"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": status}]}},
            "responseStatus": {"code": 200},
        })
        .to_string()
    }

    /// A budget status write the server took `received_ms..answered_ms` over.
    fn budget_write_over(pdb: &str, received_ms: u32, answered_ms: u32) -> String {
        budget_written(pdb, answered_ms, 0).replace(
            &format!("\"requestReceivedTimestamp\":\"{}\"", at(answered_ms)),
            &format!("\"requestReceivedTimestamp\":\"{}\"", at(received_ms)),
        )
    }

    #[test]
    fn the_audit_rules_keep_budget_writes_everywhere_and_pod_status_writes_in_the_drains_namespaces() {
        let policy = crate::bench::audit::policy(&["me"], &[&audit_rules(&["drain-a", "drain-b"])]);
        let policy: serde_json::Value = serde_yaml::from_str(&policy).expect("the policy is YAML");
        let rules = policy["rules"].as_array().expect("rules");
        let resources = |rule: &serde_json::Value| rule["resources"][0]["resources"][0].clone();
        assert_eq!(resources(&rules[1]), "poddisruptionbudgets/status");
        assert!(rules[1].get("namespaces").is_none(), "{policy}");
        assert_eq!(resources(&rules[2]), "pods/status");
        assert_eq!(rules[2]["namespaces"], serde_json::json!(["drain-a", "drain-b"]));
        assert_eq!(rules[2]["level"], "Request");
        // Nothing else is kept.
        assert_eq!(rules.last().expect("a last rule")["level"], "None");
    }

    #[test]
    fn the_budgets_part_splits_at_the_replacements_ready() {
        let log = [
            eviction("app-00-abc-1", 0, 10, 201),
            // The replacement scheduled, not yet Ready: not the split.
            pod_status("app-00-abc-9", 200, false),
            pod_status("app-00-abc-9", 410, true),
            // Another Deployment's replacement Ready earlier: not this link's.
            pod_status("app-01-def-9", 100, true),
            budget_written("app-00", 1_010, 1),
            eviction("app-00-abc-2", 1_030, 1_040, 201),
            // A link with no Ready seen before its room: split into budget and drainer only.
            budget_written("app-00", 2_040, 1),
            pod_status("app-00-abc-8", 2_050, true),
            eviction("app-00-abc-3", 2_100, 2_110, 201),
        ]
        .join("\n");
        let links = measure(&log, ME, "drain");
        assert_eq!((links.links, links.ready_not_seen), (2, 1), "{links:?}");
        // 10 → 410 ms the workload's, 410 → 1,010 the disruption controller's.
        assert!((links.workload.max_ms - 400.0).abs() < 0.01, "{links:?}");
        assert!(
            (links.disruption_controller.max_ms - 600.0).abs() < 0.01,
            "{links:?}"
        );
    }

    #[test]
    fn budget_writes_in_flight_together_are_counted_and_the_gaps_between_the_others_measured() {
        let log = [
            // Before the drainer's first eviction: not counted.
            budget_write_over("app-05", 0, 1),
            eviction("app-00-abc-1", 2, 5, 201),
            // The server's own write as it grants: not the disruption controller's.
            budget_write_over("app-00", 3, 4).replace(DISRUPTION_CONTROLLER, "system:apiserver"),
            budget_write_over("app-00", 10, 30),
            // 5 ms after the first was answered.
            budget_write_over("app-01", 35, 50),
            // Received while app-01's write was unanswered: a second writer.
            budget_write_over("app-02", 40, 60),
            // 50 ms after the last answer (app-02's at 60, not app-01's at 50).
            budget_write_over("app-00", 110, 120),
            // Refused: not a write.
            budget_write_over("app-03", 200, 210).replace("\"code\":200", "\"code\":409"),
            eviction("app-00-abc-2", 300, 310, 429),
            // After the drainer's last eviction was answered: not counted.
            budget_write_over("app-00", 400, 410),
        ]
        .join("\n");
        let links = measure(&log, ME, "drain");
        assert_eq!(
            (links.budget_writes, links.budget_writes_overlapping),
            (4, 1),
            "{links:?}"
        );
        // 20, 15, 20 and 10 ms in the server.
        assert!((links.budget_write.p50_ms - 15.0).abs() < 0.01, "{links:?}");
        assert!((links.budget_write.max_ms - 20.0).abs() < 0.01, "{links:?}");
        assert!(
            (links.between_budget_writes.p50_ms - 5.0).abs() < 0.01,
            "{links:?}"
        );
        assert!(
            (links.between_budget_writes.max_ms - 50.0).abs() < 0.01,
            "{links:?}"
        );
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
        // With the evictions' time in the server: app-00's three grants took 10 ms each.
        let (longest, seconds) = links.longest_server_chain.expect("a chain");
        assert_eq!(longest, "app-00");
        assert!((seconds - 3.03).abs() < 1e-6, "{seconds}");
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
