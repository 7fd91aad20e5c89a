//! The conditions a policy's status reports (`Ready`, `CircuitOpen`, `Paused`, `Overlap`,
//! `DomainHeld`), and
//! setting one condition so that its transition time moves only when its status changes. Pure.

use std::collections::BTreeMap;

use gpu_remediation_api::{
    GpuRemediationPolicySpec,
    constants::{policy_conditions, reasons},
    policy::{YIELDED_LISTED_MAX, YieldedNode},
};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use crate::{budget, status_condition::condition};

#[allow(
    clippy::too_many_arguments,
    reason = "each input is one fact the conditions report"
)]
pub(super) fn conditions(
    previous: &[Condition],
    paused: bool,
    decision: &budget::Decision,
    unhealthy: u32,
    selected: u32,
    spec: &GpuRemediationPolicySpec,
    yielded: Option<&BTreeMap<String, String>>,
    generation: Option<i64>,
    now: Timestamp,
) -> Vec<Condition> {
    let ready = (
        true,
        reasons::VALID.to_owned(),
        format!("enforcing in mode {:?}", spec.mode),
    );
    let circuit = if decision.circuit_open {
        (
            true,
            reasons::CIRCUIT_OPEN.to_owned(),
            format!(
                "{unhealthy} of {selected} nodes unhealthy, above {}: nothing new starts",
                spec.safety.unhealthy_limit()
            ),
        )
    } else {
        (
            false,
            "WithinLimit".to_owned(),
            format!(
                "{unhealthy} of {selected} nodes unhealthy, {}",
                spec.safety.unhealthy_limit()
            ),
        )
    };
    let paused = if paused {
        (
            true,
            reasons::PAUSED.to_owned(),
            "spec.paused is set: no new remediation starts".to_owned(),
        )
    } else {
        (false, "Running".to_owned(), "not paused".to_owned())
    };
    let overlap = match yielded {
        Some(nodes) if !nodes.is_empty() => (true, reasons::OVERLAP.to_owned(), yielded_message(nodes)),
        _ => (
            false,
            "NoOverlap".to_owned(),
            "every selected node is governed by this policy".to_owned(),
        ),
    };
    let domains = if decision.held_domains.is_empty() {
        (
            false,
            "WithinLimits".to_owned(),
            if spec.safety.failure_domains.is_empty() {
                "no failure domains are configured".to_owned()
            } else {
                "every failure domain is within its limits".to_owned()
            },
        )
    } else {
        (
            true,
            reasons::DOMAIN_HELD.to_owned(),
            decision
                .held_domains
                .iter()
                .map(gpu_remediation_api::correlated::HeldDomain::message)
                .collect::<Vec<_>>()
                .join("; "),
        )
    };
    [
        (policy_conditions::READY, ready),
        (policy_conditions::CIRCUIT_OPEN, circuit),
        (policy_conditions::PAUSED, paused),
        (policy_conditions::OVERLAP, overlap),
        (policy_conditions::DOMAIN_HELD, domains),
    ]
    .into_iter()
    .map(|(type_, (status, reason, message))| {
        condition(previous, type_, status, reason, message, generation, now)
    })
    .collect()
}

/// The first [`YIELDED_LISTED_MAX`] yielded nodes by name, each with its governing policy.
pub(super) fn listed(yielded: &BTreeMap<String, String>) -> Vec<YieldedNode> {
    yielded
        .iter()
        .take(YIELDED_LISTED_MAX as usize)
        .map(|(node, policy)| YieldedNode {
            node: node.clone(),
            governed_by: policy.clone(),
        })
        .collect()
}

/// `Overlap`'s message: how many nodes yield, to which policies, and the first of them by name.
fn yielded_message(yielded: &BTreeMap<String, String>) -> String {
    let mut winners: Vec<&str> = yielded.values().map(String::as_str).collect();
    winners.sort_unstable();
    winners.dedup();
    let named: Vec<String> = listed(yielded)
        .into_iter()
        .map(|y| format!("{} ({})", y.node, y.governed_by))
        .collect();
    let more = yielded.len().saturating_sub(named.len());
    let more = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    format!(
        "{} selected node{} governed by {} (higher priority, or same priority and an earlier name): {}{more}",
        yielded.len(),
        if yielded.len() == 1 { " is" } else { "s are" },
        winners.join(", "),
        named.join(", "),
    )
}

/// `SuspectCause`: true while most recent failures share one attribute value, naming it.
pub(super) fn suspect_condition(
    previous: &[Condition],
    suspect: Option<&gpu_remediation_api::correlated::SuspectStatus>,
    generation: Option<i64>,
    now: Timestamp,
) -> Condition {
    let (status, reason, message) = suspect.map_or_else(
        || {
            (
                false,
                "NoneShared".to_owned(),
                "no attribute value is shared by enough recent failures".to_owned(),
            )
        },
        |s| {
            let hold = if s.holding {
                "; new remediations of nodes carrying it wait"
            } else {
                ""
            };
            (
                true,
                reasons::SUSPECT_HELD.to_owned(),
                format!("{}{hold}", s.message),
            )
        },
    );
    condition(
        previous,
        policy_conditions::SUSPECT_CAUSE,
        status,
        reason,
        message,
        generation,
        now,
    )
}

pub(super) fn has_true_condition(conditions: &[Condition], type_: &str) -> bool {
    conditions.iter().any(|c| c.type_ == type_ && c.status == "True")
}
