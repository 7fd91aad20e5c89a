//! The fleet plan: for every policy, which nodes it governs, which are unhealthy, which start a
//! remediation now, which wait and why, and the status that says so. Pure: it reads snapshots of
//! the caches and the time, and returns what `admit` must write.
//!
//! One remediation per node per unhealthy *episode*: an episode is identified by the trigger
//! condition's `lastTransitionTime`. A node whose remediation ended (cancelled by a person,
//! recorded as a dry run, failed) is not remediated again until its condition clears and breaks
//! anew, so the controller never fights a person who uncordoned a node, and a dry run is recorded
//! once.
//!
//! A node due for one recycle too many (`maxAttemptsPerNode` used up in its window) gets its
//! episode's record all the same, marked `gpuremediation.dev/attempts-exhausted`: it enters
//! `ManualRequired`, touches nothing and counts against neither concurrency nor rate. When a
//! person annotates that record `gpuremediation.dev/approved=true`, the record becomes a
//! candidate again, free of the attempts limit but still subject to pause, the circuit breaker,
//! concurrency and rate; once admitted it goes back to `Pending` and proceeds like any other.

use std::{
    collections::{BTreeMap, HashSet},
    sync::Arc,
};

use gpu_remediation_api::{
    GpuRemediation, GpuRemediationPolicy, GpuRemediationStatus, Phase,
    constants::{
        APPROVED_ANNOTATION, ATTEMPTS_EXHAUSTED_ANNOTATION, CANCELLED_ANNOTATION, policy_conditions, reasons,
    },
    correlated::HeldDomain,
    policy::{BudgetStatus, GpuRemediationPolicyStatus, Mode, SlowStartStatus, WaitingNode},
    remediation::PhaseTransition,
    validate,
};
use jiff::Timestamp;
use k8s_openapi::{
    api::core::v1::Node,
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
};
use kube::ResourceExt;

mod census;
mod conditions;
#[cfg(test)]
mod correlated_tests;
pub mod index;
mod outcomes;
#[cfg(test)]
mod pass_cost_tests;
mod recheck;
mod record;
mod suspects;

pub use census::{Census, Governed};
pub use conditions::condition;
use conditions::{conditions, has_true_condition, suspect_condition};
pub use recheck::{no_longer_due, not_started};
pub use record::{new_remediation, remediation_name, snapshot_of};

use crate::{
    budget::{self, Candidate, Deferral, Started},
    detect::{self, Evidence, Verdict},
    governance, quarantine,
};

/// The nodes a policy selects and yields to another: node name to the governing policy's.
type Yielded = BTreeMap<String, String>;

/// What to do for one policy.
#[derive(Clone, Debug)]
pub struct PolicyPlan {
    /// The policy.
    pub policy: Arc<GpuRemediationPolicy>,
    /// Remediations to create now, longest unhealthy first.
    pub create: Vec<GpuRemediation>,
    /// Records to create for nodes past `maxAttemptsPerNode` (they enter `ManualRequired`).
    pub manual_required: Vec<GpuRemediation>,
    /// `ManualRequired` records a person approved and the budget admitted now: the status to
    /// write to each (back in `Pending`), with the record as read (its resourceVersion is the
    /// write's precondition).
    pub readmit: Vec<(GpuRemediation, GpuRemediationStatus)>,
    /// The status to write (conditions keep their transition times when unchanged).
    pub status: GpuRemediationPolicyStatus,
    /// Nodes that newly wait, or wait for another reason than before: one Event each.
    pub newly_waiting: Vec<WaitingNode>,
    /// Whether the circuit breaker just opened (`Some(true)`) or closed (`Some(false)`).
    pub circuit_change: Option<bool>,
    /// Failure domains newly over their limit: one Event each.
    pub domains_held: Vec<HeldDomain>,
    /// Failure domains held before and within their limits now: one Event each.
    pub domains_resumed: Vec<HeldDomain>,
    /// A suspect cause newly named (or another than before): one Event.
    pub suspect_named: Option<gpu_remediation_api::correlated::SuspectStatus>,
    /// Finished remediations older than `history.ttl`, to delete.
    pub expired: Vec<String>,
    /// Quarantine taints to add and lift on the policy's nodes.
    pub quarantine: quarantine::Plan,
}

/// The whole fleet's plan.
#[derive(Clone, Debug, Default)]
pub struct FleetPlan {
    /// One plan per policy, by name.
    pub policies: Vec<PolicyPlan>,
    /// When the plan should be made again even if nothing changes: the earliest time a pending
    /// node turns unhealthy or a rate slot frees for a waiting node.
    pub wake_at: Option<Timestamp>,
    /// Quarantines on nodes no policy governs any more (or whose policy is gone), to lift.
    pub orphan_quarantines: Vec<quarantine::Lift>,
}

/// Plans the fleet at `now`, looking at every node.
#[must_use]
pub fn plan(
    policies: &[Arc<GpuRemediationPolicy>],
    nodes: &[Arc<Node>],
    remediations: &[Arc<GpuRemediation>],
    now: Timestamp,
) -> FleetPlan {
    plan_with(policies, &Census::take(policies, nodes), nodes, remediations, now)
}

/// Plans the fleet at `now` from its `census`, looking only at the `nodes` that may need a
/// decision: every node that is not healthy by its policy's triggers or carries anything of ours,
/// and every node a remediation names (`index::NodeIndex::candidates`). The plan is the same as
/// [`plan`]'s over the whole fleet: the nodes left out only count, and the census counts them.
#[must_use]
pub fn plan_with(
    policies: &[Arc<GpuRemediationPolicy>],
    census: &Census,
    nodes: &[Arc<Node>],
    remediations: &[Arc<GpuRemediation>],
    now: Timestamp,
) -> FleetPlan {
    let mut policies: Vec<&Arc<GpuRemediationPolicy>> = policies
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    policies.sort_by_key(|p| p.name_any());
    let names: Vec<String> = policies.iter().map(|p| p.name_any()).collect();
    let claimants = governance::claimants(policies.iter().copied());

    // Which policy governs each node looked at.
    let mut governed: BTreeMap<&str, Vec<&Node>> = BTreeMap::new();
    for node in nodes {
        let Some(policy) = governance::governing(node.labels(), &claimants) else {
            continue;
        };
        if let Some(winner) = names.iter().find(|n| *n == policy) {
            governed.entry(winner.as_str()).or_default().push(node);
        }
    }

    let mut fleet = FleetPlan::default();
    for (policy, name) in policies.into_iter().zip(&names) {
        let nodes = governed.get(name.as_str()).map_or(&[][..], Vec::as_slice);
        let (plan, wake) = plan_policy(policy, nodes, census.of(name), remediations, now);
        fleet.wake_at = earliest(fleet.wake_at, wake);
        fleet.wake_at = earliest(fleet.wake_at, plan.quarantine.wake_at);
        fleet.policies.push(plan);
    }
    let quarantine_plans: Vec<&quarantine::Plan> = fleet.policies.iter().map(|p| &p.quarantine).collect();
    // Asked only of the few nodes carrying a quarantine: decided again for them rather than
    // indexing the whole fleet on every pass.
    let governor_of = |node: &Node| {
        governance::governing(node.labels(), &claimants)
            .and_then(|policy| names.iter().find(|n| *n == policy).map(String::as_str))
    };
    fleet.orphan_quarantines = quarantine::orphans(
        nodes,
        governor_of,
        |policy| names.iter().any(|n| n == policy),
        &quarantine_plans,
        remediations,
    );
    fleet
}

#[allow(
    clippy::too_many_lines,
    reason = "one status literal names every field; splitting it would scatter the status"
)]
fn plan_policy(
    policy: &Arc<GpuRemediationPolicy>,
    nodes: &[&Node],
    governed: &Governed,
    remediations: &[Arc<GpuRemediation>],
    now: Timestamp,
) -> (PolicyPlan, Option<Timestamp>) {
    let name = policy.name_any();
    let spec = &policy.spec;
    let (unhealthy, mut wake) = detect_all(nodes, spec, now);

    let found = candidates(&name, &unhealthy, remediations);
    let started = started(&name, remediations, now);
    // Nothing yielded reads as no list at all.
    let yielded = Some(&governed.yielded).filter(|y| !y.is_empty());
    let selected = governed.selected;
    let mut domains = failure_domains(spec, &governed.domain_sizes, nodes, &unhealthy, &started);
    let (slow_start, proven_at) = outcomes::slow_start(&name, spec, selected, nodes, remediations, now);
    wake = earliest(wake, proven_at);
    if let Some(slow) = &slow_start {
        domains.slow_start(&slow.outcomes, slow.max_concurrent);
    }
    let allowance = slow_start.map(|s| s.allowance);
    let suspect = suspects::named(&name, spec, nodes, &unhealthy, remediations, now);
    let settling = settling(spec, &unhealthy, now);
    wake = earliest(wake, settling.values().min().copied());
    let decision = budget::admit(budget::Inputs {
        safety: &spec.safety,
        paused: spec.paused,
        selected,
        unhealthy: count(unhealthy.len()),
        started: &started,
        candidates: found.candidates.clone(),
        domains,
        slow_start: allowance.as_ref().map(|a| a.allowed),
        suspect_hold: suspect.clone().filter(|(s, _)| s.holding),
        settling,
        now,
    });

    let invalid = invalid_reason(spec);
    let Records {
        create,
        readmit,
        manual_required,
    } = records(policy, &decision, &found, remediations, invalid.is_none(), now);
    let quarantine = plan_quarantine(&name, spec, selected, nodes, remediations, invalid.is_none(), now);
    let counted = if spec.mode == Mode::DryRun {
        0
    } else {
        count(create.len() + readmit.len())
    };
    if decision
        .waiting
        .iter()
        .any(|w| matches!(w.deferral, Deferral::Rate { .. }))
    {
        wake = earliest(wake, decision.next_slot_at);
    }

    let waiting = waiting_nodes(&decision, &manual_required, invalid.is_none());
    let previous = policy.status.clone().unwrap_or_default();
    let newly_waiting = newly_waiting(&waiting, &previous.waiting);
    let domains_held = newly_in(&decision.held_domains, &previous.held_domains);
    let domains_resumed = newly_in(&previous.held_domains, &decision.held_domains);
    let was_open = has_true_condition(&previous.conditions, policy_conditions::CIRCUIT_OPEN);
    let circuit_change = (was_open != decision.circuit_open).then_some(decision.circuit_open);

    let unhealthy_count = count(unhealthy.len());
    let generation = policy.metadata.generation;
    let mut conditions = conditions(
        &previous.conditions,
        spec.paused,
        &decision,
        unhealthy_count,
        selected,
        spec,
        yielded,
        generation,
        now,
    );
    report_validity(
        &mut conditions,
        &previous.conditions,
        invalid.as_deref(),
        generation,
        now,
    );
    conditions.push(quarantine.condition(spec, selected, &previous.conditions, generation, now));
    let suspect = suspect.map(|(s, _)| s);
    conditions.push(suspect_condition(
        &previous.conditions,
        suspect.as_ref(),
        generation,
        now,
    ));
    let suspect_named = suspects::newly_named(suspect.as_ref(), previous.suspect.as_ref());
    let status = GpuRemediationPolicyStatus {
        observed_generation: generation,
        conditions,
        selected_nodes: selected,
        yielded_nodes: count(yielded.map_or(0, BTreeMap::len)),
        yielded: yielded.map(conditions::listed).unwrap_or_default(),
        unhealthy_nodes: unhealthy_count,
        in_flight: decision.in_flight + counted,
        budget: Some(BudgetStatus {
            remaining: decision.remaining.saturating_sub(counted),
            started_in_window: decision.started_in_window + counted,
            next_slot_at: decision.next_slot_at.map(Time),
        }),
        waiting,
        held_domains: decision.held_domains.clone(),
        quarantined_nodes: quarantine.held,
        leaked_pods: crate::quarantine::leak::on_record(&name, remediations),
        slow_start: allowance.map(|a| SlowStartStatus {
            allowed: a.allowed,
            message: a.why,
        }),
        suspect,
        // As last written: the write puts the current claim.
        claim: previous.claim.clone(),
    };
    (
        PolicyPlan {
            policy: policy.clone(),
            create,
            manual_required,
            readmit,
            status,
            newly_waiting,
            circuit_change,
            domains_held,
            domains_resumed,
            suspect_named,
            expired: expired(&name, remediations, spec.history.ttl, now),
            quarantine,
        },
        wake,
    )
}

/// Why the policy is not enforced, if it is not: a policy stored before the schema had a rule, or
/// breaking one CEL cannot say, starts nothing (it keeps its nodes, so a lower priority does not
/// take them by surprise) and says why.
fn invalid_reason(spec: &gpu_remediation_api::GpuRemediationPolicySpec) -> Option<String> {
    let violations = validate::validate_spec(spec);
    (!violations.is_empty()).then(|| {
        violations
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ")
    })
}

/// The policy's quarantine decision (see `quarantine`).
fn plan_quarantine(
    name: &str,
    spec: &gpu_remediation_api::GpuRemediationPolicySpec,
    selected: u32,
    nodes: &[&Node],
    remediations: &[Arc<GpuRemediation>],
    valid: bool,
    now: Timestamp,
) -> quarantine::Plan {
    quarantine::plan(&quarantine::Inputs {
        policy: name,
        spec,
        selected,
        nodes,
        remediations,
        valid,
        now,
    })
}

/// Sets `Ready` and `Invalid` from the policy's violations (`None`: valid).
fn report_validity(
    conditions: &mut Vec<Condition>,
    previous: &[Condition],
    invalid: Option<&str>,
    generation: Option<i64>,
    now: Timestamp,
) {
    if let Some(why) = invalid {
        let message = format!("not enforced: {why}");
        conditions[0] = condition(
            previous,
            policy_conditions::READY,
            false,
            reasons::INVALID.to_owned(),
            message.clone(),
            generation,
            now,
        );
        conditions.push(condition(
            previous,
            policy_conditions::INVALID,
            true,
            reasons::INVALID.to_owned(),
            message,
            generation,
            now,
        ));
    } else {
        conditions.push(condition(
            previous,
            policy_conditions::INVALID,
            false,
            reasons::VALID.to_owned(),
            "the policy passes every check".to_owned(),
            generation,
            now,
        ));
    }
}

/// The nodes the decision holds back, with why (none for an invalid policy). A node past its
/// attempts is not waiting: its `ManualRequired` record says why, once.
fn waiting_nodes(
    decision: &budget::Decision,
    manual_required: &[GpuRemediation],
    valid: bool,
) -> Vec<WaitingNode> {
    decision
        .waiting
        .iter()
        .filter(|_| valid)
        .filter(|w| {
            !manual_required
                .iter()
                .any(|r| r.spec.node_name == w.candidate.node)
        })
        .map(|w| WaitingNode {
            node: w.candidate.node.clone(),
            unhealthy_since: Some(Time(w.candidate.since)),
            reason: w.deferral.reason().to_owned(),
            message: w.deferral.message(),
        })
        .collect()
}

/// The nodes of `now` that were not waiting before, or waited for another reason.
fn newly_waiting(now: &[WaitingNode], before: &[WaitingNode]) -> Vec<WaitingNode> {
    now.iter()
        .filter(|w| !before.iter().any(|p| p.node == w.node && p.reason == w.reason))
        .cloned()
        .collect()
}

/// The domains of `now` that were not in `before`.
fn newly_in(now: &[HeldDomain], before: &[HeldDomain]) -> Vec<HeldDomain> {
    now.iter()
        .filter(|d| !before.iter().any(|p| p.name() == d.name()))
        .cloned()
        .collect()
}

/// With `safety.settle`: when each node that turned unhealthy (its trigger's `for` past) less than
/// `settle` ago may start.
fn settling(
    spec: &gpu_remediation_api::GpuRemediationPolicySpec,
    unhealthy: &[(&Node, Evidence)],
    now: Timestamp,
) -> BTreeMap<String, Timestamp> {
    let Some(settle) = spec.safety.settle.filter(|s| !s.is_zero()) else {
        return BTreeMap::new();
    };
    unhealthy
        .iter()
        .filter_map(|(node, evidence)| {
            let trigger_for = spec.triggers.get(evidence.trigger).map(|t| t.for_.as_std())?;
            let until = crate::time::plus(evidence.since, crate::time::signed(trigger_for + settle.as_std()));
            (until > now).then(|| (node.name_any(), until))
        })
        .collect()
}

/// The policy's failure domains: their sizes from the census, the rest counted over the governed
/// nodes looked at.
fn failure_domains(
    spec: &gpu_remediation_api::GpuRemediationPolicySpec,
    sizes: &budget::domains::Sizes,
    nodes: &[&Node],
    unhealthy: &[(&Node, Evidence)],
    started: &[Started],
) -> budget::Domains {
    if spec.safety.failure_domains.is_empty() {
        return budget::Domains::count(&spec.safety.failure_domains, std::iter::empty());
    }
    // Looked up, not searched for: a pass costs the same with 1 or 100 unhealthy.
    let unhealthy: HashSet<*const Node> = unhealthy.iter().map(|(u, _)| std::ptr::from_ref(*u)).collect();
    let in_flight: HashSet<&str> = started
        .iter()
        .filter(|s| s.in_flight)
        .map(|s| s.node.as_str())
        .collect();
    let names: Vec<String> = nodes.iter().map(|n| n.name_any()).collect();
    budget::Domains::count_within(
        &spec.safety.failure_domains,
        sizes,
        nodes
            .iter()
            .zip(&names)
            .map(|(node, name)| budget::domains::Member {
                node: name,
                labels: node.labels(),
                unhealthy: unhealthy.contains(&std::ptr::from_ref(*node)),
                in_flight: in_flight.contains(name.as_str()),
            }),
    )
}

/// The governed nodes that are unhealthy now, and when the first pending one turns unhealthy.
fn detect_all<'n>(
    nodes: &[&'n Node],
    spec: &gpu_remediation_api::GpuRemediationPolicySpec,
    now: Timestamp,
) -> (Vec<(&'n Node, Evidence)>, Option<Timestamp>) {
    let mut wake = None;
    let mut unhealthy = Vec::new();
    for node in nodes {
        let conditions = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_deref())
            .unwrap_or_default();
        match detect::evaluate(conditions, &spec.triggers, now) {
            Verdict::Unhealthy { evidence } => unhealthy.push((*node, evidence)),
            Verdict::Pending { due, .. } => wake = earliest(wake, Some(due)),
            Verdict::Healthy { .. } => {}
        }
    }
    (unhealthy, wake)
}

/// The policy's finished remediations whose last phase change is older than `ttl`: the audit
/// trail keeps them that long (validation makes it longer than the rate and attempts windows, which
/// count them), then they go.
fn expired(
    name: &str,
    remediations: &[Arc<GpuRemediation>],
    ttl: gpu_remediation_api::Duration,
    now: Timestamp,
) -> Vec<String> {
    let horizon = crate::time::minus(now, crate::time::signed(ttl.as_std()));
    remediations
        .iter()
        .filter(|r| r.spec.policy_name == name && r.metadata.deletion_timestamp.is_none())
        .filter(|r| {
            let status = r.status.as_ref();
            let finished = status.is_some_and(|s| s.phase.is_terminal());
            let last = status
                .and_then(|s| s.phase_history.last())
                .map(|t| t.at.0)
                .or_else(|| r.creation_timestamp().map(|t| t.0));
            finished && last.is_some_and(|at| at < horizon)
        })
        .map(|r| r.name_any())
        .collect()
}

/// The records a policy's decision writes.
struct Records {
    /// New remediations the budget admitted.
    create: Vec<GpuRemediation>,
    /// Approved `ManualRequired` records the budget admitted, with their status back in `Pending`.
    readmit: Vec<(GpuRemediation, GpuRemediationStatus)>,
    /// New records for nodes past `maxAttemptsPerNode`, marked to enter `ManualRequired`.
    manual_required: Vec<GpuRemediation>,
}

/// The records to write for `decision` (none for an invalid policy).
fn records(
    policy: &GpuRemediationPolicy,
    decision: &budget::Decision,
    found: &Found<'_, '_>,
    remediations: &[Arc<GpuRemediation>],
    valid: bool,
    now: Timestamp,
) -> Records {
    let previous =
        |node: &Node, evidence: &Evidence| previous_incident(&node.name_any(), evidence.since, remediations);
    if !valid {
        return Records {
            create: Vec::new(),
            readmit: Vec::new(),
            manual_required: Vec::new(),
        };
    }
    let create = decision
        .admitted
        .iter()
        .filter(|c| !found.approved_records.contains_key(&c.node))
        .filter_map(|c| found.evidence_of.get(&c.node))
        .map(|(node, evidence)| new_remediation(policy, node, evidence, previous(node, evidence)))
        .collect();
    let readmit = decision
        .admitted
        .iter()
        .filter_map(|c| found.approved_records.get(&c.node))
        .map(|record| ((*record).clone(), readmitted_status(record, now)))
        .collect();
    let manual_required = decision
        .waiting
        .iter()
        .filter(|_| policy.spec.mode != Mode::DryRun)
        .filter(|w| matches!(w.deferral, Deferral::AttemptsExhausted { .. }))
        .filter_map(|w| {
            let (node, evidence) = found.evidence_of.get(&w.candidate.node)?;
            let mut record = new_remediation(policy, node, evidence, previous(node, evidence));
            record
                .annotations_mut()
                .insert(ATTEMPTS_EXHAUSTED_ANNOTATION.to_owned(), w.deferral.message());
            Some(record)
        })
        .collect();
    Records {
        create,
        readmit,
        manual_required,
    }
}

/// Whether `remediation` was created past `maxAttemptsPerNode` and has not been admitted since:
/// it waits for a person (in `ManualRequired`, or in `Pending` on its way there) and counts
/// against neither concurrency, rate nor attempts.
#[must_use]
pub fn awaits_person_past_attempts(remediation: &GpuRemediation) -> bool {
    remediation
        .annotations()
        .contains_key(ATTEMPTS_EXHAUSTED_ANNOTATION)
        && !remediation.status.as_ref().is_some_and(|s| {
            s.phase_history
                .iter()
                .skip_while(|t| t.phase != Phase::ManualRequired)
                .any(|t| t.phase == Phase::Pending)
        })
}

/// The status of an approved `ManualRequired` record the budget admitted: back in `Pending`.
fn readmitted_status(record: &GpuRemediation, now: Timestamp) -> GpuRemediationStatus {
    let mut status = record.status.clone().unwrap_or_default();
    let message = "a person approved going past maxAttemptsPerNode and the budget admitted it: proceeding";
    status.phase = Phase::Pending;
    status.message = Some(message.to_owned());
    status.phase_history.push(PhaseTransition {
        phase: Phase::Pending,
        at: Time(now),
        message: Some(message.to_owned()),
    });
    status
}

/// The candidates of one policy, with what admitting each needs.
struct Found<'n, 'r> {
    /// Nodes that may start (or, approved, resume) a remediation.
    candidates: Vec<Candidate>,
    /// The evidence each new candidate was found unhealthy on.
    evidence_of: BTreeMap<String, (&'n Node, Evidence)>,
    /// This episode's `ManualRequired` record a person approved, by node.
    approved_records: BTreeMap<String, &'r GpuRemediation>,
}

/// Unhealthy nodes free to start a remediation: none in flight for the node, and none yet for
/// this episode, or this episode's `ManualRequired` record approved by a person.
fn candidates<'n, 'r>(
    policy: &str,
    unhealthy: &[(&'n Node, Evidence)],
    remediations: &'r [Arc<GpuRemediation>],
) -> Found<'n, 'r> {
    let mut candidates = Vec::new();
    let mut evidence_of: BTreeMap<String, (&Node, Evidence)> = BTreeMap::new();
    let mut approved_records = BTreeMap::new();
    for (node, evidence) in unhealthy {
        let node_name = node.name_any();
        let approved = remediations.iter().find(|r| {
            r.spec.node_name == node_name
                && r.metadata.deletion_timestamp.is_none()
                && r.status
                    .as_ref()
                    .is_some_and(|s| s.phase == Phase::ManualRequired)
                && r.spec
                    .trigger
                    .since
                    .as_ref()
                    .is_some_and(|t| t.0 == evidence.since)
                && r.annotations()
                    .get(APPROVED_ANNOTATION)
                    .is_some_and(|v| v == "true")
        });
        if let Some(record) = approved {
            candidates.push(Candidate {
                node: node_name.clone(),
                since: evidence.since,
                approved_past_attempts: true,
            });
            approved_records.insert(node_name.clone(), record.as_ref());
            continue;
        }
        let busy = remediations
            .iter()
            .filter(|r| r.spec.node_name == node_name)
            .any(|r| {
                let phase = r.status.as_ref().map(|s| s.phase).unwrap_or_default();
                !phase.is_terminal()
                    || r.spec
                        .trigger
                        .since
                        .as_ref()
                        .is_some_and(|t| t.0 == evidence.since)
            });
        // A person cancelled this episode by deleting its record: not again until it ends.
        let cancelled = node
            .annotations()
            .get(CANCELLED_ANNOTATION)
            .is_some_and(|n| *n == remediation_name(&node_name, policy, evidence.since));
        if !busy && !cancelled {
            candidates.push(Candidate {
                node: node_name.clone(),
                since: evidence.since,
                approved_past_attempts: false,
            });
            evidence_of.insert(node_name, (node, evidence.clone()));
        }
    }

    Found {
        candidates,
        evidence_of,
        approved_records,
    }
}

/// The policy's remediations that count against its budget (dry runs do not).
fn started(name: &str, remediations: &[Arc<GpuRemediation>], now: Timestamp) -> Vec<Started> {
    remediations
        .iter()
        .filter(|r| r.spec.policy_name == name && r.spec.mode != Mode::DryRun)
        .filter(|r| !awaits_person_past_attempts(r))
        .map(|r| Started {
            node: r.spec.node_name.clone(),
            at: admitted_at(r).unwrap_or(now),
            in_flight: !r
                .status
                .as_ref()
                .map(|s| s.phase)
                .unwrap_or_default()
                .is_terminal(),
        })
        .collect()
}

/// When `node`'s latest incident before `since` started, among the records still kept (any
/// policy's).
fn previous_incident(
    node: &str,
    since: Timestamp,
    remediations: &[Arc<GpuRemediation>],
) -> Option<Timestamp> {
    remediations
        .iter()
        .filter(|r| r.spec.node_name == node)
        .filter_map(|r| r.spec.trigger.since.as_ref().map(|t| t.0))
        .filter(|t| *t < since)
        .max()
}

/// When a record was (last) admitted by the budget: its readmission after a person's approval
/// past `maxAttemptsPerNode`, else its creation. Limits count it from then.
fn admitted_at(record: &GpuRemediation) -> Option<Timestamp> {
    let readmitted = record.status.as_ref().and_then(|s| {
        s.phase_history
            .iter()
            .skip(1)
            .rev()
            .find(|t| t.phase == Phase::Pending)
            .map(|t| t.at.0)
    });
    readmitted.or_else(|| record.creation_timestamp().map(|t| t.0))
}

fn earliest(a: Option<Timestamp>, b: Option<Timestamp>) -> Option<Timestamp> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use gpu_remediation_api::{
        GpuRemediationPolicySpec, GpuRemediationSpec, GpuRemediationStatus, Phase,
        constants::REMEDIATION_FINALIZER,
        policy::{Action, ConditionStatus, Trigger},
        remediation::TriggerRecord,
        selector::{IntOrPercent, NodeSelector},
    };
    use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};
    use kube::api::ObjectMeta;

    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn policy(name: &str, group: &str) -> Arc<GpuRemediationPolicy> {
        let spec: GpuRemediationPolicySpec = serde_json::from_value(serde_json::json!({
            "nodeSelector": {"matchLabels": {"group": group}},
            "triggers": [{"conditionType": "GpuHealthy", "status": "False", "for": "60s"}],
            "action": "None",
            "safety": {"maxUnhealthy": "100%"},
        }))
        .unwrap();
        let mut p = GpuRemediationPolicy::new(name, spec);
        p.metadata.generation = Some(1);
        Arc::new(p)
    }

    fn node(name: &str, group: &str, broken_since: Option<i64>) -> Arc<Node> {
        let condition = NodeCondition {
            type_: "GpuHealthy".into(),
            status: if broken_since.is_some() { "False" } else { "True" }.into(),
            reason: Some(
                if broken_since.is_some() {
                    "XID79"
                } else {
                    "GpusHealthy"
                }
                .into(),
            ),
            last_transition_time: Some(Time(at(broken_since.unwrap_or(0)))),
            ..NodeCondition::default()
        };
        Arc::new(Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some([("group".to_owned(), group.to_owned())].into()),
                ..ObjectMeta::default()
            },
            spec: None,
            status: Some(NodeStatus {
                conditions: Some(vec![condition]),
                ..NodeStatus::default()
            }),
        })
    }

    /// A record of `node` under `policy` in `phase`, its episode begun at `since` (shared with the
    /// index's tests).
    pub(super) fn existing(
        node: &str,
        policy: &str,
        since: i64,
        phase: Phase,
        created: i64,
    ) -> Arc<GpuRemediation> {
        let mut r = GpuRemediation::new(
            &remediation_name(node, policy, at(since)),
            GpuRemediationSpec {
                node_name: node.into(),
                policy_name: policy.into(),
                trigger: TriggerRecord {
                    condition_type: "GpuHealthy".into(),
                    status: ConditionStatus::False,
                    reason: "XID79".into(),
                    message: String::new(),
                    since: Some(Time(at(since))),
                },
                action: Action::None,
                mode: Mode::Enforce,
                node_uid: None,
                previous_incident: None,
                policy_snapshot: None,
                hardware: None,
            },
        );
        r.metadata.creation_timestamp = Some(Time(at(created)));
        r.status = Some(GpuRemediationStatus {
            phase,
            ..GpuRemediationStatus::default()
        });
        Arc::new(r)
    }

    #[test]
    fn a_node_broken_for_longer_than_for_gets_a_remediation_with_its_trigger_recorded() {
        let fleet = plan(
            &[policy("p", "a")],
            &[node("n1", "a", Some(0)), node("n2", "a", None)],
            &[],
            at(60),
        );
        let plan = &fleet.policies[0];
        assert_eq!(plan.create.len(), 1);
        let created = &plan.create[0];
        assert_eq!(created.spec.node_name, "n1");
        assert_eq!(created.spec.trigger.reason, "XID79");
        assert_eq!(created.spec.trigger.since, Some(Time(at(0))));
        assert_eq!(created.spec.action, Action::None);
        assert_eq!(created.finalizers(), [REMEDIATION_FINALIZER.to_owned()]);
        assert_eq!(plan.status.selected_nodes, 2);
        assert_eq!(plan.status.unhealthy_nodes, 1);
        assert_eq!(plan.status.in_flight, 1);
    }

    #[test]
    fn a_node_still_within_for_is_not_remediated_and_the_plan_wakes_when_it_would_be() {
        let fleet = plan(&[policy("p", "a")], &[node("n1", "a", Some(10))], &[], at(60));
        assert!(fleet.policies[0].create.is_empty());
        assert_eq!(fleet.wake_at, Some(at(70)));
    }

    #[test]
    fn a_node_with_a_remediation_in_flight_gets_no_second_one() {
        let rems = [existing("n1", "p", 0, Phase::Draining, 60)];
        let fleet = plan(&[policy("p", "a")], &[node("n1", "a", Some(0))], &rems, at(100));
        assert!(fleet.policies[0].create.is_empty());
        assert_eq!(fleet.policies[0].status.in_flight, 1);
    }

    #[test]
    fn a_finished_remediation_is_not_repeated_within_the_same_episode_but_is_in_a_new_one() {
        let rems = [existing("n1", "p", 0, Phase::Cancelled, 60)];
        let same = plan(&[policy("p", "a")], &[node("n1", "a", Some(0))], &rems, at(1000));
        assert!(same.policies[0].create.is_empty());
        let new_episode = plan(
            &[policy("p", "a")],
            &[node("n1", "a", Some(500))],
            &rems,
            at(1000),
        );
        assert_eq!(new_episode.policies[0].create.len(), 1);
        assert_eq!(
            new_episode.policies[0].create[0]
                .spec
                .previous_incident
                .as_ref()
                .map(|t| t.0),
            Some(at(0)),
            "the new record names when the node's previous incident started"
        );
    }

    fn one_attempt_per_day(name: &str, group: &str) -> Arc<GpuRemediationPolicy> {
        let mut p = (*policy(name, group)).clone();
        p.spec.safety.max_attempts_per_node.count = 1;
        p.spec.safety.max_concurrent = IntOrPercent::Int(1);
        Arc::new(p)
    }

    fn manual_required(node: &str, since: i64, created: i64, approved: bool) -> Arc<GpuRemediation> {
        let mut r = (*existing(node, "p", since, Phase::ManualRequired, created)).clone();
        r.annotations_mut().insert(
            ATTEMPTS_EXHAUSTED_ANNOTATION.to_owned(),
            "1 remediations of this node within 24h reach maxAttemptsPerNode 1".to_owned(),
        );
        r.status.as_mut().unwrap().phase_history.push(PhaseTransition {
            phase: Phase::ManualRequired,
            at: Time(at(created)),
            message: None,
        });
        if approved {
            r.annotations_mut()
                .insert(APPROVED_ANNOTATION.to_owned(), "true".to_owned());
        }
        Arc::new(r)
    }

    #[test]
    fn a_node_due_one_recycle_too_many_gets_a_manual_required_record_that_counts_nowhere() {
        let rems = [existing("n1", "p", 0, Phase::Succeeded, 60)];
        let fleet = plan(
            &[one_attempt_per_day("p", "a")],
            &[node("n1", "a", Some(500))],
            &rems,
            at(1000),
        );
        let plan = &fleet.policies[0];
        assert!(plan.create.is_empty());
        assert_eq!(plan.manual_required.len(), 1);
        let record = &plan.manual_required[0];
        assert_eq!(record.spec.node_name, "n1");
        assert_eq!(record.name_any(), remediation_name("n1", "p", at(500)));
        assert!(
            record
                .annotations()
                .get(ATTEMPTS_EXHAUSTED_ANNOTATION)
                .is_some_and(|m| m.contains("maxAttemptsPerNode 1")),
            "{:?}",
            record.annotations()
        );
        assert!(
            plan.status.waiting.is_empty(),
            "its record says why, not the waiting list"
        );
        assert_eq!(plan.status.in_flight, 0);
        assert_eq!(plan.status.budget.as_ref().unwrap().started_in_window, 1);
    }

    #[test]
    fn a_manual_required_record_waits_for_a_person_and_is_not_repeated() {
        let rems = [
            existing("n1", "p", 0, Phase::Succeeded, 60),
            manual_required("n1", 500, 900, false),
        ];
        let fleet = plan(
            &[one_attempt_per_day("p", "a")],
            &[node("n1", "a", Some(500))],
            &rems,
            at(1000),
        );
        let plan = &fleet.policies[0];
        assert!(plan.create.is_empty() && plan.manual_required.is_empty() && plan.readmit.is_empty());
        assert_eq!(plan.status.in_flight, 0);
        assert_eq!(
            plan.status.budget.as_ref().unwrap().started_in_window,
            1,
            "the ManualRequired record does not count against the rate"
        );
    }

    #[test]
    fn an_approved_manual_required_record_goes_back_to_pending_when_the_budget_has_room() {
        let rems = [
            existing("n1", "p", 0, Phase::Succeeded, 60),
            manual_required("n1", 500, 900, true),
        ];
        let fleet = plan(
            &[one_attempt_per_day("p", "a")],
            &[node("n1", "a", Some(500))],
            &rems,
            at(1000),
        );
        let plan = &fleet.policies[0];
        assert!(plan.create.is_empty() && plan.manual_required.is_empty());
        assert_eq!(plan.readmit.len(), 1);
        let (record, status) = &plan.readmit[0];
        assert_eq!(record.name_any(), remediation_name("n1", "p", at(500)));
        assert_eq!(status.phase, Phase::Pending);
        assert_eq!(status.phase_history.last().map(|t| t.at.0), Some(at(1000)));
        assert_eq!(plan.status.in_flight, 1);
    }

    #[test]
    fn an_approved_manual_required_record_still_waits_for_a_concurrency_slot() {
        let rems = [
            existing("n1", "p", 0, Phase::Succeeded, 60),
            manual_required("n1", 500, 900, true),
            existing("n2", "p", 800, Phase::Draining, 850),
        ];
        let fleet = plan(
            &[one_attempt_per_day("p", "a")],
            &[node("n1", "a", Some(500)), node("n2", "a", Some(800))],
            &rems,
            at(1000),
        );
        let plan = &fleet.policies[0];
        assert!(plan.readmit.is_empty() && plan.create.is_empty() && plan.manual_required.is_empty());
        assert_eq!(plan.status.waiting.len(), 1);
        assert_eq!(plan.status.waiting[0].reason, reasons::DEFERRED_CONCURRENCY);
    }

    #[test]
    fn a_record_admitted_after_approval_counts_like_any_other() {
        let mut r = (*manual_required("n1", 500, 900, true)).clone();
        assert!(awaits_person_past_attempts(&r));
        let status = readmitted_status(&r, at(1000));
        r.status = Some(status);
        assert!(!awaits_person_past_attempts(&r));
        let counted = started("p", &[Arc::new(r)], at(2000));
        assert_eq!(
            counted[0].at,
            at(1000),
            "the rate window counts it from its readmission, not from its creation"
        );
    }

    #[test]
    fn the_same_episode_always_gets_the_same_name() {
        let a = remediation_name("gpu-1", "p", at(0));
        assert_eq!(a, remediation_name("gpu-1", "p", at(0)));
        assert_ne!(a, remediation_name("gpu-1", "p", at(1)));
        assert!(a.starts_with("gpu-1-") && a.len() == "gpu-1-".len() + 6);
    }

    #[test]
    fn nodes_of_another_policys_selector_are_not_counted() {
        let fleet = plan(
            &[policy("p", "a"), policy("q", "b")],
            &[node("n1", "a", Some(0)), node("n2", "b", None)],
            &[],
            at(60),
        );
        assert_eq!(fleet.policies[0].status.selected_nodes, 1);
        assert_eq!(fleet.policies[1].status.selected_nodes, 1);
        assert!(fleet.policies[1].create.is_empty());
    }

    #[test]
    fn a_losing_policy_reports_overlap_naming_the_winner() {
        let fleet = plan(
            &[policy("a-first", "a"), policy("b-second", "a")],
            &[node("n1", "a", None)],
            &[],
            at(60),
        );
        let loser = &fleet.policies[1];
        let overlap = loser
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == policy_conditions::OVERLAP)
            .unwrap();
        assert_eq!(overlap.status, "True");
        assert!(overlap.message.contains("a-first"), "{}", overlap.message);
        assert_eq!(loser.status.selected_nodes, 0);
    }

    #[test]
    fn four_of_ten_failing_under_thirty_percent_opens_the_circuit_and_says_why() {
        let nodes: Vec<_> = (0..10)
            .map(|i| node(&format!("n{i}"), "a", (i < 4).then_some(0)))
            .collect();
        let mut p = (*policy("p", "a")).clone();
        p.spec.safety.max_unhealthy = IntOrPercent::Percent("30%".into());
        p.spec.safety.max_concurrent = IntOrPercent::Int(10);
        let fleet = plan(&[Arc::new(p)], &nodes, &[], at(60));
        let plan = &fleet.policies[0];
        assert!(plan.create.is_empty());
        assert_eq!(plan.circuit_change, Some(true));
        assert_eq!(plan.status.waiting.len(), 4);
        assert!(
            plan.status
                .waiting
                .iter()
                .all(|w| w.reason == reasons::CIRCUIT_OPEN)
        );
        assert_eq!(plan.newly_waiting.len(), 4);
        let circuit = plan
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == policy_conditions::CIRCUIT_OPEN)
            .unwrap();
        assert_eq!(circuit.status, "True");
        assert!(circuit.message.contains("4 of 10"), "{}", circuit.message);
    }

    #[test]
    fn a_node_still_waiting_for_the_same_reason_is_not_announced_again() {
        let mut p = (*policy("p", "a")).clone();
        let nodes = [node("n1", "a", Some(0)), node("n2", "a", Some(5))];
        let first = plan(&[Arc::new(p.clone())], &nodes, &[], at(70));
        assert_eq!(first.policies[0].newly_waiting.len(), 1);
        p.status = Some(first.policies[0].status.clone());
        let rems = [existing("n1", "p", 0, Phase::Draining, 70)];
        let second = plan(&[Arc::new(p)], &nodes, &rems, at(71));
        assert!(second.policies[0].newly_waiting.is_empty());
        assert_eq!(second.policies[0].status.waiting[0].node, "n2");
    }

    #[test]
    fn unchanged_conditions_keep_their_transition_time() {
        let previous = [condition(
            &[],
            "Paused",
            false,
            "Running".into(),
            String::new(),
            None,
            at(0),
        )];
        let again = condition(
            &previous,
            "Paused",
            false,
            "Running".into(),
            String::new(),
            None,
            at(50),
        );
        assert_eq!(again.last_transition_time, Time(at(0)));
        let flipped = condition(
            &previous,
            "Paused",
            true,
            "Paused".into(),
            String::new(),
            None,
            at(50),
        );
        assert_eq!(flipped.last_transition_time, Time(at(50)));
    }

    #[test]
    fn an_unlabelled_node_is_selected_by_an_empty_selector_unless_opted_out() {
        let mut p = (*policy("p", "a")).clone();
        p.spec.node_selector = NodeSelector::default();
        let mut opted = (*node("n2", "b", Some(0))).clone();
        opted.labels_mut().insert(
            gpu_remediation_api::constants::OPT_OUT_LABEL.into(),
            "true".into(),
        );
        let fleet = plan(
            &[Arc::new(p)],
            &[node("n1", "b", None), Arc::new(opted)],
            &[],
            at(60),
        );
        assert_eq!(fleet.policies[0].status.selected_nodes, 1);
        assert!(fleet.policies[0].create.is_empty());
    }

    #[test]
    fn finished_remediations_older_than_the_history_ttl_are_expired_and_others_kept() {
        let mut p = (*policy("p", "a")).clone();
        p.spec.history.ttl = gpu_remediation_api::Duration::from_secs(3600);
        let with_history = |r: Arc<GpuRemediation>, at_secs: i64| {
            let mut r = (*r).clone();
            let status = r.status.as_mut().unwrap();
            status
                .phase_history
                .push(gpu_remediation_api::remediation::PhaseTransition {
                    phase: status.phase,
                    at: Time(at(at_secs)),
                    message: None,
                });
            Arc::new(r)
        };
        let rems = [
            with_history(existing("old", "p", 0, Phase::Succeeded, 0), 100),
            with_history(existing("recent", "p", 0, Phase::Cancelled, 0), 4000),
            with_history(existing("running", "p", 0, Phase::Draining, 0), 100),
            with_history(existing("other", "q", 0, Phase::Succeeded, 0), 100),
        ];
        let fleet = plan(&[Arc::new(p)], &[], &rems, at(5000));
        assert_eq!(fleet.policies[0].expired, vec![rems[0].name_any()]);
    }

    #[test]
    fn an_invalid_policy_starts_nothing_and_says_why() {
        let mut p = (*policy("p", "a")).clone();
        p.spec.triggers.clear();
        let fleet = plan(&[Arc::new(p)], &[node("n1", "a", Some(0))], &[], at(60));
        let plan = &fleet.policies[0];
        assert!(plan.create.is_empty());
        let ready = plan
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == policy_conditions::READY)
            .unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", reasons::INVALID)
        );
        let invalid = plan
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == policy_conditions::INVALID)
            .unwrap();
        assert_eq!(invalid.status, "True");
        assert!(invalid.message.contains("spec.triggers"), "{}", invalid.message);
    }

    #[test]
    fn a_trigger_action_overrides_the_policy_action() {
        let mut p = (*policy("p", "a")).clone();
        p.spec.triggers = vec![Trigger {
            action: Some(Action::Replace),
            ..p.spec.triggers[0].clone()
        }];
        let fleet = plan(&[Arc::new(p)], &[node("n1", "a", Some(0))], &[], at(60));
        assert_eq!(fleet.policies[0].create[0].spec.action, Action::Replace);
    }
}
