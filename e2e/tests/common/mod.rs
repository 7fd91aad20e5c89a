//! The e2e harness: one real control plane per test binary, shared by its tests, and a fresh
//! namespace (and, through `gpu_sandbox::Fleet`, fresh nodes) per test, so tests never see each
//! other's objects.
//!
//! Each `#[tokio::test]` runs its own runtime, so the shared value is the control plane itself
//! (processes and paths), never a client: call `cluster().await.client()` in each test. The
//! control plane lives in a static that is never dropped; its components terminate when the test
//! binary exits, however it exits (see `gpu_sandbox::controlplane`).
#![allow(dead_code, reason = "each test binary uses a different part of the harness")]

pub mod agent_identity;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use gpu_sandbox::{ControlPlane, ControlPlaneOptions};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::Api;
use kube::api::PostParams;

static CLUSTER: tokio::sync::OnceCell<ControlPlane> = tokio::sync::OnceCell::const_new();

/// The test binary's control plane, started by the first test that asks.
///
/// # Panics
/// If the control plane cannot start: no e2e test can run without it.
pub async fn cluster() -> &'static ControlPlane {
    cluster_with(ControlPlaneOptions::default).await
}

/// [`cluster`], started with `options()` if this is the first ask. A test binary whose control
/// plane needs options (DRA, say) calls this at the start of every test, so whichever test runs
/// first starts it right; later [`cluster`] calls (the shared harnesses') get the same one.
///
/// # Panics
/// If the control plane cannot start.
pub async fn cluster_with(options: impl FnOnce() -> ControlPlaneOptions) -> &'static ControlPlane {
    CLUSTER
        .get_or_init(|| async {
            ControlPlane::start(options())
                .await
                .unwrap_or_else(|e| panic!("starting the shared control plane: {e}"))
        })
        .await
}

/// Logs of the controller under test (`gpu_remediator=info`, or `RUST_LOG`) into the test's
/// output, once per test binary.
pub fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "gpu_remediator=info".into()),
        )
        .with_test_writer()
        .try_init();
}

/// A name unique within this test binary's cluster: `<prefix>-<n>`.
pub fn unique_name(prefix: &str) -> String {
    static SEQUENCE: AtomicU32 = AtomicU32::new(0);
    format!("{prefix}-{}", SEQUENCE.fetch_add(1, Ordering::Relaxed))
}

/// Creates a fresh namespace and waits for its `default` service account (pods cannot be created
/// before it exists). Returns the namespace's name.
///
/// # Panics
/// If the namespace cannot be created or its service account does not appear within 30s.
pub async fn namespace() -> String {
    let client = cluster().await.client();
    let name = unique_name("e2e");
    let namespace = Namespace {
        metadata: kube::api::ObjectMeta {
            name: Some(name.clone()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap_or_else(|e| panic!("creating namespace {name}: {e}"));
    let service_accounts: Api<ServiceAccount> = Api::namespaced(client, &name);
    let waited = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            if let Ok(Some(_)) = service_accounts.get_opt("default").await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(
        waited.is_ok(),
        "the default service account of {name} did not appear"
    );
    name
}

#[allow(unused_imports, reason = "each test binary uses a different part of common")]
pub use e2e::eventually;

/// The server's words refusing `what` (`result`), asserting that the admission policy `policy`
/// (its name, or the start of it) refused it.
///
/// # Panics
/// When `result` is not a refusal by that policy.
pub fn refused_by<T: std::fmt::Debug>(policy: &str, what: &str, result: Result<T, kube::Error>) -> String {
    match result {
        Err(kube::Error::Api(status)) if status.code == 403 || status.code == 422 => {
            assert!(
                status
                    .message
                    .contains(&format!("ValidatingAdmissionPolicy '{policy}")),
                "{what}: refused, but not by {policy}: {}",
                status.message
            );
            status.message
        }
        other => panic!("{what}: expected the refusal of {policy}, got {other:?}"),
    }
}

/// Returns once the server refuses `probe` by the admission policy `policy` (the start of its
/// name; end it with `'` for the whole name), as [`refused_by`] reads a refusal: how a test waits for a policy it installed,
/// which the server enforces only once its informers have loaded the policy and its binding, each
/// policy on its own. The probe makes a write that changes nothing when let through (a dry run, or
/// an object that does not exist).
///
/// # Panics
/// If the server has not refused `probe` by `policy` within 30 s.
pub async fn until_refused_by<T, F, Fut>(policy: &str, probe: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    let refusal = format!("ValidatingAdmissionPolicy '{policy}");
    eventually(
        &format!("the admission policy {policy} enforced"),
        Duration::from_secs(30),
        || async {
            match probe().await {
                Err(kube::Error::Api(status)) if status.message.contains(&refusal) => Some(()),
                _ => None,
            }
        },
    )
    .await;
}

/// A create that goes through admission and stores nothing.
pub fn dry_run() -> PostParams {
    PostParams {
        dry_run: true,
        ..PostParams::default()
    }
}

/// A fresh fleet of `nodes` simulated GPU nodes (8 GPUs each) with a unique name, on the shared
/// cluster, running on the calling test's runtime. Heartbeats every 2s, so a stopped heartbeat
/// shows within the default 50s grace period plus a little.
///
/// Other tests' fleets share the cluster, and a fleet dropped without `stop().await` leaves its
/// nodes behind (they go `Unknown` once their heartbeats stop): select nodes by
/// `fleet.selector()` (or a label of your own via `FleetOptions::labels`), never by the GPU labels
/// alone.
///
/// # Panics
/// If the nodes cannot be registered.
pub async fn fleet(nodes: usize) -> gpu_sandbox::Fleet {
    fleet_with(nodes, |_| {}).await
}

/// [`fleet`], its options edited by `edit` first.
///
/// # Panics
/// If the nodes cannot be registered.
pub async fn fleet_with(
    nodes: usize,
    edit: impl FnOnce(&mut gpu_sandbox::FleetOptions),
) -> gpu_sandbox::Fleet {
    let mut options = gpu_sandbox::FleetOptions {
        nodes,
        name_prefix: unique_name("gpu"),
        heartbeat_interval: Duration::from_secs(2),
        ..gpu_sandbox::FleetOptions::default()
    };
    edit(&mut options);
    gpu_sandbox::Fleet::start(cluster().await.client(), options)
        .await
        .unwrap_or_else(|e| panic!("starting a fleet: {e}"))
}

/// A stand-in for Self Node Remediation's CRD, for `Template` replacements to create objects of.
pub const REBOOT_CRD: &str = r"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: fakereboots.e2e.gpuremediation.dev}
spec:
  group: e2e.gpuremediation.dev
  scope: Namespaced
  names: {plural: fakereboots, singular: fakereboot, kind: FakeReboot, listKind: FakeRebootList}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    schema:
      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
";

/// Installs the CRD in `yaml` (if it is not there yet) and waits until it is established.
pub async fn install_crd(client: &kube::Client, yaml: &str) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::ResourceExt as _;

    let crd: CustomResourceDefinition = serde_yaml::from_str(yaml).expect("a CRD manifest");
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = crd.name_any();
    match crds.create(&PostParams::default(), &crd).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.is_already_exists() => {}
        Err(error) => panic!("installing CRD {name}: {error}"),
    }
    wait_established(client, &name).await;
}

/// Waits (up to 30 s) until the CRD `name` is established.
///
/// # Panics
/// When it is not within 30 s.
pub async fn wait_established(client: &kube::Client, name: &str) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    eventually(
        &format!("CRD {name} established"),
        Duration::from_secs(30),
        || async {
            let conditions = crds.get(name).await.ok()?.status?.conditions?;
            conditions
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
                .then_some(())
        },
    )
    .await;
}

/// Installs the shipped CRDs (`crds/*.yaml`, as a user applies them) and waits until each is
/// established.
///
/// # Panics
/// If a file cannot be read or a CRD cannot be installed.
pub async fn install_shipped_crds(client: &kube::Client) {
    let crds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../crds");
    for file in [
        "gpuremediationpolicies.yaml",
        "gpuremediations.yaml",
        "gpuremediation-hardwarerecords.yaml",
    ] {
        let yaml = std::fs::read_to_string(crds.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        install_crd(client, &yaml).await;
    }
}

/// Creates `policy` and runs the controller in-process on the calling test's runtime, enforcing
/// only the policies labelled `e2e.gpuremediation.dev/scope=<scope>` (the policy's own label);
/// returns the sender that stops it.
///
/// # Panics
/// If the policy cannot be created.
pub async fn run_controller_over(
    client: &kube::Client,
    policy: &gpu_remediation_api::GpuRemediationPolicy,
    scope: &str,
) -> tokio::sync::oneshot::Sender<()> {
    Api::<gpu_remediation_api::GpuRemediationPolicy>::all(client.clone())
        .create(&PostParams::default(), policy)
        .await
        .unwrap_or_else(|e| panic!("creating policy {scope}: {e}"));
    let settings = gpu_remediator::Settings {
        policy_selector: Some(format!("e2e.gpuremediation.dev/scope={scope}")),
        pod_poll: Duration::from_millis(250),
        instance: Some(scope.to_owned()),
        ..gpu_remediator::Settings::default()
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(gpu_remediator::run(
        cluster().await.config(),
        settings,
        gpu_remediator::leader::Fence::standalone(),
        async move {
            let _ = stopped.await;
        },
    ));
    stop
}

/// Installs the project's own CRDs, as generated from the Rust types, once per test binary, and
/// waits until both kinds are served (listing them succeeds).
///
/// # Panics
/// If a CRD cannot be parsed or created, or the kinds are not served within 30s.
pub async fn install_generated_crds(client: &kube::Client) {
    use gpu_remediation_api::{GpuRemediation, GpuRemediationPolicy};
    use kube::api::ListParams;

    static INSTALLED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    INSTALLED
        .get_or_init(|| async {
            for (_, yaml) in gpu_remediation_api::crds::render_all() {
                install_crd(client, &yaml).await;
            }
            // Established is not yet discoverable by every client: list once per kind.
            eventually(
                "the remediation kinds to be served",
                Duration::from_secs(30),
                || async {
                    Api::<GpuRemediationPolicy>::all(client.clone())
                        .list(&ListParams::default())
                        .await
                        .ok()?;
                    Api::<GpuRemediation>::all(client.clone())
                        .list(&ListParams::default())
                        .await
                        .ok()
                },
            )
            .await;
        })
        .await;
}

/// A file of the repository, as text.
///
/// # Panics
/// When it cannot be read.
pub fn repo_file(path: &str) -> String {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// `kubectl apply -f <repo>/<file>` on the shared cluster (a shipped manifest, as a user applies
/// it).
///
/// # Panics
/// If kubectl cannot run or refuses the file.
pub async fn kubectl_apply(file: &str) {
    let cluster = cluster().await;
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(file);
    let output = std::process::Command::new(cluster.kubectl())
        .arg("--kubeconfig")
        .arg(cluster.kubeconfig_path())
        .args(["apply", "-f"])
        .arg(&path)
        .output()
        .expect("kubectl runs");
    assert!(
        output.status.success(),
        "kubectl apply -f {file}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The replacement the finished remediation `done` recorded (`status.replacement`) is the `kind`
/// object `name`.
///
/// # Panics
/// If it recorded none, or another.
pub fn assert_replaced_through(done: &gpu_remediation_api::GpuRemediation, kind: &str, name: &str) {
    let replacement = done
        .status
        .as_ref()
        .expect("status")
        .replacement
        .as_ref()
        .unwrap_or_else(|| panic!("the {kind} is recorded"));
    assert_eq!(
        (replacement.kind.as_str(), replacement.name.as_str()),
        (kind, name)
    );
}

/// A client acting as `user` (the admin impersonates them, so the API server authorises `user`).
///
/// # Panics
/// If the client cannot be built.
pub async fn client_as(user: &str) -> kube::Client {
    let mut config = cluster().await.config();
    config.auth_info.impersonate = Some(user.to_owned());
    kube::Client::try_from(config).expect("an impersonating client")
}

/// Binds the `ClusterRole` `role` to `user` (a `ClusterRoleBinding` named `{role}-{user}`).
///
/// # Panics
/// If the server refuses the binding.
pub async fn bind(admin: &kube::Client, user: &str, role: &str) {
    use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
    let binding: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("{role}-{user}")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }))
    .unwrap();
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await
        .unwrap_or_else(|e| panic!("binding {role} to {user}: {e}"));
}

/// A `ValidatingAdmissionPolicy` and its `Deny` binding, both named `name`, installed by
/// [`deny`]; [`Self::remove`] takes them away.
pub struct Denial {
    pub name: String,
}

/// Installs the admission policy `name` (`failurePolicy: Fail`) matching `rules` (its
/// `resourceRules`) with the one `validation`, bound with `Deny` (to `match_resources` where it is
/// not null); returns once the server refuses `probe` by this policy ([`until_refused_by`]: the
/// server loads a policy when its informers see it, which under load outlasts any fixed wait).
///
/// # Panics
/// If the server refuses the policy or its binding, or has not refused `probe` by this policy
/// within 30 s.
pub async fn deny<T, F, Fut>(
    client: &kube::Client,
    name: &str,
    rules: serde_json::Value,
    validation: serde_json::Value,
    match_resources: serde_json::Value,
    probe: F,
) -> Denial
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    use k8s_openapi::api::admissionregistration::v1::{
        ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    };
    let policy: ValidatingAdmissionPolicy = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": rules},
            "validations": [validation],
        },
    }))
    .unwrap();
    let mut spec = serde_json::json!({"policyName": name, "validationActions": ["Deny"]});
    if !match_resources.is_null() {
        spec["matchResources"] = match_resources;
    }
    let binding: ValidatingAdmissionPolicyBinding =
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}, "spec": spec})).unwrap();
    Api::<ValidatingAdmissionPolicy>::all(client.clone())
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();
    Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    until_refused_by(&format!("{name}'"), probe).await;
    Denial {
        name: name.to_owned(),
    }
}

impl Denial {
    /// Deletes the binding, then the policy.
    ///
    /// # Panics
    /// If the server refuses either deletion.
    pub async fn remove(self, client: &kube::Client) {
        use k8s_openapi::api::admissionregistration::v1::{
            ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
        };
        let delete = kube::api::DeleteParams::default();
        Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
            .delete(&self.name, &delete)
            .await
            .unwrap();
        Api::<ValidatingAdmissionPolicy>::all(client.clone())
            .delete(&self.name, &delete)
            .await
            .unwrap();
    }
}
