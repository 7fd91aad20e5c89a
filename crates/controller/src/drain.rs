//! Drain decisions: which pods leave a node and which stay, who refuses an eviction, and when a
//! refused eviction is worth asking again. Pure.
//!
//! A pod stays when it is a mirror pod (the kubelet owns it; the API cannot remove it), is owned
//! by a `DaemonSet` (its controller would put it straight back, and it tolerates our taint anyway),
//! or has finished (phase `Succeeded` or `Failed`: it holds nothing). Every other pod leaves
//! through the Eviction API, so its disruption budgets are honoured.

pub mod cost;
pub mod gangs;

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::{core::v1::Pod, policy::v1::PodDisruptionBudget};
use kube::{
    ResourceExt,
    core::{Selector, SelectorExt, Status},
};

/// Annotation the kubelet puts on mirror pods of static pods.
const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Why a pod stays on the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum KeepReason {
    /// A mirror pod of a static pod.
    Mirror,
    /// Owned by a `DaemonSet`.
    DaemonSet,
    /// Already `Succeeded` or `Failed`.
    Terminal,
    /// Holds none of the failed GPUs: a reset's drain is scoped to the pods holding them.
    OtherGpus,
}

/// What happens to one pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// It must leave through an eviction.
    Evict,
    /// It stays, for this reason.
    Keep(KeepReason),
}

/// A pod that must leave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leaving {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its UID, so an eviction never hits a new pod that took the name.
    pub uid: String,
    /// Whether it is already terminating (its eviction or deletion was accepted).
    pub terminating: bool,
    /// When a terminating pod is due to be gone (its `deletionTimestamp`: the deletion time plus
    /// its grace period); a pod still there after it is stuck.
    pub gone_by: Option<Timestamp>,
    /// Its labels, to find the budgets covering it.
    pub labels: BTreeMap<String, String>,
    /// Whether it runs and is ready, as a disruption budget counts it.
    pub readiness: Readiness,
    /// Where it stands with the checkpoint notice (`drain.notice`).
    pub notice: Notice,
    /// The GPUs it asks for ([`cost::gpus_requested`]), for the GPU-seconds its drain costs.
    pub gpus: u32,
}

/// Where a leaving pod stands with the checkpoint notice (`drain.notice`), from its annotations.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Notice {
    /// It wants one: a gang's member, or annotated `gpuremediation.dev/checkpoint-notice: "true"`.
    pub wanted: bool,
    /// It was given one (`gpuremediation.dev/evict-at` is on it).
    pub given: bool,
    /// It answered: it checkpointed (`gpuremediation.dev/checkpointed` is on it).
    pub acknowledged: bool,
}

impl Notice {
    /// What `pod`'s annotations say; `member` whether it belongs to a gang.
    #[must_use]
    pub fn of(pod: &Pod, member: bool) -> Self {
        use gpu_remediation_api::constants::{
            CHECKPOINT_NOTICE_ANNOTATION, CHECKPOINTED_ANNOTATION, EVICT_AT_ANNOTATION,
        };
        let annotations = pod.annotations();
        Self {
            wanted: member
                || annotations
                    .get(CHECKPOINT_NOTICE_ANNOTATION)
                    .is_some_and(|v| v == "true"),
            given: annotations.contains_key(EVICT_AT_ANNOTATION),
            acknowledged: annotations.contains_key(CHECKPOINTED_ANNOTATION),
        }
    }
}

/// How a disruption budget counts a pod leaving (the Eviction API's own rules).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Readiness {
    /// Running and `Ready`: its eviction spends one of the budget's `disruptionsAllowed`.
    #[default]
    Ready,
    /// Running but not `Ready`: the server evicts it without spending the budget when the budget
    /// says so (`unhealthyPodEvictionPolicy: AlwaysAllow`, or the default `IfHealthyBudget` while
    /// the budget has its healthy pods).
    Unready,
    /// Phase `Pending`: the server evicts it without looking at any budget.
    Pending,
}

/// How a budget counts `pod`: its phase, and its `Ready` condition.
#[must_use]
pub fn readiness(pod: &Pod) -> Readiness {
    let status = pod.status.as_ref();
    if status.and_then(|s| s.phase.as_deref()) == Some("Pending") {
        return Readiness::Pending;
    }
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    if ready {
        Readiness::Ready
    } else {
        Readiness::Unready
    }
}

impl Leaving {
    /// `pod` as a drain takes it; `gang_member` says whether it belongs to a gang (which wants
    /// the checkpoint notice).
    #[must_use]
    pub fn of(pod: &Pod, gang_member: bool) -> Self {
        Self {
            namespace: pod.namespace().unwrap_or_default(),
            name: pod.name_any(),
            uid: pod.uid().unwrap_or_default(),
            terminating: pod.metadata.deletion_timestamp.is_some(),
            gone_by: pod.metadata.deletion_timestamp.as_ref().map(|t| t.0),
            labels: pod.labels().clone(),
            readiness: readiness(pod),
            notice: Notice::of(pod, gang_member),
            gpus: cost::gpus_requested(pod),
        }
    }

    /// `namespace/name`, as status and Events name pods.
    #[must_use]
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// The drain plan for the pods now on a node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Pods that must leave, in a stable order (namespace, name).
    pub leaving: Vec<Leaving>,
    /// Pods that stay, as `namespace/name` with why.
    pub staying: Vec<(String, KeepReason)>,
}

impl Plan {
    /// Pods still to be asked to leave (not yet terminating).
    pub fn to_evict(&self) -> impl Iterator<Item = &Leaving> {
        self.leaving.iter().filter(|p| !p.terminating)
    }
}

/// The fate of one pod.
#[must_use]
pub fn fate(pod: &Pod) -> Fate {
    if pod.annotations().contains_key(MIRROR_ANNOTATION) {
        return Fate::Keep(KeepReason::Mirror);
    }
    if pod
        .owner_references()
        .iter()
        .any(|o| o.controller == Some(true) && o.kind == "DaemonSet")
    {
        return Fate::Keep(KeepReason::DaemonSet);
    }
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded" | "Failed")) {
        return Fate::Keep(KeepReason::Terminal);
    }
    Fate::Evict
}

/// The plan for `pods` (those listed on the node).
#[must_use]
pub fn plan(pods: &[Pod]) -> Plan {
    let mut plan = Plan::default();
    for pod in pods {
        match fate(pod) {
            Fate::Evict => plan
                .leaving
                .push(Leaving::of(pod, gangs::gang_of(pod, &[]).is_some())),
            Fate::Keep(reason) => plan.staying.push((
                format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any()),
                reason,
            )),
        }
    }
    plan.leaving
        .sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    plan.staying.sort();
    plan
}

/// Narrows `plan` to the pods in `holders` (`namespace/name`): the others stay
/// ([`KeepReason::OtherGpus`]), for a drain scoped to the pods holding a failed GPU.
#[must_use]
pub fn scoped_to(plan: Plan, holders: &std::collections::BTreeSet<String>) -> Plan {
    let (leaving, others): (Vec<Leaving>, Vec<Leaving>) = plan
        .leaving
        .into_iter()
        .partition(|pod| holders.contains(&pod.key()));
    let mut staying = plan.staying;
    staying.extend(others.into_iter().map(|pod| (pod.key(), KeepReason::OtherGpus)));
    staying.sort();
    Plan { leaving, staying }
}

/// The disruption budgets (as `namespace/name`) that cover a pod: same namespace, selector
/// matches its labels. A budget without a selector covers nothing; an empty one covers every pod
/// of its namespace, as in `policy/v1`.
#[must_use]
pub fn covering_budgets(pod: &Leaving, budgets: &[PodDisruptionBudget]) -> Vec<String> {
    let mut names: Vec<String> = budgets
        .iter()
        .filter(|pdb| pdb.namespace().as_deref() == Some(pod.namespace.as_str()))
        .filter(|pdb| {
            pdb.spec
                .as_ref()
                .and_then(|spec| spec.selector.clone())
                .and_then(|selector| Selector::try_from(selector).ok())
                .is_some_and(|selector| selector.matches(&pod.labels))
        })
        .map(|pdb| format!("{}/{}", pod.namespace, pdb.name_any()))
        .collect();
    names.sort();
    names
}

/// The budget an eviction refusal names, from the server's causes ("The disruption budget NAME
/// needs 2 healthy pods ...", "... is still being processed ...").
#[must_use]
pub fn budget_named_in(refusal: &Status) -> Option<String> {
    const PREFIX: &str = "The disruption budget ";
    refusal.details.as_ref()?.causes.iter().find_map(|cause| {
        let rest = cause.message.strip_prefix(PREFIX)?;
        let name = rest.split_whitespace().next()?;
        Some(name.to_owned())
    })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::{
            core::v1::PodStatus,
            policy::v1::{PodDisruptionBudgetSpec, PodDisruptionBudgetStatus},
        },
        apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference, Time},
    };
    use kube::{
        api::ObjectMeta,
        core::response::{StatusCause, StatusDetails},
    };

    use super::*;
    use crate::test_fixtures::at;

    fn pod(name: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("work".into()),
                uid: Some(format!("uid-{name}")),
                labels: Some([("app".to_owned(), "train".to_owned())].into()),
                ..ObjectMeta::default()
            },
            status: Some(PodStatus {
                phase: Some("Running".into()),
                ..PodStatus::default()
            }),
            ..Pod::default()
        }
    }

    #[test]
    fn a_gpu_scoped_plan_evicts_only_the_holders_and_keeps_the_others_for_holding_other_gpus() {
        let pods: Vec<Pod> = (0..8).map(|i| pod(&format!("train-{i}"))).collect();
        let holders = ["work/train-3".to_owned()].into();
        let scoped = scoped_to(plan(&pods), &holders);
        assert_eq!(
            scoped.leaving.iter().map(Leaving::key).collect::<Vec<_>>(),
            ["work/train-3"]
        );
        assert_eq!(scoped.staying.len(), 7);
        assert!(
            scoped
                .staying
                .iter()
                .all(|(_, why)| *why == KeepReason::OtherGpus)
        );
    }

    fn owned_by(mut pod: Pod, kind: &str) -> Pod {
        pod.metadata.owner_references = Some(vec![OwnerReference {
            kind: kind.into(),
            name: "owner".into(),
            controller: Some(true),
            ..OwnerReference::default()
        }]);
        pod
    }

    fn pdb(name: &str, selector: Option<LabelSelector>) -> PodDisruptionBudget {
        PodDisruptionBudget {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("work".into()),
                ..ObjectMeta::default()
            },
            spec: Some(PodDisruptionBudgetSpec {
                selector,
                ..PodDisruptionBudgetSpec::default()
            }),
            status: Some(PodDisruptionBudgetStatus::default()),
        }
    }

    #[test]
    fn a_plain_pod_and_a_replica_set_pod_must_leave() {
        assert_eq!(fate(&pod("bare")), Fate::Evict);
        assert_eq!(fate(&owned_by(pod("web"), "ReplicaSet")), Fate::Evict);
    }

    #[test]
    fn a_daemon_set_pod_stays() {
        assert_eq!(
            fate(&owned_by(pod("agent"), "DaemonSet")),
            Fate::Keep(KeepReason::DaemonSet)
        );
    }

    #[test]
    fn a_mirror_pod_stays() {
        let mut p = pod("static");
        p.metadata.annotations = Some([(MIRROR_ANNOTATION.to_owned(), "abc".to_owned())].into());
        assert_eq!(fate(&p), Fate::Keep(KeepReason::Mirror));
    }

    #[test]
    fn finished_pods_stay() {
        for phase in ["Succeeded", "Failed"] {
            let mut p = pod("job");
            p.status = Some(PodStatus {
                phase: Some(phase.into()),
                ..PodStatus::default()
            });
            assert_eq!(fate(&p), Fate::Keep(KeepReason::Terminal), "{phase}");
        }
    }

    #[test]
    fn a_terminating_pod_is_still_leaving_but_not_evicted_again() {
        let mut going = pod("going");
        going.metadata.deletion_timestamp = Some(Time(at(0)));
        let plan = plan(&[pod("staying-put"), going, owned_by(pod("ds"), "DaemonSet")]);
        assert_eq!(plan.leaving.len(), 2);
        assert_eq!(
            plan.to_evict().map(Leaving::key).collect::<Vec<_>>(),
            vec!["work/staying-put"]
        );
        assert_eq!(plan.staying, vec![("work/ds".to_owned(), KeepReason::DaemonSet)]);
    }

    #[test]
    fn budgets_cover_pods_their_selector_matches_in_their_namespace() {
        let plan = plan(&[pod("p")]);
        let leaving = &plan.leaving[0];
        let by_app = LabelSelector {
            match_labels: Some([("app".to_owned(), "train".to_owned())].into()),
            ..LabelSelector::default()
        };
        let other = LabelSelector {
            match_labels: Some([("app".to_owned(), "serve".to_owned())].into()),
            ..LabelSelector::default()
        };
        let mut elsewhere = pdb("elsewhere", Some(by_app.clone()));
        elsewhere.metadata.namespace = Some("other".into());
        let budgets = [
            pdb("by-app", Some(by_app)),
            pdb("other-app", Some(other)),
            pdb("no-selector", None),
            pdb("everything", Some(LabelSelector::default())),
            elsewhere,
        ];
        assert_eq!(
            covering_budgets(leaving, &budgets),
            vec!["work/by-app", "work/everything"]
        );
    }

    #[test]
    fn the_refusing_budget_is_read_from_the_server_cause() {
        let refusal = Status {
            code: 429,
            message: "Cannot evict pod as it would violate the pod's disruption budget.".into(),
            details: Some(StatusDetails {
                causes: vec![StatusCause {
                    reason: "DisruptionBudget".into(),
                    message: "The disruption budget train-pdb needs 3 healthy pods and has 3 currently"
                        .into(),
                    field: String::new(),
                }],
                name: "train-0".into(),
                group: String::new(),
                kind: "pods".into(),
                uid: String::new(),
                retry_after_seconds: 0,
            }),
            ..Status::default()
        };
        assert_eq!(budget_named_in(&refusal).as_deref(), Some("train-pdb"));
        assert_eq!(budget_named_in(&Status::default()), None);
    }
}
