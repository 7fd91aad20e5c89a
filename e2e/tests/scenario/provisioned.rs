//! What the tests against a real provisioner (Cluster API, Karpenter) share: a workload of two
//! 8-GPU pods that the provisioner gives a node each, the pods as they run again after a
//! replacement, and the budget kept across both drains (ours, then the provisioner's).

use std::time::Duration;

use gpu_sandbox::{
    fleet::FLEET_LABEL,
    workload::{self, Budget, Workload},
};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{Api, api::ListParams};

use super::{BudgetWatch, Scenario, is_ready};

impl Scenario {
    /// Two pods of 8 GPUs each on the fleet's nodes (the workload edited by `edit` first), behind
    /// a PDB of `minAvailable: 1`: a provisioner gives each a node of its own. Returns once both
    /// run (within `within`; on a timeout the panic carries `log`, the provisioner's log tail)
    /// and the budget allows one disruption.
    pub async fn two_training_pods(
        &self,
        within: Duration,
        log: impl Fn() -> String,
        edit: impl FnOnce(Workload) -> Workload,
    ) -> Workload {
        let app = edit(
            Workload::new(&self.namespace, "train")
                .replicas(2)
                .gpus(8)
                .node_selector(FLEET_LABEL, self.fleet.name()),
        );
        workload::create(&self.client, &app.deployment())
            .await
            .expect("deployment");
        workload::create(&self.client, &app.pdb(&Budget::min_available(1)))
            .await
            .expect("pdb");
        self.wait_ready_pods_showing(&app, within, log).await;
        workload::wait_pdb_allows(
            &self.client,
            &self.namespace,
            &app.name,
            1,
            Duration::from_secs(30),
        )
        .await
        .expect("the PDB allows one disruption");
        app
    }

    /// Waits until both pods of `app` are ready; on a timeout the panic carries `log`, the
    /// provisioner's log tail.
    pub async fn wait_ready_pods_showing(&self, app: &Workload, within: Duration, log: impl Fn() -> String) {
        workload::wait_ready_pods(&self.client, &self.namespace, &app.selector(), 2, within)
            .await
            .unwrap_or_else(|e| panic!("{e}; the provisioner's log ends:\n{}", log()));
    }

    /// The pods of `app`.
    pub async fn pods_of(&self, app: &Workload) -> Vec<Pod> {
        Api::<Pod>::namespaced(self.client.clone(), &self.namespace)
            .list(&ListParams::default().labels(&app.selector()))
            .await
            .expect("listing pods")
            .items
    }

    /// The replacement node `new_node` is Ready and the pod of `app` evicted from the broken node
    /// runs there, ready.
    pub async fn assert_the_evicted_pod_runs_on(&self, app: &Workload, new_node: &str) {
        let node = self.node(new_node).await;
        assert!(
            gpu_remediator::replace::verify::node_is_ready(&node),
            "{new_node} is Ready"
        );
        let on_new = self
            .pods_of(app)
            .await
            .into_iter()
            .filter(|pod| pod.spec.as_ref().and_then(|spec| spec.node_name.as_deref()) == Some(new_node))
            .filter(is_ready)
            .count();
        assert_eq!(
            on_new, 1,
            "the evicted pod runs on the replacement node {new_node}"
        );
    }

    /// Whether node `name` is gone.
    pub async fn node_is_gone(&self, name: &str) -> bool {
        Api::<Node>::all(self.client.clone())
            .get_opt(name)
            .await
            .expect("reading the broken node")
            .is_none()
    }
}

impl BudgetWatch {
    /// No PDB broken across both drains (ours, then the provisioner's), and every pod that left
    /// was evicted.
    pub fn assert_kept_across_both_drains(&self) {
        assert!(
            self.fewest_healthy() >= 1,
            "fewest healthy: {}",
            self.fewest_healthy()
        );
        let left = self.left();
        assert!(!left.is_empty(), "the broken node's pod left");
        assert!(
            left.values().all(|evicted| *evicted),
            "every pod left through the Eviction API: {left:?}"
        );
    }
}
