//! The policies a person might write: every fixture in `tests/fixtures/invalid/` (one per rule) is
//! refused, client-side by the CRD's own CEL rules where its rule is a CEL rule, and offline by
//! `validate`; every sample in `config/` is accepted by both. The e2e test
//! `e2e/tests/crd_validation.rs` checks the same files against a real API server.

use std::{collections::BTreeSet, fs, path::PathBuf};

use gpu_remediation_api::{
    GpuRemediationPolicy,
    validate::{validate_document, validate_policy},
};
use kube::CustomResourceExt;
use kube_cel::Validator;
use serde_json::Value;

/// kube-cel 0.8 (on the `cel` crate 0.13) has no `type()` function, and its `||` does not absorb
/// an error on its left the way CEL (and the API server) does, so the two int-or-percent rules
/// (`type(self) != int || self >= 1`, `type(self) != string || self.matches(..)`) cannot be
/// evaluated client-side. They are removed from the schema handed to kube-cel; the server test
/// covers them, and the first test below proves this is the whole gap.
fn evaluable_client_side(rule: &str) -> bool {
    !rule.contains("type(self)")
}

/// Fixtures refused by a CEL rule that kube-cel cannot evaluate (see `evaluable_client_side`).
const REFUSED_BY_CEL_ONLY_SERVER_SIDE: &[&str] = &[
    "03-count-below-one.yaml",
    "04-percent-out-of-range.yaml",
    "34-count-above-maximum.yaml",
];

/// Fixtures refused by the schema's structural checks rather than by a CEL rule, so client-side CEL
/// has nothing to evaluate for them; only the server (and `validate`) refuse them.
const REFUSED_BY_STRUCTURE_NOT_CEL: &[(&str, &str)] = &[
    (
        "10-template-without-kind.yaml",
        "x-kubernetes-embedded-resource requires apiVersion and kind",
    ),
    ("13-triggers-missing.yaml", "required"),
    ("15-trigger-status-not-enum.yaml", "enum"),
    ("17-reason-duplicate.yaml", "x-kubernetes-list-type: set"),
    ("18-action-not-enum.yaml", "enum"),
    ("19-mode-not-enum.yaml", "enum"),
    ("20-strategy-not-enum.yaml", "enum"),
    ("21-on-timeout-not-enum.yaml", "enum"),
    ("24-selector-operator-not-enum.yaml", "enum"),
    (
        "32-unknown-field.yaml",
        "pruning, refused under strict field validation",
    ),
    ("33-priority-out-of-range.yaml", "maximum"),
    ("98-drain-gangs-not-enum.yaml", "enum"),
    ("99-drain-gang-labels-too-many.yaml", "maxItems"),
];

struct Fixture {
    file: String,
    expect: String,
    field: Option<String>,
    document: Value,
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn yaml_files(dir: &PathBuf) -> Vec<(String, String)> {
    let mut files: Vec<_> = fs::read_dir(dir)
        .unwrap_or_else(|err| panic!("{}: {err}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .map(|path| {
            (
                path.file_name().unwrap().to_string_lossy().into_owned(),
                fs::read_to_string(&path).unwrap(),
            )
        })
        .collect();
    files.sort();
    files
}

fn fixtures() -> Vec<Fixture> {
    yaml_files(&repo().join("crates/api/tests/fixtures/invalid"))
        .into_iter()
        .map(|(file, text)| {
            let header = |key: &str| {
                text.lines()
                    .find_map(|l| l.strip_prefix(&format!("# {key}: ")))
                    .map(str::to_owned)
            };
            let expect = header("expect").unwrap_or_else(|| panic!("{file} lacks a `# expect:` line"));
            let document = serde_yaml::from_str(&text).unwrap_or_else(|err| panic!("{file}: {err}"));
            Fixture {
                field: header("field"),
                expect,
                document,
                file,
            }
        })
        .collect()
}

/// Every `GpuRemediationPolicy` under `config/` (the XID catalog and others are skipped).
fn samples() -> Vec<(String, Value)> {
    yaml_files(&repo().join("config"))
        .into_iter()
        .map(|(file, text)| (file, serde_yaml::from_str::<Value>(&text).unwrap()))
        .filter(|(_, doc)| doc.get("kind").and_then(Value::as_str) == Some("GpuRemediationPolicy"))
        .collect()
}

fn policy_schema() -> Value {
    let crd = GpuRemediationPolicy::crd();
    serde_json::to_value(
        crd.spec.versions[0]
            .schema
            .as_ref()
            .unwrap()
            .open_api_v3_schema
            .as_ref()
            .unwrap(),
    )
    .unwrap()
}

/// Every CEL rule in the schema, as `(rule, message)`.
fn cel_rules(schema: &Value, out: &mut Vec<(String, String)>) {
    match schema {
        Value::Object(map) => {
            for rule in map
                .get("x-kubernetes-validations")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                out.push((
                    rule["rule"].as_str().unwrap().to_owned(),
                    rule["message"].as_str().unwrap().to_owned(),
                ));
            }
            map.values().for_each(|v| cel_rules(v, out));
        }
        Value::Array(items) => items.iter().for_each(|v| cel_rules(v, out)),
        _ => {}
    }
}

/// The schema with the rules kube-cel cannot evaluate removed.
fn client_side_schema(schema: &Value) -> Value {
    match schema {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    let v = if k == "x-kubernetes-validations" {
                        Value::Array(
                            v.as_array()
                                .unwrap()
                                .iter()
                                .filter(|r| evaluable_client_side(r["rule"].as_str().unwrap()))
                                .cloned()
                                .collect(),
                        )
                    } else {
                        client_side_schema(v)
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(client_side_schema).collect()),
        other => other.clone(),
    }
}

fn refused_by_cel(fixture: &Fixture) -> bool {
    let mut rules = Vec::new();
    cel_rules(&policy_schema(), &mut rules);
    rules.iter().any(|(_, message)| message.contains(&fixture.expect))
}

fn defaults_policy() -> Value {
    serde_json::json!({
        "apiVersion": "gpuremediation.dev/v1alpha1",
        "kind": "GpuRemediationPolicy",
        "metadata": {"name": "defaults"},
        "spec": {"triggers": [{"conditionType": "GpuHealthy", "status": "False"}]},
    })
}

#[test]
fn kube_cel_fails_only_on_the_rules_listed_as_not_evaluable_client_side() {
    let errors = Validator::new()
        .validate_with_defaults(&policy_schema(), &defaults_policy(), None)
        .unwrap_err();
    let failing: BTreeSet<_> = errors.iter().map(|e| e.rule.clone()).collect();
    let mut rules = Vec::new();
    cel_rules(&policy_schema(), &mut rules);
    let listed: BTreeSet<_> = rules
        .into_iter()
        .map(|(rule, _)| rule)
        .filter(|r| !evaluable_client_side(r))
        .collect();
    assert_eq!(failing, listed, "{errors:?}");
}

#[test]
fn there_are_at_least_twenty_invalid_fixtures_each_expecting_a_different_refusal() {
    let fixtures = fixtures();
    assert!(fixtures.len() >= 20, "only {} fixtures", fixtures.len());
    let mut seen = BTreeSet::new();
    for f in &fixtures {
        assert!(
            seen.insert((f.expect.clone(), f.field.clone())),
            "{} repeats another fixture's rule",
            f.file
        );
    }
}

#[test]
fn the_fixtures_outside_cel_are_exactly_the_structural_ones() {
    let structural: Vec<_> = fixtures()
        .into_iter()
        .filter(|f| !refused_by_cel(f))
        .map(|f| f.file)
        .collect();
    let listed: Vec<_> = REFUSED_BY_STRUCTURE_NOT_CEL
        .iter()
        .map(|(file, _)| (*file).to_owned())
        .collect();
    assert_eq!(structural, listed);
}

#[test]
fn every_fixture_refused_by_a_cel_rule_is_refused_client_side_with_its_message_and_field() {
    let schema = client_side_schema(&policy_schema());
    let validator = Validator::new();
    let mut checked = 0;
    let client_side =
        |f: &Fixture| refused_by_cel(f) && !REFUSED_BY_CEL_ONLY_SERVER_SIDE.contains(&f.file.as_str());
    for fixture in fixtures().iter().filter(|f| client_side(f)) {
        let errors = validator
            .validate_with_defaults(&schema, &fixture.document, None)
            .expect_err(&format!("{} passed client-side CEL", fixture.file));
        let hit = errors.iter().find(|e| e.message.contains(&fixture.expect));
        let hit =
            hit.unwrap_or_else(|| panic!("{}: no error says {:?}: {errors:?}", fixture.file, fixture.expect));
        if let Some(field) = &fixture.field {
            assert_eq!(&hit.field_path, field, "{}", fixture.file);
        }
        checked += 1;
    }
    assert!(checked >= 20, "only {checked} fixtures exercised CEL rules");
}

fn structural(fixture: &Fixture) -> bool {
    REFUSED_BY_STRUCTURE_NOT_CEL
        .iter()
        .any(|(file, _)| *file == fixture.file)
}

#[test]
fn every_fixture_is_refused_offline_by_validate_document() {
    for fixture in fixtures() {
        let violations = validate_document(&fixture.document);
        // A document that does not deserialise (an enum value, a malformed duration) is refused in
        // serde's words; every other refusal uses the schema's message.
        let undeserialisable = violations.iter().any(|v| {
            ["unknown variant", "invalid duration"]
                .iter()
                .any(|p| v.message.starts_with(p))
        });
        let in_own_words = !undeserialisable && !structural(&fixture);
        assert!(
            violations
                .iter()
                .any(|v| fixture.field.as_ref().is_none_or(|field| &v.field == field)
                    && (!in_own_words || v.message.contains(&fixture.expect))),
            "{}: expected {:?} at {:?}, got {violations:?}",
            fixture.file,
            fixture.expect,
            fixture.field,
        );
    }
}

#[test]
fn there_are_the_three_promised_samples() {
    let names: Vec<_> = samples().into_iter().map(|(file, _)| file).collect();
    for wanted in [
        "policy-h100-replace.yaml",
        "policy-dry-run.yaml",
        "policy-manual-snr.yaml",
    ] {
        assert!(
            names.iter().any(|n| n == wanted),
            "config/{wanted} is missing: {names:?}"
        );
    }
}

#[test]
fn every_sample_policy_deserialises_and_passes_validate() {
    for (file, document) in samples() {
        assert_eq!(validate_document(&document), vec![], "config/{file}");
        let policy: GpuRemediationPolicy = serde_json::from_value(document).unwrap();
        assert_eq!(validate_policy(&policy), vec![], "config/{file}");
    }
}

#[test]
fn every_sample_policy_passes_the_schemas_cel_rules_client_side() {
    let schema = client_side_schema(&policy_schema());
    for (file, document) in samples() {
        if let Err(errors) = Validator::new().validate_with_defaults(&schema, &document, None) {
            panic!("config/{file}: {errors:?}");
        }
    }
}

#[test]
fn a_policy_of_defaults_passes_the_cel_rules_so_every_default_is_valid() {
    let document = defaults_policy();
    if let Err(errors) =
        Validator::new().validate_with_defaults(&client_side_schema(&policy_schema()), &document, None)
    {
        panic!("{errors:?}");
    }
    assert_eq!(validate_document(&document), vec![]);
}

#[test]
fn every_cel_rule_of_the_policy_crd_has_a_fixture_that_breaks_it() {
    let mut rules = Vec::new();
    cel_rules(&policy_schema(), &mut rules);
    let fixtures = fixtures();
    let untested: Vec<_> = rules
        .into_iter()
        .filter(|(_, message)| !fixtures.iter().any(|f| message.contains(&f.expect)))
        .collect();
    assert!(
        untested.is_empty(),
        "rules without a fixture in tests/fixtures/invalid/: {untested:#?}"
    );
}
