//! Who waits and what a policy's status lists of them: the nodes the budget holds back and those
//! an episode's floor holds off, the longest waiting first and at most [`WAITING_LISTED_MAX`] of
//! them with the total beside, and which are newly waiting (their Events). Pure.

use gpu_remediation_api::{
    GpuRemediation,
    policy::{WAITING_LISTED_MAX, WaitingNode},
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::episodes;
use crate::budget;

/// The nodes the decision holds back and those held off before it (see `episodes`), with why
/// (none for an invalid policy). A node past its attempts is not waiting: its `ManualRequired`
/// record says why, once.
pub(super) fn waiting_nodes(
    decision: &budget::Decision,
    manual_required: &[GpuRemediation],
    held_off: Vec<episodes::HeldOff>,
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
        .chain(held_off.into_iter().filter(|_| valid).map(|h| h.waiting))
        .collect()
}

/// The waiting nodes a status lists, the longest waiting first (at most [`WAITING_LISTED_MAX`]),
/// and how many wait in all: a status listing every one of 10,000 waiting nodes outgrows what the
/// API server takes, and then no status is written at all.
#[must_use]
pub fn listed(mut waiting: Vec<WaitingNode>) -> (Vec<WaitingNode>, u32) {
    let total = u32::try_from(waiting.len()).unwrap_or(u32::MAX);
    waiting.sort_by(|a, b| {
        let since = |w: &WaitingNode| w.unhealthy_since.as_ref().map(|t| t.0);
        since(a).cmp(&since(b)).then_with(|| a.node.cmp(&b.node))
    });
    waiting.truncate(WAITING_LISTED_MAX as usize);
    (waiting, total)
}

/// The nodes of `now` that were not waiting before, or waited for another reason.
pub(super) fn newly_waiting(now: &[WaitingNode], before: &[WaitingNode]) -> Vec<WaitingNode> {
    now.iter()
        .filter(|w| !before.iter().any(|p| p.node == w.node && p.reason == w.reason))
        .cloned()
        .collect()
}
