//! How a bench's setup fails ([`BenchSetupError`], [`api_error`]), waits for something to happen
//! ([`eventually`]) and makes the namespaces its scenarios run in ([`ensure_namespace`]): what every
//! scenario and the shared sandbox (`super::bench_env`) lean on.

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::PostParams;
use kube::{Api, Client};

/// Failure to set the bench up or to run a step of it.
#[derive(Debug, thiserror::Error)]
pub enum BenchSetupError {
    /// The control plane did not start.
    #[error(transparent)]
    ControlPlane(#[from] crate::StartControlPlaneError),
    /// A file could not be written.
    #[error("writing {path}: {source}")]
    File {
        /// The file.
        path: PathBuf,
        /// The IO error.
        source: std::io::Error,
    },
    /// An identity could not be created.
    #[error(transparent)]
    Identity(#[from] super::actor::CreateIdentityError),
    /// An API call failed.
    #[error("{what}: {source}")]
    Api {
        /// What was being done.
        what: String,
        /// The API error.
        source: kube::Error,
    },
    /// The controller process could not be started.
    #[error(transparent)]
    Controller(#[from] super::actor::StartControllerError),
    /// A sandbox step (fleet, workloads, watches) failed.
    #[error("{0}")]
    Step(String),
    /// Something did not happen in time.
    #[error("timed out after {waited:?} waiting for {what}")]
    Timeout {
        /// What.
        what: String,
        /// How long.
        waited: Duration,
    },
}

/// Wraps an API error with what was being done.
pub fn api_error(what: impl Into<String>) -> impl FnOnce(kube::Error) -> BenchSetupError {
    let what = what.into();
    move |source| BenchSetupError::Api { what, source }
}

/// Polls `probe` every 200 ms until it yields, or fails after `within`.
pub async fn eventually<T, F, Fut>(what: &str, within: Duration, mut probe: F) -> Result<T, BenchSetupError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(value) = probe().await {
            return Ok(value);
        }
        if tokio::time::Instant::now() > deadline {
            return Err(BenchSetupError::Timeout {
                what: what.to_owned(),
                waited: within,
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Creates namespace `name` if it does not exist and waits for its `default` service account
/// (pods cannot be created before it).
pub async fn ensure_namespace(client: &Client, name: &str) -> Result<(), BenchSetupError> {
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    match Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.is_already_exists() => {}
        Err(source) => {
            return Err(api_error(format!("creating namespace {name}"))(source));
        }
    }
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), name);
    eventually(
        &format!("the default service account of {name}"),
        Duration::from_secs(60),
        || async { accounts.get_opt("default").await.ok().flatten() },
    )
    .await
    .map(|_| ())
}
