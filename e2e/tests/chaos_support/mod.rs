//! What every fault scenario shares: a world of its own (an audited control plane that only this
//! test breaks, the CRDs, a fleet, a namespace, the controller as a child process under its own
//! service account), and the invariants each scenario must end with, asserted, not logged:
//!
//! - no PDB violated ([`BudgetSampler`] on every pod event of the namespace);
//! - no node taken beyond the budget (a watch of the remediations counts those in flight at
//!   every instant; a node watch checks no healthy node was ever held);
//! - no remediation lost or duplicated (exactly one remediation, by UID, per broken node, none
//!   for any other, each reaching the expected phase);
//! - the controller recovers by itself (no restart by the test; it is still running at the end).
//!
//! The shipped fence policy is on in every world: an elected controller's writes must carry its
//! current claim on the Lease.
#![allow(
    dead_code,
    reason = "each chaos test binary uses a different part of the support"
)]

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::StreamExt;
use gpu_remediation_api::{GpuRemediation, Phase};
use gpu_sandbox::{
    ControlPlaneOptions, Fleet, FleetOptions,
    bench::{
        actor::{ControllerOptions, ControllerProcess},
        bench_env::{self, BENCH_NAMESPACE, BenchEnv, SCOPE_LABEL},
        budget_sampler::BudgetSampler,
        cordon_watch::CordonWatch,
        setup::{self, ensure_namespace},
    },
    fleet::FLEET_LABEL,
    workload::{self, Budget, Workload},
};
use k8s_openapi::{api::core::v1::Node, jiff::Timestamp};
use kube::{
    Api, ResourceExt as _,
    api::{Patch, PatchParams},
    runtime::{WatchStreamExt, watcher},
};

/// The controller binary (`e2e::controller_binary`), built off the runtime's thread.
pub async fn controller_binary() -> &'static Path {
    tokio::task::spawn_blocking(e2e::controller_binary)
        .await
        .expect("building the controller binary")
}

/// The shipped fence policy (`manifests/controller/fence-policy.yaml`), for the controller's
/// identity and Lease in the bench namespace: every write of an elected controller must carry its
/// current claim. A controller run alone creates no Lease, and the policy lets it be.
async fn install_fence(client: &kube::Client) {
    let shipped = std::fs::read_to_string(format!(
        "{}/manifests/controller/fence-policy.yaml",
        e2e::WORKSPACE
    ))
    .expect("the fence policy");
    let adapted = shipped
        .replace(
            "system:serviceaccount:gpu-remediation:",
            &format!("system:serviceaccount:{BENCH_NAMESPACE}:"),
        )
        .replace(
            "    namespace: gpu-remediation\n",
            &format!("    namespace: {BENCH_NAMESPACE}\n"),
        );
    assert!(adapted.contains(BENCH_NAMESPACE), "{adapted}");
    let objects = gpu_sandbox::demo::install::parse_documents(&adapted).expect("fence policy YAML");
    gpu_sandbox::demo::install::apply(client, &objects)
        .await
        .unwrap_or_else(|e| panic!("installing the fence policy: {e}"));
}

fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
}

/// One test's world.
pub struct World {
    /// The control plane (restart and pause it through `env.control_plane`), the CRDs and the
    /// controller's identity.
    pub env: BenchEnv,
    /// The simulated nodes.
    pub fleet: Fleet,
    /// The namespace of the workloads, also the policy's name and scope.
    pub scope: String,
}

impl World {
    /// Starts a control plane of this test's own and a fleet of `nodes` nodes.
    pub async fn start(scope: &str, nodes: usize) -> Self {
        init_logs();
        let env = BenchEnv::start(controller_binary().await, ControlPlaneOptions::default())
            .await
            .unwrap_or_else(|e| panic!("starting the sandbox: {e}"));
        let fleet = Fleet::start(
            env.client.clone(),
            FleetOptions {
                nodes,
                name_prefix: scope.to_owned(),
                ..FleetOptions::default()
            },
        )
        .await
        .expect("starting the fleet");
        ensure_namespace(&env.client, scope).await.expect("namespace");
        install_fence(&env.client).await;
        Self {
            env,
            fleet,
            scope: scope.to_owned(),
        }
    }

    /// The fleet's nodes, sorted.
    pub fn nodes(&self) -> Vec<String> {
        let mut names = self.fleet.node_names();
        names.sort();
        names
    }

    /// Creates the policy over this fleet: `for: 2s`, replace by deleting the Node (so every
    /// remediation has an end: `Succeeded` once the node is gone), one node at a time unless
    /// `spec` says otherwise (merged over this base).
    pub async fn policy(&self, spec: serde_json::Value) {
        let mut base = serde_json::json!({
            "action": "Replace",
            "replacement": {"strategy": "DeleteNode", "timeout": "60s"},
            "safety": {"maxConcurrent": 1, "maxUnhealthy": "50%"},
        });
        e2e::merge(&mut base, spec);
        self.env
            .create_policy(&self.scope, self.fleet.name(), "2s", base)
            .await
            .expect("creating the policy");
    }

    /// A controller replica: alone, or one of several electing a leader.
    pub fn controller(&self, identity: &str, elect: bool, kubeconfig: Option<&Path>) -> ControllerProcess {
        ControllerProcess::start(&ControllerOptions {
            binary: self.env.controller_binary.clone(),
            kubeconfig: kubeconfig.map_or_else(|| self.env.controller.kubeconfig.clone(), Path::to_owned),
            policy_selector: format!("{SCOPE_LABEL}={}", self.scope),
            identity: identity.to_owned(),
            lease_namespace: elect.then(|| BENCH_NAMESPACE.to_owned()),
            log_dir: self.env.scratch.clone(),
            extra_args: Vec::new(),
        })
        .expect("starting the controller")
    }

    /// Deployments of `sizes` replicas with every pod on `node` (the other nodes are cordoned
    /// while they start, then opened so evicted pods have somewhere to go), each behind a
    /// `maxUnavailable: 1` PDB the disruption controller has observed.
    /// `termination`: how long each pod takes to terminate (the simulated kubelet's
    /// `sim-termination` annotation), `None` for at once.
    pub async fn apps_on(
        &self,
        node: &str,
        prefix: &str,
        sizes: &[i32],
        termination: Option<&str>,
    ) -> Vec<Workload> {
        let others: Vec<String> = self.nodes().into_iter().filter(|n| n != node).collect();
        for other in &others {
            self.set_unschedulable(other, true).await;
        }
        let apps = self.create_apps(prefix, sizes, termination).await;
        for other in &others {
            self.set_unschedulable(other, false).await;
        }
        self.protect(&apps).await;
        apps
    }

    /// Deployments of `sizes` replicas spread by the scheduler over the fleet, behind PDBs.
    pub async fn apps_spread(&self, prefix: &str, sizes: &[i32]) -> Vec<Workload> {
        let apps = self.create_apps(prefix, sizes, None).await;
        self.protect(&apps).await;
        apps
    }

    async fn create_apps(&self, prefix: &str, sizes: &[i32], termination: Option<&str>) -> Vec<Workload> {
        let apps: Vec<Workload> = sizes
            .iter()
            .enumerate()
            .map(|(i, &replicas)| {
                let app = Workload::new(&self.scope, &format!("{prefix}-{i}"))
                    .replicas(replicas)
                    .node_selector(FLEET_LABEL, self.fleet.name());
                match termination {
                    Some(t) => app.termination(t),
                    None => app,
                }
            })
            .collect();
        for app in &apps {
            workload::create(&self.env.client, &app.deployment())
                .await
                .expect("deployment");
        }
        for app in &apps {
            let replicas = usize::try_from(app.replicas).unwrap();
            workload::wait_ready_pods(
                &self.env.client,
                &self.scope,
                &app.selector(),
                replicas,
                Duration::from_secs(120),
            )
            .await
            .expect("pods ready");
        }
        apps
    }

    async fn protect(&self, apps: &[Workload]) {
        for app in apps {
            workload::create(&self.env.client, &app.pdb(&Budget::max_unavailable(1)))
                .await
                .expect("PDB");
        }
        for app in apps {
            workload::wait_pdb_allows(
                &self.env.client,
                &self.scope,
                &app.name,
                1,
                Duration::from_secs(120),
            )
            .await
            .expect("PDB observed");
        }
    }

    /// Cordons or opens a node as a person would (a merge patch of `spec.unschedulable`).
    pub async fn set_unschedulable(&self, node: &str, unschedulable: bool) {
        Api::<Node>::all(self.env.client.clone())
            .patch(
                node,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"spec": {"unschedulable": unschedulable}})),
            )
            .await
            .expect("patching the node");
    }

    /// `GpuHealthy=False reason=XID79` on every node of `nodes`, now.
    pub async fn break_nodes(&self, nodes: &[String]) {
        bench_env::set_condition_at(&self.env.client, nodes, "False", "XID79", Timestamp::now())
            .await
            .expect("breaking nodes");
    }

    /// Starts every invariant watch over this world.
    pub async fn invariants(&self) -> Invariants {
        Invariants {
            budgets: BudgetSampler::start(&self.env.client, &self.scope)
                .await
                .expect("PDB sampler"),
            cordons: CordonWatch::start(&self.env.client, &self.fleet.selector())
                .await
                .expect("node watch"),
            remediations: RemediationWatch::start(&self.env, &self.scope),
        }
    }

    /// Waits until every node of `nodes` has a remediation in `phase`.
    pub async fn wait_all(&self, nodes: &[String], phase: Phase, within: Duration) -> Vec<GpuRemediation> {
        let wanted: BTreeSet<&String> = nodes.iter().collect();
        let found = setup::eventually(&format!("{nodes:?} in phase {phase}"), within, || async {
            let all = self.env.remediations(&self.scope).await.ok()?;
            let done: BTreeSet<&String> = all
                .iter()
                .filter(|r| r.status.as_ref().is_some_and(|s| s.phase == phase))
                .map(|r| &r.spec.node_name)
                .filter(|n| wanted.contains(n))
                .collect();
            (done.len() == wanted.len()).then_some(all)
        })
        .await;
        match found {
            Ok(all) => all,
            Err(e) => panic!("{e}; remediations now: {}", self.describe().await),
        }
    }

    /// Waits (up to `within`) until every node of `broken` is replaced (`Succeeded`), then
    /// asserts the suite's invariants over them: one remediation at a time, each node once.
    pub async fn all_succeed_once(&self, broken: &[String], within: Duration, invariants: &Invariants) {
        self.wait_all(broken, Phase::Succeeded, within).await;
        invariants.assert_hold(broken, 1, Phase::Succeeded).await;
    }

    /// Asserts `controller` still runs (it recovered by itself, nobody restarted it), then stops it
    /// and the control plane.
    pub async fn end(self, mut controller: ControllerProcess) {
        assert_running(&mut controller);
        controller.terminate().await;
        self.env.control_plane.stop().await;
    }

    /// Waits (up to `within`) until some remediation of the policy is in a phase `in_phase` accepts
    /// (`None`: no status yet).
    pub async fn wait_any(&self, what: &str, within: Duration, in_phase: impl Fn(Option<Phase>) -> bool) {
        gpu_sandbox::bench::setup::eventually(what, within, || async {
            let all = self.env.remediations(&self.scope).await.ok()?;
            all.iter()
                .any(|r| in_phase(r.status.as_ref().map(|s| s.phase)))
                .then_some(())
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    }

    /// Each remediation of the policy as `node: phase (message)`, for failure messages.
    pub async fn describe(&self) -> String {
        let all = self.env.remediations(&self.scope).await.unwrap_or_default();
        all.iter()
            .map(|r| {
                let status = r.status.clone().unwrap_or_default();
                format!(
                    "{}: {} ({})",
                    r.spec.node_name,
                    status.phase,
                    status.message.unwrap_or_default()
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// The remediation of `node` once it reaches `phase`.
    pub async fn wait_phase(&self, node: &str, phase: Phase, within: Duration) -> GpuRemediation {
        let found = setup::eventually(
            &format!("the remediation of {node} in phase {phase}"),
            within,
            || async {
                self.env
                    .remediations(&self.scope)
                    .await
                    .ok()?
                    .into_iter()
                    .find(|r| r.spec.node_name == node && r.status.as_ref().is_some_and(|s| s.phase == phase))
            },
        )
        .await;
        match found {
            Ok(remediation) => remediation,
            Err(e) => panic!("{e}; remediations now: {}", self.describe().await),
        }
    }
}

/// Every remediation of a policy as a watch sees it: UIDs per node, phases, and how many were in
/// flight (not terminal) at once.
#[derive(Default)]
struct RemediationRecord {
    uids_by_node: BTreeMap<String, BTreeSet<String>>,
    phase_by_uid: BTreeMap<String, Phase>,
    in_flight: BTreeSet<String>,
    most_in_flight: usize,
}

/// A running watch of one policy's remediations.
pub struct RemediationWatch {
    record: Arc<Mutex<RemediationRecord>>,
    task: tokio::task::JoinHandle<()>,
}

impl RemediationWatch {
    fn start(env: &BenchEnv, scope: &str) -> Self {
        let record = Arc::new(Mutex::new(RemediationRecord::default()));
        let shared = record.clone();
        let api: Api<GpuRemediation> = Api::all(env.client.clone());
        let scope = scope.to_owned();
        let task = tokio::spawn(async move {
            let mut events = std::pin::pin!(
                watcher(api, watcher::Config::default())
                    .default_backoff()
                    .applied_objects()
            );
            while let Some(event) = events.next().await {
                let Ok(remediation) = event else { continue };
                if remediation.spec.policy_name != scope {
                    continue;
                }
                let uid = remediation.uid().unwrap_or_default();
                let phase = remediation.status.as_ref().map(|s| s.phase).unwrap_or_default();
                let mut record = shared.lock().unwrap();
                record
                    .uids_by_node
                    .entry(remediation.spec.node_name.clone())
                    .or_default()
                    .insert(uid.clone());
                record.phase_by_uid.insert(uid.clone(), phase);
                if phase.is_terminal() || remediation.metadata.deletion_timestamp.is_some() {
                    record.in_flight.remove(&uid);
                } else {
                    record.in_flight.insert(uid);
                }
                record.most_in_flight = record.most_in_flight.max(record.in_flight.len());
            }
        });
        Self { record, task }
    }
}

impl Drop for RemediationWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The watches a scenario's invariants are checked against.
pub struct Invariants {
    /// PDBs of the namespace.
    pub budgets: BudgetSampler,
    /// Nodes held by the controller.
    pub cordons: CordonWatch,
    /// The policy's remediations.
    pub remediations: RemediationWatch,
}

impl Invariants {
    /// Asserts the invariants: no PDB violated; never more than `max_in_flight` remediations in
    /// flight at once; no node outside `broken` ever held; exactly one remediation per node of
    /// `broken` and none for any other node, each last seen in `phase`.
    ///
    /// The test's own remediation watch may lag the API (after a restart it reconnects with
    /// backoff), so it is first given up to 30 s to see what a list already shows; what it then
    /// holds is asserted.
    pub async fn assert_hold(&self, broken: &[String], max_in_flight: usize, phase: Phase) {
        let _ = setup::eventually(
            "the remediation watch to catch up",
            Duration::from_secs(30),
            || async {
                let record = self.remediations.record.lock().unwrap();
                broken
                    .iter()
                    .all(|node| {
                        record.uids_by_node.get(node).is_some_and(|uids| {
                            uids.iter()
                                .all(|uid| record.phase_by_uid.get(uid) == Some(&phase))
                        })
                    })
                    .then_some(())
            },
        )
        .await;
        let budgets = self.budgets.report();
        assert!(
            budgets.violations.is_empty(),
            "PDBs were violated: {:?}",
            budgets.violations
        );
        assert!(budgets.samples > 0, "the PDB sampler saw no pod event at all");
        let record = self.remediations.record.lock().unwrap();
        assert!(
            record.most_in_flight <= max_in_flight,
            "{} remediations were in flight at once (budget {max_in_flight})",
            record.most_in_flight
        );
        let wanted: BTreeSet<&String> = broken.iter().collect();
        let held: BTreeSet<String> = self.cordons.first_held().into_keys().collect();
        let stray: Vec<&String> = held.iter().filter(|n| !wanted.contains(n)).collect();
        assert!(stray.is_empty(), "healthy nodes were taken: {stray:?}");
        let nodes: BTreeSet<&String> = record.uids_by_node.keys().collect();
        assert_eq!(nodes, wanted, "remediated nodes differ from the broken ones");
        for (node, uids) in &record.uids_by_node {
            assert_eq!(
                uids.len(),
                1,
                "node {node} got {} remediations: {uids:?}",
                uids.len()
            );
            let uid = uids.iter().next().unwrap();
            assert_eq!(
                record.phase_by_uid[uid], phase,
                "the remediation of {node} ended in the wrong phase"
            );
        }
    }

    /// The most remediations seen in flight at once.
    pub fn most_in_flight(&self) -> usize {
        self.remediations.record.lock().unwrap().most_in_flight
    }

    /// Remediations seen so far.
    pub fn remediation_count(&self) -> usize {
        self.remediations.record.lock().unwrap().phase_by_uid.len()
    }
}

/// Asserts the controller is still running (it recovered by itself, nobody restarted it).
fn assert_running(controller: &mut ControllerProcess) {
    assert!(
        controller.exited().is_none(),
        "the controller exited; its log ends with:\n{}",
        controller.log_tail(40)
    );
}

/// The holder of the controller's Lease, if any.
pub async fn leader(env: &BenchEnv) -> Option<String> {
    let lease =
        Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(env.client.clone(), BENCH_NAMESPACE)
            .get_opt("gpu-remediator")
            .await
            .ok()??;
    lease.spec?.holder_identity.filter(|h| !h.is_empty())
}
