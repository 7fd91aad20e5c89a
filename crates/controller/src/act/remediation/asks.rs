//! Puts one of the lifecycle's asks to the server through the writer (a cordon, evictions, a
//! dry run's, force deletes, the replacement's or a ladder step's trigger, the hand-off) and keeps
//! its answer for the next decision.

use futures::{StreamExt, stream};
use gpu_remediation_api::{GpuRemediation, remediation::PolicySnapshot};
use kube::ResourceExt;

use super::{AdvanceRemediationError, ladder};
use crate::{
    context::Context,
    drain::Leaving,
    lifecycle::{self, Answers, Ask, CordonAnswer, EvictionAnswer, Words},
    replace,
    telemetry::EvictionResult,
    write::{EditNodeError, EvictPodError, NodeEdit},
};

/// Puts one ask to the server and keeps its answer; with the record as the ask wrote it, if it
/// wrote to it.
pub(super) async fn carry_out(
    ctx: &Context,
    remediation: &GpuRemediation,
    rules: Option<&PolicySnapshot>,
    ask: Ask,
    answers: &mut Answers,
) -> Result<Option<GpuRemediation>, AdvanceRemediationError> {
    let name = remediation.name_any();
    match ask {
        Ask::Cordon(node) => {
            let seen = ctx.caches.node(&node.name);
            let answer = match ctx.writer.cordon_node(&node, seen.as_deref(), &name).await {
                Ok(NodeEdit::Written(written)) => {
                    let theirs = crate::cordon::cordon_of(&written, &name) == lifecycle::Cordon::Theirs;
                    CordonAnswer::Cordoned { theirs }
                }
                Ok(NodeEdit::Gone) => CordonAnswer::NodeGone,
                Ok(NodeEdit::Replaced) => CordonAnswer::NodeReplaced,
                Err(EditNodeError::Write { node: n, source }) if source.is_refusal() => {
                    CordonAnswer::Refused(Words::of(format!("cordoning node {n}"), &source))
                }
                Err(error) => return Err(error.into()),
            };
            tracing::info!(node = %node.name, answer = ?answer, "cordon");
            answers.cordon = Some(answer);
        }
        Ask::Evict { .. } => unreachable!("the step keeps evictions in flight itself"),
        Ask::DryRunEvict(pods) => {
            let mut asked = Vec::new();
            for (pod, answer) in evict_all(ctx, pods, None, true).await {
                asked.push((pod, answer?));
            }
            answers.dry_run = Some(asked);
        }
        Ask::Delete { pods, grace } => {
            for pod in pods {
                tracing::warn!(pod = %pod.key(), ?grace, "drain timed out: deleting the pod (onTimeout: ForceDelete)");
                let answer = ctx.writer.force_delete(&pod, grace).await?;
                if answer.is_ok() {
                    ctx.metrics.eviction(EvictionResult::ForceDeleted);
                }
                answers.deletions.push((pod, answer));
            }
        }
        Ask::Notice { pods, evict_at } => notice(ctx, remediation, pods, evict_at, answers).await?,
        Ask::TriggerReplacement => {
            let Some(rules) = rules else {
                unreachable!("the lifecycle triggers a replacement only under rules")
            };
            let strategy = rules.replacement.strategy;
            let (answer, rewritten) = match crate::act::replace::Replacers::new(ctx.writer.clone())
                .for_strategy(strategy)
                .trigger(remediation, &rules.replacement)
                .await
            {
                Ok(replace::Triggered { reference, rewritten }) => (Ok(reference), rewritten),
                Err(replace::TriggerReplacementError::Fenced(fenced)) => return Err(fenced.into()),
                Err(error) => {
                    let words = Words::of(format!("triggering the replacement ({strategy:?})"), &error);
                    (Err(words), None)
                }
            };
            answers.trigger = Some(answer);
            if let Some(written) = rewritten {
                return Ok(Some(written));
            }
        }
        Ask::TriggerStep(rung) => {
            let Some(rules) = rules else {
                unreachable!("the lifecycle climbs the ladder only under rules")
            };
            answers.step = Some(ladder::trigger_step(ctx, remediation, rules, rung).await?);
        }
        Ask::Validate(rung) => {
            let Some(rules) = rules else {
                unreachable!("the lifecycle validates only under rules")
            };
            answers.validation = Some(Box::new(ladder::validate(ctx, remediation, rules, rung).await?));
        }
        Ask::Diagnose => {
            let Some(rules) = rules else {
                unreachable!("the lifecycle runs diagnostics only under rules")
            };
            answers.diagnostics = Some(Box::new(ladder::diagnose(ctx, remediation, rules).await?));
        }
        Ask::HandOff(node) => {
            answers.hand_off = Some(ladder::hand_off(ctx, &node, &name).await?);
        }
    }
    Ok(None)
}

/// Asks for every eviction in `pods`, at most `eviction_concurrency` at once.
async fn evict_all(
    ctx: &Context,
    pods: Vec<Leaving>,
    grace: Option<i64>,
    dry_run: bool,
) -> Vec<(Leaving, Result<EvictionAnswer, EvictPodError>)> {
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

pub(super) async fn evict_one(
    ctx: &Context,
    pod: Leaving,
    grace: Option<i64>,
    dry_run: bool,
) -> (Leaving, Result<EvictionAnswer, EvictPodError>) {
    let answer = ctx.writer.evict(&pod, grace, dry_run).await;
    match &answer {
        Ok(answer) => tracing::info!(pod = %pod.key(), dry_run, ?answer, "eviction"),
        Err(error) => tracing::warn!(pod = %pod.key(), dry_run, %error, "eviction not asked"),
    }
    ctx.metrics.eviction(match &answer {
        Ok(_) if dry_run => EvictionResult::DryRun,
        Ok(EvictionAnswer::Accepted) => EvictionResult::Evicted,
        Ok(EvictionAnswer::Gone) => EvictionResult::Gone,
        Ok(EvictionAnswer::Refused(answer)) if answer.code == 429 => EvictionResult::Blocked,
        Ok(EvictionAnswer::Refused(_) | EvictionAnswer::Unanswered(_)) | Err(_) => EvictionResult::Failed,
    });
    (pod, answer)
}

/// Gives each of `pods` the checkpoint notice (the annotation, then an Event on the pod); a pod
/// gone counts as noticed (nothing to wait for); one the server refuses is evicted without it.
async fn notice(
    ctx: &Context,
    remediation: &GpuRemediation,
    pods: Vec<crate::drain::Leaving>,
    evict_at: jiff::Timestamp,
    answers: &mut Answers,
) -> Result<(), AdvanceRemediationError> {
    for pod in pods {
        match ctx.writer.notice(&pod, evict_at).await {
            Ok(true) => {
                let message = format!(
                    "evicted at {evict_at} to repair node {} (drain.notice); checkpoint, then annotate the pod {} to go sooner",
                    remediation.spec.node_name,
                    gpu_remediation_api::constants::CHECKPOINTED_ANNOTATION
                );
                let reference = k8s_openapi::api::core::v1::ObjectReference {
                    api_version: Some("v1".to_owned()),
                    kind: Some("Pod".to_owned()),
                    namespace: Some(pod.namespace.clone()),
                    name: Some(pod.name.clone()),
                    uid: Some(pod.uid.clone()),
                    ..Default::default()
                };
                let event = lifecycle::Note::new(
                    gpu_remediation_api::constants::reasons::CHECKPOINT_NOTICE,
                    kube::runtime::events::EventType::Normal,
                    &message,
                )
                .event("Notice");
                ctx.writer.publish_to(&reference, event).await;
                answers.noticed.insert(pod.uid);
            }
            Ok(false) => {
                answers.noticed.insert(pod.uid);
            }
            Err(crate::write::WriteError::Fenced(fenced)) => return Err(fenced.into()),
            Err(error) => {
                tracing::info!(pod = %pod.key(), %error, "giving a pod the checkpoint notice failed: it is evicted without one");
                answers.notice_refused.insert(pod.uid);
            }
        }
    }
    Ok(())
}
