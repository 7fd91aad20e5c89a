//! The simulated kubelet of every node in a fleet: one watch over all bound pods (not a watch or a
//! poll per node, so 20,000 pods on 1,000 nodes cost one stream), filtered to the fleet's nodes.
//! A pod that arrives is made Running and Ready (Pending pods bypass PDBs, so this matters); a
//! terminating pod is finalised with a grace-0 delete preconditioned on its UID, after the delay
//! named by its `gpuremediation.dev/sim-termination` annotation, or never if that says `stall`.
//! Pods asking for `nvidia.com/gpu` are handed GPUs by the simulated device plugin
//! ([`super::device_plugin`]) before they run (failed with `UnexpectedAdmissionError`, as the real
//! kubelet does, when their node has too few free), and give them back once finished or gone.
//! Pods annotated as training-gang members time out in their collective when another member dies,
//! and answer the checkpoint notice ([`super::gang`]).

use std::collections::HashSet;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use gpu_remediation_api::constants::SIM_TERMINATION_ANNOTATION;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use super::gang::{GangAction, GangBook};
use super::{device_plugin::DevicePlugin, registry::NodeRegistry};

/// The annotation value that makes a terminating pod never finish.
pub const STALL: &str = "stall";

/// What the kubelet does next with a pod bound to one of its nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubeletStep {
    /// Nothing: the pod is Running and Ready, or has finished.
    Nothing,
    /// Report it Running with every container ready.
    MakeRunning,
    /// Delete it with grace 0 (UID precondition) after this long.
    Finalise {
        /// The simulated termination time.
        after: Duration,
    },
    /// It is terminating and its annotation says `stall`: leave it terminating forever.
    Stall,
}

/// Decides the next step for `pod`. An unreadable termination annotation finalises at once, and the
/// second value says what was wrong with it, so the caller can log it.
#[must_use]
pub fn next_step(pod: &Pod) -> (KubeletStep, Option<String>) {
    if pod.metadata.deletion_timestamp.is_some() {
        let annotation = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(SIM_TERMINATION_ANNOTATION));
        return match annotation.map(String::as_str) {
            None => (
                KubeletStep::Finalise {
                    after: Duration::ZERO,
                },
                None,
            ),
            Some(STALL) => (KubeletStep::Stall, None),
            Some(text) => match gpu_remediation_api::Duration::from_str(text) {
                Ok(after) => (
                    KubeletStep::Finalise {
                        after: after.as_std(),
                    },
                    None,
                ),
                Err(e) => (
                    KubeletStep::Finalise {
                        after: Duration::ZERO,
                    },
                    Some(format!("{SIM_TERMINATION_ANNOTATION}: {e}")),
                ),
            },
        };
    }
    let status = pod.status.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded" | "Failed")) {
        return (KubeletStep::Nothing, None);
    }
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        });
    if phase == Some("Running") && ready {
        (KubeletStep::Nothing, None)
    } else {
        (KubeletStep::MakeRunning, None)
    }
}

/// Whether a pod the kubelet kills is first reported `Failed`: one that still runs and carries
/// finalizers. Its delete only marks it, and its owner waits for a terminal phase (a `Job`'s
/// tracking finalizer: with a `podFailurePolicy` the `Job` replaces a pod only once it is
/// terminal), as the real kubelet reports it. Others go at once, as before.
#[must_use]
pub fn reported_terminal_first(pod: &Pod) -> bool {
    let finished = matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    );
    !finished && pod.metadata.finalizers.as_ref().is_some_and(|f| !f.is_empty())
}

/// A merge patch for the pod's status: Running, every condition true, every container running and
/// ready (init containers completed).
#[must_use]
pub fn running_status_patch(pod: &Pod, pod_ip: &str, host_ip: &str, now: Timestamp) -> Value {
    let now = now.to_string();
    let spec = pod.spec.as_ref();
    let container = |c: &k8s_openapi::api::core::v1::Container, running: bool| {
        let state = if running {
            json!({ "running": { "startedAt": now } })
        } else {
            json!({ "terminated": { "exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now } })
        };
        super::pod_status::container_status(c, running, &state)
    };
    let containers: Vec<Value> = spec
        .map(|s| s.containers.iter().map(|c| container(c, true)).collect())
        .unwrap_or_default();
    let init_containers: Vec<Value> = spec
        .and_then(|s| s.init_containers.as_ref())
        .map(|cs| cs.iter().map(|c| container(c, false)).collect())
        .unwrap_or_default();
    let condition = |kind: &str| json!({ "type": kind, "status": "True", "lastProbeTime": null, "lastTransitionTime": now });
    json!({
        "status": {
            "phase": "Running",
            "hostIP": host_ip,
            "hostIPs": [{ "ip": host_ip }],
            "podIP": pod_ip,
            "podIPs": [{ "ip": pod_ip }],
            "startTime": now,
            "conditions": [
                condition("PodReadyToStartContainers"),
                condition("Initialized"),
                condition("Ready"),
                condition("ContainersReady"),
                condition("PodScheduled"),
            ],
            "containerStatuses": containers,
            "initContainerStatuses": init_containers,
        }
    })
}

/// Which kind of work is in flight for a pod, so a burst of events for one pod does one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Work {
    Run,
    Validate,
    Reject,
    Finalise,
}

/// The simulated kubelet of every node in a fleet.
pub struct Kubelet {
    client: Client,
    nodes: Arc<NodeRegistry>,
    in_flight: Mutex<HashSet<(String, Work)>>,
    permits: Semaphore,
    pod_ips: AtomicU64,
    devices: Arc<Mutex<DevicePlugin>>,
    gangs: Mutex<GangBook>,
}

impl Kubelet {
    /// A kubelet for the nodes in `nodes` of `gpus_per_node` GPUs each, making at most
    /// `concurrency` API requests at once.
    pub fn new(client: Client, nodes: Arc<NodeRegistry>, concurrency: usize, gpus_per_node: u32) -> Self {
        Self {
            client,
            nodes,
            in_flight: Mutex::new(HashSet::new()),
            permits: Semaphore::new(concurrency.max(1)),
            pod_ips: AtomicU64::new(0),
            devices: Arc::new(Mutex::new(DevicePlugin::new(gpus_per_node))),
            gangs: Mutex::new(GangBook::default()),
        }
    }

    /// The device plugin's state (which pod holds which GPU).
    pub fn devices(&self) -> Arc<Mutex<DevicePlugin>> {
        Arc::clone(&self.devices)
    }

    fn release_devices(&self, uid: &str) {
        self.devices
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .release(uid);
    }

    /// Watches every bound pod and acts on those of the fleet's nodes, until the task is aborted.
    pub async fn run(self: Arc<Self>) {
        let config = watcher::Config::default().fields("spec.nodeName!=");
        let mut events = watcher(Api::<Pod>::all(self.client.clone()), config)
            .default_backoff()
            .boxed();
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => {
                    Arc::clone(&self).observe(pod);
                }
                Ok(watcher::Event::Delete(pod)) => {
                    if let Some(uid) = pod.metadata.uid.as_deref() {
                        self.release_devices(uid);
                    }
                    // A gang member on one of our nodes (the book knows no other) died.
                    let actions = self.gang_book().gone(&pod, Timestamp::now());
                    Arc::clone(&self).carry_out(actions);
                }
                Ok(watcher::Event::Init | watcher::Event::InitDone) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "simulated kubelet: pod watch failed; retrying");
                }
            }
        }
    }

    /// Looks again at every pod of `node`, as a restarted kubelet does: pods that changed while
    /// it was down produced no new events.
    pub async fn resync_node(self: &Arc<Self>, node: &str) -> Result<(), kube::Error> {
        let pods: Api<Pod> = Api::all(self.client.clone());
        let list = pods
            .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
            .await?;
        for pod in list.items {
            Arc::clone(self).observe(pod);
        }
        Ok(())
    }

    fn observe(self: Arc<Self>, pod: Pod) {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
            return;
        };
        let Some(host_ip) = self.nodes.kubelet_ip(&node) else {
            return;
        };
        let actions = self.gang_book().observe(&pod, Timestamp::now());
        Arc::clone(&self).carry_out(actions);
        let (step, problem) = next_step(&pod);
        if let Some(problem) = problem {
            tracing::warn!(pod = %pod.name_any(), %problem, "simulated kubelet: finalising at once");
        }
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        let finished = matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        );
        let admitted = if finished {
            self.release_devices(&uid);
            Ok(Vec::new())
        } else if matches!(step, KubeletStep::Finalise { .. } | KubeletStep::Stall) {
            Ok(Vec::new())
        } else {
            self.devices
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .allocate(&node, &pod)
        };
        let work = match (&step, &admitted) {
            (KubeletStep::MakeRunning, Err(_)) => Work::Reject,
            (KubeletStep::Nothing | KubeletStep::Stall, _) => return,
            (KubeletStep::MakeRunning, Ok(_)) if super::validation_pod::finishes(&pod) => Work::Validate,
            (KubeletStep::MakeRunning, Ok(_)) => Work::Run,
            (KubeletStep::Finalise { .. }, _) => Work::Finalise,
        };
        if !self
            .in_flight
            .lock()
            .expect("in-flight set lock")
            .insert((uid.clone(), work))
        {
            return;
        }
        tokio::spawn(async move {
            match (step, admitted) {
                (KubeletStep::MakeRunning, Err(refused)) => self.reject(&pod, &refused.to_string()).await,
                (KubeletStep::MakeRunning, Ok(_)) if work == Work::Validate => {
                    self.validate(&pod, &node).await;
                }
                (KubeletStep::MakeRunning, Ok(_)) => self.make_running(&pod, &host_ip).await,
                (KubeletStep::Finalise { after }, _) => {
                    self.finalise(&pod, &uid, after).await;
                    self.release_devices(&uid);
                }
                (KubeletStep::Nothing | KubeletStep::Stall, _) => {}
            }
            self.in_flight
                .lock()
                .expect("in-flight set lock")
                .remove(&(uid, work));
        });
    }

    fn gang_book(&self) -> std::sync::MutexGuard<'_, GangBook> {
        self.gangs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Carries out the gangs' actions, each in a task of its own.
    fn carry_out(self: Arc<Self>, actions: Vec<GangAction>) {
        for action in actions {
            let kubelet = Arc::clone(&self);
            tokio::spawn(async move {
                match action {
                    GangAction::FailAt(pod, at) => {
                        let wait = at.duration_since(Timestamp::now());
                        tokio::time::sleep(Duration::try_from(wait).unwrap_or(Duration::ZERO)).await;
                        kubelet
                            .gang_patch(&pod, &super::gang::timed_out_patch(Timestamp::now()), true)
                            .await;
                    }
                    GangAction::Acknowledge(pod, after) => {
                        tokio::time::sleep(after).await;
                        kubelet
                            .gang_patch(&pod, &super::gang::acknowledged_patch(Timestamp::now()), false)
                            .await;
                    }
                }
            });
        }
    }

    /// Applies a gang action's merge patch to `pod` (its status where `status`), if the pod is
    /// still the same one and not leaving.
    async fn gang_patch(&self, pod: &super::gang::PodId, patch: &Value, status: bool) {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
        let _permit = self.permits.acquire().await.expect("semaphore open");
        let current = match pods.get_opt(&pod.name).await {
            Ok(Some(current)) => current,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(pod = %pod.name, error = %e, "simulated kubelet: reading a gang member failed");
                return;
            }
        };
        if current.uid().as_deref() != Some(pod.uid.as_str()) || current.metadata.deletion_timestamp.is_some()
        {
            return;
        }
        let params = PatchParams::default();
        let result = if status {
            pods.patch_status(&pod.name, &params, &Patch::Merge(patch)).await
        } else {
            pods.patch(&pod.name, &params, &Patch::Merge(patch)).await
        };
        if let Err(e) = result {
            tracing::warn!(pod = %pod.name, error = %e, "simulated kubelet: a gang member's update failed");
        }
    }

    async fn make_running(&self, pod: &Pod, host_ip: &str) {
        let n = self.pod_ips.fetch_add(1, Ordering::Relaxed);
        let pod_ip = format!("10.{}.{}.{}", 128 + (n >> 16) % 64, (n >> 8) % 256, n % 256);
        let patch = running_status_patch(pod, &pod_ip, host_ip, Timestamp::now());
        let namespace = pod.namespace().unwrap_or_default();
        let name = pod.name_any();
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &namespace);
        for attempt in 1..=5 {
            let result = {
                let _permit = self.permits.acquire().await.expect("semaphore open");
                pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
            };
            match result {
                Ok(_) => return,
                Err(kube::Error::Api(status)) if status.code == 404 => return,
                Err(e) => {
                    tracing::warn!(%namespace, pod = %name, attempt, error = %e, "simulated kubelet: reporting Running failed");
                    tokio::time::sleep(Duration::from_millis(200 * attempt)).await;
                }
            }
        }
    }

    /// Finishes a validation Job's pod from its node's simulated GPU state, or a diagnostics Job's
    /// pod as collected ([`super::validation_pod`]): no diagnostic runs.
    async fn validate(&self, pod: &Pod, node: &str) {
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(self.client.clone());
        let namespace = pod.namespace().unwrap_or_default();
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &namespace);
        let _permit = self.permits.acquire().await.expect("semaphore open");
        let found = match nodes.get_opt(node).await {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!(%node, error = %e, "simulated kubelet: reading the node for a validation pod failed");
                return;
            }
        };
        let patch = super::validation_pod::finished_patch(pod, found.as_ref(), Timestamp::now());
        if let Err(e) = pods
            .patch_status(&pod.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            tracing::warn!(%namespace, pod = %pod.name_any(), error = %e, "simulated kubelet: finishing a validation pod failed");
        }
    }

    /// Fails a pod the device plugin could not serve, as the real kubelet's admission does.
    async fn reject(&self, pod: &Pod, message: &str) {
        let patch =
            json!({"status": {"phase": "Failed", "reason": "UnexpectedAdmissionError", "message": message}});
        let namespace = pod.namespace().unwrap_or_default();
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &namespace);
        let _permit = self.permits.acquire().await.expect("semaphore open");
        if let Err(e) = pods
            .patch_status(&pod.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            tracing::warn!(%namespace, pod = %pod.name_any(), error = %e, "simulated kubelet: rejecting failed");
        }
    }

    async fn finalise(&self, pod: &Pod, uid: &str, after: Duration) {
        if !after.is_zero() {
            tokio::time::sleep(after).await;
        }
        let namespace = pod.namespace().unwrap_or_default();
        let name = pod.name_any();
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &namespace);
        if reported_terminal_first(pod) {
            let failed = json!({"status": {"phase": "Failed", "reason": "Terminated"}});
            let _permit = self.permits.acquire().await.expect("semaphore open");
            if let Err(e) = pods
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&failed))
                .await
            {
                tracing::warn!(%namespace, pod = %name, error = %e, "simulated kubelet: reporting a killed pod failed");
            }
        }
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(uid.to_owned()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        for attempt in 1..=5 {
            let result = {
                let _permit = self.permits.acquire().await.expect("semaphore open");
                pods.delete(&name, &params).await
            };
            match result {
                // Gone already, or a new pod took the name (its UID differs): either way done.
                Ok(_) => return,
                Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => return,
                Err(e) => {
                    tracing::warn!(%namespace, pod = %name, attempt, error = %e, "simulated kubelet: finalising failed");
                    tokio::time::sleep(Duration::from_millis(200 * attempt)).await;
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "kubelet_tests.rs"]
mod tests;
