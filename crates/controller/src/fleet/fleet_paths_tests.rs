//! The fleet planner along random paths: a property test beyond one record. A fleet of 4–12
//! nodes under two policies whose selectors overlap (`wide` selects every node at priority 0,
//! `narrow` the nodes of group `a` at priority 10), records in random phases, node conditions
//! that turn healthy, unhealthy and back, stamped in the past, the future or not at all, a clock
//! that advances, and passes of [`plan_with`] at random times. The model applies each pass's
//! creates the way the acting layer would, with lost writes: a create the server refused (with an
//! HTTP code or without an answer), or a create whose policy status was never written (a
//! half-applied settlement); it also adds finished records of older episodes on a node, moves
//! records through their phases (a `Failed` one may keep its node cordoned), lets records expire
//! past `history.ttl`, moves nodes between the policies (a label changes, the records stay),
//! and changes leader (the planner's first-seen memory is lost). Each policy has a random
//! `quarantine` section (on or off, `max` set or left to `safety.maxUnhealthy`); the model writes
//! each pass's quarantine adds and lifts (the policies' and the orphans') as the acting layer
//! would, some of them lost, and a record's release lifts its policy's quarantine.
//!
//! After every pass, for every policy:
//! 1. what it admits (creates and readmissions) never brings its records in flight past
//!    `safety.maxConcurrent` (none at all when already at or past it);
//! 2. nothing is admitted while its circuit breaker is open (the governed nodes whose trigger
//!    holds, counted by the model, past `maxUnhealthy`/`maxUnhealthyCount`), nor in a failure
//!    domain (label `zone`) held over its `maxUnhealthyCount`, nor past a domain's `maxInFlight`;
//! 3. every node it opens a record for is governed by it and its trigger holds at the pass's
//!    `now`, by the model's own reading of the node's clock (a stamp in the past as written, a
//!    missing or future one from when the current leader first saw it);
//! 4. no record is opened for a node that has an open record (under either policy), nor two for
//!    one node in a pass: a node never has more than one open record;
//! 5. a node opens at most one episode per `max(for, EPISODE_FLOOR)` under a policy, counted on
//!    the server's creation times, whatever its own clock says and across leader changes; and a
//!    node whose record was refused is not asked again within `REFUSAL_BACKOFF_SECONDS`;
//! 6. expiry deletes only finished records past `history.ttl`, and never one that still holds
//!    its node (the node's cordon annotation names it);
//! 7. what its quarantine plan adds never takes it past `quarantine.max` (resolved against the
//!    nodes it governs): the governed nodes carrying its quarantine, less those the plan lifts,
//!    plus those it adds, are within the limit whenever it adds any; and it adds only governed
//!    nodes whose condition says `False`, with quarantine on;
//! 8. its quarantine is lifted only by the rules of `quarantine`'s header: from a node whose
//!    condition says `False` (by the model's reading of its clock), only with quarantine off or
//!    once the episode is over (a record of the policy, not `ManualRequired`, whose
//!    `trigger.since` is that episode's); from a node whose condition is clear, only once it has
//!    stayed clear for `quarantine.hysteresis`; as an orphan, only from a node the owner no
//!    longer governs (a cancelled episode is not modelled: no node carries the cancel annotation);
//! 9. no quarantine (its own or an orphan) is lifted from a node a record of its owner holds (an
//!    open record, or a finished one its cordon annotation names): the record's release lifts it.
//!
//! Each invariant fails on a planner broken on purpose (10,000 paths, failure found in): 7 on
//! the limit ignored (0.05 s) and on `quarantine.enabled` ignored (0.10 s); 8 on the hysteresis
//! ignored (0.07 s), on a `ManualRequired` record ending the episode (0.20 s), on any record of
//! the node ending it whatever its episode (0.14 s), and on orphans found on governed nodes
//! (0.10 s); 9 on a finished record's cordon not holding the quarantine (0.52 s) and on orphans
//! lifted while a record holds them (0.36 s).
//!
//! Left out: the nodes' quarantine count between the writes of one pass (the acting layer lifts
//! before it adds, and adds only as many as the lifts that landed leave room for:
//! `quarantine::Plan::adds_within_limit`, unit-tested beside it), so 7 holds the plan, not the
//! fleet, to the limit; a person lifting a taint, device-level quarantine, `DryRun` and `paused`; slow start, settle and suspects stay off so that invariants 1 and
//! 2 are `maxConcurrent` and the limits themselves; liveness (that a node due is remediated in
//! the end) is not checked: the invariants say what is never done.
//!
//! `PROPTEST_CASES` sets the number of paths (10,000 by default).

use std::sync::Arc;

use gpu_remediation_api::{GpuRemediation, GpuRemediationPolicy, Phase, policy::REFUSAL_BACKOFF_SECONDS};
use jiff::SignedDuration;
use kube::ResourceExt;
use proptest::{
    prelude::{ProptestConfig, Strategy, prop, prop_assert, prop_oneof, proptest},
    strategy::Just,
};

use super::{Census, FleetPlan, PolicyPlan, episodes::EPISODE_FLOOR, plan_with};
use crate::test_fixtures::at;
use model::{Fate, Limits, Model, NodeState, PHASES, Reading, Start, Zone};

#[path = "fleet_paths_model.rs"]
mod model;

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
    /// `node` joins group `a` or leaves it: its governing policy changes, its records stay.
    Relabel {
        node: usize,
    },
}

fn limits() -> impl Strategy<Value = Limits> {
    (
        1..4u32,
        prop_oneof![Just(40u32), Just(70), Just(100)],
        prop::option::of(2..6u32),
        1..6u32,
        prop::option::of((1..3u32, 1..3u32)),
        (prop::bool::weighted(0.8), prop::option::of(1..4u32)),
    )
        .prop_map(
            |(max_concurrent, max_unhealthy_percent, max_unhealthy_count, rate, zone, quarantine)| Limits {
                max_concurrent,
                max_unhealthy_percent,
                max_unhealthy_count,
                rate,
                zone: zone.map(|(max_unhealthy, max_in_flight)| Zone {
                    max_unhealthy,
                    max_in_flight,
                }),
                quarantine: quarantine.0,
                quarantine_max: quarantine.1,
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
        1 => (0..12usize).prop_map(|node| Step::Relabel { node }),
    ]
}

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
    fn pass(
        &mut self,
        fates: &[Fate],
        deletes_lost: bool,
    ) -> Result<(), proptest::test_runner::TestCaseError> {
        let now = self.now;
        self.observe();
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
        self.check_orphans(&plan)?;
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

    /// Invariant 2 for the policy's failure domains: nothing admitted in a zone over its
    /// unhealthy limit, nor past its `maxInFlight`.
    fn check_zones(&self, p: &PolicyPlan, name: &str) -> Result<(), proptest::test_runner::TestCaseError> {
        let Some(domain) = self.spec(name).safety.failure_domains.first() else {
            return Ok(());
        };
        for zone in 0..2 {
            let members: Vec<&NodeState> = self
                .nodes
                .iter()
                .filter(|n| n.governor() == name && n.zone == zone)
                .collect();
            let member = |node: &str| members.iter().any(|n| n.name == node);
            let unhealthy = u32::try_from(members.iter().filter(|n| self.holds(n)).count()).unwrap();
            let in_flight = self
                .records
                .iter()
                .filter(|r| r.spec.policy_name == name && Self::open(r) && member(&r.spec.node_name))
                .count();
            let admitted = p
                .create
                .iter()
                .chain(p.readmit.iter().map(|(r, _)| r))
                .filter(|r| member(&r.spec.node_name))
                .count();
            let held = domain.max_unhealthy_count.is_some_and(|c| unhealthy > c);
            prop_assert!(
                admitted == 0 || !held,
                "2: {name} admits {admitted} in zone z{zone}, held with {unhealthy} unhealthy"
            );
            let limit = domain.max_in_flight.map_or(usize::MAX, |m| m as usize);
            prop_assert!(
                admitted <= limit.saturating_sub(in_flight),
                "2: {name} admits {admitted} in zone z{zone} with {in_flight} in flight under maxInFlight {limit}"
            );
        }
        Ok(())
    }

    /// Invariant 7: what the policy's quarantine plan adds never takes it past its limit.
    /// Invariants 8 and 9 for its lifts.
    fn check_quarantine(
        &self,
        p: &PolicyPlan,
        name: &str,
    ) -> Result<(), proptest::test_runner::TestCaseError> {
        let spec = self.spec(name);
        let governed: Vec<&NodeState> = self.nodes.iter().filter(|n| n.governor() == name).collect();
        let selected = u32::try_from(governed.len()).unwrap();
        let max = spec.quarantine.max.as_ref().unwrap_or(&spec.safety.max_unhealthy);
        let limit = max.resolve(selected).unwrap_or(0) as usize;
        let held = governed
            .iter()
            .filter(|n| n.quarantined_by.as_deref() == Some(name))
            .count();
        let (added, lifted) = (p.quarantine.add.len(), p.quarantine.lift.len());
        prop_assert!(
            added == 0 || held - lifted + added <= limit,
            "7: {name} holds {held}, lifts {lifted} and adds {added} under quarantine.max {limit}"
        );
        for add in &p.quarantine.add {
            let node = self.node(&add.node.name);
            prop_assert!(
                node.governor() == name && !node.healthy && spec.quarantine.enabled,
                "7: {name} quarantines {} (quarantine on: {}): {node:?}",
                add.node.name,
                spec.quarantine.enabled
            );
        }
        let hysteresis = i64::try_from(spec.quarantine.hysteresis.as_std().as_secs()).unwrap();
        for lift in &p.quarantine.lift {
            let node = self.node(&lift.node.name);
            prop_assert!(
                !self.held_by_record(node, name),
                "9: {name} lifts the quarantine of {}, which a record holds",
                node.name
            );
            if !spec.quarantine.enabled {
                continue;
            }
            if let Some(since) = self.since(node) {
                let over = self.records.iter().any(|r| {
                    r.spec.node_name == node.name
                        && r.spec.policy_name == name
                        && r.status
                            .as_ref()
                            .is_some_and(|s| s.phase != Phase::ManualRequired)
                        && r.spec.trigger.since.as_ref().is_some_and(|t| t.0 == at(since))
                });
                prop_assert!(
                    over,
                    "8: {name} lifts the quarantine of {}, whose signal holds since {since} and whose \
                     episode no record ended: {node:?}",
                    node.name
                );
            } else if !node.healthy {
                // Not seen yet by this leader: nothing to lift it for.
                prop_assert!(false, "8: {name} lifts {} before seeing its signal", node.name);
            } else {
                let cleared = node.stamp.unwrap_or(self.now).min(self.now);
                prop_assert!(
                    cleared + hysteresis <= self.now,
                    "8: {name} lifts the quarantine of {}, clear since {cleared}, within quarantine.hysteresis",
                    node.name
                );
            }
        }
        Ok(())
    }

    /// Invariants 8 and 9 for the quarantines no policy's plan covers: lifted only from a node that
    /// left its policy, and never from one the policy's record holds.
    fn check_orphans(&self, plan: &FleetPlan) -> Result<(), proptest::test_runner::TestCaseError> {
        for lift in &plan.orphan_quarantines {
            let node = self.node(&lift.node.name);
            prop_assert!(
                node.quarantined_by.as_ref() == Some(&lift.policy) && node.governor() != lift.policy,
                "8: the quarantine of {} by {} lifted as an orphan: {node:?}",
                node.name,
                lift.policy
            );
            prop_assert!(
                !self.held_by_record(node, &lift.policy),
                "9: the quarantine of {} by {} lifted as an orphan while a record holds it",
                node.name,
                lift.policy
            );
        }
        Ok(())
    }

    fn node(&self, name: &str) -> &NodeState {
        self.nodes.iter().find(|n| n.name == name).unwrap()
    }

    fn check(&self, plan: &FleetPlan) -> Result<(), proptest::test_runner::TestCaseError> {
        let now = self.now;
        let mut opened: Vec<&str> = Vec::new();
        for p in &plan.policies {
            let name = p.policy.name_any();
            let spec = self.spec(&name);
            let governed: Vec<&NodeState> = self.nodes.iter().filter(|n| n.governor() == name).collect();
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
            self.check_zones(p, &name)?;
            self.check_quarantine(p, &name)?;
            let trigger_for =
                SignedDuration::from_secs(i64::try_from(spec.triggers[0].for_.as_std().as_secs()).unwrap());
            let floor = trigger_for.max(EPISODE_FLOOR).as_secs();
            for created in p.create.iter().chain(&p.manual_required) {
                let node_name = created.spec.node_name.as_str();
                let node = self.nodes.iter().find(|n| n.name == node_name).unwrap();
                prop_assert!(
                    node.governor() == name,
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
            Step::LeaderChange => self.leader_change(),
            Step::Relabel { node } => {
                let i = node % self.nodes.len();
                self.nodes[i].narrow = !self.nodes[i].narrow;
            }
        }
        Ok(())
    }
}

/// 10,000 paths, or as many as `PROPTEST_CASES` says; no failure file (a failure prints its
/// minimal path).
fn paths() -> ProptestConfig {
    let paths = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(10_000);
    let mut config = ProptestConfig::with_cases(paths);
    config.failure_persistence = None;
    config
}

proptest! {
    #![proptest_config(paths())]

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
