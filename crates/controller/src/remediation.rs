//! Carries one remediation forward: observes its node and policy, asks the phase machine for the
//! next step, takes it through `kubeops`, and records the result in the remediation's status
//! (a timestamp per phase, drain progress, blockers) with one Event per phase change.
//!
//! Steps are idempotent and decided from what the API server holds, so a restart, a new leader
//! or a repeated pass resumes where the record says, without repeating an action.

use std::{collections::HashMap, sync::Arc};

use futures::{StreamExt, stream};
use gpu_remediation_api::{
    GpuRemediation, GpuRemediationPolicy, GpuRemediationStatus, Phase,
    constants::{
        APPROVED_ANNOTATION, ATTEMPTS_EXHAUSTED_ANNOTATION, REMEDIATION_FINALIZER, reasons,
        remediation_conditions,
    },
    remediation::{Blocker, DrainStatus, PhaseTransition},
};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::{
    api::{core::v1::Pod, policy::v1::PodDisruptionBudget},
    apimachinery::pkg::apis::meta::v1::Time,
};
use kube::{
    Api, ResourceExt,
    api::ListParams,
    runtime::events::{Event, EventType},
};

use crate::{
    context::Context,
    cordon,
    detect::{self, Verdict},
    drain::{self, Leaving, Plan},
    fleet::{awaits_person_past_attempts, condition},
    kubeops::{
        DeletePodError, DropFinalizerError, EditNodeError, EvictPodError, EvictionOutcome, WriteStatusError,
    },
    observe::prune_node,
    phase::{self, DrainState, DrainVerdict, FinishReason, HandOver, Health, NodeState, Observed, Step},
    replace,
    telemetry::EvictionResult,
    time::{plus, signed},
};

/// How many steps one call takes at most before handing back to the loop (a step that needs
/// nothing new from the cluster continues at once, e.g. Draining → Replacing when the last pod
/// has gone). The cordon always hands back: the drain runs in the loop's other lane, so that no
/// other node's cordon waits behind it.
const STEPS_PER_PASS: usize = 4;

/// Why a remediation could not be carried forward in this pass (it is retried in the next).
#[derive(Debug, thiserror::Error)]
pub enum AdvanceRemediationError {
    /// Listing the node's pods failed.
    #[error("listing the pods of node {node} failed: {source}")]
    ListPods {
        /// The node.
        node: String,
        /// What went wrong.
        #[source]
        source: kube::Error,
    },
    /// Cordoning or releasing the node failed.
    #[error(transparent)]
    EditNode(#[from] EditNodeError),
    /// Writing the status failed.
    #[error(transparent)]
    WriteStatus(#[from] WriteStatusError),
    /// An eviction could not be asked.
    #[error(transparent)]
    Evict(#[from] EvictPodError),
    /// A forced deletion failed.
    #[error(transparent)]
    DeletePod(#[from] DeletePodError),
    /// Removing the finalizer failed.
    #[error(transparent)]
    DropFinalizer(#[from] DropFinalizerError),
    /// Triggering the replacement failed.
    #[error(transparent)]
    TriggerReplacement(#[from] replace::TriggerReplacementError),
    /// Looking at the replacement failed.
    #[error(transparent)]
    ObserveReplacement(#[from] replace::ObserveReplacementError),
}

/// When the remediation wants another look.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Only when something it watches changes.
    Idle,
    /// At this time at the latest.
    At(Timestamp),
}

/// Carries `remediation` forward as far as it can go in this pass.
pub async fn advance(
    ctx: &Context,
    remediation: Arc<GpuRemediation>,
) -> Result<Next, AdvanceRemediationError> {
    let mut current = remediation;
    for _ in 0..STEPS_PER_PASS {
        let now = Timestamp::now();
        let policy = ctx.caches.policy(&current.spec.policy_name);
        if policy.is_none() && ctx.settings.policy_selector.is_some() {
            // Another controller's policy (tests share one cluster): not ours to touch.
            return Ok(Next::Idle);
        }
        let observed = observe(ctx, &current, policy.as_deref(), now);
        let step = phase::next_step(&observed);
        tracing::debug!(remediation = %current.name_any(), phase = %observed.phase, ?step, "step");
        // A recovered node is released once it has stayed healthy long enough: look again then.
        let release_at = match observed.health {
            Health::Recovered(Some(since)) if phase::is_before_hand_over(observed.phase) => {
                Some(plus(since, observed.healthy_for))
            }
            _ => None,
        };
        match take(ctx, &current, policy.as_deref(), step, now).await? {
            Taken::Continue(updated) => current = updated,
            Taken::Done(next) => return Ok(earliest(next, release_at)),
        }
    }
    Ok(Next::At(Timestamp::now()))
}

fn observe(
    ctx: &Context,
    remediation: &GpuRemediation,
    policy: Option<&GpuRemediationPolicy>,
    now: Timestamp,
) -> Observed {
    let name = remediation.name_any();
    let status = remediation.status.clone().unwrap_or_default();
    let node = ctx.caches.node(&remediation.spec.node_name);
    let health = match (policy, node.as_deref()) {
        (None, _) => Health::PolicyGone,
        (Some(_), None) => Health::Broken,
        (Some(policy), Some(node)) => {
            let conditions = node
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_deref())
                .unwrap_or_default();
            match detect::evaluate(conditions, &policy.spec.triggers, now) {
                Verdict::Healthy { since } => Health::Recovered(since),
                Verdict::Pending { .. } | Verdict::Unhealthy { .. } => Health::Broken,
            }
        }
    };
    Observed {
        phase: status.phase,
        mode: remediation.spec.mode,
        action: remediation.spec.action,
        deleting: remediation.metadata.deletion_timestamp.is_some(),
        has_finalizer: remediation
            .finalizers()
            .iter()
            .any(|f| f == REMEDIATION_FINALIZER),
        approved: remediation
            .annotations()
            .get(APPROVED_ANNOTATION)
            .is_some_and(|v| v == "true"),
        attempts_exhausted: awaits_person_past_attempts(remediation),
        node: node.map(|n| NodeState {
            cordon: cordon::cordon_of(&n, &name),
        }),
        health,
        healthy_for: policy.map_or(SignedDuration::ZERO, |p| {
            signed(p.spec.release.healthy_for.as_std())
        }),
        drained: has_true(&status, remediation_conditions::DRAINED),
        now,
    }
}

enum Taken {
    /// The step changed the record; take the next step now.
    Continue(Arc<GpuRemediation>),
    /// Nothing more this pass.
    Done(Next),
}

async fn take(
    ctx: &Context,
    remediation: &Arc<GpuRemediation>,
    policy: Option<&GpuRemediationPolicy>,
    step: Step,
    now: Timestamp,
) -> Result<Taken, AdvanceRemediationError> {
    let name = remediation.name_any();
    let node = remediation.spec.node_name.clone();
    let mut status = remediation.status.clone().unwrap_or_default();
    match step {
        Step::Idle => Ok(Taken::Done(Next::Idle)),
        Step::DropFinalizer => {
            drop_finalizer(ctx, remediation).await?;
            Ok(Taken::Done(Next::Idle))
        }
        Step::ReleaseForDeletion => {
            release(ctx, &node, &name).await?;
            drop_finalizer(ctx, remediation).await?;
            Ok(Taken::Done(Next::Idle))
        }
        Step::Cancel(reason) => {
            release(ctx, &node, &name).await?;
            enter(&mut status, Phase::Cancelled, reason.message(), now);
            set_condition(
                &mut status,
                remediation_conditions::COMPLETE,
                true,
                reason.reason(),
                reason.message(),
                now,
            );
            if status
                .conditions
                .iter()
                .any(|c| c.type_ == remediation_conditions::CORDONED)
            {
                set_condition(
                    &mut status,
                    remediation_conditions::CORDONED,
                    false,
                    reason.reason(),
                    "released",
                    now,
                );
            }
            let updated = write(ctx, remediation, status, reason.reason(), EventType::Normal).await?;
            drop_finalizer(ctx, &updated).await?;
            Ok(Taken::Done(Next::Idle))
        }
        Step::HoldForPerson(look_at) => Ok(Taken::Done(look_at.map_or(Next::Idle, Next::At))),
        Step::Finish(reason) => {
            finish_held(ctx, remediation, status, reason, now).await?;
            Ok(Taken::Done(Next::Idle))
        }
        Step::RecordDryRun => {
            record_dry_run(ctx, remediation, policy, status, now).await?;
            Ok(Taken::Done(Next::At(now)))
        }
        Step::AwaitApproval => {
            let message = format!(
                "waiting for a person to approve: kubectl annotate gpuremediation {name} {APPROVED_ANNOTATION}=true"
            );
            enter(&mut status, Phase::AwaitingApproval, &message, now);
            write(
                ctx,
                remediation,
                status,
                reasons::PHASE_CHANGED,
                EventType::Normal,
            )
            .await?;
            Ok(Taken::Done(Next::Idle))
        }
        Step::RequireManual => {
            let message = manual_required_message(remediation);
            enter(&mut status, Phase::ManualRequired, &message, now);
            write(
                ctx,
                remediation,
                status,
                reasons::ATTEMPTS_EXHAUSTED,
                EventType::Warning,
            )
            .await?;
            Ok(Taken::Done(Next::Idle))
        }
        Step::Cordon => cordon_node(ctx, remediation, status, now).await,
        Step::Drain | Step::DrainUntilReleased(_) => {
            let Some(policy) = policy else {
                return Ok(Taken::Done(Next::At(now)));
            };
            let release_at = match step {
                Step::DrainUntilReleased(at) => Some(at),
                _ => None,
            };
            drain_round(ctx, remediation, policy, status, release_at, now).await
        }
        Step::HandOver => hand_over(ctx, remediation, status, now).await,
        Step::TriggerReplacement | Step::VerifyReplacement => {
            let Some(policy) = policy else {
                return Ok(Taken::Done(Next::Idle));
            };
            if step == Step::TriggerReplacement {
                trigger_replacement(ctx, remediation, policy, status, now).await
            } else {
                let node_healthy = node_recovered(ctx, remediation, policy, now);
                verify_replacement(ctx, remediation, policy, node_healthy, status, now).await
            }
        }
    }
}

/// The status of a record created past `maxAttemptsPerNode`: how many attempts in which window
/// (as the fleet recorded them at creation), and how a person lets it proceed.
fn manual_required_message(remediation: &GpuRemediation) -> String {
    let why = remediation
        .annotations()
        .get(ATTEMPTS_EXHAUSTED_ANNOTATION)
        .map_or("this node used up maxAttemptsPerNode", String::as_str);
    format!(
        "{why}. Nothing was touched. To proceed: kubectl annotate gpuremediation {} {APPROVED_ANNOTATION}=true \
         (it then starts like an admitted remediation, within maxConcurrent, rate and maxUnhealthy); \
         or fix the node and leave this record",
        remediation.name_any()
    )
}

/// Cordons and taints the node for this remediation and records who owns the cordon.
async fn cordon_node(
    ctx: &Context,
    remediation: &Arc<GpuRemediation>,
    mut status: GpuRemediationStatus,
    now: Timestamp,
) -> Result<Taken, AdvanceRemediationError> {
    let name = remediation.name_any();
    let node = &remediation.spec.node_name;
    let Some(written) = ctx.ops.cordon_node(node, &name).await? else {
        // The node vanished between the cache and the read: the next step cancels.
        return Ok(Taken::Done(Next::At(now)));
    };
    let message = match cordon::cordon_of(&written, &name) {
        phase::Cordon::Theirs => {
            "the node was already cordoned by someone else; it stays theirs, we added our taint"
        }
        _ => "unschedulable and tainted by this remediation",
    };
    if let Some(since) = &remediation.spec.trigger.since {
        let elapsed = std::time::Duration::try_from(now.duration_since(since.0)).unwrap_or_default();
        ctx.metrics
            .detected_to_cordoned(&remediation.spec.policy_name, elapsed);
    }
    let mut pruned = written;
    prune_node(&mut pruned);
    ctx.caches.written_nodes.record(pruned);
    enter(&mut status, Phase::Cordoned, message, now);
    set_condition(
        &mut status,
        remediation_conditions::CORDONED,
        true,
        "Cordoned",
        message,
        now,
    );
    write(
        ctx,
        remediation,
        status,
        reasons::PHASE_CHANGED,
        EventType::Normal,
    )
    .await?;
    // The drain starts in the next advance, in the loop's carrying lane (see `controller`).
    Ok(Taken::Done(Next::At(now)))
}

/// Whether the node's triggers have cleared (for a `Template` replacement such as a reboot).
fn node_recovered(
    ctx: &Context,
    remediation: &GpuRemediation,
    policy: &GpuRemediationPolicy,
    now: Timestamp,
) -> bool {
    ctx.caches.node(&remediation.spec.node_name).is_some_and(|node| {
        let conditions = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_deref())
            .unwrap_or_default();
        matches!(
            detect::evaluate(conditions, &policy.spec.triggers, now),
            Verdict::Healthy { .. }
        )
    })
}

/// One round of the drain: list the node's pods, evict those due, record progress, and apply the
/// timeout policy.
async fn drain_round(
    ctx: &Context,
    remediation: &Arc<GpuRemediation>,
    policy: &GpuRemediationPolicy,
    mut status: GpuRemediationStatus,
    release_at: Option<Timestamp>,
    now: Timestamp,
) -> Result<Taken, AdvanceRemediationError> {
    let entered_draining = status.phase == Phase::Cordoned;
    if entered_draining {
        enter(
            &mut status,
            Phase::Draining,
            "evicting pods through the Eviction API",
            now,
        );
    }
    let plan = list_plan(ctx, &remediation.spec.node_name).await?;
    let budgets: Vec<PodDisruptionBudget> =
        ctx.caches.budgets.state().iter().map(|b| (**b).clone()).collect();
    let grace = policy.spec.drain.grace_period_seconds;
    let previous = status.drain.clone().unwrap_or_default();
    let backoff = signed(ctx.settings.eviction_backoff);

    let round = evict_round(ctx, &plan, &budgets, &previous, grace, now).await?;
    let (evicted, gone) = (round.evicted, round.gone);
    let remaining = count(plan.leaving.len()).saturating_sub(gone);
    status.drain = Some(DrainStatus {
        pods_total: previous.pods_total.max(count(plan.leaving.len())),
        pods_evicted: previous.pods_evicted + evicted,
        pods_remaining: remaining,
        blockers: round.blockers,
        would_evict: Vec::new(),
    });

    let started = phase_entered(&status, Phase::Draining).unwrap_or(now);
    let verdict = phase::drain_verdict(DrainState {
        remaining,
        started,
        timeout: signed(policy.spec.drain.timeout.as_std()),
        on_timeout: policy.spec.drain.on_timeout,
        now,
    });
    // Pods are not watched: look again soon while some are terminating, after the backoff while
    // the only thing left is refusals (a budget's change wakes the loop earlier), and never later
    // than the drain deadline or the release time.
    let terminating = remaining > count(plan.to_evict().count());
    let has_blockers = status.drain.as_ref().is_some_and(|d| !d.blockers.is_empty());
    let look_again = if has_blockers && !terminating && evicted == 0 {
        plus(now, backoff)
    } else {
        plus(now, signed(ctx.settings.pod_poll))
    };
    let look = Look {
        at: look_again,
        release_at,
    };
    follow_verdict(ctx, remediation, policy, status, verdict, &plan, look, now).await
}

/// When a drain that is not finished wants another look.
#[derive(Clone, Copy)]
struct Look {
    /// For its pods.
    at: Timestamp,
    /// For a recovered node's release, if pending.
    release_at: Option<Timestamp>,
}

impl Look {
    fn until(self, deadline: Option<Timestamp>) -> Next {
        let mut next = self.at;
        for at in [deadline, self.release_at].into_iter().flatten() {
            next = next.min(at);
        }
        Next::At(next)
    }
}

/// Acts on the drain's verdict: hand over when drained, keep going, or apply `onTimeout`.
#[allow(
    clippy::too_many_arguments,
    reason = "the round's observations, passed on as they are"
)]
async fn follow_verdict(
    ctx: &Context,
    remediation: &Arc<GpuRemediation>,
    policy: &GpuRemediationPolicy,
    mut status: GpuRemediationStatus,
    verdict: DrainVerdict,
    plan: &Plan,
    look: Look,
    now: Timestamp,
) -> Result<Taken, AdvanceRemediationError> {
    let grace = policy.spec.drain.grace_period_seconds;
    let remaining = status.drain.as_ref().map_or(0, |d| d.pods_remaining);
    let poll = plus(now, signed(ctx.settings.pod_poll));
    match verdict {
        DrainVerdict::Drained => {
            let message = format!(
                "all {} pods that had to leave are gone",
                status.drain.as_ref().map_or(0, |d| d.pods_total)
            );
            set_condition(
                &mut status,
                remediation_conditions::DRAINED,
                true,
                "Drained",
                &message,
                now,
            );
            status.message = Some(message);
            let updated = write(
                ctx,
                remediation,
                status,
                reasons::PHASE_CHANGED,
                EventType::Normal,
            )
            .await?;
            Ok(Taken::Continue(updated))
        }
        DrainVerdict::Continue { deadline } => {
            write_if_changed(ctx, remediation, status).await?;
            Ok(Taken::Done(look.until(Some(deadline))))
        }
        DrainVerdict::Blocked => {
            if status.phase == Phase::Blocked {
                write_if_changed(ctx, remediation, status).await?;
            } else {
                let message = format!(
                    "drain timed out after {} with {remaining} pods left; the node stays cordoned and evictions keep being retried{}",
                    policy.spec.drain.timeout,
                    blocked_by(&status)
                );
                enter(&mut status, Phase::Blocked, &message, now);
                write(
                    ctx,
                    remediation,
                    status,
                    reasons::DRAIN_TIMEOUT,
                    EventType::Warning,
                )
                .await?;
            }
            Ok(Taken::Done(look.until(None)))
        }
        DrainVerdict::ForceDelete => {
            let doomed: Vec<&Leaving> = plan.to_evict().collect();
            for pod in &doomed {
                tracing::warn!(pod = %pod.key(), "drain timed out: deleting the pod (onTimeout: ForceDelete)");
                ctx.ops.force_delete(pod, grace).await?;
                ctx.metrics.eviction(EvictionResult::ForceDeleted);
            }
            if doomed.is_empty() {
                write_if_changed(ctx, remediation, status).await?;
            } else {
                let pods: Vec<String> = doomed.iter().map(|p| p.key()).collect();
                let message = format!(
                    "drain timed out after {}: deleting {} pods directly (onTimeout: ForceDelete): {}",
                    policy.spec.drain.timeout,
                    pods.len(),
                    pods.join(", ")
                );
                status.message = Some(message.clone());
                let updated = write_if_changed(ctx, remediation, status).await?;
                ctx.ops
                    .publish(
                        updated.as_ref(),
                        event(reasons::DRAIN_TIMEOUT, &message, EventType::Warning),
                    )
                    .await;
            }
            Ok(Taken::Done(Next::At(poll)))
        }
        DrainVerdict::Proceed => {
            let message = format!(
                "drain timed out after {} with {remaining} pods left; proceeding (onTimeout: Proceed){}",
                policy.spec.drain.timeout,
                blocked_by(&status)
            );
            set_condition(
                &mut status,
                remediation_conditions::DRAINED,
                true,
                reasons::DRAIN_TIMEOUT,
                &message,
                now,
            );
            status.message = Some(message.clone());
            let updated = write_if_changed(ctx, remediation, status).await?;
            ctx.ops
                .publish(
                    updated.as_ref(),
                    event(reasons::DRAIN_TIMEOUT, &message, EventType::Warning),
                )
                .await;
            Ok(Taken::Continue(updated))
        }
    }
}

/// What one round of evictions did.
struct EvictionRound {
    /// Evictions the server accepted.
    evicted: u32,
    /// Pods found gone (or replaced by a new pod of the same name) when asked.
    gone: u32,
    /// Pods refused now, or refused earlier and not asked again yet.
    blockers: Vec<Blocker>,
}

/// Asks every pod that is due (never asked, its budget shows room, or its backoff passed) to
/// leave, and collects what the server said.
async fn evict_round(
    ctx: &Context,
    plan: &Plan,
    budgets: &[PodDisruptionBudget],
    previous: &DrainStatus,
    grace: Option<i64>,
    now: Timestamp,
) -> Result<EvictionRound, AdvanceRemediationError> {
    let backoff = signed(ctx.settings.eviction_backoff);
    let due: Vec<&Leaving> = plan
        .to_evict()
        .filter(|pod| {
            let last = ctx.last_eviction_attempt(&pod.uid);
            drain::retry_due(last, budget_allows(pod, budgets), backoff, now)
        })
        .collect();
    let outcomes = evict_all(ctx, due, grace, false).await;
    let earlier = |pod: &Leaving| previous.blockers.iter().find(|b| b.pod == pod.key()).cloned();
    let mut round = EvictionRound {
        evicted: 0,
        gone: 0,
        blockers: Vec::new(),
    };
    let mut asked: HashMap<String, Option<Blocker>> = HashMap::new();
    for (pod, outcome) in outcomes {
        ctx.record_eviction_attempt(&pod.uid, now);
        let refusal = match outcome? {
            EvictionOutcome::Accepted => {
                tracing::info!(pod = %pod.key(), "eviction accepted");
                round.evicted += 1;
                None
            }
            EvictionOutcome::Gone => {
                round.gone += 1;
                None
            }
            EvictionOutcome::Refused(answer) => {
                let since = earlier(pod).and_then(|b| b.since).unwrap_or(Time(now));
                Some(blocker(pod, &answer, budgets, since))
            }
        };
        asked.insert(pod.key(), refusal);
    }
    // A pod asked this round has its new answer; one not asked keeps its earlier blocker.
    round.blockers = plan
        .to_evict()
        .filter_map(|pod| asked.remove(&pod.key()).unwrap_or_else(|| earlier(pod)))
        .collect();
    Ok(round)
}

/// Ends a held `action: None` remediation `Succeeded`: lifts our cordon and taint (a person's
/// pre-existing cordon stays, `release` never lifts what is not ours).
async fn finish_held(
    ctx: &Context,
    remediation: &Arc<GpuRemediation>,
    mut status: GpuRemediationStatus,
    reason: FinishReason,
    now: Timestamp,
) -> Result<(), AdvanceRemediationError> {
    let name = remediation.name_any();
    release(ctx, &remediation.spec.node_name, &name).await?;
    enter(&mut status, Phase::Succeeded, reason.message(), now);
    set_condition(
        &mut status,
        remediation_conditions::COMPLETE,
        true,
        "Succeeded",
        reason.message(),
        now,
    );
    set_condition(
        &mut status,
        remediation_conditions::CORDONED,
        false,
        reason.reason(),
        "released",
        now,
    );
    let updated = write(ctx, remediation, status, reason.reason(), EventType::Normal).await?;
    drop_finalizer(ctx, &updated).await?;
    Ok(())
}

/// After the drain: `action: None` holds the node in `Verifying`; `Replace`/`Reboot` wait for the
/// replacement step.
async fn hand_over(
    ctx: &Context,
    remediation: &Arc<GpuRemediation>,
    mut status: GpuRemediationStatus,
    now: Timestamp,
) -> Result<Taken, AdvanceRemediationError> {
    match phase::hand_over(remediation.spec.action) {
        HandOver::Hold => {
            let message = "drained; action None: the node stays cordoned and waits for a person (uncordon it) or for recovery (its trigger clears for release.healthyFor)";
            enter(&mut status, Phase::Verifying, message, now);
            let updated = write(
                ctx,
                remediation,
                status,
                reasons::PHASE_CHANGED,
                EventType::Normal,
            )
            .await?;
            Ok(Taken::Continue(updated))
        }
        HandOver::Replace => {
            let message = format!("drained; replacing the node ({:?})", remediation.spec.action);
            enter(&mut status, Phase::Replacing, &message, now);
            let updated = write(
                ctx,
                remediation,
                status,
                reasons::PHASE_CHANGED,
                EventType::Normal,
            )
            .await?;
            Ok(Taken::Continue(updated))
        }
    }
}

/// Phase `Replacing`: triggers the policy's replacement strategy (idempotent: a retry after a
/// crash finds the same object), records the object that carries it out, enters `Verifying`.
async fn trigger_replacement(
    ctx: &Context,
    remediation: &Arc<GpuRemediation>,
    policy: &GpuRemediationPolicy,
    mut status: GpuRemediationStatus,
    now: Timestamp,
) -> Result<Taken, AdvanceRemediationError> {
    let strategy = policy.spec.replacement.strategy;
    let reference = ctx
        .replacers
        .for_strategy(strategy)
        .trigger(remediation, &policy.spec.replacement)
        .await?;
    let message = format!(
        "replacement triggered ({strategy:?}): {} {}",
        reference.kind,
        reference
            .namespace
            .as_ref()
            .map_or_else(|| reference.name.clone(), |ns| format!("{ns}/{}", reference.name))
    );
    status.replacement = Some(reference);
    set_condition(
        &mut status,
        remediation_conditions::REPLACEMENT_TRIGGERED,
        true,
        "Triggered",
        &message,
        now,
    );
    enter(&mut status, Phase::Verifying, &message, now);
    let updated = write(
        ctx,
        remediation,
        status,
        reasons::PHASE_CHANGED,
        EventType::Normal,
    )
    .await?;
    Ok(Taken::Continue(updated))
}

/// Phase `Verifying`: looks at the replacement and ends the remediation when it is judged done
/// (or failed, or timed out).
async fn verify_replacement(
    ctx: &Context,
    remediation: &Arc<GpuRemediation>,
    policy: &GpuRemediationPolicy,
    node_healthy: bool,
    mut status: GpuRemediationStatus,
    now: Timestamp,
) -> Result<Taken, AdvanceRemediationError> {
    let Some(reference) = status.replacement.clone() else {
        // Verifying without a recorded object (written by hand?): trigger again, idempotently.
        return trigger_replacement(ctx, remediation, policy, status, now).await;
    };
    let strategy = policy.spec.replacement.strategy;
    let triggered_at = replace::verify::replacing_since(&status).unwrap_or(now);
    let observation = ctx
        .replacers
        .for_strategy(strategy)
        .observe(remediation, &reference, triggered_at)
        .await?;
    let progress = replace::judge(&replace::Verification {
        strategy,
        observation: &observation,
        node_healthy,
        triggered_at,
        timeout: policy.spec.replacement.timeout.as_std(),
        now,
    });
    match progress {
        replace::Progress::Waiting { message } => {
            status.message = Some(message);
            write_if_changed(ctx, remediation, status).await?;
            Ok(Taken::Done(Next::At(plus(
                now,
                signed(ctx.settings.replacement_poll),
            ))))
        }
        replace::Progress::Succeeded { message } => {
            enter(&mut status, Phase::Succeeded, &message, now);
            set_condition(
                &mut status,
                remediation_conditions::COMPLETE,
                true,
                replace::verify::REPLACED,
                &message,
                now,
            );
            let updated = write(
                ctx,
                remediation,
                status,
                reasons::PHASE_CHANGED,
                EventType::Normal,
            )
            .await?;
            Ok(Taken::Continue(updated))
        }
        replace::Progress::Failed { reason, message } => {
            enter(&mut status, Phase::Failed, &message, now);
            set_condition(
                &mut status,
                remediation_conditions::COMPLETE,
                true,
                reason,
                &message,
                now,
            );
            let updated = write(ctx, remediation, status, reason, EventType::Warning).await?;
            Ok(Taken::Continue(updated))
        }
    }
}

/// Mode `DryRun`: lists what would be evicted and asks the server, with dry-run evictions, which
/// budgets would refuse. Changes nothing.
async fn record_dry_run(
    ctx: &Context,
    remediation: &Arc<GpuRemediation>,
    policy: Option<&GpuRemediationPolicy>,
    mut status: GpuRemediationStatus,
    now: Timestamp,
) -> Result<(), AdvanceRemediationError> {
    let plan = list_plan(ctx, &remediation.spec.node_name).await?;
    let budgets: Vec<PodDisruptionBudget> =
        ctx.caches.budgets.state().iter().map(|b| (**b).clone()).collect();
    let grace = policy.and_then(|p| p.spec.drain.grace_period_seconds);
    let outcomes = evict_all(ctx, plan.to_evict().collect(), grace, true).await;
    let mut blockers = Vec::new();
    for (pod, outcome) in outcomes {
        if let EvictionOutcome::Refused(answer) = outcome? {
            blockers.push(blocker(pod, &answer, &budgets, Time(now)));
        }
    }
    blockers.sort_by(|a, b| a.pod.cmp(&b.pod));
    let would_evict: Vec<String> = plan.to_evict().map(Leaving::key).collect();
    let refusing: Vec<String> = blockers.iter().filter_map(|b| b.pdb.clone()).collect();
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
    });
    enter(&mut status, Phase::DryRun, &message, now);
    set_condition(
        &mut status,
        remediation_conditions::COMPLETE,
        true,
        "DryRun",
        &message,
        now,
    );
    write(
        ctx,
        remediation,
        status,
        reasons::PHASE_CHANGED,
        EventType::Normal,
    )
    .await?;
    Ok(())
}

/// Asks for every eviction in `pods`, at most `eviction_concurrency` at once.
async fn evict_all<'a>(
    ctx: &Context,
    pods: Vec<&'a Leaving>,
    grace: Option<i64>,
    dry_run: bool,
) -> Vec<(&'a Leaving, Result<EvictionOutcome, EvictPodError>)> {
    // The futures are built before they enter the stream: a closure producing them inside the
    // stream would make the whole controller future lose `Send` (a rustc limitation).
    let asks: Vec<_> = pods
        .into_iter()
        .map(|pod| evict_one(ctx, pod, grace, dry_run))
        .collect();
    stream::iter(asks)
        .buffer_unordered(ctx.settings.eviction_concurrency.max(1))
        .collect()
        .await
}

async fn evict_one<'a>(
    ctx: &Context,
    pod: &'a Leaving,
    grace: Option<i64>,
    dry_run: bool,
) -> (&'a Leaving, Result<EvictionOutcome, EvictPodError>) {
    let outcome = ctx.ops.evict(pod, grace, dry_run).await;
    ctx.metrics.eviction(match &outcome {
        Ok(_) if dry_run => EvictionResult::DryRun,
        Ok(EvictionOutcome::Accepted) => EvictionResult::Evicted,
        Ok(EvictionOutcome::Gone) => EvictionResult::Gone,
        Ok(EvictionOutcome::Refused(answer)) if answer.code == 429 => EvictionResult::Blocked,
        Ok(EvictionOutcome::Refused(_)) | Err(_) => EvictionResult::Failed,
    });
    (pod, outcome)
}

async fn list_plan(ctx: &Context, node: &str) -> Result<Plan, AdvanceRemediationError> {
    let pods = Api::<Pod>::all(ctx.ops.client().clone());
    let listed = pods
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .map_err(|source| AdvanceRemediationError::ListPods {
            node: node.to_owned(),
            source,
        })?;
    Ok(drain::plan(&listed.items))
}

fn budget_allows(pod: &Leaving, budgets: &[PodDisruptionBudget]) -> Option<bool> {
    let covering = drain::covering_budgets(pod, budgets);
    let [only] = covering.as_slice() else { return None };
    let name = only.split_once('/').map_or(only.as_str(), |(_, n)| n);
    budgets
        .iter()
        .find(|b| b.namespace().as_deref() == Some(pod.namespace.as_str()) && b.name_any() == name)
        .and_then(|b| b.status.as_ref())
        .map(|s| s.disruptions_allowed > 0)
}

fn blocker(
    pod: &Leaving,
    answer: &kube::core::Status,
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
/// the two) holds the budget until the disruption controller gives it back, 2 minutes later: the
/// blocker says so, so that a person reading it knows why nothing moves and that it will.
fn spent_on(budget: &PodDisruptionBudget) -> Option<String> {
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

fn blocked_by(status: &GpuRemediationStatus) -> String {
    let mut budgets: Vec<String> = status
        .drain
        .iter()
        .flat_map(|d| d.blockers.iter().filter_map(|b| b.pdb.clone()))
        .collect();
    budgets.sort();
    budgets.dedup();
    if budgets.is_empty() {
        String::new()
    } else {
        format!("; refused by {}", budgets.join(", "))
    }
}

async fn release(ctx: &Context, node: &str, remediation: &str) -> Result<(), AdvanceRemediationError> {
    if let Some(mut written) = ctx.ops.release_node(node, remediation).await? {
        prune_node(&mut written);
        ctx.caches.written_nodes.record(written);
    }
    Ok(())
}

async fn drop_finalizer(ctx: &Context, remediation: &GpuRemediation) -> Result<(), AdvanceRemediationError> {
    if !remediation
        .finalizers()
        .iter()
        .any(|f| f == REMEDIATION_FINALIZER)
    {
        return Ok(());
    }
    match ctx.ops.drop_finalizer(remediation).await? {
        // A record being deleted goes once its last finalizer is dropped: never lay it over the
        // cache, or it would linger in the view.
        Some(updated)
            if updated.metadata.deletion_timestamp.is_none() || !updated.finalizers().is_empty() =>
        {
            ctx.caches.written_remediations.record(updated);
        }
        Some(_) | None => ctx.caches.written_remediations.forget(&remediation.name_any()),
    }
    Ok(())
}

/// Writes the status and, when the phase changed, publishes one Event saying so.
async fn write(
    ctx: &Context,
    remediation: &GpuRemediation,
    status: GpuRemediationStatus,
    reason: &str,
    type_: EventType,
) -> Result<Arc<GpuRemediation>, AdvanceRemediationError> {
    let mut status = status;
    // `Pending` is entered by creation, which cannot set a status: date it from the record.
    if status
        .phase_history
        .first()
        .is_none_or(|t| t.phase != Phase::Pending)
        && let Some(created) = remediation.creation_timestamp()
    {
        let admitted = PhaseTransition {
            phase: Phase::Pending,
            at: created,
            message: Some("admitted by the budget".to_owned()),
        };
        status.phase_history.insert(0, admitted);
    }
    let before = remediation.status.as_ref().map(|s| s.phase).unwrap_or_default();
    let after = status.phase;
    let message = status.message.clone().unwrap_or_default();
    let entered_before = remediation
        .status
        .as_ref()
        .and_then(|s| phase_entered(s, before))
        .or_else(|| remediation.creation_timestamp().map(|t| t.0));
    let updated = write_if_changed(ctx, remediation, status).await?;
    if before != after {
        let policy = &remediation.spec.policy_name;
        let now = Timestamp::now();
        if let Some(entered) = entered_before {
            let spent = std::time::Duration::try_from(now.duration_since(entered)).unwrap_or_default();
            ctx.metrics.phase_finished(policy, before, spent);
        }
        if after.is_terminal() {
            ctx.metrics
                .remediation_finished(policy, remediation.spec.action, after);
        }
    }
    if before != after || reason != reasons::PHASE_CHANGED {
        let note = format!("{before} → {after}: {message}");
        ctx.ops
            .publish(updated.as_ref(), event(reason, &note, type_))
            .await;
    }
    Ok(updated)
}

async fn write_if_changed(
    ctx: &Context,
    remediation: &GpuRemediation,
    status: GpuRemediationStatus,
) -> Result<Arc<GpuRemediation>, AdvanceRemediationError> {
    if remediation.status.as_ref() == Some(&status) {
        return Ok(Arc::new(remediation.clone()));
    }
    let mut updated = ctx
        .ops
        .write_remediation_status(&remediation.name_any(), &status)
        .await?;
    updated.managed_fields_mut().clear();
    ctx.caches.written_remediations.record(updated.clone());
    Ok(Arc::new(updated))
}

fn event(reason: &str, note: &str, type_: EventType) -> Event {
    Event {
        type_,
        reason: reason.to_owned(),
        note: Some(truncate(note, 1000)),
        action: "Remediate".to_owned(),
        secondary: None,
    }
}

fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

/// Enters `phase`: records it with its time in the history and as the current message.
fn enter(status: &mut GpuRemediationStatus, phase: Phase, message: &str, now: Timestamp) {
    status.phase = phase;
    status.phase_history.push(PhaseTransition {
        phase,
        at: Time(now),
        message: Some(message.to_owned()),
    });
    status.message = Some(message.to_owned());
}

fn set_condition(
    status: &mut GpuRemediationStatus,
    type_: &str,
    value: bool,
    reason: &str,
    message: &str,
    now: Timestamp,
) {
    let updated = condition(
        &status.conditions,
        type_,
        value,
        reason.to_owned(),
        message.to_owned(),
        None,
        now,
    );
    match status.conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(existing) => *existing = updated,
        None => status.conditions.push(updated),
    }
}

fn has_true(status: &GpuRemediationStatus, type_: &str) -> bool {
    status
        .conditions
        .iter()
        .any(|c| c.type_ == type_ && c.status == "True")
}

fn phase_entered(status: &GpuRemediationStatus, phase: Phase) -> Option<Timestamp> {
    status
        .phase_history
        .iter()
        .rev()
        .find(|t| t.phase == phase)
        .map(|t| t.at.0)
}

fn earliest(next: Next, at: Option<Timestamp>) -> Next {
    match (next, at) {
        (Next::Idle, None) => Next::Idle,
        (Next::Idle, Some(at)) => Next::At(at),
        (Next::At(next), at) => Next::At(at.map_or(next, |at| next.min(at))),
    }
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Whether a remediation is still ours to advance (not finished, or
/// finished but still holding our finalizer).
#[must_use]
pub fn needs_attention(remediation: &GpuRemediation) -> bool {
    let phase = remediation.status.as_ref().map(|s| s.phase).unwrap_or_default();
    !phase.is_terminal()
        || remediation
            .finalizers()
            .iter()
            .any(|f| f == REMEDIATION_FINALIZER)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::policy::v1::{PodDisruptionBudgetSpec, PodDisruptionBudgetStatus},
        apimachinery::pkg::apis::meta::v1::LabelSelector,
    };
    use kube::{api::ObjectMeta, core::Status};

    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn pod() -> Leaving {
        Leaving {
            namespace: "work".into(),
            name: "web-0".into(),
            uid: "u".into(),
            terminating: false,
            labels: [("app".to_owned(), "web".to_owned())].into(),
        }
    }

    fn budget(name: &str, allowed: i32) -> PodDisruptionBudget {
        PodDisruptionBudget {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("work".into()),
                ..ObjectMeta::default()
            },
            spec: Some(PodDisruptionBudgetSpec {
                selector: Some(LabelSelector {
                    match_labels: Some([("app".to_owned(), "web".to_owned())].into()),
                    ..LabelSelector::default()
                }),
                ..PodDisruptionBudgetSpec::default()
            }),
            status: Some(PodDisruptionBudgetStatus {
                disruptions_allowed: allowed,
                ..PodDisruptionBudgetStatus::default()
            }),
        }
    }

    #[test]
    fn the_one_budget_covering_a_pod_says_whether_it_has_room() {
        assert_eq!(budget_allows(&pod(), &[budget("web", 1)]), Some(true));
        assert_eq!(budget_allows(&pod(), &[budget("web", 0)]), Some(false));
        assert_eq!(budget_allows(&pod(), &[]), None, "no budget: nothing to wait for");
        assert_eq!(
            budget_allows(&pod(), &[budget("a", 1), budget("b", 1)]),
            None,
            "two budgets: the server decides"
        );
    }

    #[test]
    fn a_blocker_names_the_budget_the_server_names_or_those_that_cover_the_pod() {
        let named = Status {
            code: 429,
            message: "Cannot evict pod as it would violate the pod's disruption budget.".into(),
            ..Status::default()
        };
        let b = blocker(&pod(), &named, &[budget("web", 0)], Time(at(0)));
        assert_eq!(
            (b.pod.as_str(), b.pdb.as_deref(), b.code),
            ("work/web-0", Some("work/web"), 429)
        );
        let several = Status {
            code: 500,
            message: "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."
                .into(),
            ..Status::default()
        };
        let b = blocker(&pod(), &several, &[budget("a", 1), budget("b", 1)], Time(at(0)));
        assert_eq!(b.pdb.as_deref(), Some("work/a,work/b"));
        assert_eq!(b.code, 500);
    }

    #[test]
    fn a_blocker_names_the_pods_its_budget_still_counts_as_evicted() {
        let refused: Status = serde_json::from_value(serde_json::json!({
            "code": 429,
            "message": "Cannot evict pod as it would violate the pod's disruption budget.",
            "details": {"causes": [{
                "reason": "DisruptionBudget",
                "message": "The disruption budget web needs 3 healthy pods and has 3 currently",
            }]},
        }))
        .unwrap();
        let mut spent = budget("web", 0);
        spent.status.as_mut().unwrap().disrupted_pods = Some(
            [
                ("web-2".to_owned(), Time(at(30))),
                ("web-1".to_owned(), Time(at(10))),
            ]
            .into(),
        );
        let b = blocker(&pod(), &refused, &[spent], Time(at(40)));
        assert!(
            b.message.ends_with(&format!(
                "; the budget still counts web-1, web-2 as evicted (granted since {}): it is given back once \
                 they are gone, or by the disruption controller 2 minutes after the grant if a deletion was lost",
                at(10)
            )),
            "{}",
            b.message
        );
        let b = blocker(&pod(), &refused, &[budget("web", 0)], Time(at(40)));
        assert!(!b.message.contains("still counts"), "{}", b.message);
    }

    #[test]
    fn a_drain_looks_again_at_the_earliest_of_its_pods_its_deadline_and_the_release() {
        let look = Look {
            at: at(10),
            release_at: None,
        };
        assert_eq!(look.until(Some(at(5))), Next::At(at(5)));
        assert_eq!(look.until(None), Next::At(at(10)));
        let look = Look {
            at: at(10),
            release_at: Some(at(3)),
        };
        assert_eq!(look.until(Some(at(5))), Next::At(at(3)));
        assert_eq!(earliest(Next::Idle, Some(at(7))), Next::At(at(7)));
        assert_eq!(earliest(Next::Idle, None), Next::Idle);
    }

    #[test]
    fn entering_a_phase_records_it_with_its_time_and_message() {
        let mut status = GpuRemediationStatus::default();
        enter(&mut status, Phase::Cordoned, "cordoned", at(1));
        enter(&mut status, Phase::Draining, "draining", at(2));
        assert_eq!(status.phase, Phase::Draining);
        assert_eq!(status.message.as_deref(), Some("draining"));
        assert_eq!(phase_entered(&status, Phase::Cordoned), Some(at(1)));
        assert_eq!(phase_entered(&status, Phase::Draining), Some(at(2)));
    }

    #[test]
    fn long_event_notes_are_cut_on_a_character_boundary() {
        assert_eq!(truncate("héllo", 2), "h");
        assert_eq!(truncate("short", 100), "short");
    }
}
