//! The model of `fleet_paths_tests`: a fleet of nodes under two policies, their records, the
//! clock, their quarantines, and how the acting layer applies a pass's plan (with lost writes).
//! What the planner is held to lives in the tests; this module only keeps the world.

use std::sync::Arc;

use gpu_remediation_api::{
    GpuRemediation, GpuRemediationPolicy, GpuRemediationPolicySpec, GpuRemediationStatus, Phase,
    constants::{CORDONED_BY_ANNOTATION, QUARANTINE_TAINT_KEY, QUARANTINED_BY_ANNOTATION},
    policy::RecordRefusal,
    remediation::PhaseTransition,
    validate,
};
use k8s_openapi::{
    api::core::v1::{Node, NodeCondition, NodeSpec, NodeStatus, Taint},
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
};
use kube::ResourceExt;

use crate::{first_seen::FirstSeen, fleet::FleetPlan, quarantine::Lift, test_fixtures::at};

/// The phases a record moves through, open and finished.
pub(super) const PHASES: [Phase; 9] = [
    Phase::Pending,
    Phase::Cordoned,
    Phase::Draining,
    Phase::Replacing,
    Phase::Verifying,
    Phase::Succeeded,
    Phase::Failed,
    Phase::Cancelled,
    Phase::ManualRequired,
];

/// What a node's `GpuHealthy` condition says, and with which stamp.
#[derive(Clone, Copy, Debug)]
pub(super) enum Reading {
    Healthy,
    /// `False`, stamped this many seconds before now.
    BrokenSince(i64),
    /// `False`, no `lastTransitionTime`.
    BrokenUnstamped,
    /// `False`, stamped this many seconds after now.
    BrokenInFuture(i64),
}

/// What becomes of one create of a pass.
#[derive(Clone, Copy, Debug)]
pub(super) enum Fate {
    Applied,
    RefusedWithCode,
    RefusedUnanswered,
    /// Created, but the policy status of the pass was never written.
    HalfApplied,
}

#[derive(Clone, Debug)]
pub(super) struct Seen {
    pub(super) at: i64,
    pub(super) untrusted: bool,
    pub(super) healthy: bool,
    pub(super) stamp: Option<i64>,
}

#[derive(Clone, Debug)]
pub(super) struct NodeState {
    pub(super) name: String,
    /// In group `a`: governed by `narrow`.
    pub(super) narrow: bool,
    /// Its zone (label `zone`), `z0` or `z1`: every other node.
    pub(super) zone: usize,
    pub(super) healthy: bool,
    pub(super) stamp: Option<i64>,
    pub(super) cordoned_by: Option<String>,
    /// The policy whose quarantine (taint and `quarantined-by` annotation) the node carries.
    pub(super) quarantined_by: Option<String>,
    /// When the current leader first saw the condition as it is (status and stamp, as of its
    /// last pass: a blip between two passes is not seen), and whether its stamp was untrusted
    /// then.
    pub(super) seen: Option<Seen>,
}

impl NodeState {
    /// The policy that governs the node: `narrow` (priority 10) over `wide` (priority 0).
    pub(super) fn governor(&self) -> &'static str {
        if self.narrow { "narrow" } else { "wide" }
    }
}

pub(super) struct Model {
    pub(super) now: i64,
    pub(super) nodes: Vec<NodeState>,
    pub(super) records: Vec<GpuRemediation>,
    pub(super) policies: Vec<GpuRemediationPolicy>,
    pub(super) first_seen: FirstSeen,
    /// A number for the names of added records.
    pub(super) serial: u32,
}

pub(super) fn policy(
    name: &str,
    (label, value): (&str, &str),
    priority: i32,
    for_secs: u32,
    limits: Limits,
) -> GpuRemediationPolicy {
    let mut safety = serde_json::json!({
        "maxConcurrent": limits.max_concurrent,
        "maxUnhealthy": format!("{}%", limits.max_unhealthy_percent),
        "rate": {"limit": limits.rate, "per": "1h"},
        "maxAttemptsPerNode": {"count": 2, "per": "1h"},
    });
    if let Some(count) = limits.max_unhealthy_count {
        safety["maxUnhealthyCount"] = count.into();
    }
    let mut quarantine = serde_json::json!({"enabled": limits.quarantine});
    if let Some(max) = limits.quarantine_max {
        quarantine["max"] = max.into();
    }
    if let Some(domain) = limits.zone {
        safety["failureDomains"] = serde_json::json!([{
            "topologyKey": "zone",
            "maxUnhealthyCount": domain.max_unhealthy,
            "maxInFlight": domain.max_in_flight,
        }]);
    }
    let spec: GpuRemediationPolicySpec = serde_json::from_value(serde_json::json!({
        "nodeSelector": {"matchLabels": {label: value}},
        "priority": priority,
        "triggers": [{"conditionType": "GpuHealthy", "status": "False", "for": format!("{for_secs}s")}],
        "action": "None",
        "safety": safety,
        "history": {"ttl": "2h"},
        "quarantine": quarantine,
    }))
    .unwrap();
    assert!(
        validate::validate_spec(&spec).is_empty(),
        "the model's policy {name} is valid"
    );
    let mut p = GpuRemediationPolicy::new(name, spec);
    p.metadata.generation = Some(1);
    p
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Limits {
    pub(super) max_concurrent: u32,
    pub(super) max_unhealthy_percent: u32,
    pub(super) max_unhealthy_count: Option<u32>,
    pub(super) rate: u32,
    /// A failure domain per zone, if any.
    pub(super) zone: Option<Zone>,
    /// `quarantine.enabled`.
    pub(super) quarantine: bool,
    /// `quarantine.max` (unset: `safety.maxUnhealthy`).
    pub(super) quarantine_max: Option<u32>,
}

/// The limits of a policy's failure domain (label `zone`).
#[derive(Clone, Copy, Debug)]
pub(super) struct Zone {
    pub(super) max_unhealthy: u32,
    pub(super) max_in_flight: u32,
}

/// The fleet at the start: each node's group and reading, and the phase of its record (if any).
pub(super) type Start = Vec<(bool, Reading, Option<(usize, i64)>)>;

impl Model {
    pub(super) fn new(start: &Start, wide: Limits, narrow: Limits, narrow_for: u32) -> Self {
        let now = 100_000;
        let mut model = Self {
            now,
            nodes: Vec::new(),
            records: Vec::new(),
            policies: vec![
                policy("narrow", ("group", "a"), 10, narrow_for, narrow),
                policy("wide", ("gpu", "yes"), 0, 120, wide),
            ],
            first_seen: FirstSeen::default(),
            serial: 0,
        };
        for (i, (narrow, reading, record)) in start.iter().enumerate() {
            model.nodes.push(NodeState {
                name: format!("n{i}"),
                narrow: *narrow,
                zone: i % 2,
                healthy: true,
                stamp: None,
                cordoned_by: None,
                quarantined_by: None,
                seen: None,
            });
            model.read(i, *reading);
            if let Some((phase, age)) = record {
                model.add_record(i, PHASES[*phase], now - age, now - age - 600);
            }
        }
        model
    }

    pub(super) fn spec(&self, name: &str) -> &GpuRemediationPolicySpec {
        &self.policies.iter().find(|p| p.name_any() == name).unwrap().spec
    }

    pub(super) fn read(&mut self, i: usize, reading: Reading) {
        let now = self.now;
        let node = &mut self.nodes[i];
        let (healthy, stamp) = match reading {
            Reading::Healthy => (true, Some(now)),
            Reading::BrokenSince(ago) => (false, Some(now - ago)),
            Reading::BrokenUnstamped => (false, None),
            Reading::BrokenInFuture(ahead) => (false, Some(now + ahead)),
        };
        node.healthy = healthy;
        node.stamp = stamp;
    }

    /// A record of node `i`'s episode begun at `since`, created at `created`, in `phase`.
    pub(super) fn add_record(&mut self, i: usize, phase: Phase, created: i64, since: i64) {
        let node = &self.nodes[i];
        self.serial += 1;
        let mut r = crate::test_fixtures::remediation(
            &format!("{}-{}", node.name, self.serial),
            &node.name,
            node.governor(),
            Some(at(since)),
            gpu_remediation_api::policy::Action::None,
        );
        r.metadata.creation_timestamp = Some(Time(at(created)));
        r.status = Some(GpuRemediationStatus {
            phase,
            phase_history: vec![PhaseTransition {
                phase,
                at: Time(at(created)),
                message: None,
            }],
            ..GpuRemediationStatus::default()
        });
        self.records.push(r);
    }

    pub(super) fn node_objects(&self) -> Vec<Arc<Node>> {
        self.nodes
            .iter()
            .map(|n| {
                let mut labels = std::collections::BTreeMap::from([
                    ("gpu".to_owned(), "yes".to_owned()),
                    ("zone".to_owned(), format!("z{}", n.zone)),
                ]);
                if n.narrow {
                    labels.insert("group".into(), "a".into());
                }
                let annotations = [
                    (CORDONED_BY_ANNOTATION, &n.cordoned_by),
                    (QUARANTINED_BY_ANNOTATION, &n.quarantined_by),
                ]
                .into_iter()
                .filter_map(|(key, by)| Some((key.to_owned(), by.clone()?)))
                .collect();
                let taints = n.quarantined_by.as_ref().map(|_| {
                    vec![Taint {
                        key: QUARANTINE_TAINT_KEY.to_owned(),
                        effect: "NoSchedule".to_owned(),
                        ..Taint::default()
                    }]
                });
                Arc::new(Node {
                    metadata: ObjectMeta {
                        name: Some(n.name.clone()),
                        uid: Some(format!("uid-{}", n.name)),
                        labels: Some(labels),
                        annotations: Some(annotations),
                        ..ObjectMeta::default()
                    },
                    spec: Some(NodeSpec {
                        taints,
                        ..NodeSpec::default()
                    }),
                    status: Some(NodeStatus {
                        conditions: Some(vec![NodeCondition {
                            type_: "GpuHealthy".into(),
                            status: if n.healthy { "True" } else { "False" }.into(),
                            reason: Some("XID79".into()),
                            last_transition_time: n.stamp.map(|s| Time(at(s))),
                            ..NodeCondition::default()
                        }]),
                        ..NodeStatus::default()
                    }),
                })
            })
            .collect()
    }

    /// Since when the node's condition has said `False`, by the model's reading of its clock (a
    /// stamp in the past as written, a missing or future one from when the leader first saw it).
    pub(super) fn since(&self, node: &NodeState) -> Option<i64> {
        if node.healthy {
            return None;
        }
        let seen = node.seen.as_ref()?;
        Some(if seen.untrusted {
            seen.at
        } else {
            node.stamp.unwrap_or(seen.at).min(self.now)
        })
    }

    /// Whether node `i`'s trigger under its governing policy holds now, by the model's clock.
    pub(super) fn holds(&self, node: &NodeState) -> bool {
        let Some(since) = self.since(node) else {
            return false;
        };
        let trigger_for = self.spec(node.governor()).triggers[0].for_.as_std().as_secs();
        since + i64::try_from(trigger_for).unwrap() <= self.now
    }

    /// Whether a record of `policy` holds the node: one open, or a finished one whose cordon it
    /// still names.
    pub(super) fn held_by_record(&self, node: &NodeState, policy: &str) -> bool {
        self.records.iter().any(|r| {
            r.spec.node_name == node.name
                && r.spec.policy_name == policy
                && (Self::open(r) || node.cordoned_by.as_deref() == Some(r.name_any().as_str()))
        })
    }

    pub(super) fn open(record: &GpuRemediation) -> bool {
        !record
            .status
            .as_ref()
            .map(|s| s.phase)
            .unwrap_or_default()
            .is_terminal()
    }

    /// What the leader sees at a pass at `now`: each node's condition first seen now unless it
    /// is as at the previous pass.
    pub(super) fn observe(&mut self) {
        let now = self.now;
        for node in &mut self.nodes {
            let same = |seen: &Seen| (seen.healthy, seen.stamp) == (node.healthy, node.stamp);
            if !node.seen.as_ref().is_some_and(same) {
                node.seen = Some(Seen {
                    at: now,
                    untrusted: node.stamp.is_none_or(|s| s > now),
                    healthy: node.healthy,
                    stamp: node.stamp,
                });
            }
        }
    }

    /// A new leader: the planner's memory and the model's reading of it start afresh.
    pub(super) fn leader_change(&mut self) {
        self.first_seen = FirstSeen::default();
        for node in &mut self.nodes {
            node.seen = None;
        }
    }

    pub(super) fn apply(&mut self, plan: FleetPlan, fates: &[Fate], deletes_lost: bool) {
        let now = self.now;
        // The node edits' fates, read from the other end: a refused one is a lost write.
        let mut lost = fates
            .iter()
            .rev()
            .map(|f| matches!(f, Fate::RefusedWithCode | Fate::RefusedUnanswered))
            .cycle();
        let mut fates = fates.iter().cycle();
        for p in plan.policies {
            let name = p.policy.name_any();
            for add in &p.quarantine.add {
                if !lost.next().unwrap_or(false) {
                    let node = self.nodes.iter_mut().find(|n| n.name == add.node.name).unwrap();
                    node.quarantined_by = Some(name.clone());
                }
            }
            self.lift(&p.quarantine.lift, &mut lost);
            let mut status = p.status;
            let mut status_lost = false;
            let manual = p.manual_required.into_iter().map(|r| (r, Phase::ManualRequired));
            for (mut record, phase) in p.create.into_iter().map(|r| (r, Phase::Pending)).chain(manual) {
                let node = record.spec.node_name.clone();
                let code = match fates.next().copied().unwrap_or(Fate::Applied) {
                    Fate::Applied => None,
                    Fate::HalfApplied => {
                        status_lost = true;
                        None
                    }
                    Fate::RefusedWithCode => Some(Some(422)),
                    Fate::RefusedUnanswered => Some(None),
                };
                let exists = self.records.iter().any(|r| r.name_any() == record.name_any());
                let code = if exists { Some(Some(409)) } else { code };
                if let Some(code) = code {
                    crate::fleet::episodes::add_refusal(
                        &mut status.record_refusals,
                        RecordRefusal {
                            node,
                            at: Time(at(now)),
                            code,
                            message: "refused".into(),
                        },
                    );
                    continue;
                }
                record.metadata.creation_timestamp = Some(Time(at(now)));
                record.status = Some(GpuRemediationStatus {
                    phase,
                    phase_history: vec![PhaseTransition {
                        phase,
                        at: Time(at(now)),
                        message: None,
                    }],
                    ..GpuRemediationStatus::default()
                });
                self.records.push(record);
            }
            if !deletes_lost {
                self.records.retain(|r| !p.expired.contains(&r.name_any()));
            }
            if !status_lost {
                let policy = self.policies.iter_mut().find(|q| q.name_any() == name).unwrap();
                policy.status = Some(status);
            }
        }
        self.lift(&plan.orphan_quarantines, &mut lost);
    }

    /// Lifts each quarantine whose write is not `lost`: only the owner's (`taint::lift`).
    fn lift(&mut self, lifts: &[Lift], lost: &mut impl Iterator<Item = bool>) {
        for lift in lifts {
            let node = self.nodes.iter_mut().find(|n| n.name == lift.node.name).unwrap();
            if !lost.next().unwrap_or(false) && node.quarantined_by.as_ref() == Some(&lift.policy) {
                node.quarantined_by = None;
            }
        }
    }

    pub(super) fn progress(&mut self, record: usize, phase: usize, holds: bool) {
        if self.records.is_empty() {
            return;
        }
        let now = self.now;
        let i = record % self.records.len();
        let record = &mut self.records[i];
        if !Self::open(record) {
            return;
        }
        let phase = PHASES[phase];
        let status = record.status.get_or_insert_with(GpuRemediationStatus::default);
        status.phase = phase;
        status.phase_history.push(PhaseTransition {
            phase,
            at: Time(at(now)),
            message: None,
        });
        let name = record.name_any();
        let node_name = record.spec.node_name.clone();
        let policy = record.spec.policy_name.clone();
        let node = self.nodes.iter_mut().find(|n| n.name == node_name).unwrap();
        if phase == Phase::Failed && holds {
            node.cordoned_by = Some(name);
        } else if phase.is_terminal() {
            // The release: the cordon the record made and the quarantine of its policy it took
            // over (`Writer::release_node`).
            if node.cordoned_by.as_deref() == Some(name.as_str()) {
                node.cordoned_by = None;
            }
            if node.quarantined_by.as_ref() == Some(&policy) {
                node.quarantined_by = None;
            }
        }
    }
}
