//! `JobSet` itself against the sandbox: upstream `JobSet`'s controller manager (`sigs.k8s.io/jobset`:
//! its `JobSet` and pod reconcilers and its webhooks, the release pinned in `tools/jobset`, built
//! from the Go module and cached like Karpenter and Cluster API) with its CRD. The real
//! kube-controller-manager's job controller runs the `Jobs` it creates; the sandbox's kubelet runs
//! their pods.
//!
//! The manager runs without leader election or metrics, its health probes on a free 127.0.0.1
//! port, internal certificate management off, and its webhook server on a free port with the API
//! server's serving certificate (valid for 127.0.0.1, signed by the sandbox CA). Its four webhooks
//! (`JobSet` defaulting and validation, pod mutation and admission) are registered with the API
//! server by URL, as upstream's manifests register them by Service, so a `JobSet` here is
//! defaulted and validated as on a real cluster; the pod webhooks only see pods that carry the
//! `JobSet` name label (upstream's act on those alone).

use std::path::PathBuf;
use std::time::Duration;

use gpu_remediation_api::constants::gang_labels::JOBSET_NAME;
use kube::api::{ApiResource, DynamicObject, PostParams};
use kube::core::GroupVersionKind;
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::ControlPlane;
use crate::controlplane::OwnedProcess;
use crate::upstream::{self, StartUpstreamError};

/// The environment variable naming the `JobSet` manager binary; unset: `tools/build.sh jobset`.
pub const BINARY_ENV: &str = "GPU_REMEDIATOR_JOBSET";

/// How long the manager may take until its webhooks answer.
const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// `jobset.x-k8s.io/v1alpha2` `JobSet`.
#[must_use]
pub fn resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("jobset.x-k8s.io", "v1alpha2", "JobSet"),
        "jobsets",
    )
}

/// `JobSet`'s controller manager running against one control plane; dropping it terminates the
/// process (the webhook configurations stay, and refuse `JobSet` writes, as on a cluster whose
/// `JobSet` is down).
pub struct JobSetController {
    process: OwnedProcess,
}

impl JobSetController {
    /// Installs `JobSet`'s CRD, starts its manager and registers its webhooks, and waits until a
    /// `JobSet` create (server-side dry run) passes them.
    pub async fn start(control_plane: &ControlPlane) -> Result<Self, StartUpstreamError> {
        let binary = upstream::locate("jobset", BINARY_ENV)?;
        let client = control_plane.client();
        upstream::install_crds(&client, &binary).await?;

        let dir = control_plane.data_dir().join("jobset");
        let certs = dir.join("webhook-certs");
        let write_error = |path: &PathBuf| {
            let path = path.clone();
            move |source| StartUpstreamError::Write { path, source }
        };
        std::fs::create_dir_all(&certs).map_err(write_error(&certs))?;
        let pki = control_plane.data_dir().join("pki");
        for (from, to) in [("apiserver.crt", "tls.crt"), ("apiserver.key", "tls.key")] {
            std::fs::copy(pki.join(from), certs.join(to)).map_err(write_error(&certs.join(to)))?;
        }
        let ca = std::fs::read(pki.join("ca.crt")).map_err(|source| StartUpstreamError::Read {
            path: pki.join("ca.crt"),
            source,
        })?;
        let [webhook_port, health_port] = [free_port(&dir)?, free_port(&dir)?];
        let config_path = dir.join("config.yaml");
        std::fs::write(
            &config_path,
            configuration(webhook_port, health_port, &certs).to_string(),
        )
        .map_err(write_error(&config_path))?;
        let args = vec![
            format!("--config={}", config_path.display()),
            "--zap-log-level=2".to_owned(),
        ];
        let env = [(
            "KUBECONFIG",
            control_plane.kubeconfig_path().display().to_string(),
        )];
        let log = dir.join("jobset.log");
        let process = upstream::spawn("jobset", &binary, &env, &args, &log).await?;
        let controller = Self { process };

        // `ByteString` serialises as base64, the form `caBundle` takes.
        let ca_bundle = serde_json::to_value(k8s_openapi::ByteString(ca)).expect("bytes serialise");
        let ca_bundle = ca_bundle.as_str().unwrap_or_default();
        for (kind, plural, object) in webhook_configurations(webhook_port, ca_bundle) {
            let resource = ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind),
                plural,
            );
            upstream::apply_object(&client, None, &resource, &object).await?;
        }
        controller.wait_webhooks_answer(&client).await?;
        Ok(controller)
    }

    /// The last `lines` lines of the manager's log (for a failing test's message).
    #[must_use]
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }

    /// Until a server-side dry-run create of a small `JobSet` comes back defaulted by the
    /// manager's mutating webhook (`spec.successPolicy`, which the CRD does not default), so the
    /// API server both knows the webhooks and reaches them; or [`READY_TIMEOUT`].
    async fn wait_webhooks_answer(&self, client: &Client) -> Result<(), StartUpstreamError> {
        let api = Api::<DynamicObject>::namespaced_with(client.clone(), "default", &resource());
        let probe: DynamicObject = serde_json::from_value(probe_jobset()).expect("the probe is an object");
        let params = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        loop {
            let last = match api.create(&params, &probe).await {
                Ok(created) if created.data["spec"]["successPolicy"]["operator"] == "All" => return Ok(()),
                Ok(_) => "created without the defaulting webhook".to_owned(),
                Err(error) => error.to_string(),
            };
            if tokio::time::Instant::now() >= deadline {
                return Err(StartUpstreamError::NotReady {
                    what: format!("JobSet's webhooks (last dry-run create: {last})"),
                    waited: READY_TIMEOUT,
                    log_tail: self.log_tail(20),
                });
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// A free 127.0.0.1 port (taken and released: the manager binds it next).
fn free_port(dir: &std::path::Path) -> Result<u16, StartUpstreamError> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .map_err(|source| StartUpstreamError::Write {
            path: dir.to_owned(),
            source,
        })
}

/// The manager's `config.jobset.x-k8s.io/v1alpha1` `Configuration` (JSON is YAML).
fn configuration(webhook_port: u16, health_port: u16, certs: &std::path::Path) -> Value {
    json!({
        "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": false},
        "internalCertManagement": {"enable": false},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": certs.display().to_string()},
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": format!("127.0.0.1:{health_port}")},
    })
}

/// Upstream's webhook configurations (`config/components/webhook/manifests.yaml`), pointed at
/// `https://127.0.0.1:port` by URL instead of at a Service: (kind, plural, object).
fn webhook_configurations(port: u16, ca_bundle: &str) -> [(&'static str, &'static str, Value); 2] {
    let webhook =
        |name: &str, path: &str, group: &str, resource: &str, version: &str, operations: &[&str]| {
            let mut hook = json!({
                "name": name,
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Fail",
                "clientConfig": {"url": format!("https://127.0.0.1:{port}{path}"), "caBundle": ca_bundle},
                "rules": [{
                    "apiGroups": [group], "apiVersions": [version],
                    "operations": operations, "resources": [resource],
                }],
            });
            if resource == "pods" {
                hook["objectSelector"] =
                    json!({"matchExpressions": [{"key": JOBSET_NAME, "operator": "Exists"}]});
            }
            hook
        };
    [
        (
            "MutatingWebhookConfiguration",
            "mutatingwebhookconfigurations",
            json!({
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "MutatingWebhookConfiguration",
                "metadata": {"name": "jobset-mutating-webhook-configuration"},
                "webhooks": [
                    webhook("mjobset.kb.io", "/mutate-jobset-x-k8s-io-v1alpha2-jobset",
                        "jobset.x-k8s.io", "jobsets", "v1alpha2", &["CREATE"]),
                    webhook("mpod.kb.io", "/mutate--v1-pod", "", "pods", "v1", &["CREATE"]),
                ],
            }),
        ),
        (
            "ValidatingWebhookConfiguration",
            "validatingwebhookconfigurations",
            json!({
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingWebhookConfiguration",
                "metadata": {"name": "jobset-validating-webhook-configuration"},
                "webhooks": [
                    webhook("vjobset.kb.io", "/validate-jobset-x-k8s-io-v1alpha2-jobset",
                        "jobset.x-k8s.io", "jobsets", "v1alpha2", &["CREATE", "UPDATE"]),
                    webhook("vpod.kb.io", "/validate--v1-pod", "", "pods", "v1", &["CREATE", "UPDATE"]),
                ],
            }),
        ),
    ]
}

/// The readiness probe's `JobSet` (never stored: dry run).
fn probe_jobset() -> Value {
    json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "webhook-probe", "namespace": "default"},
        "spec": {"replicatedJobs": [{
            "name": "probe",
            "replicas": 1,
            "template": {"spec": {"template": {"spec": {
                "containers": [{"name": "probe", "image": crate::workload::IMAGE}],
            }}}},
        }]},
    })
}

/// A `JobSet` of one replicated job: `workers` pods at once (an indexed `Job` of parallelism and
/// completions `workers`, no retry: one member lost fails the `Job`, and the `JobSet` restarts
/// every member, up to `max_restarts` times), each asking for `gpus` GPUs, one per node
/// (required anti-affinity on the node name), only on nodes matching `node_selector`, with
/// `annotations` on its pods.
#[must_use]
pub fn gang(
    namespace: &str,
    name: &str,
    workers: u32,
    gpus: u32,
    max_restarts: u32,
    node_selector: &Value,
    annotations: &Value,
) -> Value {
    json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "failurePolicy": {"maxRestarts": max_restarts},
            "replicatedJobs": [{
                "name": "workers",
                "replicas": 1,
                "template": {"spec": {
                    "parallelism": workers,
                    "completions": workers,
                    "backoffLimit": 0,
                    "template": {
                        "metadata": {"annotations": annotations},
                        "spec": {
                            "restartPolicy": "Never",
                            "nodeSelector": node_selector,
                            "terminationGracePeriodSeconds": 0,
                            "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
                                "topologyKey": "kubernetes.io/hostname",
                                "labelSelector": {"matchLabels": {JOBSET_NAME: name}},
                            }]}},
                            "containers": [{
                                "name": "worker",
                                "image": crate::workload::IMAGE,
                                "resources": {"limits": {gpu_remediation_api::constants::GPU_RESOURCE: gpus.to_string()}},
                            }],
                        },
                    },
                }},
            }],
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_webhooks_point_at_the_manager_by_url_and_the_pod_ones_only_at_jobset_pods() {
        let [(_, _, mutating), (_, _, validating)] = webhook_configurations(9443, "Q0E=");
        for config in [&mutating, &validating] {
            for hook in config["webhooks"].as_array().unwrap() {
                let url = hook["clientConfig"]["url"].as_str().unwrap();
                assert!(url.starts_with("https://127.0.0.1:9443/"), "{url}");
                assert_eq!(hook["clientConfig"]["caBundle"], "Q0E=");
                let on_pods = hook["rules"][0]["resources"][0] == "pods";
                assert_eq!(
                    hook.get("objectSelector").is_some(),
                    on_pods,
                    "{}: only pod webhooks are narrowed",
                    hook["name"]
                );
            }
        }
        assert_eq!(mutating["webhooks"].as_array().unwrap().len(), 2);
        assert_eq!(validating["webhooks"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn a_gang_spreads_one_worker_per_node_and_fails_its_job_on_the_first_loss() {
        let gang = gang("ns", "llm", 4, 8, 3, &json!({"fleet": "f"}), &json!({"a": "b"}));
        let job = &gang["spec"]["replicatedJobs"][0]["template"]["spec"];
        assert_eq!(job["parallelism"], 4);
        assert_eq!(job["completions"], 4);
        assert_eq!(job["backoffLimit"], 0);
        assert_eq!(gang["spec"]["failurePolicy"]["maxRestarts"], 3);
        let pod = &job["template"]["spec"];
        assert_eq!(pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"], "8");
        assert_eq!(
            pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]["topologyKey"],
            "kubernetes.io/hostname"
        );
        assert_eq!(job["template"]["metadata"]["annotations"]["a"], "b");
        assert_eq!(pod["nodeSelector"]["fleet"], "f");
    }
}
