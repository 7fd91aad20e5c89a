//! Gangs: the pods of one distributed job across nodes, and what a drain does with a gang's
//! members on other nodes ([`GangDrain`]). Pure.
//!
//! The acting layer (`act::remediation::gang_drain`) lists a touched gang's members by
//! [`selector`], records the gangs when the drain first acts ([`records`], the remediation's
//! `status.drain.gangs`), and under `Together` puts the recorded members on other nodes
//! ([`recorded_members`]) into the drain's plan: they are evicted like the node's own pods,
//! through the Eviction API under their budgets, and the drain ends when they are gone too.
//!
//! A pod belongs to a gang when it carries one of the well-known keys of a gang controller, or a
//! label key the policy adds (to be `spec.drain.gangLabels`); pods of one namespace with the same kind
//! and name are one gang. The keys are tried in this order, the first present wins (a `JobSet`'s
//! pods also carry their `Job`'s name, and that `Job` is only a slice of the gang):
//!
//! | kind | key |
//! |---|---|
//! | `JobSet` | label `jobset.sigs.k8s.io/jobset-name` |
//! | Kubeflow training job | label `training.kubeflow.org/job-name` |
//! | `LeaderWorkerSet` group | labels `leaderworkerset.sigs.k8s.io/name` and `.../group-index` (a group is the gang) |
//! | scheduler-plugins `PodGroup` | label `scheduling.x-k8s.io/pod-group` |
//! | Volcano `PodGroup` | annotation `scheduling.k8s.io/group-name` |
//! | Kueue pod group | label `kueue.x-k8s.io/pod-group-name` |
//! | a policy key | label `spec.drain.gangLabels[i]` |
//! | indexed `Job` | label `batch.kubernetes.io/job-name` with annotation `batch.kubernetes.io/job-completion-index` |
//!
//! Pods that stay on a drained node anyway (mirror, `DaemonSet`, finished: [`super::fate`]) are
//! never members. The values come from workloads: a value longer than a Kubernetes object name
//! (253 bytes) names no gang, so nothing unbounded is kept.
//!
//! [`plan`] says, for the pods a node's drain evicts, which gangs it touches, where their members
//! run, and, with `Together`, which members on other nodes are evicted with them. The plan is of
//! one moment: while the node's own member is still terminating, a job controller that already
//! restarted the gang has new members elsewhere, which a later plan would name too; the acting
//! layer records the members (by UID) when it first acts and evicts only those.

use std::collections::{BTreeMap, BTreeSet};

use gpu_remediation_api::gangs::{GANGS_MAX, GangMember, GangRecord, MEMBERS_MAX, NODES_MAX};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use super::{Fate, Leaving, fate};

/// The longest value that names a gang: a Kubernetes object name (a DNS subdomain).
pub const NAME_MAX: usize = 253;

/// `JobSet`'s label on every pod of a `JobSet`.
pub const JOBSET: &str = gpu_remediation_api::constants::gang_labels::JOBSET_NAME;
/// The Kubeflow training operator's label on every pod of a training job.
pub const TRAINING: &str = "training.kubeflow.org/job-name";
/// `LeaderWorkerSet`'s label naming the set.
pub const LWS_NAME: &str = "leaderworkerset.sigs.k8s.io/name";
/// `LeaderWorkerSet`'s label naming the group (leader and its workers) within the set.
pub const LWS_GROUP: &str = "leaderworkerset.sigs.k8s.io/group-index";
/// The scheduler-plugins coscheduling label naming a `PodGroup`.
pub const POD_GROUP: &str = "scheduling.x-k8s.io/pod-group";
/// Volcano's annotation naming a pod's `PodGroup`.
pub const VOLCANO_GROUP: &str = "scheduling.k8s.io/group-name";
/// Kueue's label naming a plain-pod group.
pub const KUEUE_GROUP: &str = "kueue.x-k8s.io/pod-group-name";
/// The `Job` controller's label on its pods.
pub const JOB_NAME: &str = gpu_remediation_api::constants::gang_labels::JOB_NAME;
/// The `Job` controller's annotation on the pods of an indexed `Job`.
pub const COMPLETION_INDEX: &str = gpu_remediation_api::constants::gang_labels::COMPLETION_INDEX;

pub use gpu_remediation_api::policy::GangDrain;

/// Which controller (or policy key) makes a gang.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// A `JobSet`.
    JobSet,
    /// A Kubeflow training-operator job (`PyTorchJob`, `MPIJob`, ...).
    TrainingJob,
    /// One group of a `LeaderWorkerSet`.
    LeaderWorkerSet,
    /// A scheduler-plugins `PodGroup`.
    PodGroup,
    /// A Volcano `PodGroup`.
    VolcanoPodGroup,
    /// A Kueue pod group.
    KueuePodGroup,
    /// The policy's label key.
    Label(String),
    /// An indexed `batch/v1` `Job`.
    IndexedJob,
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::JobSet => f.write_str("JobSet"),
            Self::TrainingJob => f.write_str("TrainingJob"),
            Self::LeaderWorkerSet => f.write_str("LeaderWorkerSet"),
            Self::PodGroup => f.write_str("PodGroup"),
            Self::VolcanoPodGroup => f.write_str("VolcanoPodGroup"),
            Self::KueuePodGroup => f.write_str("KueuePodGroup"),
            Self::Label(key) => write!(f, "label {key}"),
            Self::IndexedJob => f.write_str("IndexedJob"),
        }
    }
}

/// One gang: a namespace, a kind and a name (`LeaderWorkerSet` groups are `NAME/INDEX`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Gang {
    /// The members' namespace.
    pub namespace: String,
    /// What makes it a gang.
    pub kind: Kind,
    /// Its name under that kind.
    pub name: String,
}

impl std::fmt::Display for Gang {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
    }
}

/// A value under a gang key, when it can name one (non-empty, at most [`NAME_MAX`]).
fn named(value: Option<&String>) -> Option<String> {
    value.filter(|v| !v.is_empty() && v.len() <= NAME_MAX).cloned()
}

/// The gang `pod` belongs to, by the well-known keys and the policy's `extra` label keys (see the
/// module's table for the order). `None` for a pod of no gang and for a pod that stays on a
/// drained node anyway.
#[must_use]
pub fn gang_of(pod: &Pod, extra: &[String]) -> Option<Gang> {
    if fate(pod) != Fate::Evict {
        return None;
    }
    let labels = pod.labels();
    let annotations = pod.annotations();
    let lws = || {
        let name = named(labels.get(LWS_NAME))?;
        let group = named(labels.get(LWS_GROUP))?;
        named(Some(&format!("{name}/{group}")))
    };
    let indexed_job = || {
        annotations.get(COMPLETION_INDEX)?;
        named(labels.get(JOB_NAME))
    };
    let (kind, name) = named(labels.get(JOBSET))
        .map(|n| (Kind::JobSet, n))
        .or_else(|| named(labels.get(TRAINING)).map(|n| (Kind::TrainingJob, n)))
        .or_else(|| lws().map(|n| (Kind::LeaderWorkerSet, n)))
        .or_else(|| named(labels.get(POD_GROUP)).map(|n| (Kind::PodGroup, n)))
        .or_else(|| named(annotations.get(VOLCANO_GROUP)).map(|n| (Kind::VolcanoPodGroup, n)))
        .or_else(|| named(labels.get(KUEUE_GROUP)).map(|n| (Kind::KueuePodGroup, n)))
        .or_else(|| {
            extra
                .iter()
                .find_map(|key| named(labels.get(key)).map(|n| (Kind::Label(key.clone()), n)))
        })
        .or_else(|| indexed_job().map(|n| (Kind::IndexedJob, n)))?;
    Some(Gang {
        namespace: pod.namespace().unwrap_or_default(),
        kind,
        name,
    })
}

/// A gang's member: a pod that would leave, and the node it runs on (empty while unscheduled).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// The pod, as the drain evicts it.
    pub pod: Leaving,
    /// Its node.
    pub node: String,
}

/// A gang a drain touches: its members everywhere.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Touched {
    /// The gang.
    pub gang: Gang,
    /// Its members, in a stable order (node, namespace, name).
    pub members: Vec<Member>,
}

impl Touched {
    /// The nodes its members run on, sorted, each once.
    #[must_use]
    pub fn nodes(&self) -> BTreeSet<&str> {
        self.members.iter().map(|m| m.node.as_str()).collect()
    }
}

/// What a node's drain does about gangs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GangPlan {
    /// The gangs the drain touches (one of their members leaves the node), sorted.
    pub touched: Vec<Touched>,
    /// With `Together`: the members on other nodes (not unscheduled ones) that leave too, each with its gang (sorted by
    /// node, namespace, name). Empty with `Members`.
    pub elsewhere: Vec<(Member, Gang)>,
}

impl GangPlan {
    /// Members on other nodes still to be asked to leave (not yet terminating).
    pub fn to_evict(&self) -> impl Iterator<Item = &(Member, Gang)> {
        self.elsewhere.iter().filter(|(m, _)| !m.pod.terminating)
    }
}

/// The gang plan of a drain of `node` that evicts `evicted` (its plan's leaving pods, perhaps
/// scoped to a failed GPU's holders), given `pods`: every pod the gangs' members may be among
/// (the node's own and other nodes'). `extra` is `spec.drain.gangLabels`, `choice` is
/// `spec.drain.gangs`.
#[must_use]
pub fn plan(node: &str, evicted: &[Leaving], pods: &[Pod], extra: &[String], choice: GangDrain) -> GangPlan {
    let evicted: BTreeSet<&str> = evicted.iter().map(|p| p.uid.as_str()).collect();
    let mut gangs: BTreeMap<Gang, (bool, Vec<Member>)> = BTreeMap::new();
    for pod in pods {
        let Some(gang) = gang_of(pod, extra) else {
            continue;
        };
        let on = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        let member = Member {
            pod: Leaving::of(pod, true),
            node: on,
        };
        let entry = gangs.entry(gang).or_default();
        entry.0 |= member.node == node && evicted.contains(member.pod.uid.as_str());
        entry.1.push(member);
    }
    let mut out = GangPlan::default();
    for (gang, (touched, mut members)) in gangs {
        if !touched {
            continue;
        }
        members.sort_by(|a, b| {
            (&a.node, &a.pod.namespace, &a.pod.name).cmp(&(&b.node, &b.pod.namespace, &b.pod.name))
        });
        if choice == GangDrain::Together {
            out.elsewhere.extend(
                members
                    .iter()
                    .filter(|m| !m.node.is_empty() && m.node != node)
                    .map(|m| (m.clone(), gang.clone())),
            );
        }
        out.touched.push(Touched { gang, members });
    }
    out.elsewhere.sort_by(|(a, _), (b, _)| {
        (&a.node, &a.pod.namespace, &a.pod.name).cmp(&(&b.node, &b.pod.namespace, &b.pod.name))
    });
    out
}

/// The label selector that lists `gang`'s members in its namespace; `None` for a Volcano group
/// (named by an annotation: the namespace's pods are read and each one's gang looked at).
#[must_use]
pub fn selector(gang: &Gang) -> Option<String> {
    let name = &gang.name;
    match &gang.kind {
        Kind::JobSet => Some(format!("{JOBSET}={name}")),
        Kind::TrainingJob => Some(format!("{TRAINING}={name}")),
        Kind::LeaderWorkerSet => {
            let (set, group) = name.rsplit_once('/')?;
            Some(format!("{LWS_NAME}={set},{LWS_GROUP}={group}"))
        }
        Kind::PodGroup => Some(format!("{POD_GROUP}={name}")),
        Kind::VolcanoPodGroup => None,
        Kind::KueuePodGroup => Some(format!("{KUEUE_GROUP}={name}")),
        Kind::Label(key) => Some(format!("{key}={name}")),
        Kind::IndexedJob => Some(format!("{JOB_NAME}={name}")),
    }
}

/// What a drain records of `plan` (`status.drain.gangs`): the first [`GANGS_MAX`] gangs it
/// touches, each with its members' nodes and, under `Together`, its members on other nodes, at
/// most [`MEMBERS_MAX`] over all gangs (the others counted in `leftOut`, never evicted).
#[must_use]
pub fn records(plan: &GangPlan) -> Vec<GangRecord> {
    let mut room = MEMBERS_MAX;
    plan.touched
        .iter()
        .take(GANGS_MAX)
        .map(|touched| {
            let elsewhere: Vec<&Member> = plan
                .elsewhere
                .iter()
                .filter(|(_, gang)| *gang == touched.gang)
                .map(|(member, _)| member)
                .collect();
            let kept = elsewhere.len().min(room);
            room -= kept;
            GangRecord {
                gang: touched.gang.to_string(),
                namespace: touched.gang.namespace.clone(),
                selector: selector(&touched.gang),
                nodes: touched
                    .nodes()
                    .into_iter()
                    .filter(|n| !n.is_empty())
                    .take(NODES_MAX)
                    .map(str::to_owned)
                    .collect(),
                evicted: elsewhere
                    .iter()
                    .take(kept)
                    .map(|m| GangMember {
                        pod: m.pod.key(),
                        uid: m.pod.uid.clone(),
                        node: m.node.clone(),
                    })
                    .collect(),
                left_out: u32::try_from(elsewhere.len() - kept).unwrap_or(u32::MAX),
            }
        })
        .collect()
}

/// The pods among `pods` that `records` names as members to evict (by UID, whatever their name
/// now), as the drain evicts them.
#[must_use]
pub fn recorded_members(records: &[GangRecord], pods: &[Pod]) -> Vec<Leaving> {
    let uids: BTreeSet<&str> = records
        .iter()
        .flat_map(|r| &r.evicted)
        .map(|m| m.uid.as_str())
        .collect();
    let mut seen = BTreeSet::new();
    pods.iter()
        .filter(|pod| {
            let uid = pod.metadata.uid.as_deref().unwrap_or_default();
            uids.contains(uid) && seen.insert(uid.to_owned())
        })
        .map(|pod| Leaving::of(pod, true))
        .collect()
}

#[cfg(test)]
#[path = "gangs_tests.rs"]
mod tests;
