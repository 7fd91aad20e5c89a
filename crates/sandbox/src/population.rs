//! A standing population of workloads spread over a whole fleet, as `gpu-sandbox up --pods`,
//! `make demo` and `make bench` want it: Deployments of equal size, each behind a
//! `maxUnavailable: 10%` PDB, every `gpu_every`-th one requesting a GPU per pod.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{ListParams, ObjectMeta, PostParams};
use kube::{Api, Client};

use crate::workload::{self, Budget, CreateWorkloadError, WaitError, Workload};

/// What to create.
#[derive(Debug, Clone)]
pub struct PopulationOptions {
    /// The namespace to create and fill.
    pub namespace: String,
    /// Pods in all.
    pub pods: usize,
    /// Replicas per Deployment (the last one takes the remainder).
    pub pods_per_deployment: usize,
    /// Every n-th Deployment's pods request one GPU each (0: none do).
    pub gpu_every: usize,
    /// The node label every pod must match (a fleet's label), as `(key, value)`.
    pub node_selector: (String, String),
}

/// Failure to create the population.
#[derive(Debug, thiserror::Error)]
pub enum CreatePopulationError {
    /// The namespace could not be created.
    #[error("creating namespace {namespace}: {source}")]
    Namespace {
        /// The namespace.
        namespace: String,
        /// The API error.
        source: kube::Error,
    },
    /// The namespace's service account never appeared.
    #[error(transparent)]
    ServiceAccount(WaitError),
    /// A Deployment or PDB could not be created.
    #[error(transparent)]
    Workload(#[from] CreateWorkloadError),
}

/// The Deployments' replica counts: equal slices of `pods`, the last one smaller if needed.
#[must_use]
pub fn deployment_sizes(pods: usize, per_deployment: usize) -> Vec<usize> {
    let per = per_deployment.max(1);
    (0..pods.div_ceil(per)).map(|i| per.min(pods - i * per)).collect()
}

/// Creates the namespace, the Deployments and their PDBs; returns the workloads.
pub async fn create(
    client: &Client,
    options: &PopulationOptions,
) -> Result<Vec<Workload>, CreatePopulationError> {
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(options.namespace.clone()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .map_err(|source| CreatePopulationError::Namespace {
            namespace: options.namespace.clone(),
            source,
        })?;
    wait_default_service_account(client, &options.namespace)
        .await
        .map_err(CreatePopulationError::ServiceAccount)?;
    let workloads: Vec<Workload> = deployment_sizes(options.pods, options.pods_per_deployment)
        .into_iter()
        .enumerate()
        .map(|(i, size)| {
            let (key, value) = &options.node_selector;
            let app = Workload::new(&options.namespace, &format!("app-{i:04}"))
                .replicas(i32::try_from(size).unwrap_or(i32::MAX))
                .node_selector(key, value);
            if options.gpu_every > 0 && i % options.gpu_every == 0 {
                app.gpus(1)
            } else {
                app
            }
        })
        .collect();
    // A few at a time: one by one takes minutes on a loaded server, all at once floods it.
    futures::stream::iter(&workloads)
        .map(|app| async move {
            workload::create(client, &app.deployment()).await?;
            workload::create(client, &app.pdb(&Budget::max_unavailable_percent(10))).await?;
            Ok::<_, CreateWorkloadError>(())
        })
        .buffer_unordered(8)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(workloads)
}

async fn wait_default_service_account(client: &Client, namespace: &str) -> Result<(), WaitError> {
    let service_accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let started = tokio::time::Instant::now();
    loop {
        if let Ok(Some(_)) = service_accounts.get_opt("default").await {
            return Ok(());
        }
        if started.elapsed() > Duration::from_secs(60) {
            return Err(WaitError {
                what: format!("the default service account of {namespace}"),
                waited: started.elapsed(),
                last_seen: "absent".to_owned(),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Ready replicas over all Deployments in `namespace` (cheap: reads Deployments, not pods).
pub async fn ready_pods(client: &Client, namespace: &str) -> Result<usize, kube::Error> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    let list = deployments.list(&ListParams::default()).await?;
    Ok(list
        .items
        .iter()
        .filter_map(|d| d.status.as_ref()?.ready_replicas)
        .map(|n| usize::try_from(n).unwrap_or(0))
        .sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_are_split_into_equal_deployments_with_the_remainder_last() {
        assert_eq!(deployment_sizes(250, 100), vec![100, 100, 50]);
        assert_eq!(deployment_sizes(200, 100), vec![100, 100]);
        assert_eq!(deployment_sizes(0, 100), Vec::<usize>::new());
    }
}
