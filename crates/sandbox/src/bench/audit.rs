//! The API server's own record of who asked for what: an audit policy that logs, at `Metadata`
//! level, every request of the identities being measured (and nothing else, so the log stays
//! small), and the reader that counts them by verb and resource between two moments.
//!
//! `apiserver_request_total` on `/metrics` has no label naming the client, so it cannot separate
//! the controller's requests from the scheduler's, the kubelets' or the controller-manager's; the
//! audit log can, by username.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The audit policy: every stage but `ResponseStarted` of every request `users` make, and what
/// `extra_rules` (whole rules, indented as a policy's list items) select of the other users'.
#[must_use]
pub fn policy(users: &[&str], extra_rules: &[&str]) -> String {
    let users = flow_list(users);
    format!(
        "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [\"ResponseStarted\", \"Panic\"]
rules:
  - level: Metadata
    users: [{users}]
{extra}  - level: None
",
        extra = extra_rules.concat()
    )
}

/// `"a", "b"`: the items of a policy's flow-style list (`users: [...]`, `namespaces: [...]`).
#[must_use]
pub fn flow_list(items: &[&str]) -> String {
    items
        .iter()
        .map(|item| format!("\"{item}\""))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The API server flags that turn auditing on with `policy_file`, logging to `log_file`.
#[must_use]
pub fn apiserver_args(policy_file: &Path, log_file: &Path) -> Vec<String> {
    vec![
        format!("--audit-policy-file={}", policy_file.display()),
        format!("--audit-log-path={}", log_file.display()),
        // Written before the response, so the log is complete the moment a scenario ends.
        "--audit-log-mode=blocking".to_owned(),
    ]
}

/// One request, as counted: `verb resource[/subresource]`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct RequestKind {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`.
    pub verb: String,
    /// `nodes`, `pods/eviction`, `gpuremediations/status`, ...
    pub resource: String,
}

/// Requests of one user, by kind, and how many the server refused with 429.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct RequestCounts {
    /// Requests received, by kind.
    pub by_kind: BTreeMap<String, u64>,
    /// Requests answered 429 (a PDB refusing an eviction, or throttling), by kind.
    pub refused_429: BTreeMap<String, u64>,
    /// All requests received.
    pub total: u64,
}

/// Counts the requests `username` made in `log` (a slice of the audit log, e.g. what
/// [`AuditLog::since_mark`] returns for one scenario).
#[must_use]
pub fn count(log: &str, username: &str) -> RequestCounts {
    let mut counts = RequestCounts::default();
    for line in log.lines() {
        let Ok(event) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let text = |pointer: &str| event.pointer(pointer).and_then(serde_json::Value::as_str);
        if text("/user/username") != Some(username) {
            continue;
        }
        let resource = resource_of(&event);
        let kind = format!("{} {resource}", text("/verb").unwrap_or("?"));
        match text("/stage") {
            Some("RequestReceived") => {
                counts.total += 1;
                *counts.by_kind.entry(kind).or_default() += 1;
            }
            Some("ResponseComplete")
                if event
                    .pointer("/responseStatus/code")
                    .and_then(serde_json::Value::as_u64)
                    == Some(429) =>
            {
                *counts.refused_429.entry(kind).or_default() += 1;
            }
            _ => {}
        }
    }
    counts
}

/// One request of a user as the audit log recorded it: for listing every write of a scenario.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AuditedRequest {
    /// When the server received it (`requestReceivedTimestamp`).
    pub at: String,
    /// When the server answered it (`stageTimestamp` of `ResponseComplete`).
    pub done: String,
    /// `create`, `update`, `patch`, ...
    pub verb: String,
    /// `nodes`, `pods/eviction`, `gpuremediations/status`, ...
    pub resource: String,
    /// The object's name, where the request names one.
    pub name: Option<String>,
    /// The answer's HTTP code.
    pub code: Option<u64>,
}

impl AuditedRequest {
    /// Whether the request changes something (not a read, a list or a watch).
    #[must_use]
    pub fn is_write(&self) -> bool {
        !matches!(self.verb.as_str(), "get" | "list" | "watch")
    }
}

/// Every request `username` made in `log` whose answer is recorded, in the order answered.
#[must_use]
pub fn requests(log: &str, username: &str) -> Vec<AuditedRequest> {
    let mut listed = Vec::new();
    for line in log.lines() {
        let Ok(event) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let text = |pointer: &str| event.pointer(pointer).and_then(serde_json::Value::as_str);
        if text("/user/username") != Some(username) || text("/stage") != Some("ResponseComplete") {
            continue;
        }
        listed.push(AuditedRequest {
            at: text("/requestReceivedTimestamp").unwrap_or("?").to_owned(),
            done: text("/stageTimestamp").unwrap_or("?").to_owned(),
            verb: text("/verb").unwrap_or("?").to_owned(),
            resource: resource_of(&event),
            name: text("/objectRef/name").map(str::to_owned),
            code: event
                .pointer("/responseStatus/code")
                .and_then(serde_json::Value::as_u64),
        });
    }
    listed
}

fn resource_of(event: &serde_json::Value) -> String {
    let text = |pointer: &str| event.pointer(pointer).and_then(serde_json::Value::as_str);
    match (text("/objectRef/resource"), text("/objectRef/subresource")) {
        (Some(r), Some(s)) => format!("{r}/{s}"),
        (Some(r), None) => r.to_owned(),
        (None, _) => text("/requestURI")
            .unwrap_or("?")
            .split('?')
            .next()
            .unwrap_or("?")
            .to_owned(),
    }
}

/// An audit log being read in slices: each [`AuditLog::since_mark`] reads what was appended after
/// the last [`AuditLog::mark`].
#[derive(Debug, Clone)]
pub struct AuditLog {
    path: PathBuf,
    mark: u64,
}

impl AuditLog {
    /// The log at `path`, marked at its current end.
    #[must_use]
    pub fn new(path: &Path) -> Self {
        let mut log = Self {
            path: path.to_owned(),
            mark: 0,
        };
        log.mark();
        log
    }

    /// Remembers the log's current end.
    pub fn mark(&mut self) {
        self.mark = std::fs::metadata(&self.path).map_or(0, |m| m.len());
    }

    /// What was appended since the mark (empty if the log does not exist).
    #[must_use]
    pub fn since_mark(&self) -> String {
        use std::io::{Read, Seek, SeekFrom};
        let Ok(mut file) = std::fs::File::open(&self.path) else {
            return String::new();
        };
        let mut text = String::new();
        if file.seek(SeekFrom::Start(self.mark)).is_ok() {
            let _ = file.read_to_string(&mut text);
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(stage: &str, user: &str, verb: &str, resource: &str, sub: Option<&str>, code: u64) -> String {
        let mut object = serde_json::json!({"resource": resource});
        if let Some(sub) = sub {
            object["subresource"] = serde_json::json!(sub);
        }
        serde_json::json!({
            "stage": stage, "verb": verb, "user": {"username": user},
            "objectRef": object, "responseStatus": {"code": code},
        })
        .to_string()
    }

    #[test]
    fn requests_are_counted_once_by_verb_and_resource_and_429s_apart() {
        let me = "system:serviceaccount:bench:gpu-remediator";
        let log = [
            event("RequestReceived", me, "create", "pods", Some("eviction"), 0),
            event("ResponseComplete", me, "create", "pods", Some("eviction"), 429),
            event("RequestReceived", me, "create", "pods", Some("eviction"), 0),
            event("ResponseComplete", me, "create", "pods", Some("eviction"), 201),
            event("RequestReceived", me, "update", "nodes", None, 0),
            event("RequestReceived", "someone-else", "update", "nodes", None, 0),
            "not json".to_owned(),
        ]
        .join("\n");
        let counts = count(&log, me);
        assert_eq!(counts.total, 3);
        assert_eq!(counts.by_kind["create pods/eviction"], 2);
        assert_eq!(counts.by_kind["update nodes"], 1);
        assert_eq!(counts.refused_429["create pods/eviction"], 1);
    }

    #[test]
    fn every_answered_request_is_listed_in_order_with_its_object_and_code() {
        let me = "system:serviceaccount:bench:gpu-remediator";
        let mut patched = serde_json::from_str::<serde_json::Value>(&event(
            "ResponseComplete",
            me,
            "patch",
            "gpuremediations",
            Some("status"),
            200,
        ))
        .unwrap();
        patched["objectRef"]["name"] = serde_json::json!("gpu-1");
        let log = [
            event("RequestReceived", me, "list", "pods", None, 0),
            event("ResponseComplete", me, "list", "pods", None, 200),
            patched.to_string(),
            event("ResponseComplete", "someone-else", "update", "nodes", None, 200),
        ]
        .join("\n");
        let listed = requests(&log, me);
        assert_eq!(listed.len(), 2, "{listed:?}");
        assert!(!listed[0].is_write());
        assert_eq!(listed[1].resource, "gpuremediations/status");
        assert_eq!(listed[1].name.as_deref(), Some("gpu-1"));
        assert_eq!(listed[1].code, Some(200));
        assert!(listed[1].is_write());
    }

    #[test]
    fn the_policy_names_the_measured_users_then_the_extra_rules_then_nothing_else() {
        let text = policy(&["a", "b"], &["  - level: Request\n    verbs: [\"update\"]\n"]);
        assert!(
            text.contains("users: [\"a\", \"b\"]\n  - level: Request\n"),
            "{text}"
        );
        assert!(text.trim_end().ends_with("- level: None"), "{text}");
        let parsed: serde_json::Value = serde_yaml::from_str(&text).expect("a YAML policy");
        assert_eq!(parsed["rules"].as_array().map(Vec::len), Some(3), "{text}");
    }
}
