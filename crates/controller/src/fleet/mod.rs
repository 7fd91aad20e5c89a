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
    collections::{BTreeMap, HashMap, HashSet},
    sync::Arc,
};

use gpu_remediation_api::{
    GpuRemediation, GpuRemediationPolicy, GpuRemediationStatus,
    constants::{policy_conditions, reasons},
    correlated::HeldDomain,
    policy::{BudgetStatus, GpuRemediationPolicyStatus, Mode, SlowStartStatus, WaitingNode},
    validate,
};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;

mod candidates;
mod census;
mod conditions;
#[cfg(test)]
mod correlated_tests;
pub(crate) mod episodes;
mod expiry;
#[cfg(test)]
#[path = "fleet_paths_tests.rs"]
mod fleet_paths_tests;
pub mod index;
mod outcomes;
#[cfg(test)]
mod pass_cost_tests;
mod recheck;
mod record;
pub(crate) mod recovering;
mod suspects;
mod waiting;

use candidates::{Records, candidates, earliest, records, started};
pub use census::{Census, Governed};
use conditions::{conditions, has_true_condition, suspect_condition};
pub use expiry::{AwaitingPerson, Expiry, holds_node};
pub use recheck::{no_longer_due, not_started};
pub use record::{new_remediation, snapshot_of};

use crate::{
    budget::{self, Deferral, Started},
    detect::{self, Evidence, Verdict},
    first_seen::FirstSeen,
    governance,
    observe::{NodeConditionRef, NodeView},
    quarantine,
    status_condition::condition,
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
    /// Finished remediations older than `history.ttl` kept because they still hold their node,
    /// newly saying so: the status to write and one Event each (see `expiry`).
    pub awaiting_person: Vec<AwaitingPerson>,
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
pub fn plan<N: NodeView>(
    policies: &[Arc<GpuRemediationPolicy>],
    nodes: &[Arc<N>],
    remediations: &[Arc<GpuRemediation>],
    now: Timestamp,
) -> FleetPlan {
    let mut first_seen = FirstSeen::default();
    first_seen.observe(nodes.iter().map(AsRef::as_ref), now);
    plan_with(
        policies,
        &Census::take(policies, nodes),
        nodes,
        remediations,
        &first_seen,
        now,
    )
}

/// Plans the fleet at `now` from its `census`, looking only at the `nodes` that may need a
/// decision: every node that is not healthy by its policy's triggers or carries anything of ours,
/// and every node a remediation names (`index::NodeIndex::candidates`). The plan is the same as
/// [`plan`]'s over the whole fleet: the nodes left out only count, and the census counts them.
/// A condition whose own clock cannot be trusted holds since `first_seen` saw it.
#[must_use]
pub fn plan_with<N: NodeView>(
    policies: &[Arc<GpuRemediationPolicy>],
    census: &Census,
    nodes: &[Arc<N>],
    remediations: &[Arc<GpuRemediation>],
    first_seen: &FirstSeen,
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
    let mut governed: BTreeMap<&str, Vec<&N>> = BTreeMap::new();
    for node in nodes {
        let Some(policy) = governance::governing(node.node_labels(), &claimants) else {
            continue;
        };
        if let Some(winner) = names.iter().find(|n| *n == policy) {
            governed.entry(winner.as_str()).or_default().push(node);
        }
    }

    // Every node looked at by name: a finished record's node may have left its policy.
    let by_name: HashMap<&str, &N> = nodes.iter().map(|n| (n.node_name(), n.as_ref())).collect();
    let mut fleet = FleetPlan::default();
    for (policy, name) in policies.into_iter().zip(&names) {
        let nodes = governed.get(name.as_str()).map_or(&[][..], Vec::as_slice);
        let (plan, wake) = plan_policy(
            policy,
            nodes,
            &by_name,
            census.of(name),
            remediations,
            first_seen,
            now,
        );
        fleet.wake_at = earliest(fleet.wake_at, wake);
        fleet.wake_at = earliest(fleet.wake_at, plan.quarantine.wake_at);
        fleet.policies.push(plan);
    }
    let quarantine_plans: Vec<&quarantine::Plan> = fleet.policies.iter().map(|p| &p.quarantine).collect();
    // Asked only of the few nodes carrying a quarantine: decided again for them rather than
    // indexing the whole fleet on every pass.
    let governor_of = |node: &N| {
        governance::governing(node.node_labels(), &claimants)
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
fn plan_policy<N: NodeView>(
    policy: &Arc<GpuRemediationPolicy>,
    nodes: &[&N],
    looked_at: &HashMap<&str, &N>,
    governed: &Governed,
    remediations: &[Arc<GpuRemediation>],
    first_seen: &FirstSeen,
    now: Timestamp,
) -> (PolicyPlan, Option<Timestamp>) {
    let name = policy.name_any();
    let spec = &policy.spec;
    let Detected {
        unhealthy,
        mut wake,
        recovering,
    } = detect_all(nodes, spec, first_seen, now);

    let previous = policy.status.clone().unwrap_or_default();
    let mut found = candidates(&name, &unhealthy, remediations);
    let held_off = episodes::hold_off(
        &mut found,
        &name,
        spec,
        &previous.record_refusals,
        remediations,
        now,
    );
    wake = earliest(wake, held_off.iter().map(|h| h.until).min());
    let started = started(&name, remediations, now);
    // Nothing yielded reads as no list at all.
    let yielded = Some(&governed.yielded).filter(|y| !y.is_empty());
    let selected = governed.selected;
    let mut domains = failure_domains(spec, &governed.domain_sizes, nodes, &unhealthy, &started);
    let (slow_start, proven_at) =
        outcomes::slow_start(&name, spec, selected, nodes, remediations, first_seen, now);
    wake = earliest(wake, proven_at);
    if let Some(slow) = &slow_start {
        domains.slow_start(&slow.outcomes, slow.max_concurrent);
    }
    let allowance = slow_start.map(|s| s.allowance);
    let suspect = suspects::named(&name, spec, nodes, &unhealthy, remediations, now);
    let settling = settling(spec, &unhealthy, now);
    wake = earliest(wake, settling.values().min().copied());
    wake = earliest(wake, recovering.map(|(_, until)| until));
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
        recovering,
        now,
    });

    let invalid = invalid_reason(spec);
    let Records {
        create,
        readmit,
        manual_required,
    } = records(policy, &decision, &found, remediations, invalid.is_none(), now);
    let expiry = expiry::expiry(&name, remediations, looked_at, spec.history.ttl, now);
    wake = earliest(wake, expiry.wake_at);
    let quarantine = quarantine::plan(&quarantine::Inputs {
        policy: &name,
        spec,
        selected,
        nodes,
        remediations,
        valid: invalid.is_none(),
        first_seen,
        now,
    });
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

    let (waiting, waiting_total) = waiting::listed(waiting::waiting_nodes(
        &decision,
        &manual_required,
        held_off,
        invalid.is_none(),
    ));
    let newly_waiting = waiting::newly_waiting(&waiting, &previous.waiting);
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
        waiting_total,
        // As last written: admission adds this pass's refusals.
        record_refusals: episodes::current_refusals(&previous.record_refusals, now),
        held_domains: decision.held_domains.clone(),
        quarantined_nodes: quarantine.held,
        leaked_pods: crate::quarantine::leak::on_record(&name, remediations),
        drain_gpu_seconds: crate::drain::cost::on_record(&name, remediations),
        slow_start: allowance.map(|a| SlowStartStatus {
            allowed: a.allowed,
            message: a.why,
        }),
        suspect,
        // Quarantine's report adds it (`act::quarantine`).
        device_taints: None,
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
            expired: expiry.delete,
            awaiting_person: expiry.awaiting_person,
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

/// The domains of `now` that were not in `before`.
fn newly_in(now: &[HeldDomain], before: &[HeldDomain]) -> Vec<HeldDomain> {
    now.iter()
        .filter(|d| !before.iter().any(|p| p.name() == d.name()))
        .cloned()
        .collect()
}

/// With `safety.settle`: when each node that turned unhealthy (its trigger's `for` past) less than
/// `settle` ago may start.
fn settling<N: NodeView>(
    spec: &gpu_remediation_api::GpuRemediationPolicySpec,
    unhealthy: &[(&N, Evidence)],
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
            (until > now).then(|| (node.node_name().to_owned(), until))
        })
        .collect()
}

/// The policy's failure domains: their sizes from the census, the rest counted over the governed
/// nodes looked at.
fn failure_domains<N: NodeView>(
    spec: &gpu_remediation_api::GpuRemediationPolicySpec,
    sizes: &budget::domains::Sizes,
    nodes: &[&N],
    unhealthy: &[(&N, Evidence)],
    started: &[Started],
) -> budget::Domains {
    if spec.safety.failure_domains.is_empty() {
        return budget::Domains::count(&spec.safety.failure_domains, std::iter::empty());
    }
    // Looked up, not searched for: a pass costs the same with 1 or 100 unhealthy.
    let unhealthy: HashSet<*const N> = unhealthy.iter().map(|(u, _)| std::ptr::from_ref(*u)).collect();
    let in_flight: HashSet<&str> = started
        .iter()
        .filter(|s| s.in_flight)
        .map(|s| s.node.as_str())
        .collect();
    let names: Vec<String> = nodes.iter().map(|n| n.node_name().to_owned()).collect();
    budget::Domains::count_within(
        &spec.safety.failure_domains,
        sizes,
        nodes
            .iter()
            .zip(&names)
            .map(|(node, name)| budget::domains::Member {
                node: name,
                labels: node.node_labels(),
                unhealthy: unhealthy.contains(&std::ptr::from_ref(*node)),
                in_flight: in_flight.contains(name.as_str()),
            }),
    )
}

/// What `spec`'s triggers say of `node` at `now`.
fn verdict(
    node: &(impl NodeView + ?Sized),
    spec: &gpu_remediation_api::GpuRemediationPolicySpec,
    first_seen: &FirstSeen,
    now: Timestamp,
) -> Verdict {
    let conditions = node.conditions();
    let name = node.node_name();
    let since = |condition: NodeConditionRef<'_>| first_seen.since(name, condition, now);
    detect::evaluate_with(conditions, &spec.triggers, now, since)
}

/// What the governed nodes' verdicts say, read in one pass over them.
struct Detected<'n, N> {
    /// The nodes unhealthy now, with their evidence.
    unhealthy: Vec<(&'n N, Evidence)>,
    /// When the first pending one turns unhealthy.
    wake: Option<Timestamp>,
    /// The recovering nodes (`recovering`): how many, and when the last settles.
    recovering: Option<(u32, Timestamp)>,
}

/// The governed nodes' verdicts at `now`.
fn detect_all<'n, N: NodeView>(
    nodes: &[&'n N],
    spec: &gpu_remediation_api::GpuRemediationPolicySpec,
    first_seen: &FirstSeen,
    now: Timestamp,
) -> Detected<'n, N> {
    let mut wake = None;
    let mut unhealthy = Vec::new();
    let mut recovering = recovering::Recovering::new(now);
    for node in nodes {
        match verdict(node, spec, first_seen, now) {
            Verdict::Unhealthy { evidence } => unhealthy.push((*node, evidence)),
            Verdict::Pending { due, .. } => wake = earliest(wake, Some(due)),
            Verdict::Healthy { since } => recovering.note(since),
        }
    }
    Detected {
        unhealthy,
        wake,
        recovering: recovering.found(),
    }
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
pub(crate) mod tests;
