//! `validate` speaks the API server's words: for every refused policy fixture
//! (`crates/api/tests/fixtures/invalid/`), each cause the server gives for a server-side dry-run
//! create (strict field validation, as `kubectl apply` sends) is among `validate`'s findings with
//! the same field and the same message (see `same_words`). The sample policies and the recipes in
//! `config/` pass both. Also: `kubectl apply -f crds/` installs the CRDs (the
//! directory holds nothing else that kubectl would read).

mod common;

use std::{path::Path, process::Command, time::Duration};

use gpu_remediation_api::GpuRemediationPolicy;
use gpu_remediator::cli::validate::{Finding, Severity, check, load};
use kube::{Api, api::ListParams, core::DynamicObject};

const FIXTURES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../crates/api/tests/fixtures/invalid"
);
const CRDS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../crds");

/// `kubectl apply -f crds/`, the command a reader would type, then waits until policies are served.
/// Once per test binary: two concurrent client-side applies race (both see the CRD missing, one
/// create fails with `AlreadyExists`).
async fn apply_crds_directory() {
    static APPLIED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    APPLIED.get_or_init(apply_crds_directory_once).await;
}

async fn apply_crds_directory_once() {
    let cluster = common::cluster().await;
    let output = Command::new(cluster.kubectl())
        .args(["--kubeconfig", cluster.kubeconfig_path().to_str().unwrap()])
        .args(["apply", "-f", &format!("{CRDS}/")])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "kubectl apply -f crds/: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        stdout.lines().count(),
        3,
        "the three CRDs and nothing else: {stdout}"
    );
    let client = cluster.client();
    common::eventually("policies served", Duration::from_secs(30), || {
        let api = Api::<GpuRemediationPolicy>::all(client.clone());
        async move { api.list(&ListParams::default()).await.ok().map(|_| ()) }
    })
    .await;
}

/// The server's refusal of `document` (a dry-run create with strict field validation): each
/// cause as `(field, message)`; a refusal without causes (a strict decoding error) as one cause
/// without a field. The note that CEL rules were skipped (field `<nil>`) is no refusal of its own.
async fn server_refusal(document: &serde_json::Value) -> Vec<(String, String)> {
    let client = common::cluster().await.client();
    let params = common::dry_run();
    let mut request = kube::core::Request::new("/apis/gpuremediation.dev/v1alpha1/gpuremediationpolicies")
        .create(&params, serde_json::to_vec(document).unwrap())
        .unwrap();
    *request.uri_mut() = format!("{}&fieldValidation=Strict", request.uri())
        .parse()
        .unwrap();
    let status = match client.request::<DynamicObject>(request).await {
        Ok(_) => return Vec::new(),
        Err(kube::Error::Api(status)) => status,
        Err(error) => panic!("dry-run create: {error}"),
    };
    let causes = status.details.map(|d| d.causes).unwrap_or_default();
    if causes.is_empty() {
        return vec![(String::new(), status.message)];
    }
    causes
        .into_iter()
        .filter(|cause| !cause.message.contains("some validation rules were not checked"))
        .map(|cause| (cause.field, cause.message))
        .collect()
}

/// Whether validate's `ours` says what the server's `theirs` says: the same sentence, or the
/// same after the server's kind of error (`Invalid value: 0: `, `Required value: `,
/// `Forbidden: `), which says what validate's `file:line: field:` already shows. Validate may
/// add which entry is wrong in parentheses (`("NVIDIA H100 80GB" is not)`), which the server's
/// CEL rule cannot say.
fn same_words(theirs: &str, ours: &str) -> bool {
    let ours = ours
        .rsplit_once(" (\"")
        .filter(|(_, detail)| detail.ends_with("\" is not)"))
        .map_or(ours, |(words, _)| words);
    theirs == ours
        || theirs
            .strip_suffix(ours)
            .and_then(|p| p.strip_suffix(": "))
            .is_some_and(|kind| {
                ["Invalid value", "Required value", "Forbidden"]
                    .iter()
                    .any(|k| kind.starts_with(k))
            })
}

#[tokio::test]
async fn validate_gives_every_refused_fixture_the_servers_field_and_words() {
    apply_crds_directory().await;
    let files = load(&[Path::new(FIXTURES).to_owned()]).unwrap();
    assert!(files.len() >= 32, "{} fixtures", files.len());
    let mut failures = Vec::new();
    for file in &files {
        let document: serde_json::Value = serde_yaml::from_str(&file.text).unwrap();
        let server = server_refusal(&document).await;
        assert!(!server.is_empty(), "{}: the server accepted it", file.path);
        let findings: Vec<Finding> = check(std::slice::from_ref(file))
            .findings
            .into_iter()
            .filter(|f| f.severity == Severity::Error)
            .collect();
        for (field, message) in &server {
            let said = findings.iter().any(|f| {
                if field.is_empty() {
                    // No causes: the whole refusal is one sentence, e.g. `…: strict decoding error:
                    // unknown field "spec.x"`; validate's message is its last clause.
                    message.ends_with(&f.message)
                } else {
                    // A rule on the whole object is reported at `<nil>`; validate names the field.
                    (f.field == *field || field == "<nil>") && same_words(message, &f.message)
                }
            });
            if !said {
                let ours: Vec<String> = findings
                    .iter()
                    .map(|f| format!("{}: {}", f.field, f.message))
                    .collect();
                failures.push(format!(
                    "{}:\n  server:   {field}: {message}\n  validate: {}",
                    file.path,
                    ours.join("\n            ")
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[tokio::test]
async fn the_samples_and_recipes_in_config_pass_validate_and_the_server() {
    apply_crds_directory().await;
    let files = load(&[Path::new(e2e::WORKSPACE).join("config")]).unwrap();
    let mut policies = 0;
    for file in &files {
        let report = check(std::slice::from_ref(file));
        assert_eq!(
            report.count(Severity::Error),
            0,
            "{}: {:?}",
            file.path,
            report.findings
        );
        for document in file.text.split("\n---\n") {
            let document: serde_json::Value = serde_yaml::from_str(document).unwrap();
            if document["kind"] == "GpuRemediationPolicy" {
                policies += 1;
                assert_eq!(
                    server_refusal(&document).await,
                    Vec::<(String, String)>::new(),
                    "{}",
                    file.path
                );
            }
        }
    }
    assert!(policies >= 5, "the three samples and two recipes: {policies}");
}
