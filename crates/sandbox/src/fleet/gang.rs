//! The simulated kubelet's training gangs: what a distributed job's workers do when one of them
//! dies, and how a worker answers the controller's checkpoint notice. Opt-in, by pod annotation:
//!
//! - [`COLLECTIVE_TIMEOUT_ANNOTATION`] (a duration, e.g. `60s`): the pod is a gang member. Members
//!   that start running together form a collective. When one dies (deleted, evicted or failed),
//!   the others of its collective keep running without progress, as workers blocked in an NCCL
//!   all-reduce do, until that death plus the timeout; then each fails (phase `Failed`, reason
//!   [`COLLECTIVE_TIMEOUT_REASON`]). A member that is gone before then is simply gone. A member
//!   that starts after the death (a replacement, or a restarted job) joins a new collective, which
//!   that death and its aftermath do not touch.
//! - [`CHECKPOINT_ANNOTATION`] (a duration, e.g. `12s`): once the controller's
//!   `gpuremediation.dev/evict-at` notice is on the pod, the worker checkpoints for that long and
//!   then writes `gpuremediation.dev/checkpointed`, as a training loop following
//!   `docs/checkpoint-notice.md` does.
//!
//! A gang is the pods of one namespace sharing the value of the first of [`GANG_LABELS`] present
//! (the keys the controller recognises for `JobSet`s and `Job`s). [`GangBook`] is pure: the kubelet
//! tells it what it saw and carries out the [`GangAction`]s it returns.

use std::collections::{BTreeMap, BTreeSet};
use std::str::FromStr;
use std::time::Duration;

use gpu_remediation_api::constants::gang_labels;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

/// Pod annotation: the pod is a gang member with this collective timeout.
pub const COLLECTIVE_TIMEOUT_ANNOTATION: &str = "gpuremediation.dev/sim-collective-timeout";
/// Pod annotation: the worker checkpoints for this long after the notice, then acknowledges.
pub const CHECKPOINT_ANNOTATION: &str = "gpuremediation.dev/sim-checkpoint";
/// The reason a member that timed out in its collective fails with.
pub const COLLECTIVE_TIMEOUT_REASON: &str = "CollectiveTimeout";
/// The labels naming a pod's gang, the first present wins: a `JobSet`'s, then a `Job`'s.
pub const GANG_LABELS: [&str; 2] = [gang_labels::JOBSET_NAME, gang_labels::JOB_NAME];

/// A pod the book tracks.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PodId {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its UID.
    pub uid: String,
}

impl PodId {
    fn of(pod: &Pod) -> Option<Self> {
        Some(Self {
            namespace: pod.namespace()?,
            name: pod.name_any(),
            uid: pod.uid()?,
        })
    }
}

/// What the kubelet is to do for a gang.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GangAction {
    /// Fail this member at this time (if it is still there and not leaving).
    FailAt(PodId, Timestamp),
    /// Write the checkpoint acknowledgement on this member after this long.
    Acknowledge(PodId, Duration),
}

#[derive(Clone, Debug)]
struct Member {
    id: PodId,
    /// The collective it joined: members that started together, before any of them died.
    generation: u64,
    timeout: Duration,
    failure_scheduled: bool,
}

/// One gang: its running members, and its newest collective and whether a death broke it.
#[derive(Debug, Default)]
struct Gang {
    members: BTreeMap<String, Member>,
    generation: u64,
    broken: bool,
}

/// Every gang's running members and the deaths among them; the checkpoints under way.
#[derive(Debug, Default)]
pub struct GangBook {
    /// By (namespace, gang).
    gangs: BTreeMap<(String, String), Gang>,
    acknowledging: BTreeSet<String>,
}

impl GangBook {
    /// What `pod`, as the kubelet sees it now, means for its gang. A running member joins the
    /// gang's newest collective, or a new one where a death broke that (a replacement cannot join
    /// a communicator that hangs); a member leaving (terminating, or finished) dies: each other
    /// member of its collective fails at `now` plus its timeout. A noticed member with a checkpoint
    /// time acknowledges after it, once.
    pub fn observe(&mut self, pod: &Pod, now: Timestamp) -> Vec<GangAction> {
        let mut actions = Vec::new();
        let Some(id) = PodId::of(pod) else { return actions };
        let annotations = pod.annotations();
        if let Some(checkpoint) = annotations.get(CHECKPOINT_ANNOTATION).and_then(|d| duration(d))
            && annotations.contains_key(gpu_remediation_api::constants::EVICT_AT_ANNOTATION)
            && !annotations.contains_key(gpu_remediation_api::constants::CHECKPOINTED_ANNOTATION)
            && pod.metadata.deletion_timestamp.is_none()
            && self.acknowledging.insert(id.uid.clone())
        {
            actions.push(GangAction::Acknowledge(id.clone(), checkpoint));
        }
        let (Some(timeout), Some(gang)) = (
            annotations
                .get(COLLECTIVE_TIMEOUT_ANNOTATION)
                .and_then(|d| duration(d)),
            gang_of(pod),
        ) else {
            return actions;
        };
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        let leaving =
            pod.metadata.deletion_timestamp.is_some() || matches!(phase, Some("Failed" | "Succeeded"));
        let gang = self.gangs.entry((id.namespace.clone(), gang)).or_default();
        if leaving {
            actions.extend(died(gang, &id.uid, now));
        } else if phase == Some("Running") && !gang.members.contains_key(&id.uid) {
            if gang.broken {
                gang.generation += 1;
                gang.broken = false;
            }
            let generation = gang.generation;
            gang.members.insert(
                id.uid.clone(),
                Member {
                    id,
                    generation,
                    timeout,
                    failure_scheduled: false,
                },
            );
        }
        actions
    }

    /// `pod` is gone from the server: a death, if it was a running member.
    pub fn gone(&mut self, pod: &Pod, now: Timestamp) -> Vec<GangAction> {
        let Some(id) = PodId::of(pod) else {
            return Vec::new();
        };
        self.acknowledging.remove(&id.uid);
        let Some(gang) = gang_of(pod) else {
            return Vec::new();
        };
        let key = (id.namespace, gang);
        let Some(gang) = self.gangs.get_mut(&key) else {
            return Vec::new();
        };
        let actions = died(gang, &id.uid, now);
        if gang.members.is_empty() {
            self.gangs.remove(&key);
        }
        actions
    }
}

/// Member `uid` of `gang` died at `now`: it leaves, its collective is broken, and each other member
/// of that collective fails at `now` plus its timeout, once.
fn died(gang: &mut Gang, uid: &str, now: Timestamp) -> Vec<GangAction> {
    let Some(dead) = gang.members.remove(uid) else {
        return Vec::new();
    };
    if dead.generation == gang.generation {
        gang.broken = true;
    }
    gang.members
        .values_mut()
        .filter(|m| m.generation == dead.generation && !m.failure_scheduled)
        .map(|m| {
            m.failure_scheduled = true;
            let at = now
                .checked_add(jiff::SignedDuration::try_from(m.timeout).unwrap_or(jiff::SignedDuration::MAX))
                .unwrap_or(Timestamp::MAX);
            GangAction::FailAt(m.id.clone(), at)
        })
        .collect()
}

/// The status patch of a member whose collective timed out: `Failed`, not ready.
#[must_use]
pub fn timed_out_patch(now: Timestamp) -> serde_json::Value {
    serde_json::json!({"status": {
        "phase": "Failed",
        "reason": COLLECTIVE_TIMEOUT_REASON,
        "message": "a gang member died; the collective timed out waiting for it",
        "conditions": [{"type": "Ready", "status": "False", "reason": "PodFailed", "lastTransitionTime": now.to_string()}],
    }})
}

/// The patch of a worker acknowledging the notice: `gpuremediation.dev/checkpointed`, naming
/// the checkpoint by its time.
#[must_use]
pub fn acknowledged_patch(now: Timestamp) -> serde_json::Value {
    serde_json::json!({"metadata": {"annotations": {
        gpu_remediation_api::constants::CHECKPOINTED_ANNOTATION: format!("sim-checkpoint-{}", now.as_second()),
    }}})
}

/// A training job as an indexed `Job` named `name` in `namespace`: `workers` pods at once, never
/// ending, one per node of fleet `fleet` (required anti-affinity), each asking for `gpus`
/// `nvidia.com/gpu` (none where 0), labelled `app=<name>`, annotated with `annotations` (this
/// module's, to make them gang members), retried up to `backoff_limit` times.
#[must_use]
pub fn indexed_job(
    namespace: &str,
    name: &str,
    (workers, gpus): (u32, u32),
    fleet: &str,
    backoff_limit: u32,
    annotations: &serde_json::Value,
) -> serde_json::Value {
    let mut worker = serde_json::json!({"name": "worker", "image": crate::workload::IMAGE});
    if gpus > 0 {
        worker["resources"] =
            serde_json::json!({"limits": {gpu_remediation_api::constants::GPU_RESOURCE: gpus.to_string()}});
    }
    serde_json::json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "completions": workers, "parallelism": workers, "completionMode": "Indexed",
            "backoffLimit": backoff_limit,
            "template": {
                "metadata": {"labels": {"app": name}, "annotations": annotations},
                "spec": {
                    "restartPolicy": "Never",
                    "nodeSelector": {crate::fleet::FLEET_LABEL: fleet},
                    "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
                        "labelSelector": {"matchLabels": {"app": name}},
                        "topologyKey": "kubernetes.io/hostname",
                    }]}},
                    "containers": [worker],
                },
            },
        },
    })
}

/// The pod's gang: the value of the first of [`GANG_LABELS`] it carries.
fn gang_of(pod: &Pod) -> Option<String> {
    let labels = pod.labels();
    GANG_LABELS
        .iter()
        .find_map(|key| labels.get(*key).map(|v| format!("{key}={v}")))
}

fn duration(text: &str) -> Option<Duration> {
    gpu_remediation_api::Duration::from_str(text)
        .ok()
        .map(gpu_remediation_api::Duration::as_std)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + seconds).unwrap()
    }

    fn member(name: &str, phase: &str, annotations: &serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}"),
                         "labels": {"jobset.sigs.k8s.io/jobset-name": "llm", "batch.kubernetes.io/job-name": "llm-w-0"},
                         "annotations": annotations},
            "status": {"phase": phase},
        }))
        .unwrap()
    }

    fn timed(name: &str, phase: &str) -> Pod {
        member(name, phase, &json!({COLLECTIVE_TIMEOUT_ANNOTATION: "60s"}))
    }

    fn leaving(mut pod: Pod) -> Pod {
        pod.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at(0)));
        pod
    }

    fn fails(actions: &[GangAction]) -> Vec<(String, Timestamp)> {
        actions
            .iter()
            .filter_map(|a| match a {
                GangAction::FailAt(id, at) => Some((id.name.clone(), *at)),
                GangAction::Acknowledge(..) => None,
            })
            .collect()
    }

    #[test]
    fn a_member_leaving_fails_the_others_that_ran_beside_it_at_its_death_plus_their_timeout_once() {
        let mut book = GangBook::default();
        for name in ["w0", "w1", "w2"] {
            assert!(book.observe(&timed(name, "Running"), at(0)).is_empty());
        }
        let actions = book.observe(&leaving(timed("w0", "Running")), at(10));
        assert_eq!(
            fails(&actions),
            [("w1".to_owned(), at(70)), ("w2".to_owned(), at(70))]
        );
        // Its deletion and another's later death schedule nothing more for them.
        assert!(book.gone(&timed("w0", "Running"), at(11)).is_empty());
        assert!(fails(&book.observe(&timed("w1", "Failed"), at(70))).is_empty());
    }

    #[test]
    fn a_member_started_after_a_death_joins_a_new_collective_the_old_deaths_never_touch() {
        let mut book = GangBook::default();
        book.observe(&timed("w0", "Running"), at(0));
        book.observe(&timed("w1", "Running"), at(0));
        let first = book.gone(&timed("w0", "Running"), at(10));
        assert_eq!(fails(&first), [("w1".to_owned(), at(70))]);
        // w0's replacement starts at 20, while w1 still hangs: a new collective. w1's own failure
        // at 70 does not touch it; a death in the new collective fails only its members.
        book.observe(&timed("w2", "Running"), at(20));
        assert!(fails(&book.observe(&timed("w1", "Failed"), at(70))).is_empty());
        book.observe(&timed("w3", "Running"), at(75));
        let second = book.observe(&timed("w3", "Failed"), at(80));
        assert_eq!(fails(&second), [("w2".to_owned(), at(140))]);
    }

    #[test]
    fn an_indexed_job_spreads_its_workers_one_per_node_of_the_fleet() {
        let job = indexed_job(
            "ml",
            "train",
            (4, 8),
            "f",
            100,
            &json!({COLLECTIVE_TIMEOUT_ANNOTATION: "60s"}),
        );
        let spec = &job["spec"];
        assert_eq!(
            (spec["completions"].clone(), spec["parallelism"].clone()),
            (json!(4), json!(4))
        );
        assert_eq!(spec["completionMode"], "Indexed");
        assert_eq!(spec["backoffLimit"], 100);
        let pod = &spec["template"];
        assert_eq!(pod["metadata"]["labels"]["app"], "train");
        assert_eq!(
            pod["metadata"]["annotations"][COLLECTIVE_TIMEOUT_ANNOTATION],
            "60s"
        );
        assert_eq!(pod["spec"]["nodeSelector"][crate::fleet::FLEET_LABEL], "f");
        let anti =
            &pod["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0];
        assert_eq!(anti["labelSelector"]["matchLabels"]["app"], "train");
        assert_eq!(
            pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"],
            "8"
        );
        let no_gpus = indexed_job("ml", "train", (3, 0), "f", 10, &json!({}));
        assert!(
            no_gpus["spec"]["template"]["spec"]["containers"][0]
                .get("resources")
                .is_none()
        );
    }

    #[test]
    fn pods_without_the_timeout_or_a_gang_label_are_not_members() {
        let mut book = GangBook::default();
        let plain = member("p", "Running", &json!({}));
        book.observe(&plain, at(0));
        book.observe(&timed("w1", "Running"), at(0));
        assert!(book.gone(&plain, at(5)).is_empty());
        let mut unlabelled = timed("u", "Running");
        unlabelled.metadata.labels = None;
        book.observe(&unlabelled, at(0));
        assert!(book.gone(&unlabelled, at(5)).is_empty());
    }

    #[test]
    fn a_noticed_worker_with_a_checkpoint_time_acknowledges_once_and_not_after_it_did() {
        use gpu_remediation_api::constants::{CHECKPOINTED_ANNOTATION, EVICT_AT_ANNOTATION};
        let mut book = GangBook::default();
        let waiting = member("w", "Running", &json!({CHECKPOINT_ANNOTATION: "5s"}));
        assert!(book.observe(&waiting, at(0)).is_empty(), "no notice yet");
        let noticed = member(
            "w",
            "Running",
            &json!({CHECKPOINT_ANNOTATION: "5s", EVICT_AT_ANNOTATION: "2026-12-05T12:00:00Z"}),
        );
        let actions = book.observe(&noticed, at(1));
        assert!(
            matches!(&actions[..], [GangAction::Acknowledge(id, d)] if id.name == "w" && *d == Duration::from_secs(5))
        );
        assert!(book.observe(&noticed, at(2)).is_empty(), "once");
        let mut done = GangBook::default();
        let acknowledged = member(
            "w",
            "Running",
            &json!({CHECKPOINT_ANNOTATION: "5s", EVICT_AT_ANNOTATION: "x", CHECKPOINTED_ANNOTATION: "step-1"}),
        );
        assert!(
            done.observe(&acknowledged, at(3)).is_empty(),
            "already acknowledged"
        );
    }
}
