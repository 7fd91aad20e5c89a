//! The invariants the path test checks after each pass (numbered as in `super`'s header): the
//! node as it stands (1, 2), a ladder's steps (8), a status the lifecycle could have written (10),
//! a release only with evidence of health (11), diagnostics before destruction (12), and a
//! drain that stops waiting for a pod only on a dead node (13).

#[allow(
    clippy::wildcard_imports,
    reason = "the path test's model and its imports, shared by its parts"
)]
use super::*;

/// Invariant 11: our cordon or taint leaves the standing admitted node only with recorded evidence
/// of health, or because a person acted. Evidence: the settled status says the node recovered
/// (`NodeRecovered`, and the node's `GpuHealthy` is indeed `True`) or its replacement finished
/// (`Replaced`: the object reported done, the node came back healthy, or a ladder step's evidence,
/// which invariant 8 checks). A person: the record deleted, the policy deleted, or the node
/// uncordoned (taken over).
pub(super) fn check_release_proven(
    world: &World,
    record: &GpuRemediation,
    settlement: &Settlement,
) -> Result<(), Violation> {
    let Some(n) = world.node.as_ref() else {
        return Ok(());
    };
    let ours = n.metadata.uid.as_deref() == Some(world.admitted_uid.as_str());
    let annotations = n.metadata.annotations.clone().unwrap_or_default();
    let holds = cordon::has_taint(n)
        || [CORDONED_BY_ANNOTATION, PRE_CORDONED_ANNOTATION]
            .iter()
            .any(|key| annotations.get(*key).is_some_and(|by| by == NAME));
    if !ours || !holds {
        return Ok(());
    }
    let person =
        record.metadata.deletion_timestamp.is_some() || !world.policy_exists || !cordon::is_unschedulable(n);
    if person {
        return Ok(());
    }
    let complete = settlement.status.conditions.iter().find(|c| {
        c.type_ == gpu_remediation_api::constants::remediation_conditions::COMPLETE && c.status == "True"
    });
    let healthy = n
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "GpuHealthy"))
        .is_some_and(|c| c.status == "True");
    match complete.map(|c| c.reason.as_str()) {
        Some(gpu_remediation_api::constants::reasons::NODE_RECOVERED) if healthy => Ok(()),
        Some(crate::replace::verify::REPLACED) => Ok(()),
        reason => Err(format!(
            "{} released the node (healthy: {healthy}) with no recorded evidence of health (Complete reason \
             {reason:?}) and no person acting",
            settlement.status.phase
        )),
    }
}

/// Invariants 1 and 2 on the node as it now stands.
pub(super) fn check_node(world: &World, phase: Phase) -> Result<(), Violation> {
    if let Some(n) = world.node.as_ref() {
        if world.person_holds && !cordon::is_unschedulable(n) {
            return Err("a person's cordon was lifted".into());
        }
        let ours = n.metadata.uid.as_deref() == Some(world.admitted_uid.as_str());
        let deleted = world.record.is_none();
        let finished =
            (phase.is_terminal() && !matches!(phase, Phase::Failed | Phase::ManualRequired)) || deleted;
        if ours && finished {
            let annotations = n.metadata.annotations.clone().unwrap_or_default();
            let holds = cordon::has_taint(n)
                || annotations
                    .get(CORDONED_BY_ANNOTATION)
                    .is_some_and(|by| by == NAME)
                || annotations
                    .get(PRE_CORDONED_ANNOTATION)
                    .is_some_and(|by| by == NAME)
                || annotations
                    .get(HANDED_OFF_BY_ANNOTATION)
                    .is_some_and(|by| by == NAME);
            if holds {
                return Err(format!("{phase} left our cordon or taint on the standing node"));
            }
        }
    }
    Ok(())
}

/// Whether the record climbs no ladder (its rules, or the policy's, have none).
pub(super) fn on_legacy(world: &World, record: &GpuRemediation) -> bool {
    record
        .spec
        .policy_snapshot
        .as_ref()
        .unwrap_or(&world.rules)
        .ladder
        .is_empty()
}

/// Invariant 8 on a settlement's status.
pub(super) fn check_steps(
    record: &GpuRemediation,
    before: &GpuRemediationStatus,
    after: &GpuRemediationStatus,
    node: Option<&k8s_openapi::api::core::v1::Node>,
) -> Result<(), Violation> {
    let open = after.steps.iter().filter(|s| s.end.is_none()).count();
    if open > 1 {
        return Err(format!("{open} steps open at once: {:?}", after.steps));
    }
    if let Some(step) = after
        .steps
        .iter()
        .find(|s| s.end.is_some() != s.outcome.is_some())
    {
        return Err(format!(
            "a step with an end but no outcome, or the reverse: {step:?}"
        ));
    }
    let succeeded_now = after.phase == Phase::Succeeded && before.phase != Phase::Succeeded;
    let by = after
        .steps
        .last()
        .filter(|s| s.outcome == Some(StepOutcome::Succeeded));
    if succeeded_now && let Some(step) = by {
        match step.step {
            Rung::ResetGpu => {
                let listed = node
                    .map(crate::lifecycle::ladder_evidence::inventory_uuids)
                    .unwrap_or_default();
                let failed = crate::lifecycle::ladder_evidence::failed_gpus(record);
                if failed.is_empty() || failed.iter().any(|g| !listed.contains(&g.uuid)) {
                    return Err(format!(
                        "a reset succeeded without the failed GPU answering: {listed:?}"
                    ));
                }
            }
            Rung::Reboot => {
                let now = node.and_then(crate::lifecycle::ladder_evidence::boot_id);
                if now.is_none() || step.evidence.boot_id_before.as_deref() == now {
                    return Err(format!(
                        "a reboot succeeded without a new boot ID ({:?} → {now:?})",
                        step.evidence.boot_id_before
                    ));
                }
            }
            Rung::Replace | Rung::HandOff => {}
        }
    }
    Ok(())
}

/// 10: every status the lifecycle writes is one `provenance::judge` finds its own, unless a
/// person hand-edited the record's phase on the way (then it may rightly be held).
pub(super) fn own_status(world: &World, path: &[Event]) -> Result<(), Violation> {
    let edited = path.iter().any(|e| matches!(e, Event::HandEdit(_)));
    match world.record.as_ref().map(crate::lifecycle::provenance::judge) {
        Some(crate::lifecycle::provenance::Provenance::Tampered(findings)) if !edited => Err(format!(
            "a status the lifecycle wrote is judged tampered: {findings:?}\n  after {path:?}"
        )),
        _ => Ok(()),
    }
}

/// 12: a step that destroys the node's state (a reset, a reboot, a replacement) is asked for only
/// once the diagnostics the policy asks for ended: collected, failed, unreachable, or timed out no
/// earlier than their timeout (unless a person hand-edited the record's phase past the drain).
pub(super) fn diagnosed_before_destruction(
    world: &World,
    rules: &PolicySnapshot,
    before: &GpuRemediationStatus,
    what: &str,
) -> Result<(), Violation> {
    let Some(diagnostics) = &rules.diagnostics else {
        return Ok(());
    };
    if world.hand_edited {
        return Ok(());
    }
    let Some(run) = before.diagnostics.as_ref().filter(|r| r.outcome.is_some()) else {
        return Err(format!(
            "{what} was triggered before the diagnostics ended: {:?}",
            before.diagnostics
        ));
    };
    if run.outcome == Some(gpu_remediation_api::diagnostics::DiagnosticsOutcome::TimedOut) {
        let timeout = SignedDuration::try_from(diagnostics.timeout.as_std()).expect("a duration");
        let end = run
            .end
            .as_ref()
            .map(|t| t.0)
            .ok_or("a timed-out run without its end")?;
        if end < run.start.0 + timeout {
            return Err(format!(
                "the diagnostics timed out at {end}, before their timeout from {}",
                run.start.0
            ));
        }
    }
    Ok(())
}

/// Invariant 13: under `onTimeout: Block`, a drain ends with pods still on the node only because
/// the node is unreachable (`Ready=Unknown`) and each of them has been terminating for more than
/// `drain.unreachableAfter` past its `deletionTimestamp` (no kubelet will report it gone).
pub(super) fn drained_or_unreachable(
    world: &World,
    before: &GpuRemediationStatus,
    after: &GpuRemediationStatus,
) -> Result<(), Violation> {
    let left_draining = before.phase == Phase::Draining
        && !after.phase.is_terminal()
        && !matches!(after.phase, Phase::Draining | Phase::Blocked);
    if !left_draining || world.rules.drain.on_timeout != OnDrainTimeout::Block || world.pods.is_empty() {
        return Ok(());
    }
    let unreachable = world
        .node
        .as_ref()
        .is_some_and(crate::lifecycle::diagnostics::unreachable);
    let after_bound =
        SignedDuration::try_from(world.rules.drain.unreachable_after.as_std()).expect("a duration");
    let waited_out =
        |pod: &Pod| pod.terminating && pod.gone_by.is_some_and(|by| by + after_bound < world.now);
    if unreachable && world.pods.iter().all(waited_out) {
        return Ok(());
    }
    Err(format!(
        "the drain moved to {} under onTimeout Block with {} pod(s) on the node (unreachable: {unreachable}, \
         pods {:?})",
        after.phase,
        world.pods.len(),
        world.pods
    ))
}
