//! `gpu-remediator validate FILE…`: checks policy YAML offline, for `GitOps` CI and pre-commit.
//!
//! Each `GpuRemediationPolicy` document gets every check the API server's schema makes (through
//! `gpu_remediation_api::validate`, which also refuses a history TTL not longer than a rate or
//! attempts window and unknown fields), plus what only a view of all the files can say: two
//! documents defining one policy, and policies at the same priority whose selectors can pick the
//! same node (one of them would silently never act there). Findings read `file:line: field:
//! message`, in the API server's words (`server_words` rewords what does not deserialise).
//! Documents of other kinds are skipped, so a whole `GitOps` directory can be given.
//!
//! [`check`] is pure; [`load`] reads the files.

use std::{
    fmt,
    path::{Path, PathBuf},
};

use gpu_remediation_api::{GpuRemediationPolicy, validate::validate_document, violation::Violation};
use serde_json::Value;

use super::{locate::line_of, overlap::can_select_the_same_node, server_words::in_servers_words};

const API_VERSION: &str = "gpuremediation.dev/v1alpha1";
const KIND: &str = "GpuRemediationPolicy";

/// A file's name, as findings show it, and its text.
#[derive(Clone, Debug)]
pub struct PolicyFile {
    /// The path as given.
    pub path: String,
    /// The file's content.
    pub text: String,
}

/// How serious a finding is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    /// The server would refuse the policy, or the controller would report it `Invalid`.
    Error,
    /// Valid, but probably not what was meant.
    Warning,
}

/// One problem, where it is written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// The file.
    pub path: String,
    /// The line (1-based) of the field, or of the nearest written parent.
    pub line: usize,
    /// The field, as the API server names it (`spec.triggers[0].status`); empty for the document.
    pub field: String,
    /// What is wrong.
    pub message: String,
    /// Error or warning.
    pub severity: Severity,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: ", self.path, self.line)?;
        if !self.field.is_empty() {
            write!(f, "{}: ", self.field)?;
        }
        if self.severity == Severity::Warning {
            f.write_str("warning: ")?;
        }
        f.write_str(&self.message)
    }
}

/// Everything found in a set of files.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Errors and warnings, in file order.
    pub findings: Vec<Finding>,
    /// `GpuRemediationPolicy` documents checked.
    pub policies: usize,
    /// Documents of other kinds, skipped.
    pub skipped: usize,
}

impl Report {
    /// Findings of `severity`.
    #[must_use]
    pub fn count(&self, severity: Severity) -> usize {
        self.findings.iter().filter(|f| f.severity == severity).count()
    }

    /// Whether the files pass: no errors, and no warnings either when `strict`.
    #[must_use]
    pub fn passes(&self, strict: bool) -> bool {
        self.count(Severity::Error) == 0 && (!strict || self.count(Severity::Warning) == 0)
    }

    /// One line for the end of the output.
    #[must_use]
    pub fn summary(&self) -> String {
        format!(
            "{} policies checked, {} errors, {} warnings, {} other documents skipped",
            self.policies,
            self.count(Severity::Error),
            self.count(Severity::Warning),
            self.skipped
        )
    }
}

/// One YAML document of a file: its text and the file line it starts on.
struct Document<'a> {
    text: String,
    first_line: usize,
    path: &'a str,
}

impl Document<'_> {
    fn finding(&self, field: &str, message: impl Into<String>, severity: Severity) -> Finding {
        Finding {
            path: self.path.to_owned(),
            line: line_of(&self.text, self.first_line, field).unwrap_or(self.first_line),
            field: field.to_owned(),
            message: message.into(),
            severity,
        }
    }
}

/// Splits a file on `---` lines. Documents holding only comments are kept (and found empty).
fn documents(file: &PolicyFile) -> Vec<Document<'_>> {
    let mut out = Vec::new();
    let mut text = String::new();
    let mut first_line = 1;
    for (i, line) in file.text.lines().enumerate() {
        if line.trim_end() == "---" || line.starts_with("--- ") {
            out.push(Document {
                text: std::mem::take(&mut text),
                first_line,
                path: &file.path,
            });
            first_line = i + 2;
        } else {
            text.push_str(line);
            text.push('\n');
        }
    }
    out.push(Document {
        text,
        first_line,
        path: &file.path,
    });
    out
}

/// A policy that parsed, for the checks across files.
struct Parsed {
    /// No errors of its own: only such policies are compared for overlaps (an invalid one
    /// already fails, and its selector may be what is wrong).
    valid: bool,
    policy: GpuRemediationPolicy,
    path: String,
    line: usize,
    selector_finding: Finding,
}

/// Checks every policy document in `files`, each on its own and all together.
#[must_use]
pub fn check(files: &[PolicyFile]) -> Report {
    let mut report = Report::default();
    let mut parsed = Vec::new();
    for file in files {
        for document in documents(file) {
            check_document(&document, &mut report, &mut parsed);
        }
    }
    check_across(&parsed, &mut report);
    report
}

fn check_document(document: &Document<'_>, report: &mut Report, parsed: &mut Vec<Parsed>) {
    let value: Value = match serde_yaml::from_str(&document.text) {
        Ok(value) => value,
        Err(error) => {
            let line = error
                .location()
                .map_or(document.first_line, |l| document.first_line + l.line() - 1);
            report.findings.push(Finding {
                path: document.path.to_owned(),
                line,
                field: String::new(),
                message: format!("not valid YAML: {error}"),
                severity: Severity::Error,
            });
            return;
        }
    };
    if value.get("kind").and_then(Value::as_str) != Some(KIND) {
        if !value.is_null() {
            report.skipped += 1;
        }
        return;
    }
    report.policies += 1;
    let api_version = value.get("apiVersion").and_then(Value::as_str);
    if api_version != Some(API_VERSION) {
        report.findings.push(document.finding(
            "apiVersion",
            format!(
                "must be {API_VERSION} (found {})",
                api_version.unwrap_or("nothing")
            ),
            Severity::Error,
        ));
    }
    let named = value
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .is_some_and(|n| !n.is_empty());
    if !named {
        report.findings.push(document.finding(
            "metadata.name",
            "Required value: a policy needs a name (generateName would create a new policy on every sync)",
            Severity::Error,
        ));
    }
    let violations: Vec<Violation> = validate_document(&value)
        .into_iter()
        .flat_map(|v| in_servers_words(v, &value))
        .collect();
    let valid = named && violations.is_empty() && api_version == Some(API_VERSION);
    report.findings.extend(
        violations
            .iter()
            .map(|v: &Violation| document.finding(&v.field, &v.message, Severity::Error)),
    );
    if let (true, Ok(policy)) = (named, serde_json::from_value::<GpuRemediationPolicy>(value)) {
        parsed.push(Parsed {
            valid,
            line: line_of(&document.text, document.first_line, "metadata.name")
                .unwrap_or(document.first_line),
            path: document.path.to_owned(),
            selector_finding: document.finding("spec.nodeSelector", "", Severity::Warning),
            policy,
        });
    }
}

fn name(parsed: &Parsed) -> &str {
    parsed.policy.metadata.name.as_deref().unwrap_or_default()
}

/// Duplicate names, and same-priority policies whose selectors can meet on one node.
fn check_across(parsed: &[Parsed], report: &mut Report) {
    for (i, later) in parsed.iter().enumerate() {
        let earlier = &parsed[..i];
        if let Some(first) = earlier.iter().find(|p| name(p) == name(later)) {
            report.findings.push(Finding {
                path: later.path.clone(),
                line: later.line,
                field: "metadata.name".to_owned(),
                message: format!(
                    "policy {} is already defined at {}:{}; applying both, one silently replaces the other",
                    name(later),
                    first.path,
                    first.line
                ),
                severity: Severity::Error,
            });
            continue;
        }
        for other in earlier {
            if !(other.valid && later.valid)
                || name(other) == name(later)
                || other.policy.spec.priority != later.policy.spec.priority
                || !can_select_the_same_node(
                    &other.policy.spec.node_selector,
                    &later.policy.spec.node_selector,
                )
            {
                continue;
            }
            // Governance gives a node to the first name: the other one is the policy that yields.
            let (winner, loser) = if name(other) < name(later) {
                (other, later)
            } else {
                (later, other)
            };
            report.findings.push(Finding {
                message: format!(
                    "can select the same nodes as policy {} ({}:{}) at the same priority {}: {} governs \
                     such nodes only because its name sorts first, and {} reports Overlap and never acts \
                     on them. Give the one that should act a higher spec.priority, or make the selectors \
                     disjoint",
                    name(other),
                    other.path,
                    other.line,
                    later.policy.spec.priority,
                    name(winner),
                    name(loser),
                ),
                ..later.selector_finding.clone()
            });
        }
    }
}

/// Why the files could not be read.
#[derive(Debug, thiserror::Error)]
#[error("reading {path}: {source}")]
pub struct LoadPolicyFilesError {
    /// The file or directory.
    pub path: PathBuf,
    /// The IO error.
    pub source: std::io::Error,
}

/// Reads each path; a directory gives its `*.yaml` and `*.yml` files, recursively, sorted.
pub fn load(paths: &[PathBuf]) -> Result<Vec<PolicyFile>, LoadPolicyFilesError> {
    let mut files = Vec::new();
    for path in paths {
        load_path(path, true, &mut files)?;
    }
    Ok(files)
}

fn load_path(path: &Path, given: bool, files: &mut Vec<PolicyFile>) -> Result<(), LoadPolicyFilesError> {
    let error = |source| LoadPolicyFilesError {
        path: path.to_owned(),
        source,
    };
    if path.is_dir() {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(error)?
            .map(|entry| entry.map(|e| e.path()))
            .collect::<Result<_, _>>()
            .map_err(error)?;
        entries.sort();
        for entry in entries {
            load_path(&entry, false, files)?;
        }
        return Ok(());
    }
    let is_yaml = path.extension().is_some_and(|e| e == "yaml" || e == "yml");
    if given || is_yaml {
        files.push(PolicyFile {
            path: path.display().to_string(),
            text: std::fs::read_to_string(path).map_err(error)?,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, text: &str) -> PolicyFile {
        PolicyFile {
            path: path.to_owned(),
            text: text.to_owned(),
        }
    }

    fn policy(name: &str, priority: i32, selector: &str) -> String {
        format!(
            "apiVersion: gpuremediation.dev/v1alpha1\nkind: GpuRemediationPolicy\nmetadata:\n  name: {name}\nspec:\n  \
             priority: {priority}\n  nodeSelector:\n    matchLabels: {selector}\n  triggers:\n    - conditionType: \
             GpuHealthy\n      status: \"False\"\n"
        )
    }

    fn lines(report: &Report) -> Vec<String> {
        report.findings.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn a_policy_that_does_not_decode_is_reported_and_the_others_still_checked() {
        let text = format!(
            "{}---\n{}",
            policy("gpus", 0, "{gpu: \"true\"}"),
            policy("huge", 0, "{gpu: \"b\"}").replace("priority: 0", "priority: 3000000000")
        );
        let report = check(&[file("p.yaml", &text)]);
        let found = lines(&report);
        assert_eq!(report.policies, 2);
        // The schema's bound (an i32) names it, in the API server's words; the valid one passes.
        assert!(!found.is_empty(), "the undecodable policy is reported");
        assert!(
            found.iter().all(|f| f.starts_with("p.yaml:18: spec.priority: ")),
            "only the undecodable policy, at its field: {found:?}"
        );
    }

    #[test]
    fn a_valid_policy_has_no_findings() {
        let report = check(&[file("p.yaml", &policy("gpus", 0, "{gpu: \"true\"}"))]);
        assert_eq!(lines(&report), Vec::<String>::new());
        assert_eq!(report.policies, 1);
        assert!(report.passes(true));
    }

    #[test]
    fn a_violation_is_reported_at_the_line_of_its_field_in_its_document() {
        let text = format!(
            "kind: ConfigMap\nmetadata: {{name: other}}\n---\n{}  drain:\n    gracePeriodSeconds: -1\n",
            policy("gpus", 0, "{}")
        );
        let report = check(&[file("gitops/p.yaml", &text)]);
        let found = lines(&report);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].starts_with("gitops/p.yaml:16: spec.drain.gracePeriodSeconds: "),
            "{found:?}"
        );
        assert_eq!((report.policies, report.skipped), (1, 1));
        assert!(!report.passes(false));
    }

    #[test]
    fn a_quarantine_hysteresis_out_of_bounds_and_a_zero_quarantine_limit_are_reported_at_their_lines() {
        let text = format!(
            "{}  quarantine:\n    max: 0\n    hysteresis: 2h\n",
            policy("gpus", 0, "{}")
        );
        let found = lines(&check(&[file("p.yaml", &text)]));
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found
                .iter()
                .any(|l| l.contains("spec.quarantine.max: a count must be at least 1")),
            "{found:?}"
        );
        assert!(
            found.iter().any(
                |l| l.contains("spec.quarantine.hysteresis: quarantine.hysteresis must be from 1s to 1h")
            ),
            "{found:?}"
        );
    }

    #[test]
    fn a_document_that_is_not_yaml_is_an_error_at_the_line_the_parser_stopped() {
        let report = check(&[file("bad.yaml", "kind: GpuRemediationPolicy\nspec: [\n")]);
        assert_eq!(report.findings.len(), 1);
        assert_eq!(report.findings[0].line, 3, "{}", report.findings[0]);
        assert!(report.findings[0].message.starts_with("not valid YAML"));
    }

    #[test]
    fn a_policy_without_a_name_or_with_another_api_version_is_refused() {
        let text = policy("x", 0, "{}")
            .replace("gpuremediation.dev/v1alpha1", "gpuremediation.dev/v1")
            .replace("  name: x\n", "  generateName: x-\n");
        let fields: Vec<String> = check(&[file("p.yaml", &text)])
            .findings
            .into_iter()
            .map(|f| format!("{}@{}", f.field, f.line))
            .collect();
        assert_eq!(fields, ["apiVersion@1", "metadata.name@3"]);
    }

    #[test]
    fn two_documents_defining_one_policy_are_an_error_naming_both_places() {
        let report = check(&[
            file("a.yaml", &policy("gpus", 0, "{a: b}")),
            file("b.yaml", &policy("gpus", 5, "{c: d}")),
        ]);
        assert_eq!(
            lines(&report),
            [
                "b.yaml:4: metadata.name: policy gpus is already defined at a.yaml:4; applying both, one silently replaces the other"
            ]
        );
    }

    #[test]
    fn overlapping_selectors_at_one_priority_warn_and_name_the_policy_that_would_never_act() {
        let report = check(&[
            file("enforce.yaml", &policy("h100-enforce", 0, "{gpu: \"true\"}")),
            file("dry-run.yaml", &policy("all-dry-run", 0, "{}")),
        ]);
        let found = lines(&report);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].starts_with("dry-run.yaml:7: spec.nodeSelector: warning: can select the same nodes as policy h100-enforce (enforce.yaml:4) at the same priority 0: all-dry-run governs"),
            "{}",
            found[0]
        );
        assert!(found[0].contains("h100-enforce reports Overlap"), "{}", found[0]);
        assert!(report.passes(false));
        assert!(!report.passes(true));
    }

    #[test]
    fn overlapping_selectors_at_different_priorities_or_disjoint_selectors_are_fine() {
        let report = check(&[
            file("a.yaml", &policy("low", 0, "{gpu: \"true\"}")),
            file("b.yaml", &policy("high", 10, "{}")),
            file("c.yaml", &policy("a100", 10, "{product: A100, gpu: \"true\"}")),
            file("d.yaml", &policy("h100", 10, "{product: H100}")),
        ]);
        let found = lines(&report);
        // high overlaps both a100 and h100 at priority 10; a100 and h100 are disjoint.
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found.iter().all(|f| f.contains("policy high")), "{found:?}");
    }

    fn repo_path(relative: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(relative)
    }

    #[test]
    fn every_invalid_policy_of_the_schema_tests_is_refused_at_the_line_of_its_field() {
        let files = load(&[repo_path("crates/api/tests/fixtures/invalid")]).unwrap();
        assert!(files.len() >= 32, "{} fixtures", files.len());
        for file in files {
            let report = check(std::slice::from_ref(&file));
            let errors: Vec<&Finding> = report
                .findings
                .iter()
                .filter(|f| f.severity == Severity::Error)
                .collect();
            assert!(!errors.is_empty(), "{} was accepted", file.path);
            let Some(field) = file.text.lines().find_map(|l| l.strip_prefix("# field: ")) else {
                continue;
            };
            let finding = errors
                .iter()
                .find(|f| f.field == field)
                .unwrap_or_else(|| panic!("{}: no error on {field}: {errors:?}", file.path));
            let written = file.text.lines().nth(finding.line - 1).unwrap();
            // The field's line, or (for a field not written) its nearest written parent's.
            let keys: Vec<&str> = field.split('.').map(|k| k.split('[').next().unwrap()).collect();
            assert!(
                keys.iter().any(|k| written.contains(&format!("{k}:")))
                    || written.trim_start().starts_with("- "),
                "{}: {field} reported at line {}: {written:?}",
                file.path,
                finding.line
            );
        }
    }

    #[test]
    fn the_sample_policies_in_config_pass_with_their_overlap_reported_as_a_warning() {
        let report = check(&load(&[repo_path("config")]).unwrap());
        assert_eq!(report.count(Severity::Error), 0, "{:?}", report.findings);
        assert!(report.policies >= 3, "{}", report.summary());
        assert!(report.passes(false));
    }
}
