//! The fleet planner along random paths: a property test beyond one record. A fleet of 4–12
//! nodes under two policies whose selectors overlap (`wide` selects every node at priority 0,
//! `narrow` the nodes of group `a` at priority 10), records in random phases, node conditions
//! that turn healthy, unhealthy and back, stamped in the past, the future or not at all, a clock
//! that advances, and passes of [`plan_with`] at random times. The model applies each pass's
//! creates the way the acting layer would, with lost writes: a create the server refused (with an
//! HTTP code or without an answer), or a create whose policy status was never written (a
//! half-applied settlement); it also adds finished records of older episodes on a node, moves
//! records through their phases (a `Failed` one may keep its node cordoned), lets records expire
//! past `history.ttl`, and changes leader (the planner's first-seen memory is lost).
//!
//! After every pass, for every policy:
//! 1. what it admits (creates and readmissions) never brings its records in flight past
//!    `safety.maxConcurrent` (none at all when already at or past it);
//! 2. nothing is admitted while its circuit breaker is open (the governed nodes whose trigger
//!    holds, counted by the model, past `maxUnhealthy`/`maxUnhealthyCount`);
//! 3. every node it opens a record for is governed by it and its trigger holds at the pass's
//!    `now`, by the model's own reading of the node's clock (a stamp in the past as written, a
//!    missing or future one from when the current leader first saw it);
//! 4. no record is opened for a node that has an open record (under either policy), nor two for
//!    one node in a pass: a node never has more than one open record;
//! 5. a node opens at most one episode per `max(for, EPISODE_FLOOR)` under a policy, counted on
//!    the server's creation times, whatever its own clock says and across leader changes; and a
//!    node whose record was refused is not asked again within `REFUSAL_BACKOFF_SECONDS`;
//! 6. expiry deletes only finished records past `history.ttl`, and never one that still holds
//!    its node (the node's cordon annotation names it).
//!
//! Left out: the quarantine limit (quarantine is off in the model: `quarantine::plan` is a planner
//! of its own, tested by its own module) and failure domains (no domain labels in the model);
//! slow start, settle and suspects stay off so that invariant 1 is `maxConcurrent` itself.
//!
//! `PROPTEST_CASES` sets the number of paths (10,000 by default).

use std::sync::Arc;

use gpu_remediation_api::{
    GpuRemediation, GpuRemediationPolicy, GpuRemediationPolicySpec, GpuRemediationStatus, Phase,
    constants::CORDONED_BY_ANNOTATION,
    policy::{REFUSAL_BACKOFF_SECONDS, RecordRefusal},
    remediation::PhaseTransition,
    validate,
};
use jiff::SignedDuration;
use k8s_openapi::{
    api::core::v1::{Node, NodeCondition, NodeStatus},
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
};
use kube::ResourceExt;
use proptest::{
    prelude::{ProptestConfig, Strategy, prop, prop_assert, prop_oneof, proptest},
    strategy::Just,
};

use super::{Census, FleetPlan, episodes::EPISODE_FLOOR, plan_with};
use crate::{first_seen::FirstSeen, test_fixtures::at};

/// The phases a record moves through, open and finished.
const PHASES: [Phase; 9] = [
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
enum Reading {
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
enum Fate {
    Applied,
    RefusedWithCode,
    RefusedUnanswered,
    /// Created, but the policy status of the pass was never written.
    HalfApplied,
}

#[derive(Clone, Debug)]
enum Step {
    Advance(i64),
    Read {
        node: usize,
        reading: Reading,
    },
    Pass {
        fates: Vec<Fate>,
        deletes_lost: bool,
    },
    /// Record `record` (modulo their number) moves to `PHASES[phase]`; a `Failed` one keeps its
    /// node cordoned when `holds`.
    Progress {
        record: usize,
        phase: usize,
        holds: bool,
    },
    /// A finished record of an older episode on `node`, created `age` seconds ago (a `Failed`
    /// one keeps the node cordoned when `holds`).
    Older {
        node: usize,
        phase: usize,
        age: i64,
        holds: bool,
    },
    LeaderChange,
}

#[derive(Clone, Debug)]
struct Seen {
    at: i64,
    untrusted: bool,
    healthy: bool,
    stamp: Option<i64>,
}

#[derive(Clone, Debug)]
struct NodeState {
    name: String,
    /// In group `a`: governed by `narrow`.
    narrow: bool,
    healthy: bool,
    stamp: Option<i64>,
    cordoned_by: Option<String>,
    /// When the current leader first saw the condition as it is (status and stamp, as of its
    /// last pass: a blip between two passes is not seen), and whether its stamp was untrusted
    /// then.
    seen: Option<Seen>,
}

struct Model {
    now: i64,
    nodes: Vec<NodeState>,
    records: Vec<GpuRemediation>,
    policies: Vec<GpuRemediationPolicy>,
    first_seen: FirstSeen,
    /// A number for the names of added records.
    serial: u32,
}

fn policy(
    name: &str,
    selector: serde_json::Value,
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
    let spec: GpuRemediationPolicySpec = serde_json::from_value(serde_json::json!({
        "nodeSelector": {"matchLabels": selector},
        "priority": priority,
        "triggers": [{"conditionType": "GpuHealthy", "status": "False", "for": format!("{for_secs}s")}],
        "action": "None",
        "safety": safety,
        "history": {"ttl": "2h"},
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
struct Limits {
    max_concurrent: u32,
    max_unhealthy_percent: u32,
    max_unhealthy_count: Option<u32>,
    rate: u32,
}

fn limits() -> impl Strategy<Value = Limits> {
    (
        1..4u32,
        prop_oneof![Just(40u32), Just(70), Just(100)],
        prop::option::of(2..6u32),
        1..6u32,
    )
        .prop_map(
            |(max_concurrent, max_unhealthy_percent, max_unhealthy_count, rate)| Limits {
                max_concurrent,
                max_unhealthy_percent,
                max_unhealthy_count,
                rate,
            },
        )
}

fn reading() -> impl Strategy<Value = Reading> {
    prop_oneof![
        4 => Just(Reading::Healthy),
        3 => (0..900i64).prop_map(Reading::BrokenSince),
        1 => Just(Reading::BrokenUnstamped),
        1 => (1..900i64).prop_map(Reading::BrokenInFuture),
    ]
}

fn fate() -> impl Strategy<Value = Fate> {
    prop_oneof![
        6 => Just(Fate::Applied),
        1 => Just(Fate::RefusedWithCode),
        1 => Just(Fate::RefusedUnanswered),
        1 => Just(Fate::HalfApplied),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (1..90i64).prop_map(Step::Advance),
        1 => (90..2000i64).prop_map(Step::Advance),
        4 => (0..12usize, reading()).prop_map(|(node, reading)| Step::Read { node, reading }),
        5 => (prop::collection::vec(fate(), 12), prop::bool::weighted(0.2))
            .prop_map(|(fates, deletes_lost)| Step::Pass { fates, deletes_lost }),
        3 => (0..64usize, 0..PHASES.len(), prop::bool::ANY)
            .prop_map(|(record, phase, holds)| Step::Progress { record, phase, holds }),
        1 => (0..12usize, 5..PHASES.len(), 0..12_000i64, prop::bool::ANY)
            .prop_map(|(node, phase, age, holds)| Step::Older { node, phase, age, holds }),
        1 => Just(Step::LeaderChange),
    ]
}

/// The fleet at the start: each node's group and reading, and the phase of its record (if any).
type Start = Vec<(bool, Reading, Option<(usize, i64)>)>;

fn start() -> impl Strategy<Value = Start> {
    prop::collection::vec(
        (
            prop::bool::ANY,
            reading(),
            prop::option::weighted(0.4, (0..PHASES.len(), 0..7200i64)),
        ),
        4..=12,
    )
}

impl Model {
    fn new(start: &Start, wide: Limits, narrow: Limits, narrow_for: u32) -> Self {
        let now = 100_000;
        let mut model = Self {
            now,
            nodes: Vec::new(),
            records: Vec::new(),
            policies: vec![
                policy(
                    "narrow",
                    serde_json::json!({"group": "a"}),
                    10,
                    narrow_for,
                    narrow,
                ),
                policy("wide", serde_json::json!({"gpu": "yes"}), 0, 120, wide),
            ],
            first_seen: FirstSeen::default(),
            serial: 0,
        };
        for (i, (narrow, reading, record)) in start.iter().enumerate() {
            model.nodes.push(NodeState {
                name: format!("n{i}"),
                narrow: *narrow,
                healthy: true,
                stamp: None,
                cordoned_by: None,
                seen: None,
            });
            model.read(i, *reading);
            if let Some((phase, age)) = record {
                model.add_record(i, PHASES[*phase], now - age, now - age - 600);
            }
        }
        model
    }

    fn governor(&self, node: &NodeState) -> &'static str {
        if node.narrow { "narrow" } else { "wide" }
    }

    fn spec(&self, name: &str) -> &GpuRemediationPolicySpec {
        &self.policies.iter().find(|p| p.name_any() == name).unwrap().spec
    }

    fn read(&mut self, i: usize, reading: Reading) {
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
    fn add_record(&mut self, i: usize, phase: Phase, created: i64, since: i64) {
        let node = &self.nodes[i];
        self.serial += 1;
        let mut r = crate::test_fixtures::remediation(
            &format!("{}-{}", node.name, self.serial),
            &node.name,
            self.governor(node),
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

    fn node_objects(&self) -> Vec<Arc<Node>> {
        self.nodes
            .iter()
            .map(|n| {
                let mut labels = std::collections::BTreeMap::from([("gpu".to_owned(), "yes".to_owned())]);
                if n.narrow {
                    labels.insert("group".into(), "a".into());
                }
                let annotations = n.cordoned_by.as_ref().map(|by| {
                    std::collections::BTreeMap::from([(CORDONED_BY_ANNOTATION.to_owned(), by.clone())])
                });
                Arc::new(Node {
                    metadata: ObjectMeta {
                        name: Some(n.name.clone()),
                        uid: Some(format!("uid-{}", n.name)),
                        labels: Some(labels),
                        annotations,
                        ..ObjectMeta::default()
                    },
                    spec: None,
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

    /// Whether node `i`'s trigger under its governing policy holds now, by the model's clock.
    fn holds(&self, node: &NodeState) -> bool {
        if node.healthy {
            return false;
        }
        let Some(seen) = &node.seen else {
            return false;
        };
        let since = if seen.untrusted {
            seen.at
        } else {
            node.stamp.unwrap_or(seen.at).min(self.now)
        };
        let trigger_for = self.spec(self.governor(node)).triggers[0].for_.as_std().as_secs();
        since + i64::try_from(trigger_for).unwrap() <= self.now
    }

    fn open(record: &GpuRemediation) -> bool {
        !record
            .status
            .as_ref()
            .map(|s| s.phase)
            .unwrap_or_default()
            .is_terminal()
    }

    fn pass(
        &mut self,
        fates: &[Fate],
        deletes_lost: bool,
    ) -> Result<(), proptest::test_runner::TestCaseError> {
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
        let nodes = self.node_objects();
        self.first_seen.observe(nodes.iter().map(AsRef::as_ref), at(now));
        let policies: Vec<Arc<GpuRemediationPolicy>> = self.policies.iter().cloned().map(Arc::new).collect();
        let records: Vec<Arc<GpuRemediation>> = self.records.iter().cloned().map(Arc::new).collect();
        let plan = plan_with(
            &policies,
            &Census::take(&policies, &nodes),
            &nodes,
            &records,
            &self.first_seen,
            at(now),
        );
        self.check(&plan)?;
        self.apply(plan, fates, deletes_lost);
        let mut open = std::collections::HashMap::<&str, u32>::new();
        for r in self.records.iter().filter(|r| Self::open(r)) {
            *open.entry(r.spec.node_name.as_str()).or_default() += 1;
        }
        prop_assert!(
            open.values().all(|n| *n <= 1),
            "4: a node has two open records: {open:?}"
        );
        Ok(())
    }

    fn check(&self, plan: &FleetPlan) -> Result<(), proptest::test_runner::TestCaseError> {
        let now = self.now;
        let mut opened: Vec<&str> = Vec::new();
        for p in &plan.policies {
            let name = p.policy.name_any();
            let spec = self.spec(&name);
            let governed: Vec<&NodeState> = self.nodes.iter().filter(|n| self.governor(n) == name).collect();
            let selected = u32::try_from(governed.len()).unwrap();
            let unhealthy = u32::try_from(governed.iter().filter(|n| self.holds(n)).count()).unwrap();
            let in_flight = self
                .records
                .iter()
                .filter(|r| r.spec.policy_name == name && Self::open(r))
                .count();
            let admitted = p.create.len() + p.readmit.len();
            let limit = crate::budget::max_concurrent(&spec.safety, selected) as usize;
            prop_assert!(
                admitted <= limit.saturating_sub(in_flight),
                "1: {name} admits {admitted} with {in_flight} in flight under maxConcurrent {limit}"
            );
            prop_assert!(
                admitted == 0 || spec.safety.unhealthy_limit().allows(unhealthy, selected),
                "2: {name} admits {admitted} with its breaker open ({unhealthy} of {selected} unhealthy)"
            );
            let trigger_for =
                SignedDuration::from_secs(i64::try_from(spec.triggers[0].for_.as_std().as_secs()).unwrap());
            let floor = trigger_for.max(EPISODE_FLOOR).as_secs();
            for created in p.create.iter().chain(&p.manual_required) {
                let node_name = created.spec.node_name.as_str();
                let node = self.nodes.iter().find(|n| n.name == node_name).unwrap();
                prop_assert!(
                    self.governor(node) == name,
                    "3: {name} opens a record for {node_name}, governed by another"
                );
                prop_assert!(
                    self.holds(node),
                    "3: {name} opens a record for {node_name}, whose trigger does not hold: {node:?}"
                );
                prop_assert!(
                    !self
                        .records
                        .iter()
                        .any(|r| r.spec.node_name == node_name && Self::open(r)),
                    "4: {name} opens a record for {node_name}, which has one open"
                );
                prop_assert!(
                    !opened.contains(&node_name),
                    "4: two records opened for {node_name} in one pass"
                );
                opened.push(node_name);
                let last = self
                    .records
                    .iter()
                    .filter(|r| r.spec.node_name == node_name && r.spec.policy_name == name)
                    .filter_map(|r| r.metadata.creation_timestamp.as_ref())
                    .map(|t| t.0.as_second() - at(0).as_second())
                    .max();
                prop_assert!(
                    last.is_none_or(|last| last + floor <= now),
                    "5: {name} opens an episode of {node_name} at {now}, its last at {last:?}, floor {floor}s"
                );
                let refused = p.policy.status.as_ref().is_some_and(|s| {
                    s.record_refusals.iter().any(|r| {
                        r.node == node_name
                            && r.at.0.as_second() - at(0).as_second() + REFUSAL_BACKOFF_SECONDS > now
                    })
                });
                prop_assert!(
                    !refused,
                    "5: {name} asks again for {node_name} within the refusal backoff"
                );
            }
            let ttl = i64::try_from(spec.history.ttl.as_std().as_secs()).unwrap();
            for expired in &p.expired {
                let record = self.records.iter().find(|r| r.name_any() == *expired).unwrap();
                let status = record.status.as_ref().unwrap();
                let last = status.phase_history.last().unwrap().at.0.as_second() - at(0).as_second();
                prop_assert!(status.phase.is_terminal(), "6: {expired} expires unfinished");
                prop_assert!(last + ttl < now, "6: {expired} expires within history.ttl");
                prop_assert!(
                    !self
                        .nodes
                        .iter()
                        .any(|n| n.cordoned_by.as_deref() == Some(expired.as_str())),
                    "6: {expired} expires while it holds its node"
                );
            }
        }
        Ok(())
    }

    fn apply(&mut self, plan: FleetPlan, fates: &[Fate], deletes_lost: bool) {
        let now = self.now;
        let mut fates = fates.iter().cycle();
        for p in plan.policies {
            let name = p.policy.name_any();
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
                    super::episodes::add_refusal(
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
    }

    fn progress(&mut self, record: usize, phase: usize, holds: bool) {
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
        let node = self.nodes.iter_mut().find(|n| n.name == node_name).unwrap();
        if phase == Phase::Failed && holds {
            node.cordoned_by = Some(name);
        } else if node.cordoned_by.as_deref() == Some(name.as_str()) && phase.is_terminal() {
            node.cordoned_by = None;
        }
    }

    fn step(&mut self, step: &Step) -> Result<(), proptest::test_runner::TestCaseError> {
        match step {
            Step::Advance(secs) => self.now += secs,
            Step::Read { node, reading } => {
                let i = node % self.nodes.len();
                self.read(i, *reading);
            }
            Step::Pass { fates, deletes_lost } => self.pass(fates, *deletes_lost)?,
            Step::Progress { record, phase, holds } => self.progress(*record, *phase, *holds),
            Step::Older {
                node,
                phase,
                age,
                holds,
            } => {
                let i = node % self.nodes.len();
                let created = self.now - age;
                self.add_record(i, PHASES[*phase], created, created - 600);
                if PHASES[*phase] == Phase::Failed && *holds {
                    self.nodes[i].cordoned_by = self.records.last().map(ResourceExt::name_any);
                }
            }
            Step::LeaderChange => {
                self.first_seen = FirstSeen::default();
                for node in &mut self.nodes {
                    node.seen = None;
                }
            }
        }
        Ok(())
    }
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(10_000)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn every_random_fleet_path_keeps_the_planner_invariants(
        start in start(),
        wide in limits(),
        narrow in limits(),
        narrow_for in prop_oneof![Just(0u32), Just(30), Just(90)],
        steps in prop::collection::vec(step(), 1..40),
    ) {
        let mut model = Model::new(&start, wide, narrow, narrow_for);
        for step in &steps {
            model.step(step)?;
        }
    }
}
