//! `gpu-remediator explain NODE`: why a node is or is not being remediated. Pure.
//!
//! It asks the controller's own decision modules, on a snapshot of the cluster, the questions the
//! controller asks: who governs the node (`governance`), what its triggers say (`detect`),
//! whether a remediation already exists for it, and, when it is unhealthy and free, what the
//! fleet plan (`fleet`, through `budget`) decides: start now, or wait for a named limit. Nothing
//! is re-implemented here, so the answer cannot drift from what the controller does.

use std::{fmt, sync::Arc};

use gpu_remediation_api::{GpuRemediation, GpuRemediationPolicy, Phase, validate::validate_policy};
use jiff::Timestamp;
use kube::ResourceExt;

use crate::{
    detect::{self, Evidence, Verdict},
    fleet,
    governance::{self, Governor},
    observe::NodeView,
};

/// The answer, in one word.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// No node by that name.
    NoSuchNode,
    /// The node carries the opt-out label.
    OptedOut,
    /// No policy selects the node.
    Unselected,
    /// No trigger holds.
    Healthy,
    /// A trigger holds but not yet for its `for`.
    Pending {
        /// When the node turns unhealthy if nothing changes.
        due: Timestamp,
    },
    /// A remediation of the node is under way.
    InFlight {
        /// The remediation.
        remediation: String,
        /// Its phase.
        phase: Phase,
    },
    /// This unhealthy episode was already handled (a finished remediation, or a dry run): the
    /// condition must clear and break again for a new one.
    AlreadyHandled {
        /// The remediation.
        remediation: String,
        /// Its final phase.
        phase: Phase,
    },
    /// Unhealthy and admitted: the controller starts a remediation on its next pass.
    StartsNow,
    /// Unhealthy and held back by a limit.
    Waiting {
        /// The reason, as the policy status spells it.
        reason: String,
        /// The limit, with numbers.
        message: String,
    },
}

/// An outcome and the facts behind it.
#[derive(Clone, Debug)]
pub struct Explanation {
    /// The node.
    pub node: String,
    /// The answer.
    pub outcome: Outcome,
    /// One line per fact: the governing policy, the trigger, the remediation, the limit.
    pub facts: Vec<String>,
}

impl fmt::Display for Explanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let headline = match &self.outcome {
            Outcome::NoSuchNode => "not remediated: no such node".to_owned(),
            Outcome::OptedOut => "not remediated: the node opted out".to_owned(),
            Outcome::Unselected => "not remediated: no policy selects it".to_owned(),
            Outcome::Healthy => "not remediated: healthy (no trigger holds)".to_owned(),
            Outcome::Pending { due } => {
                format!("not remediated yet: a trigger holds, and the node counts as unhealthy at {due}")
            }
            Outcome::InFlight { remediation, phase } => {
                format!("being remediated: {remediation} is {phase}")
            }
            Outcome::AlreadyHandled { remediation, phase } => format!(
                "not remediated again: {remediation} ({phase}) already handled this episode; the condition must clear \
                 and break again"
            ),
            Outcome::StartsNow => {
                "unhealthy and admitted: a remediation starts on the controller's next pass".to_owned()
            }
            Outcome::Waiting { reason, message } => format!("unhealthy but held back ({reason}): {message}"),
        };
        writeln!(f, "node {}: {headline}", self.node)?;
        for fact in &self.facts {
            writeln!(f, "  {fact}")?;
        }
        Ok(())
    }
}

fn describe_evidence(policy: &GpuRemediationPolicy, evidence: &Evidence) -> String {
    let trigger = &policy.spec.triggers[evidence.trigger];
    let reason = if evidence.reason.is_empty() {
        String::new()
    } else {
        format!(" reason {}", evidence.reason)
    };
    format!(
        "trigger spec.triggers[{}]: {}={}{reason} since {} (for {}): {:?}",
        evidence.trigger,
        evidence.condition_type,
        trigger.status.as_str(),
        evidence.since,
        trigger.for_,
        evidence.message
    )
}

/// Explains `node_name` against a snapshot of the cluster at `now`, as the controller would see
/// it (with `policies` being the policies this controller enforces).
#[must_use]
pub fn explain<N: NodeView>(
    node_name: &str,
    nodes: &[Arc<N>],
    policies: &[Arc<GpuRemediationPolicy>],
    remediations: &[Arc<GpuRemediation>],
    now: Timestamp,
) -> Explanation {
    let mut explanation = Explanation {
        node: node_name.to_owned(),
        outcome: Outcome::NoSuchNode,
        facts: Vec::new(),
    };
    let Some(node) = nodes.iter().find(|n| n.node_name() == node_name) else {
        return explanation;
    };
    let Some(governing) = governing_policy(node, policies, &mut explanation) else {
        return explanation;
    };
    describe_quarantine(
        node,
        &governing,
        nodes,
        policies,
        remediations,
        now,
        &mut explanation,
    );
    let mine: Vec<&Arc<GpuRemediation>> = remediations
        .iter()
        .filter(|r| r.spec.node_name == node_name)
        .collect();
    if let Some(current) = mine.iter().find(|r| {
        !r.status
            .as_ref()
            .map(|s| s.phase)
            .unwrap_or_default()
            .is_terminal()
    }) {
        describe_in_flight(current, &mut explanation);
        return explanation;
    }
    let Some(evidence) = unhealthy_evidence(node, &governing, now, &mut explanation) else {
        return explanation;
    };
    if let Some(done) = mine.iter().find(|r| {
        r.spec
            .trigger
            .since
            .as_ref()
            .is_some_and(|t| t.0 == evidence.since)
    }) {
        explanation.outcome = Outcome::AlreadyHandled {
            remediation: done.name_any(),
            phase: done.status.as_ref().map(|s| s.phase).unwrap_or_default(),
        };
        if let Some(status) = &done.status {
            explanation
                .facts
                .extend(super::ladder_steps::record_lines(status));
        }
        return explanation;
    }
    admission(
        node_name,
        &governing,
        nodes,
        policies,
        remediations,
        now,
        &mut explanation,
    );
    explanation
}

/// The node's quarantine, as the fleet plan decides it this pass (`quarantine`), as one fact.
fn describe_quarantine<N: NodeView>(
    node: &(impl NodeView + ?Sized),
    governing: &GpuRemediationPolicy,
    nodes: &[Arc<N>],
    policies: &[Arc<GpuRemediationPolicy>],
    remediations: &[Arc<GpuRemediation>],
    now: Timestamp,
    explanation: &mut Explanation,
) {
    let name = node.node_name().to_owned();
    let plan = fleet::plan(policies, nodes, remediations, now);
    let Some(policy_plan) = plan
        .policies
        .iter()
        .find(|p| p.policy.name_any() == governing.name_any())
    else {
        return;
    };
    let q = &policy_plan.quarantine;
    let fact = if let Some(add) = q.add.iter().find(|a| a.node.name == name) {
        format!(
            "quarantine: taken on the controller's next pass (first signal {} since {}): no new pod lands on it during `for`",
            add.signal, add.since
        )
    } else if q.refused.contains(&name) {
        format!(
            "quarantine: not taken, the quarantine limit is reached ({} of {} nodes held; see the policy's QuarantineLimited)",
            q.held, q.limit
        )
    } else if let Some(lift) = q.lift.iter().find(|l| l.node.name == name) {
        format!("quarantine: lifted on the controller's next pass: {}", lift.why)
    } else if let Some(owner) = crate::quarantine::taint::owner(node)
        && crate::quarantine::device::is_device_level(node)
    {
        let devices: Vec<String> = crate::quarantine::device::recorded(node)
            .iter()
            .map(|d| format!("GPU {} ({}/{}/{})", d.uuid, d.driver, d.pool, d.device))
            .collect();
        format!(
            "quarantine: held at device level by policy {owner}: only {} out of allocation (DeviceTaintRule); \
             the node's other GPUs take work",
            devices.join(", ")
        )
    } else if let Some(owner) = crate::quarantine::taint::owner(node)
        && crate::quarantine::taint::has_taint(node)
    {
        format!(
            "quarantine: held (taint {} by policy {owner})",
            gpu_remediation_api::constants::QUARANTINE_TAINT_KEY
        )
    } else {
        return;
    };
    explanation.facts.push(fact);
}

/// Who governs the node (`governance`), with the policy's mode and validity as facts. `None`
/// (with the outcome set) when nobody does.
fn governing_policy(
    node: &(impl NodeView + ?Sized),
    policies: &[Arc<GpuRemediationPolicy>],
    explanation: &mut Explanation,
) -> Option<Arc<GpuRemediationPolicy>> {
    let live: Vec<&Arc<GpuRemediationPolicy>> = policies
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    let claimants = governance::claimants(live.iter().copied());
    let governing = match governance::governor(node.node_labels(), &claimants) {
        Governor::OptedOut => {
            explanation.outcome = Outcome::OptedOut;
            explanation.facts.push(format!(
                "label {}=true: no policy touches this node",
                gpu_remediation_api::constants::OPT_OUT_LABEL
            ));
            return None;
        }
        Governor::Unselected => {
            explanation.outcome = Outcome::Unselected;
            explanation.facts.push(format!(
                "{} policies checked; none of their nodeSelectors matches the node's labels",
                live.len()
            ));
            return None;
        }
        Governor::Policy { policy, overlapping } => {
            let fact = if overlapping.is_empty() {
                format!("policy {policy} governs the node")
            } else {
                format!(
                    "policy {policy} governs the node; {} also select it and yield (lower priority, or same priority \
                     and a later name)",
                    overlapping.join(", ")
                )
            };
            explanation.facts.push(fact);
            live.iter()
                .find(|p| p.name_any() == policy)
                .map(|p| (*p).clone())
                .expect("the governor is one of the policies")
        }
    };
    let spec = &governing.spec;
    explanation.facts.push(format!(
        "mode {:?}, action {:?}{}",
        spec.mode,
        spec.action,
        if spec.paused { ", paused" } else { "" }
    ));
    let broken_rules = validate_policy(&governing);
    if let Some(first) = broken_rules.first() {
        explanation.facts.push(format!(
            "the policy breaks {} rules (`gpu-remediator validate` lists them), first: {first}",
            broken_rules.len()
        ));
    }
    Some(governing)
}

/// A remediation under way: its phase, message, drain progress and blockers.
fn describe_in_flight(current: &GpuRemediation, explanation: &mut Explanation) {
    let status = current.status.clone().unwrap_or_default();
    explanation.outcome = Outcome::InFlight {
        remediation: current.name_any(),
        phase: status.phase,
    };
    explanation.facts.push(format!(
        "remediation {} (policy {}, trigger {} reason {})",
        current.name_any(),
        current.spec.policy_name,
        current.spec.trigger.condition_type,
        current.spec.trigger.reason
    ));
    if let Some(message) = &status.message {
        explanation.facts.push(format!("status: {message}"));
    }
    if let Some(hardware) = &current.spec.hardware {
        let ledger = [
            hardware
                .repeat_offender
                .as_ref()
                .map(crate::hardware::history::describe),
            crate::hardware::trust::describe_untrusted(hardware),
        ];
        explanation.facts.extend(
            ledger
                .into_iter()
                .flatten()
                .map(|line| format!("hardware: {line}")),
        );
    }
    if let Some(drain) = &status.drain {
        explanation.facts.push(format!(
            "drain: {} of {} pods evicted, {} remaining",
            drain.pods_evicted, drain.pods_total, drain.pods_remaining
        ));
        for blocker in &drain.blockers {
            explanation.facts.push(format!(
                "blocked: pod {} by {}: {}",
                blocker.pod,
                blocker.pdb.as_deref().unwrap_or("(no PDB named)"),
                blocker.message
            ));
        }
        explanation.facts.extend(drain.gangs.iter().map(gang_line));
        if drain.gpu_seconds > 0 {
            explanation
                .facts
                .push(format!("drain cost: {} GPU-seconds", drain.gpu_seconds));
        }
    }
    explanation
        .facts
        .extend(super::ladder_steps::record_lines(&status));
}

/// One gang a drain touched: its members' nodes, and the members evicted elsewhere (`Together`).
fn gang_line(gang: &gpu_remediation_api::gangs::GangRecord) -> String {
    let elsewhere = match (gang.evicted.len(), gang.left_out) {
        (0, 0) => String::new(),
        (evicted, 0) => format!("; {evicted} members on other nodes evicted with it"),
        (evicted, left) => {
            format!("; {evicted} members on other nodes evicted with it, {left} more left in place")
        }
    };
    format!(
        "gang: {} on nodes {}{elsewhere}",
        gang.gang,
        gang.nodes.join(", ")
    )
}

/// What the triggers say (`detect`). `None` (with the outcome set) unless the node is unhealthy.
fn unhealthy_evidence(
    node: &(impl NodeView + ?Sized),
    governing: &GpuRemediationPolicy,
    now: Timestamp,
    explanation: &mut Explanation,
) -> Option<Evidence> {
    let conditions = node.conditions();
    match detect::evaluate(conditions, &governing.spec.triggers, now) {
        Verdict::Healthy { since } => {
            explanation.outcome = Outcome::Healthy;
            let since = since.map_or_else(
                || "no trigger condition present".to_owned(),
                |t| format!("since {t}"),
            );
            explanation
                .facts
                .push(format!("no trigger's condition holds ({since})"));
            None
        }
        Verdict::Pending { evidence, due } => {
            explanation.facts.push(describe_evidence(governing, &evidence));
            explanation.outcome = Outcome::Pending { due };
            None
        }
        Verdict::Unhealthy { evidence } => {
            explanation.facts.push(describe_evidence(governing, &evidence));
            Some(evidence)
        }
    }
}

/// What the fleet plan (`fleet`, through `budget`) decides for an unhealthy, free node.
fn admission<N: NodeView>(
    node_name: &str,
    governing: &GpuRemediationPolicy,
    nodes: &[Arc<N>],
    policies: &[Arc<GpuRemediationPolicy>],
    remediations: &[Arc<GpuRemediation>],
    now: Timestamp,
    explanation: &mut Explanation,
) {
    let plan = fleet::plan(policies, nodes, remediations, now);
    let policy_plan = plan
        .policies
        .iter()
        .find(|p| p.policy.name_any() == governing.name_any())
        .expect("the fleet plan covers every live policy");
    let status = &policy_plan.status;
    explanation.facts.push(format!(
        "policy counts: {} selected, {} unhealthy, {} in flight, budget {} left in the rate window",
        status.selected_nodes,
        status.unhealthy_nodes,
        status.in_flight,
        status.budget.as_ref().map_or(0, |b| b.remaining)
    ));
    explanation
        .facts
        .extend(correlated_facts(node_name, governing, nodes, status));
    explanation.outcome = if policy_plan.create.iter().any(|r| r.spec.node_name == node_name) {
        Outcome::StartsNow
    } else if let Some(waiting) = status.waiting.iter().find(|w| w.node == node_name) {
        Outcome::Waiting {
            reason: waiting.reason.clone(),
            message: waiting.message.clone(),
        }
    } else {
        // The plan neither starts nor defers an unhealthy, free node only if this explanation
        // disagrees with the controller: say so rather than guess.
        Outcome::Waiting {
            reason: "Unknown".to_owned(),
            message: "the fleet plan neither starts nor defers this node; please report this".to_owned(),
        }
    };
}

/// The node's failure domains (held or within their limits), the slow-start allowance and the
/// suspect cause, as the plan's status says.
fn correlated_facts<N: NodeView>(
    node_name: &str,
    governing: &GpuRemediationPolicy,
    nodes: &[Arc<N>],
    status: &gpu_remediation_api::GpuRemediationPolicyStatus,
) -> Vec<String> {
    let node = nodes.iter().find(|n| n.node_name() == node_name);
    let mut facts: Vec<String> = governing
        .spec
        .safety
        .failure_domains
        .iter()
        .map(|domain| match node.and_then(|n| n.label(&domain.topology_key)) {
            None => format!(
                "failure domain {}: the node has no such label, so no domain of it",
                domain.topology_key
            ),
            Some(value) => status
                .held_domains
                .iter()
                .find(|h| h.topology_key == domain.topology_key && h.value == value)
                .map_or_else(
                    || {
                        format!(
                            "failure domain {}={value}: within its limits",
                            domain.topology_key
                        )
                    },
                    gpu_remediation_api::correlated::HeldDomain::message,
                ),
        })
        .collect();
    if let Some(slow) = &status.slow_start {
        facts.push(format!("slow start: {}", slow.message));
    }
    if let Some(suspect) = &status.suspect {
        facts.push(format!("suspect cause: {}", suspect.message));
    }
    facts
}

#[cfg(test)]
mod tests;
