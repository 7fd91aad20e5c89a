//! New nodes validated before they take work (issue 40), pure: a node that registers with the
//! [`UNVALIDATED_TAINT_KEY`] taint (kubelet `--register-with-taints`, Karpenter `startupTaints`, a
//! Cluster API node template) takes no pod until that taint is gone, so a controller that has not
//! seen it yet cannot race a workload onto it. The policy that governs the node
//! (`spec.validation.newNodes`) runs its validation Job there, and this module decides each next
//! step: start the Job (bounded: at most `newNodes.max` at once per policy, oldest node first),
//! wait for it (until its deadline), lift the taint when it passed, or hold the node (taint kept,
//! reason said) when it failed, was lost or timed out. The node's `GpuValidated` condition, written
//! by the controller, is what a person reads and what the next pass remembers ([`recorded`]).
//!
//! ```text
//! tainted ─► no Job ─► room? ─► Start ─► Running ─► Complete ─────────────► Lift (taint removed)
//!                   └► full ─► Queued (said)     └► Failed / deleted ─────► Hold (taint kept, said)
//!                                                └► past the timeout ─────► Hold (TimedOut)
//! ```
//!
//! Nothing here lets a node's word release it: only the Job named after the node's UID
//! ([`job_name`]), created by the controller and owned by the policy, can say `Complete`. A node
//! that forges or removes its condition can only have itself validated again, or held. The writes
//! are `act::join_validation`'s.

use std::sync::Arc;

use gpu_remediation_api::{
    GpuRemediationPolicy,
    constants::{UNVALIDATED_TAINT_KEY, node_conditions::GPU_VALIDATED, validated_reasons},
    hardware::fnv1a,
    policy::Mode,
    validation::{POD_LABEL, Validation, ValidationOutcome},
};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Node;
use kube::{Resource as _, ResourceExt as _};
use serde_json::{Value, json};

use crate::{
    governance,
    lifecycle::node_job,
    observe::NodeView,
    replace::{Reported, template::report, template::substitute},
};

/// A node's validation Job as last read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobSeen {
    /// No Job for the node yet.
    None,
    /// The Job runs; it was created at this time.
    Running {
        /// The Job's creation time (the server's).
        since: Timestamp,
    },
    /// The Job reported `Complete`.
    Complete,
    /// The Job reported `Failed`.
    Failed,
    /// A Job was started for the node (recorded) but is gone before it reported.
    Lost,
    /// An earlier pass held the node (its condition says so): nothing more to do or read.
    Held,
}

/// What a node's validation Job says: `status` is the Job's status as read (`None` when no Job
/// was found), `created` its creation time, `started` whether a start was recorded for the node
/// (a Job recorded but gone before it reported is lost, never started twice).
#[must_use]
pub fn seen(found: Option<(Option<&Value>, Timestamp)>, started: bool) -> JobSeen {
    match found {
        None if started => JobSeen::Lost,
        None => JobSeen::None,
        Some((status, created)) => match report(status) {
            Reported::Done(_) => JobSeen::Complete,
            Reported::Failed(_) => JobSeen::Failed,
            Reported::Nothing | Reported::InProgress => JobSeen::Running { since: created },
        },
    }
}

/// One node carrying the startup taint, as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// The node.
    pub node: String,
    /// When the node registered (its creation time): the order nodes are validated in.
    pub joined: Timestamp,
    /// Its validation Job.
    pub job: JobSeen,
}

/// What to do about one candidate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Create the validation Job.
    Start {
        /// The node.
        node: String,
    },
    /// The Job runs: look again at the latest at `deadline`.
    Wait {
        /// The node.
        node: String,
        /// When the Job's time is up.
        deadline: Timestamp,
    },
    /// The Job passed: lift the startup taint.
    Lift {
        /// The node.
        node: String,
    },
    /// The Job failed, was lost or timed out: the taint stays; the policy's trigger and
    /// remediation take over from here.
    Hold {
        /// The node.
        node: String,
        /// How the validation ended.
        outcome: ValidationOutcome,
        /// Why, for a person (Event and status).
        message: String,
    },
    /// No room: `limit` validations already run. Said in status, never silently waiting.
    Queued {
        /// The node.
        node: String,
        /// Why, for a person.
        message: String,
    },
}

/// The steps for the candidates now: `limit` validations may run at once, each for `timeout`.
/// Oldest nodes first, so that a stream of new nodes cannot starve an early one.
#[must_use]
pub fn steps(
    candidates: &[Candidate],
    limit: u32,
    timeout: std::time::Duration,
    now: Timestamp,
) -> Vec<Step> {
    let timeout = SignedDuration::try_from(timeout).unwrap_or(SignedDuration::MAX);
    let mut ordered: Vec<&Candidate> = candidates.iter().collect();
    ordered.sort_by(|a, b| a.joined.cmp(&b.joined).then_with(|| a.node.cmp(&b.node)));
    // Running Jobs hold room before any new one is started.
    let mut running = u32::try_from(
        ordered
            .iter()
            .filter(|c| matches!(c.job, JobSeen::Running { .. }))
            .count(),
    )
    .unwrap_or(u32::MAX);
    let mut out = Vec::with_capacity(ordered.len());
    for candidate in ordered {
        let node = candidate.node.clone();
        out.push(match candidate.job {
            JobSeen::Running { since } => {
                let deadline = since.checked_add(timeout).unwrap_or(Timestamp::MAX);
                if now >= deadline {
                    Step::Hold {
                        node,
                        outcome: ValidationOutcome::TimedOut,
                        message: format!(
                            "validation of the new node did not finish within {}s: the startup taint stays",
                            timeout.as_secs()
                        ),
                    }
                } else {
                    Step::Wait { node, deadline }
                }
            }
            JobSeen::Complete => Step::Lift { node },
            JobSeen::Failed => Step::Hold {
                node,
                outcome: ValidationOutcome::Failed,
                message: "validation of the new node failed: the startup taint stays".to_owned(),
            },
            JobSeen::Lost => Step::Hold {
                node,
                outcome: ValidationOutcome::Failed,
                message:
                    "the new node's validation Job was deleted before it reported: the startup taint stays"
                        .to_owned(),
            },
            JobSeen::Held => continue,
            JobSeen::None if running < limit => {
                running += 1;
                Step::Start { node }
            }
            JobSeen::None => Step::Queued {
                node,
                message: format!("waiting: {running} validation(s) of new nodes already run (limit {limit})"),
            },
        });
    }
    out
}

/// What the node's `GpuValidated` condition (the controller's) says earlier passes did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recorded {
    /// No Job started (or the memory is gone: creating the Job again finds it).
    Nothing,
    /// A Job was started: read it.
    Started,
    /// The node was held: its validation failed, was lost or timed out.
    Held,
}

/// What `node`'s `GpuValidated` condition records.
#[must_use]
pub fn recorded(node: &(impl NodeView + ?Sized)) -> Recorded {
    let reason = node.condition(GPU_VALIDATED).and_then(|c| c.reason);
    match reason {
        Some(validated_reasons::RUNNING) => Recorded::Started,
        Some(validated_reasons::FAILED | validated_reasons::TIMED_OUT) => Recorded::Held,
        _ => Recorded::Nothing,
    }
}

/// One policy's new nodes: those carrying [`UNVALIDATED_TAINT_KEY`] that it governs.
#[derive(Debug)]
pub struct Governed<'a, N> {
    /// The policy.
    pub policy: &'a Arc<GpuRemediationPolicy>,
    /// Its validation, with `newNodes`.
    pub validation: &'a Validation,
    /// `newNodes.max`.
    pub max: u32,
    /// Its new nodes, not being deleted.
    pub nodes: Vec<&'a Arc<N>>,
}

/// Whether any policy validates new nodes (else no node need be looked at).
#[must_use]
pub fn any_policy(policies: &[Arc<GpuRemediationPolicy>]) -> bool {
    policies.iter().any(|p| validating(p).is_some())
}

/// The policy's validation, when it validates new nodes: live, not `DryRun` (which changes no
/// node), with `validation.newNodes`.
fn validating(policy: &GpuRemediationPolicy) -> Option<(&Validation, u32)> {
    if policy.metadata.deletion_timestamp.is_some() || policy.spec.mode == Mode::DryRun {
        return None;
    }
    let validation = policy.spec.validation.as_ref()?;
    Some((validation, validation.new_nodes.as_ref()?.max))
}

/// The new nodes of each policy that validates them. A node another policy governs (by priority,
/// see `governance`) is that policy's, or nobody's when that one does not validate new nodes.
#[must_use]
pub fn governed<'a, N: NodeView>(
    policies: &'a [Arc<GpuRemediationPolicy>],
    nodes: &'a [Arc<N>],
) -> Vec<Governed<'a, N>> {
    let mut out: Vec<Governed<'a, N>> = policies
        .iter()
        .filter_map(|policy| {
            validating(policy).map(|(validation, max)| Governed {
                policy,
                validation,
                max,
                nodes: Vec::new(),
            })
        })
        .collect();
    if out.is_empty() {
        return out;
    }
    let claimants = governance::claimants(policies.iter());
    for node in nodes {
        if node.deleting().is_some() || !has_taint(node, UNVALIDATED_TAINT_KEY) {
            continue;
        }
        let Some(name) = governance::governing(node.node_labels(), &claimants) else {
            continue;
        };
        if let Some(entry) = out
            .iter_mut()
            .find(|g| g.policy.metadata.name.as_deref() == Some(name))
        {
            entry.nodes.push(node);
        }
    }
    out.retain(|g| !g.nodes.is_empty());
    out
}

/// The suffix of a new node's validation Job name: one per node UID, so a node registered again
/// under its name is validated again.
const JOB_SUFFIX: &str = "-validate-new-";

/// The name of the validation Job of the node `node` with UID `uid`: `<node>-validate-new-<hash>`,
/// the node's name cut so the whole fits a Job name (63 characters).
#[must_use]
pub fn job_name(node: &str, uid: &str) -> String {
    let hash = format!("{:08x}", fnv1a(uid) & 0xffff_ffff);
    let room = node_job::JOB_NAME_MAX - JOB_SUFFIX.len() - hash.len();
    let stem: String = node.chars().take(room).collect();
    format!("{}{JOB_SUFFIX}{hash}", stem.trim_end_matches(['-', '.']))
}

/// The validation Job for the new node `node` (with UID `uid`) under `policy`: the policy's Job as
/// a repaired node gets it (pinned, tolerating every taint, bounded, labelled for the sandbox),
/// named [`job_name`] whatever the template says (a fixed name would serve one node only),
/// `{{nodeName}}` rendered and `{{remediationName}}` the Job's own name (no remediation exists),
/// and owned by the policy (removed with it). `None` for a policy whose identity is unknown.
#[must_use]
pub fn job_object(
    validation: &Validation,
    policy: &GpuRemediationPolicy,
    node: &str,
    uid: &str,
) -> Option<Value> {
    let policy_uid = policy.metadata.uid.as_deref()?;
    let name = job_name(node, uid);
    let mut template = validation.job.clone();
    if let Some(metadata) = template.get_mut("metadata").and_then(Value::as_object_mut) {
        metadata.remove("name");
        metadata.remove("generateName");
    }
    let job = node_job::job_object(&template, validation.timeout.as_std(), &name, "", POD_LABEL);
    let mut job = substitute(&job, node, &name);
    job["metadata"]["ownerReferences"] = json!([{
        "apiVersion": GpuRemediationPolicy::api_version(&()),
        "kind": GpuRemediationPolicy::kind(&()),
        "name": policy.name_any(),
        "uid": policy_uid,
        "controller": true,
    }]);
    Some(job)
}

/// Whether the node carries the startup taint `key`.
#[must_use]
pub fn has_taint(node: &(impl NodeView + ?Sized), key: &str) -> bool {
    node.taints().iter().any(|t| t.key == key)
}

/// Lifts the startup taint `key`, keeping every other taint; whether anything changed. The
/// writer applies it as a read-modify-replace of the node (its `resourceVersion`).
pub fn lift(node: &mut Node, key: &str) -> bool {
    let Some(taints) = node.spec.as_mut().and_then(|s| s.taints.as_mut()) else {
        return false;
    };
    let before = taints.len();
    taints.retain(|t| t.key != key);
    taints.len() != before
}

#[cfg(test)]
#[path = "join_validation_tests.rs"]
mod tests;
