//! Why a drain waits, as the status and Events say it: one blocker per pod, naming the disruption
//! budget and the server's words, and the summary of what blocks the drain.

use std::collections::BTreeSet;

use gpu_remediation_api::{GpuRemediationStatus, remediation::Blocker};
use jiff::Timestamp;
use k8s_openapi::{api::policy::v1::PodDisruptionBudget, apimachinery::pkg::apis::meta::v1::Time};
use kube::core::Status;

use crate::drain::{self, Leaving};

/// The blocker of a pod not asked yet because its budget shows no room (code 0: no server answer).
pub(super) fn waiting_for(pod: &Leaving, budget: &str, now: Timestamp) -> Blocker {
    Blocker {
        pod: pod.key(),
        pdb: Some(budget.to_owned()),
        code: 0,
        message: format!(
            "not asked yet: the disruption budget {budget} allows no more disruptions now (its status, less \
             the evictions already granted under it); asked as soon as its status shows room"
        ),
        since: Some(Time(now)),
    }
}

/// A blocker from a refusal: the budget the server names (or those covering the pod) and the
/// server's words.
pub(super) fn blocker(
    pod: &Leaving,
    answer: &Status,
    budgets: &[PodDisruptionBudget],
    since: Time,
) -> Blocker {
    let named = drain::budget_named_in(answer);
    let pdb = named
        .as_ref()
        .map(|name| format!("{}/{name}", pod.namespace))
        .or_else(|| {
            let covering = drain::covering_budgets(pod, budgets);
            (!covering.is_empty()).then(|| covering.join(","))
        });
    let causes = answer.details.as_ref().map(|d| {
        d.causes
            .iter()
            .map(|c| c.message.as_str())
            .collect::<Vec<_>>()
            .join("; ")
    });
    let mut message = match causes {
        Some(causes) if !causes.is_empty() => format!("{} ({causes})", answer.message),
        _ => answer.message.clone(),
    };
    let refusing = named.and_then(|name| {
        budgets.iter().find(|b| {
            b.metadata.namespace.as_deref() == Some(pod.namespace.as_str())
                && b.metadata.name.as_deref() == Some(name.as_str())
        })
    });
    if let Some(spent) = refusing.and_then(spent_on) {
        message.push_str(&spent);
    }
    Blocker {
        pod: pod.key(),
        pdb,
        code: answer.code,
        message,
        since: Some(since),
    }
}

/// What a refusing budget has already granted: the pods its status still counts as evicted. An
/// eviction the API server granted but whose pod deletion was lost (the client went away between
/// the two) holds the budget until the disruption controller gives it back, 2 minutes later.
pub(super) fn spent_on(budget: &PodDisruptionBudget) -> Option<String> {
    let disrupted = budget.status.as_ref()?.disrupted_pods.as_ref()?;
    let earliest = disrupted.values().map(|t| t.0).min()?;
    let mut pods: Vec<&str> = disrupted.keys().map(String::as_str).collect();
    pods.sort_unstable();
    Some(format!(
        "; the budget still counts {} as evicted (granted since {earliest}): it is given back once \
         they are gone, or by the disruption controller 2 minutes after the grant if a deletion was lost",
        pods.join(", ")
    ))
}

/// Each refusing budget once, sorted (a blocker may name several, comma-separated).
pub(super) fn budgets_named(blockers: &[Blocker]) -> Vec<String> {
    let names: BTreeSet<String> = blockers
        .iter()
        .filter_map(|b| b.pdb.as_deref())
        .flat_map(|pdbs| pdbs.split(',').map(str::to_owned))
        .collect();
    names.into_iter().collect()
}

/// "; refused by a, b" for the blockers' budgets, or nothing.
pub(super) fn blocked_by(status: &GpuRemediationStatus) -> String {
    let budgets = budgets_named(status.drain.as_ref().map_or(&[], |d| d.blockers.as_slice()));
    if budgets.is_empty() {
        String::new()
    } else {
        format!("; refused by {}", budgets.join(", "))
    }
}
