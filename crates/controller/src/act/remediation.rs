//! Carries one remediation forward: sees what its phase needs (the node from the cache, the
//! node's pods while it drains, the replacement while it is verified), asks
//! [`lifecycle::decide`], puts the lifecycle's asks to the server and hands the answers back, then
//! has [`settle`] carry out the settlement (release, status, Events, finalizer, metrics).
//!
//! Every decision is in `lifecycle`; this module only reads, writes and counts. Steps are
//! idempotent and decided from what the API server holds, so a restart, a new leader or a repeated
//! pass resumes where the record says, without repeating an action.

use std::{collections::BTreeMap, sync::Arc};
use tracing::Instrument as _;

use gpu_remediation_api::{
    GpuRemediation, GpuRemediationStatus, Phase, constants::REMEDIATION_FINALIZER, policy::Action,
    remediation::PolicySnapshot,
};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::{ResourceExt, api::ListParams};

use crate::{
    context::Context,
    drain::{self, Leaving, Plan},
    fleet::snapshot_of,
    lifecycle::{
        self, Answers, Ask, Decision, EvictionAnswer, Pace, Seen, Settlement, Words,
        eviction_round::{self, Flight},
        provenance::Provenance,
    },
    observe::NodeView,
    progress,
    read::Scope,
    replace::Observation,
    time::signed,
    write::{DeletePodError, DropFinalizerError, EditNodeError, EvictPodError, WriteStatusError},
};

mod asks;
mod evictions;
mod gang_drain;
mod ladder;
mod settle;
#[cfg(test)]
pub(crate) mod tests;

use asks::{carry_out, evict_one};
use evictions::InFlight;

pub use lifecycle::Next;
use settle::settle;

/// How many settlements one call carries out at most before handing back to the loop (a
/// settlement that is due again at once continues, e.g. Draining → Replacing → Verifying). The
/// cordon always hands back: the drain runs in the loop's other lane, so that no other node's
/// cordon waits behind it.
const STEPS_PER_PASS: usize = 4;

/// How many asks one decision may chain (evict, then delete, then delete the stuck), besides one
/// per pod of the node: an eviction round is asked again within the step while budgets regain room
/// (each time for pods not asked yet). The lifecycle never asks again what was answered, so more
/// means a bug, reported as an error.
const ASKS_PER_STEP: usize = 6;

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
    /// Listing the members of a gang the drain touches failed.
    #[error("listing the gang members {selector:?} in namespace {namespace} failed: {source}")]
    ListGang {
        /// Their namespace.
        namespace: String,
        /// The label selector (empty: the namespace's pods).
        selector: String,
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
    /// An eviction could not be asked (this replica is not the leader).
    #[error(transparent)]
    Evict(#[from] EvictPodError),
    /// A forced deletion could not be asked.
    #[error(transparent)]
    DeletePod(#[from] DeletePodError),
    /// Removing the finalizer failed.
    #[error(transparent)]
    DropFinalizer(#[from] DropFinalizerError),
    /// This replica may not act now.
    #[error("not acting: {0}")]
    Fenced(#[from] crate::leader::FenceError),
    /// Reading which pods hold the failed GPU (`ResourceSlices`, `ResourceClaims`) failed.
    #[error(transparent)]
    ReadDevices(#[from] crate::dra::ReadDevicesError),
    /// The lifecycle kept asking after every answer (a bug in `lifecycle`).
    #[error("remediation {name}: the lifecycle asked more than {limit} times in one step")]
    KeptAsking {
        /// The remediation.
        name: String,
        /// The asks allowed.
        limit: usize,
    },
}

/// [`advance`] inside the remediation's span (`remediation`, `node`, `policy`, `phase`), so each
/// log line of its cordon, drain and replacement says whose it is: how the controller runs it.
pub fn advance_in_span(
    ctx: &Context,
    remediation: Arc<GpuRemediation>,
) -> impl Future<Output = Result<Next, AdvanceRemediationError>> + Send + '_ {
    let span = crate::telemetry::remediation_span(
        &remediation.name_any(),
        &remediation.spec.node_name,
        &remediation.spec.policy_name,
        remediation
            .status
            .as_ref()
            .map(|s| s.phase)
            .unwrap_or_default()
            .as_str(),
    );
    advance(ctx, remediation).instrument(span)
}

/// Carries `remediation` forward as far as it can go in this pass.
pub async fn advance(
    ctx: &Context,
    remediation: Arc<GpuRemediation>,
) -> Result<Next, AdvanceRemediationError> {
    // A drain's progress held back since the last status write (see `progress`) is where this
    // pass starts; `written` is what the server has.
    let (resumed, mut written) = ctx.progress.resume(&remediation);
    let mut current = Arc::new(resumed);
    if let Provenance::Tampered(findings) = lifecycle::provenance::judge(&current) {
        return hold(ctx, &current, written.as_ref(), &findings).await;
    }
    let mut hold_until = None;
    for pass_step in 0..STEPS_PER_PASS {
        crate::telemetry::logs::record_phase(
            current
                .status
                .as_ref()
                .map(|s| s.phase)
                .unwrap_or_default()
                .as_str(),
        );
        let live = ctx.caches.policy(&current.spec.policy_name);
        let rules = current
            .spec
            .policy_snapshot
            .clone()
            .or_else(|| live.as_deref().map(snapshot_of));
        // Boxed: a step's future holds its asks' requests, and an advance's would hold it inline.
        let Stepped {
            settlement,
            rewritten,
        } = Box::pin(step(ctx, &current, rules.as_ref())).await?;
        if let Some(rewritten) = rewritten {
            // The step's own write to the record (see `replace::Triggered`): the status is written
            // over the version it made.
            ctx.progress.rebase(
                &current.name_any(),
                current.resource_version().as_deref(),
                rewritten.resource_version(),
            );
            current = Arc::new(GpuRemediation {
                metadata: rewritten.metadata,
                ..(*current).clone()
            });
        }
        let next = settlement.next;
        let entered = settlement.status.phase;
        let was = current.status.as_ref().map(|s| s.phase).unwrap_or_default();
        if entered != was {
            tracing::info!(
                from = was.as_str(),
                to = entered.as_str(),
                "phase {}",
                entered.as_str()
            );
        }
        let changed = current.status.as_ref() != Some(&settlement.status);
        let due_now = matches!(next, Next::At(at) if at <= Timestamp::now());
        let continues =
            due_now && changed && entered != Phase::Cordoned && current.metadata.deletion_timestamp.is_none();
        // A status the next step of this very advance follows at once (a drain that has just
        // finished, then Verifying) is carried by that step's write (see `progress::passed_through`).
        let passing = continues
            && pass_step + 1 < STEPS_PER_PASS
            && progress::passed_through(
                &settlement.status,
                settlement.release.is_some(),
                settlement.drop_finalizer,
            );
        let settled = settle(ctx, &current, written.as_ref(), settlement, passing).await?;
        current = settled.remediation;
        hold_until = settled.hold_until;
        if hold_until.is_none() {
            written.clone_from(&current.status);
        }
        if !continues {
            // Held progress is written by the pass due when its interval is over.
            return Ok(next.or_at(hold_until));
        }
    }
    Ok(Next::At(Timestamp::now()).or_at(hold_until))
}

/// Holds a record whose status the controller could not have written (`lifecycle::provenance`):
/// the `Tampered` condition and its Event, counted once per hold; nothing is asked of the node.
async fn hold(
    ctx: &Context,
    remediation: &Arc<GpuRemediation>,
    written: Option<&GpuRemediationStatus>,
    findings: &[String],
) -> Result<Next, AdvanceRemediationError> {
    tracing::warn!(
        ?findings,
        "the record's status was not written by the controller: held"
    );
    let settlement = lifecycle::provenance::hold(remediation, findings, Timestamp::now());
    if !settlement.notes.is_empty() {
        ctx.metrics.record_held(&remediation.spec.policy_name);
    }
    settle(ctx, remediation, written, settlement, false).await?;
    Ok(Next::Idle)
}

/// A step's settlement, and the record as the step itself wrote it, if it did.
struct Stepped {
    settlement: Settlement,
    rewritten: Option<GpuRemediation>,
}

/// Sees, decides, and puts the lifecycle's asks to the server until it settles.
#[allow(
    clippy::too_many_lines,
    reason = "one pass of seeing, then one loop of deciding and acting whose arms are the step's cases"
)]
async fn step(
    ctx: &Context,
    remediation: &GpuRemediation,
    rules: Option<&PolicySnapshot>,
) -> Result<Stepped, AdvanceRemediationError> {
    let now = Timestamp::now();
    let status = remediation.status.clone().unwrap_or_default();
    let node = ctx.caches.node(&remediation.spec.node_name);
    let since = remediation.spec.trigger.since.as_ref().map(|t| t.0);
    let (pods, leaked, drain_scope, gangs) = if needs_pods(remediation, &status) {
        let (plan, leaked, listed) = list_plan(ctx, &remediation.spec.node_name, since).await?;
        let reset =
            rules.and_then(|rules| lifecycle::ladder_evidence::reset_scope(remediation, rules, &status));
        let (plan, scope) = match reset {
            Some(uuids) => {
                let previous = status.drain.as_ref().and_then(|d| d.scope.as_deref());
                ladder::scope_drain(ctx, &remediation.spec.node_name, &uuids, plan, &listed, previous).await?
            }
            None => (plan, None),
        };
        // The gangs it touches, recorded when it first acts; under `Together`, their members
        // elsewhere join the plan.
        let (plan, gangs) = match rules {
            Some(rules) => {
                let recorded = status.drain.as_ref().map_or(&[][..], |d| d.gangs.as_slice());
                gang_drain::widen(ctx, &remediation.spec.node_name, rules, recorded, plan, &listed).await?
            }
            None => (plan, Vec::new()),
        };
        (Some(plan), leaked, scope, gangs)
    } else {
        (None, None, None, Vec::new())
    };
    let step = rules.and_then(|rules| lifecycle::ladder::looked_at(&status, rules));
    let replacement = match (&status.replacement, rules) {
        _ if let Some((strategy, reference)) = &step => {
            let started = status.steps.last().map_or(now, |s| s.start.0);
            Some(look_at(ctx, remediation, *strategy, reference, started).await)
        }
        (Some(reference), Some(rules))
            if status.phase == Phase::Verifying
                && remediation.spec.action != Action::None
                && rules.ladder.is_empty() =>
        {
            let triggered_at = lifecycle::status::deadline_base(&status, Phase::Replacing, now);
            let strategy = rules.replacement.strategy;
            Some(look_at(ctx, remediation, strategy, reference, triggered_at).await)
        }
        _ => None,
    };
    // The validation Job running: the open step's (with a ladder), else the record's own.
    let running = status
        .steps
        .last()
        .filter(|s| s.end.is_none())
        .and_then(|s| s.evidence.validation.as_ref())
        .or(status.validation.as_ref())
        .filter(|r| r.outcome.is_none());
    let validation = match running {
        Some(record) => Some(look_at_job(ctx, remediation, record).await),
        None => None,
    };
    // The diagnostics Job running before the step that destroys the node's state.
    let diagnostics = match status.diagnostics.as_ref().filter(|r| r.outcome.is_none()) {
        Some(record) => Some(look_at_job(ctx, remediation, record).await),
        None => None,
    };
    let asked_at = |uid: &str| ctx.last_eviction_attempt(uid);
    let mut answers = Answers::default();
    // The record dated from its admission: creation cannot set a status.
    let mut dated = remediation.clone();
    dated.status = Some(lifecycle::status::with_admission(
        status,
        remediation.creation_timestamp().map(|t| t.0),
    ));
    let limit = ASKS_PER_STEP + pods.as_ref().map_or(0, |plan| plan.leaving.len());
    let mut asks = 0;
    let mut rewritten = None;
    // Evictions asked and not yet answered; the step decides again at each answer and each change
    // of a budget, and settles only once all are answered.
    let mut flying = InFlight::new(ctx.settings.eviction_concurrency);
    let mut budget_changes = ctx.caches.budget_changes.clone();
    budget_changes.mark_unchanged();
    loop {
        answers.evictions_unanswered.clone_from(flying.unanswered());
        // Planned and reserved under one lock: two drains sharing a budget never spend the
        // same room (nothing awaits while it is held).
        let decision = {
            let mut flights = ctx
                .evictions_in_flight
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            // The watch's word on each eviction in flight, read before the budgets: a listing is
            // recorded once its version is in the store (`observe`), so the budgets read after it
            // count every eviction it says they count (read the other way round, a budget version
            // arriving in between made an eviction look counted by a status that did not hold it).
            let words: BTreeMap<(String, String), Timestamp> = flights
                .values()
                .flat_map(|flight| flight.budgets.iter().map(move |key| (key, &flight.pod)))
                .filter_map(|(key, pod)| {
                    let at = ctx.caches.disrupted.last_listed(key, pod)?;
                    Some(((key.clone(), pod.clone()), at))
                })
                .collect();
            let listed = |budget: &str, pod: &str| words.get(&(budget.to_owned(), pod.to_owned())).copied();
            let leaving = pods.iter().flat_map(|plan| plan.leaving.iter());
            let budgets = eviction_round::in_reach(&ctx.caches.budgets.state(), leaving, flights.values());
            flights.retain(|_, flight| !flight.counted(&budgets, &listed, now));
            let in_flight = eviction_round::in_flight(flights.values(), &budgets, &listed, now);
            let seen = Seen {
                node: node.as_deref().map(|n| n as &dyn NodeView),
                pods: pods.as_ref(),
                drain_scope: drain_scope.as_deref(),
                gangs: &gangs,
                budgets: &budgets,
                in_flight: &in_flight,
                asked_at: &asked_at,
                replacement: replacement.as_ref(),
                validation: validation.as_deref(),
                diagnostics: diagnostics.as_deref(),
                answers: &answers,
                pace: pace(ctx),
            };
            let decision = lifecycle::decide(&dated, rules, &seen, now);
            if let Decision::Ask(Ask::Evict { pods, .. }) = &decision {
                for pod in pods {
                    let flight = Flight::of(pod, &budgets, now);
                    if !flight.budgets.is_empty() {
                        flights.insert(pod.uid.clone(), flight);
                    }
                }
            }
            decision
        };
        match decision {
            // Decided while evictions are still in the server: their answers, or room shown by a
            // budget meanwhile, may change it. Wait for either, then decide again.
            Decision::Settle(_) if !flying.is_empty() => {
                let woken = async {
                    if budget_changes.changed().await.is_err() {
                        // The budget watch is gone: wait for the answers alone.
                        std::future::pending::<()>().await;
                    }
                };
                let answered = flying.next(woken).await;
                take(ctx, &mut flying, answered, &mut answers, now).await?;
            }
            Decision::Settle(mut settlement) => {
                // Measured once, at the first look at the node's pods (the cordon's step).
                if settlement.status.leaked_pods.is_none() {
                    settlement.status.leaked_pods = leaked;
                }
                return Ok(Stepped {
                    settlement,
                    rewritten,
                });
            }
            Decision::Ask(_) if asks == limit => {
                let answered = flying.all().await;
                take(ctx, &mut flying, answered, &mut answers, now).await?;
                return Err(AdvanceRemediationError::KeptAsking {
                    name: remediation.name_any(),
                    limit,
                });
            }
            Decision::Ask(Ask::Evict { pods, grace }) => {
                asks += 1;
                for pod in pods {
                    let uid = pod.uid.clone();
                    flying.ask(uid, evict_one(ctx, pod, grace, false));
                }
            }
            // Any other ask is decided from every eviction's answer.
            Decision::Ask(_) if !flying.is_empty() => {
                let answered = flying.all().await;
                take(ctx, &mut flying, answered, &mut answers, now).await?;
            }
            Decision::Ask(ask) => {
                asks += 1;
                let asked = rewritten.as_ref().unwrap_or(remediation);
                if let Some(written) = carry_out(ctx, asked, rules, ask, &mut answers).await? {
                    rewritten = Some(written);
                }
            }
        }
    }
}

/// Keeps one eviction's answer; the error if it could not be asked.
fn keep(
    ctx: &Context,
    answers: &mut Answers,
    pod: Leaving,
    answer: Result<EvictionAnswer, EvictPodError>,
    now: Timestamp,
) -> Option<EvictPodError> {
    ctx.record_eviction_attempt(&pod.uid, now);
    if !matches!(answer, Ok(EvictionAnswer::Accepted)) {
        // Not granted: it spends no budget.
        ctx.evictions_in_flight
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&pod.uid);
    }
    match answer {
        Ok(answer) => {
            answers.evictions.push((pod, answer));
            None
        }
        Err(error) => Some(error),
    }
}

/// Keeps the evictions' `answered`; the first that could not be asked (the fence) ends the step,
/// once every other eviction in flight is answered too.
async fn take(
    ctx: &Context,
    flying: &mut InFlight<'_, (Leaving, Result<EvictionAnswer, EvictPodError>)>,
    answered: Vec<(Leaving, Result<EvictionAnswer, EvictPodError>)>,
    answers: &mut Answers,
    now: Timestamp,
) -> Result<(), AdvanceRemediationError> {
    let mut failed = None;
    for (pod, answer) in answered {
        failed = failed.or(keep(ctx, answers, pod, answer, now));
    }
    if failed.is_some() {
        for (pod, answer) in flying.all().await {
            failed = failed.or(keep(ctx, answers, pod, answer, now));
        }
    }
    match failed {
        Some(error) => Err(error.into()),
        None => Ok(()),
    }
}

/// Whether this pass must list the node's pods: the phases that drain, and a dry run's record.
fn needs_pods(remediation: &GpuRemediation, status: &GpuRemediationStatus) -> bool {
    let deleting = remediation.metadata.deletion_timestamp.is_some();
    let drained = lifecycle::status::has_true(
        status,
        gpu_remediation_api::constants::remediation_conditions::DRAINED,
    );
    !deleting
        && match status.phase {
            Phase::Cordoned | Phase::Draining | Phase::Blocked => !drained,
            Phase::Pending => remediation.spec.mode == gpu_remediation_api::policy::Mode::DryRun,
            _ => false,
        }
}

fn pace(ctx: &Context) -> Pace {
    Pace {
        pod_poll: signed(ctx.settings.pod_poll),
        eviction_backoff: signed(ctx.settings.eviction_backoff),
        replacement_poll: signed(ctx.settings.replacement_poll),
    }
}

/// Looks at the replacement (or a ladder step's object) through `strategy`; a failure to look is
/// a refusal the lifecycle weighs.
/// The validation or diagnostics Job `record` names, as it is now. Boxed: held across the
/// pass's awaits (clippy's large-future bound).
async fn look_at_job<O>(
    ctx: &Context,
    remediation: &GpuRemediation,
    record: &gpu_remediation_api::node_job::JobRecord<O>,
) -> Box<Result<Observation, Words>> {
    let reference = lifecycle::node_job::reference(record);
    let strategy = gpu_remediation_api::policy::Strategy::Template;
    Box::new(look_at(ctx, remediation, strategy, &reference, record.start.0).await)
}

async fn look_at(
    ctx: &Context,
    remediation: &GpuRemediation,
    strategy: gpu_remediation_api::policy::Strategy,
    reference: &gpu_remediation_api::object_reference::ObjectReference,
    triggered_at: Timestamp,
) -> Result<Observation, Words> {
    let mut observation = crate::act::replace::Replacers::new(ctx.writer.clone())
        .for_strategy(strategy)
        .observe(remediation, reference, triggered_at)
        .await
        .map_err(|error| {
            Words::of(
                format!("looking at the replacement {} {}", reference.kind, reference.name),
                &error,
            )
        })?;
    if strategy == gpu_remediation_api::policy::Strategy::DeleteNode {
        // The replacement of a deleted Node is whatever joins that the policy selects: looked for
        // in the node cache (no policy in scope: none is recognised, so none is proven; nor while
        // the cache does not keep the labels its selector reads, see `observe::labels`).
        let policy = ctx
            .caches
            .policy(&remediation.spec.policy_name)
            .filter(|p| ctx.caches.node_labels.covers(&p.spec));
        let nodes = ctx.caches.all_nodes();
        observation.replacement = crate::replace::verify::replacement_seen(
            nodes.iter().map(AsRef::as_ref),
            |node| {
                policy
                    .as_ref()
                    .is_some_and(|p| p.spec.node_selector.matches(node.node_labels()))
            },
            remediation.spec.node_uid.as_deref(),
            triggered_at,
        );
    }
    Ok(observation)
}

/// The node's pods as a drain plan, how many of them the scheduler placed after `since` (the
/// fault's start; see `quarantine::leak`), and the pods as listed.
async fn list_plan(
    ctx: &Context,
    node: &str,
    since: Option<Timestamp>,
) -> Result<(Plan, Option<u32>, Vec<Pod>), AdvanceRemediationError> {
    let listed = ctx
        .reader
        .list::<Pod>(
            Scope::Cluster,
            &(),
            &ListParams::default().fields(&format!("spec.nodeName={node}")),
        )
        .await
        .map_err(|source| AdvanceRemediationError::ListPods {
            node: node.to_owned(),
            source,
        })?;
    let leaked = since.map(|since| crate::quarantine::leak::scheduled_after(&listed.items, since));
    Ok((drain::plan(&listed.items), leaked, listed.items))
}

/// Whether a remediation is still ours to advance (not finished, or finished but still holding
/// our finalizer).
#[must_use]
pub fn needs_attention(remediation: &GpuRemediation) -> bool {
    let phase = remediation.status.as_ref().map(|s| s.phase).unwrap_or_default();
    !phase.is_terminal()
        || remediation
            .finalizers()
            .iter()
            .any(|f| f == REMEDIATION_FINALIZER)
}
