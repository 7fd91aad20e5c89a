//! Mode `DryRun`'s drain: the server asked which evictions it would refuse (a dry-run eviction
//! each), what would happen recorded, nothing changed.

#[allow(clippy::wildcard_imports, reason = "the drain's own types and helpers")]
use super::*;

/// Mode `DryRun`: asks the server which evictions would be refused, records what would happen,
/// and ends `DryRun` having changed nothing.
pub(in crate::lifecycle) fn dry_run(
    seen: &Seen<'_>,
    facts: &Facts<'_>,
    mut status: GpuRemediationStatus,
) -> Decision {
    let Some(plan) = seen.pods else {
        return Decision::Settle(status::unchanged(status, false, Next::At(facts.now)));
    };
    let Some(answers) = &seen.answers.dry_run else {
        return Decision::Ask(Ask::DryRunEvict(plan.to_evict().cloned().collect()));
    };
    let mut blockers: Vec<Blocker> = answers
        .iter()
        .filter_map(|(pod, answer)| match answer {
            EvictionAnswer::Refused(answer) => Some(blocker(pod, answer, seen.budgets, Time(facts.now))),
            EvictionAnswer::Unanswered(error) => Some(Blocker {
                pod: pod.key(),
                pdb: None,
                code: 0,
                message: format!("the dry-run eviction got no answer: {error}"),
                since: Some(Time(facts.now)),
            }),
            EvictionAnswer::Accepted | EvictionAnswer::Gone => None,
        })
        .collect();
    blockers.sort_by(|a, b| a.pod.cmp(&b.pod));
    let would_evict: Vec<String> = plan.to_evict().map(Leaving::key).collect();
    let refusing = budgets_named(&blockers);
    let message = if blockers.is_empty() {
        format!(
            "dry run: {} pods would be evicted; no disruption budget would refuse; nothing was changed",
            would_evict.len()
        )
    } else {
        format!(
            "dry run: {} pods would be evicted; {} evictions would be refused now (by {}); nothing was changed",
            would_evict.len(),
            blockers.len(),
            if refusing.is_empty() {
                "the server".to_owned()
            } else {
                refusing.join(", ")
            }
        )
    };
    status.drain = Some(DrainStatus {
        pods_total: count(would_evict.len()),
        pods_evicted: 0,
        pods_remaining: count(would_evict.len()),
        blockers,
        would_evict,
        evicted: Vec::new(),
        scope: None,
        gangs: seen.gangs.to_vec(),
        notice_since: None,
        gpu_seconds: 0,
    });
    Decision::Settle(status::move_to(
        status,
        Phase::DryRun,
        &message,
        "DryRun",
        EventType::Normal,
        facts.now,
        Next::Idle,
    ))
}
