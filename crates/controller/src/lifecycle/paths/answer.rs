//! How the model's cluster answers each of the lifecycle's asks (a cordon, evictions, a notice,
//! deletions, a replacement's or a step's object, a Job), checking on the way the invariants an
//! ask itself can break (see the parent module's list: 3, 5, 7, 8, 12, 14).

#[allow(
    clippy::wildcard_imports,
    reason = "the model's parts, shared with its parent"
)]
use super::*;

/// 14: under `drain.notice`, a pod that wants the notice is evicted only after it was given it
/// (or the server refused it), and only once it checkpointed or the window ran out.
fn noticed_first(
    world: &World,
    rules: &PolicySnapshot,
    pod: &crate::drain::Leaving,
) -> Result<(), Violation> {
    let length = SignedDuration::try_from(rules.drain.notice.as_std()).expect("a duration");
    let Some(p) = world.pods.iter().find(|p| p.uid == pod.uid) else {
        return Ok(());
    };
    if length.is_zero() || !p.notice.wanted || world.notice_refused.contains(&p.uid) {
        return Ok(());
    }
    if !p.notice.given {
        return Err(format!("{} evicted without its checkpoint notice", p.uid));
    }
    let until = world.notice_since.map(|since| since + length);
    if !p.notice.acknowledged && until.is_some_and(|until| world.now < until) {
        return Err(format!(
            "{} evicted at {} before its notice ran out ({until:?}) or it checkpointed",
            p.uid, world.now
        ));
    }
    Ok(())
}

#[allow(
    clippy::too_many_lines,
    reason = "one arm per kind of ask, each answering as the cluster would"
)]
pub(super) fn answer(
    world: &mut World,
    record: &GpuRemediation,
    rules: Option<&PolicySnapshot>,
    before: &GpuRemediationStatus,
    ask: Ask,
    answers: &mut Answers,
    mood: Mood,
) -> Result<(), Violation> {
    let stubborn = mood == Mood::Stubborn;
    let calm = mood == Mood::Calm;
    let admitted = record.spec.node_uid.clone();
    match ask {
        Ask::Cordon(target) => {
            if target.uid != admitted {
                return Err(format!(
                    "a cordon targets {:?}, not the admitted {admitted:?}",
                    target.uid
                ));
            }
            answers.cordon = Some(if stubborn || (!calm && world.roll(10) == 0) {
                CordonAnswer::Refused(words("cordoning", refused_code(world)))
            } else {
                match world.node.as_mut() {
                    None => CordonAnswer::NodeGone,
                    Some(n) if n.metadata.uid != target.uid => CordonAnswer::NodeReplaced,
                    Some(n) => {
                        let theirs = cordon::is_unschedulable(n);
                        cordon::cordon(n, NAME);
                        if !theirs {
                            super::world::manages_cordon(
                                n,
                                gpu_remediation_api::constants::field_managers::CONTROLLER,
                            );
                        }
                        CordonAnswer::Cordoned { theirs }
                    }
                }
            });
        }
        Ask::Evict { pods, grace } => {
            let rules = rules.ok_or("an eviction without rules")?;
            if grace == Some(0) && !rules.drain.allow_zero_grace_period {
                return Err("an eviction with grace 0 the policy did not allow".into());
            }
            // 7: never more evictions at once than the budget has room for now.
            if let Some((allowed, _)) = world.budget
                && i64::try_from(pods.len()).unwrap_or(i64::MAX) > i64::from(allowed)
            {
                return Err(format!(
                    "{} evictions asked under a budget with room for {allowed}",
                    pods.len()
                ));
            }
            for pod in &pods {
                noticed_first(world, rules, pod)?;
            }
            for pod in pods {
                world.asked_at.insert(pod.uid.clone(), world.now);
                let answer = match if stubborn {
                    2 + world.roll(5)
                } else if calm {
                    0
                } else {
                    world.roll(7)
                } {
                    0 => {
                        world.spend_budget();
                        let gone_by = world.now + SignedDuration::from_secs(30);
                        if let Some(p) = world.pods.iter_mut().find(|p| p.uid == pod.uid) {
                            p.terminating = true;
                            p.gone_by = Some(gone_by);
                        }
                        EvictionAnswer::Accepted
                    }
                    1 => {
                        world.pods.retain(|p| p.uid != pod.uid);
                        EvictionAnswer::Gone
                    }
                    2 => refusal(429),
                    3 => refusal(500),
                    4 => refusal(403),
                    5 => refusal(422),
                    _ => EvictionAnswer::Unanswered("connection reset".into()),
                };
                answers.evictions.push((pod, answer));
            }
        }
        Ask::Notice { pods, evict_at } => {
            let rules = rules.ok_or("a notice without rules")?;
            let length = SignedDuration::try_from(rules.drain.notice.as_std()).expect("a duration");
            if length.is_zero() {
                return Err("a checkpoint notice under a policy without one".into());
            }
            // Each drain's window opens with its first notice given (a refused one opens none).
            let since = before
                .drain
                .as_ref()
                .and_then(|d| d.notice_since.as_ref())
                .map_or(world.now, |t| t.0);
            if evict_at != since + length {
                return Err(format!(
                    "a notice for {evict_at}, not the window's end {}",
                    since + length
                ));
            }
            for pod in pods {
                let refused = mood == Mood::Random && world.roll(6) == 0;
                let acknowledges = world.roll(2) == 0;
                let Some(p) = world.pods.iter_mut().find(|p| p.uid == pod.uid) else {
                    return Err(format!("a notice to {}, which is not on the node", pod.uid));
                };
                if !p.notice.wanted || p.notice.given {
                    return Err(format!(
                        "a notice to {} (wanted {}, given {})",
                        pod.uid, p.notice.wanted, p.notice.given
                    ));
                }
                if refused {
                    world.notice_refused.insert(pod.uid.clone());
                    answers.notice_refused.insert(pod.uid);
                } else {
                    // The workload checkpoints at once, or never.
                    p.notice.given = true;
                    p.notice.acknowledged = acknowledges;
                    world.notice_since = Some(since);
                    world.notice_refused.remove(&pod.uid);
                    answers.noticed.insert(pod.uid);
                }
            }
        }
        Ask::DryRunEvict(pods) => {
            let asked = pods.into_iter().map(|p| (p, refusal(429))).collect();
            answers.dry_run = Some(asked);
        }
        Ask::Delete { pods, grace } => {
            let rules = rules.ok_or("a deletion without rules")?;
            let started = status::deadline_base(before, Phase::Draining, world.now);
            let deadline =
                started + SignedDuration::try_from(rules.drain.timeout.as_std()).expect("a duration");
            if rules.drain.on_timeout != OnDrainTimeout::ForceDelete || world.now < deadline {
                return Err(format!(
                    "pods deleted under onTimeout {:?} at {} (drain deadline {deadline})",
                    rules.drain.on_timeout, world.now
                ));
            }
            if grace == Some(0) && !rules.drain.allow_zero_grace_period {
                return Err("a deletion with grace 0 the policy did not allow".into());
            }
            for pod in pods {
                let refused = stubborn || (!calm && world.roll(4) == 0);
                if !refused {
                    if grace == Some(0) {
                        world.pods.retain(|p| p.uid != pod.uid);
                    } else {
                        let gone_by = world.now + SignedDuration::from_secs(30);
                        if let Some(p) = world.pods.iter_mut().find(|p| p.uid == pod.uid) {
                            p.terminating = true;
                            p.gone_by = Some(gone_by);
                        }
                    }
                }
                let answer = if refused {
                    Err(words("deleting a pod", 403))
                } else {
                    Ok(())
                };
                answers.deletions.push((pod, answer));
            }
        }
        Ask::TriggerReplacement => {
            let rules = rules.ok_or("a trigger without rules")?;
            diagnosed_before_destruction(world, rules, before, "the replacement")?;
            let someone_else = world.node.as_ref().is_some_and(|n| n.metadata.uid != admitted);
            if someone_else && rules.replacement.strategy == Strategy::Template {
                return Err("a template triggered while another node holds the name".into());
            }
            answers.trigger = Some(if stubborn || (!calm && world.roll(5) == 0) {
                Err(words("triggering", refused_code(world)))
            } else {
                if rules.replacement.strategy == Strategy::DeleteNode && world.ours().is_some() {
                    world.node = None;
                    world.pods.clear();
                    world.person_holds = false;
                }
                world.replacement = Some((true, Reported::InProgress));
                Ok(ObjectReference {
                    api_version: "v1".into(),
                    kind: "Thing".into(),
                    name: NAME.into(),
                    namespace: None,
                    uid: Some("obj".into()),
                })
            });
        }
        Ask::TriggerStep(rung) => {
            if let Some(rules) = rules {
                diagnosed_before_destruction(world, rules, before, rung.as_str())?;
            }
            // 8 and 3: a step's object acts on the node by name.
            if world.node.as_ref().is_none_or(|n| n.metadata.uid != admitted) {
                return Err(format!(
                    "a {rung} object was created while the admitted node is not there"
                ));
            }
            answers.step = Some(if stubborn || (!calm && world.roll(5) == 0) {
                Err(words(
                    "creating the step's object",
                    if world.roll(2) == 0 { 403 } else { 503 },
                ))
            } else {
                world.replacement = Some((true, Reported::InProgress));
                Ok(ObjectReference {
                    api_version: "v1".into(),
                    kind: "Thing".into(),
                    name: format!("{NAME}-{rung}"),
                    namespace: None,
                    uid: Some(format!("obj-{rung}")),
                })
            });
        }
        Ask::Validate(rung) => {
            return Err(format!(
                "a {rung:?} validation was asked under rules without validation"
            ));
        }
        Ask::Diagnose => {
            if rules.is_none_or(|rules| rules.diagnostics.is_none()) {
                return Err("diagnostics were asked under rules without diagnostics".into());
            }
            // 3: the Job is pinned to the node by name.
            if world.node.as_ref().is_none_or(|n| n.metadata.uid != admitted) {
                return Err("a diagnostics Job was created while the admitted node is not there".into());
            }
            if before.diagnostics.is_some() {
                return Err("diagnostics were asked twice in one remediation".into());
            }
            answers.diagnostics = Some(Box::new(if stubborn || (!calm && world.roll(5) == 0) {
                Err(words("creating the diagnostics Job", refused_code(world)))
            } else {
                Ok(ObjectReference {
                    api_version: "batch/v1".into(),
                    kind: "Job".into(),
                    name: format!("{NAME}-diagnostics"),
                    namespace: Some("ops".into()),
                    uid: Some("job-diagnostics".into()),
                })
            }));
        }
        Ask::HandOff(target) => {
            if target.uid != admitted {
                return Err(format!("a hand-off targets {:?}, not {admitted:?}", target.uid));
            }
            answers.hand_off = Some(if stubborn || (!calm && world.roll(4) == 0) {
                Err(words("labelling the node", 503))
            } else {
                if let Some(n) = world.node.as_mut()
                    && n.metadata.uid == target.uid
                {
                    cordon::hand_off(n, NAME);
                }
                Ok(())
            });
        }
    }
    Ok(())
}
