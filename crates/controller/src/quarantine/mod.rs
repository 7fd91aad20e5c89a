//! Quarantine on the first signal: which governed nodes get the policy's quarantine taint now,
//! which lose it, and how many the limit lets it hold. Pure: it reads the nodes, the remediation
//! records and the time, and returns the edits the acting layer (`act::quarantine`, `act::quarantine_device`) writes.
//!
//! Stopping new placements is cheap and reversible (no pod is touched); draining is not. So a
//! node is quarantined as soon as a quarantining trigger's condition matches, before `for`
//! elapses, and admission still waits for `for` as before. From then on:
//! - the signal clears before `for`: the taint is lifted once the condition has stayed clear for
//!   `quarantine.hysteresis`;
//! - `for` elapses: the episode's remediation takes the quarantine over (its cordon adds to it;
//!   its release lifts it), so the node is never schedulable in between;
//! - the episode ends without a remediation holding the node (a person cancelled it, it finished):
//!   the taint is lifted, so a person's decision is never fought;
//! - the episode's record waits in `ManualRequired` (the node used up `maxAttemptsPerNode`): the
//!   fault is still there and nobody has acted, so the quarantine stays while the signal persists
//!   (and is lifted after `quarantine.hysteresis` once it clears, or by a person).
//!
//! Bounded: at most `quarantine.max` (default `safety.maxUnhealthy`) of the selected nodes carry
//! the taint at once; a quarantine held is never lifted to make room, and past the limit no
//! further node is quarantined: the plan names them and the policy's `QuarantineLimited` says why.
//! Nodes that left the policy, or whose policy is gone, are found by their annotation and lifted
//! ([`orphans`]).
//!
//! Where the fault names GPUs allocated through DRA and the server serves `DeviceTaintRule`, the
//! quarantine takes only those devices out of allocation instead of tainting the node
//! ([`device`]); everything above holds the same for it.

pub mod device;
pub mod leak;
pub mod taint;

use std::{
    collections::{BTreeSet, HashMap},
    fmt::Write as _,
    sync::Arc,
};

use gpu_remediation_api::{
    GpuRemediation, GpuRemediationPolicySpec, Phase,
    constants::{CANCELLED_ANNOTATION, policy_conditions, reasons},
    policy::Mode,
};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use crate::{
    cordon::NodeRef,
    detect::{self, Verdict},
    first_seen::FirstSeen,
    observe::{NodeConditionRef, NodeConditions, NodeView},
    time::{plus, signed},
};

/// A node to quarantine now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Add {
    /// The node (its UID a precondition of the edit).
    pub node: NodeRef,
    /// Since when the quarantining condition has held.
    pub since: Timestamp,
    /// The condition as a person reads it: `GpuHealthy=False (XID79)`.
    pub signal: String,
}

/// A quarantine to lift now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lift {
    /// The node.
    pub node: NodeRef,
    /// The policy that owns it (the annotation's value).
    pub policy: String,
    /// Why, for the Event.
    pub why: String,
    /// Lift only once the API server confirms the owning policy does not exist: this controller
    /// does not see it, and a controller scoped by a policy selector cannot tell a deleted policy
    /// from another controller's.
    pub unless_owner_exists: bool,
}

/// One policy's quarantine decision.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Nodes to quarantine, the longest signal first.
    pub add: Vec<Add>,
    /// Quarantines to lift.
    pub lift: Vec<Lift>,
    /// Governed nodes carrying the taint once the plan is written.
    pub held: u32,
    /// How many the limit lets the policy hold.
    pub limit: u32,
    /// Nodes with a quarantining signal the limit kept untainted, the longest signal first.
    pub refused: Vec<String>,
    /// When a held quarantine's hysteresis ends.
    pub wake_at: Option<Timestamp>,
}

/// What one policy's quarantine decision needs.
pub struct Inputs<'a, N> {
    /// The policy's name (the owner written on its nodes).
    pub policy: &'a str,
    /// Its spec.
    pub spec: &'a GpuRemediationPolicySpec,
    /// How many nodes it governs.
    pub selected: u32,
    /// The nodes it governs that may need a decision (all of them, or at least every one that
    /// signals or carries its quarantine).
    pub nodes: &'a [&'a N],
    /// Every remediation record.
    pub remediations: &'a [Arc<GpuRemediation>],
    /// Whether the policy passes every check (an invalid one quarantines nothing new).
    pub valid: bool,
    /// When a condition without a trustworthy clock was first seen: it holds since then, as
    /// for detection (`fleet::verdict`), so its episode is the one its record names.
    pub first_seen: &'a FirstSeen,
    /// The time.
    pub now: Timestamp,
}

/// Decides one policy's quarantines.
#[must_use]
pub fn plan<N: NodeView>(inputs: &Inputs<'_, N>) -> Plan {
    let Inputs {
        policy,
        spec,
        selected,
        nodes,
        remediations,
        valid,
        first_seen,
        now,
    } = *inputs;
    let max = spec.quarantine.max.as_ref().unwrap_or(&spec.safety.max_unhealthy);
    let limit = max.resolve(selected).unwrap_or(0);
    let may_add = valid && !spec.paused && spec.mode != Mode::DryRun;
    let hysteresis = signed(spec.quarantine.hysteresis.as_std());

    let mut out = Plan {
        limit,
        ..Plan::default()
    };
    let mut candidates: Vec<Add> = Vec::new();
    // Each node's records looked up, not searched for: a pass costs the same with 1 or 100 faults.
    let by_node = RecordsByNode::of(remediations);
    for node in nodes {
        let ours = taint::owner(node) == Some(policy);
        let conditions = conditions_of(node);
        let clock = Clock {
            node: node.node_name(),
            first_seen,
            now,
        };
        let signalled = signal(conditions, spec, &clock);
        // Neither signalling nor quarantined by this policy (most of the fleet, most of the time):
        // nothing to decide, and its records are not looked up.
        if signalled.is_none() && !ours {
            continue;
        }
        let records = by_node.on(node);
        // A device-level quarantine holds the node too (its rules take the failed GPUs out).
        let tainted = ours && (taint::has_taint(node) || device::is_device_level(node));
        let node_ref = || NodeRef {
            name: node.node_name().to_owned(),
            uid: node.node_uid().map(str::to_owned),
        };
        if held_by_remediation(node, policy, records) {
            out.held += u32::from(tainted);
            continue;
        }
        let signal = signalled.filter(|_| !episode_over(node, policy, spec, records, &clock));
        match (signal, ours) {
            (Some(_), true) => {
                // Our annotation without our taint: a person took the taint off; not again this
                // episode (and not counted).
                out.held += u32::from(tainted);
            }
            (Some((since, signal)), false) => candidates.push(Add {
                node: node_ref(),
                since,
                signal,
            }),
            (None, false) => {}
            (None, true) => match cleared_at(conditions, spec, now) {
                Some(cleared) if tainted && plus(cleared, hysteresis) > now => {
                    out.held += 1;
                    out.wake_at = Some(earliest(out.wake_at, plus(cleared, hysteresis)));
                }
                _ => out.lift.push(Lift {
                    node: node_ref(),
                    policy: policy.to_owned(),
                    why: lift_reason(tainted, spec),
                    unless_owner_exists: false,
                }),
            },
        }
    }
    candidates.sort_by(|a, b| (a.since, &a.node.name).cmp(&(b.since, &b.node.name)));
    for candidate in candidates {
        if may_add && out.held < limit {
            out.held += 1;
            out.add.push(candidate);
        } else if may_add {
            out.refused.push(candidate.node.name);
        }
    }
    out
}

/// How many refused nodes the `QuarantineLimited` message names.
const NAMED: usize = 10;

impl Plan {
    /// How many of [`Plan::add`] (the longest signals first) may be written once the lifts are,
    /// `failed_lifts` of them having failed: the plan made room for its adds by counting its lifts
    /// done, so each lift left undone keeps one node over [`Plan::held`], and the adds that would
    /// then pass [`Plan::limit`] wait for the next pass. The acting layer writes the lifts first,
    /// so the limit holds between the writes too.
    #[must_use]
    pub fn adds_within_limit(&self, failed_lifts: usize) -> usize {
        let held = usize::try_from(self.held).unwrap_or(usize::MAX);
        let limit = usize::try_from(self.limit).unwrap_or(usize::MAX);
        let over = held.saturating_add(failed_lifts).saturating_sub(limit);
        self.add.len().saturating_sub(over)
    }

    /// The policy's `QuarantineLimited` condition (its transition time kept when unchanged).
    #[must_use]
    pub fn condition(
        &self,
        spec: &GpuRemediationPolicySpec,
        selected: u32,
        previous: &[Condition],
        generation: Option<i64>,
        now: Timestamp,
    ) -> Condition {
        let max = spec.quarantine.max.as_ref().unwrap_or(&spec.safety.max_unhealthy);
        let (limited, reason, message) = if self.refused.is_empty() {
            (
                false,
                reasons::QUARANTINE_WITHIN_LIMIT,
                format!(
                    "{} of {selected} selected nodes quarantined, limit {max} ({} nodes)",
                    self.held, self.limit
                ),
            )
        } else {
            let mut named = self
                .refused
                .iter()
                .take(NAMED)
                .cloned()
                .collect::<Vec<_>>()
                .join(", ");
            if self.refused.len() > NAMED {
                let _ = write!(named, " and {} more", self.refused.len() - NAMED);
            }
            (
                true,
                reasons::QUARANTINE_LIMIT_REACHED,
                format!(
                    "{} nodes show a quarantining signal but {} of {selected} selected nodes are already \
                     quarantined, the quarantine limit {max} ({} nodes): not quarantined: {named}",
                    self.refused.len(),
                    self.held,
                    self.limit
                ),
            )
        };
        crate::status_condition::condition(
            previous,
            policy_conditions::QUARANTINE_LIMITED,
            limited,
            reason.to_owned(),
            message,
            generation,
            now,
        )
    }
}

/// Quarantines to lift on nodes no policy's plan covers: the node left its policy (or never
/// belonged to the one named), or the policy is gone. `governor` names the policy governing a
/// node, if any; `known` says whether this controller sees a policy (an unseen owner's
/// quarantine is lifted only if the server confirms the policy is gone); `plans` are the
/// policies' decisions of this pass. A quarantine the owner's remediation still holds is left to
/// that remediation's release.
#[must_use]
pub fn orphans<'p, N: NodeView>(
    nodes: &[Arc<N>],
    governor: impl Fn(&N) -> Option<&'p str>,
    known: impl Fn(&str) -> bool,
    plans: &[&Plan],
    remediations: &[Arc<GpuRemediation>],
) -> Vec<Lift> {
    let added: BTreeSet<&str> = plans
        .iter()
        .flat_map(|p| p.add.iter().map(|a| a.node.name.as_str()))
        .collect();
    let by_node = RecordsByNode::of(remediations);
    nodes
        .iter()
        .filter_map(|node| {
            let owner = taint::owner(node)?;
            if governor(node) == Some(owner)
                || added.contains(node.node_name().to_owned().as_str())
                || held_by_remediation(node, owner, by_node.on(node))
            {
                return None;
            }
            Some(Lift {
                node: NodeRef {
                    name: node.node_name().to_owned(),
                    uid: node.node_uid().map(str::to_owned),
                },
                policy: owner.to_owned(),
                why: if known(owner) {
                    format!("policy {owner} no longer governs the node (it left the policy's selector)")
                } else {
                    format!("policy {owner} is gone")
                },
                unless_owner_exists: !known(owner),
            })
        })
        .collect()
}

/// Since when a node's conditions hold: their own clock where it can be trusted, else when this
/// controller first saw them so (`first_seen`), the same clock detection reads.
struct Clock<'a> {
    node: &'a str,
    first_seen: &'a FirstSeen,
    now: Timestamp,
}

impl Clock<'_> {
    fn since(&self, condition: NodeConditionRef<'_>) -> Timestamp {
        self.first_seen.since(self.node, condition, self.now)
    }
}

/// The earliest-held condition of a quarantining trigger that matches now: since when, and what
/// it says.
fn signal(
    conditions: NodeConditions<'_>,
    spec: &GpuRemediationPolicySpec,
    clock: &Clock<'_>,
) -> Option<(Timestamp, String)> {
    spec.triggers
        .iter()
        .filter(|t| t.quarantine.unwrap_or(spec.quarantine.enabled))
        .filter_map(|trigger| {
            let condition = conditions
                .iter()
                .find(|c| detect::condition_matches(trigger, *c))?;
            let since = clock.since(condition);
            let reason = condition.reason.unwrap_or_default();
            Some((
                since,
                format!("{}={} ({reason})", condition.type_, condition.status),
            ))
        })
        .min()
}

/// When the quarantining triggers' conditions last changed to a non-matching status (`None`: no
/// such condition is present, or quarantine is off for every trigger).
fn cleared_at(
    conditions: NodeConditions<'_>,
    spec: &GpuRemediationPolicySpec,
    now: Timestamp,
) -> Option<Timestamp> {
    spec.triggers
        .iter()
        .filter(|t| t.quarantine.unwrap_or(spec.quarantine.enabled))
        .filter_map(|trigger| {
            conditions
                .iter()
                .find(|c| c.type_ == trigger.condition_type && !detect::condition_matches(trigger, *c))
        })
        .filter_map(|c| c.last_transition_time.map(|t| t.min(now)))
        .max()
}

/// The remediation records of each node, looked up by the node's name.
pub struct RecordsByNode<'a>(HashMap<&'a str, Vec<&'a GpuRemediation>>);

impl<'a> RecordsByNode<'a> {
    /// Indexes `remediations` by node.
    #[must_use]
    pub fn of(remediations: &'a [Arc<GpuRemediation>]) -> Self {
        let mut by_node: HashMap<&str, Vec<&GpuRemediation>> = HashMap::new();
        for record in remediations {
            by_node
                .entry(record.spec.node_name.as_str())
                .or_default()
                .push(record);
        }
        Self(by_node)
    }

    /// The records of `node`.
    #[must_use]
    pub fn on(&self, node: &(impl NodeView + ?Sized)) -> &[&'a GpuRemediation] {
        self.0.get(node.node_name()).map_or(&[], Vec::as_slice)
    }
}

/// Whether a remediation of `policy` holds the node: one still running, or a finished one still
/// holding the cordon (action `None` keeps it). Its release lifts the quarantine. `records`: the
/// node's.
fn held_by_remediation(node: &(impl NodeView + ?Sized), policy: &str, records: &[&GpuRemediation]) -> bool {
    records.iter().filter(|r| r.spec.policy_name == policy).any(|r| {
        let phase = r.status.as_ref().map(|s| s.phase).unwrap_or_default();
        !phase.is_terminal()
            || crate::cordon::holds(node, r.metadata.name.as_deref().unwrap_or_default()).cordon()
    })
}

/// Whether the node's current episode already had its remediation and it ended (finished,
/// cancelled by a person): the quarantine goes with it. A record waiting in `ManualRequired` does
/// not end it: the broken node stays quarantined while its fault persists.
fn episode_over(
    node: &(impl NodeView + ?Sized),
    policy: &str,
    spec: &GpuRemediationPolicySpec,
    records: &[&GpuRemediation],
    clock: &Clock<'_>,
) -> bool {
    let verdict = detect::evaluate_with(conditions_of(node), &spec.triggers, clock.now, |c| clock.since(c));
    let since = match verdict {
        Verdict::Unhealthy { evidence } | Verdict::Pending { evidence, .. } => evidence.since,
        Verdict::Healthy { .. } => return false,
    };
    let cancelled = node
        .annotation(CANCELLED_ANNOTATION)
        .is_some_and(|c| c == crate::record_name::remediation_name(clock.node, policy, since));
    cancelled
        || records.iter().any(|r| {
            let waits_for_person = r
                .status
                .as_ref()
                .is_some_and(|s| s.phase == Phase::ManualRequired);
            r.spec.policy_name == policy
                && r.spec.trigger.since.as_ref().is_some_and(|t| t.0 == since)
                && !waits_for_person
        })
}

fn lift_reason(tainted: bool, spec: &GpuRemediationPolicySpec) -> String {
    if !tainted {
        "the signal is over: forgetting the quarantine a person lifted".to_owned()
    } else if !spec.quarantine.enabled && spec.triggers.iter().all(|t| t.quarantine != Some(true)) {
        "quarantine is off in the policy".to_owned()
    } else {
        format!(
            "the signal cleared and stayed clear for {} (quarantine.hysteresis), or its episode ended",
            spec.quarantine.hysteresis
        )
    }
}

fn conditions_of(node: &(impl NodeView + ?Sized)) -> NodeConditions<'_> {
    node.conditions()
}

fn earliest(a: Option<Timestamp>, b: Timestamp) -> Timestamp {
    a.map_or(b, |a| a.min(b))
}

#[cfg(test)]
mod tests;
