//! Fields of a policy document the CRD's schema does not know: what the API server would prune
//! (or refuse), found before a file meets a server.

use kube::CustomResourceExt;
use serde_json::Value;

use crate::{policy::GpuRemediationPolicy, violation::Violation};

/// Fields of a policy document that the schema does not know, which the server would prune (or,
/// with strict field validation, as kubectl asks for, refuse). A misspelt `maxConcurent` is the
/// typical case: pruned silently, the default applies and nobody notices.
#[must_use]
pub fn unknown_fields(document: &Value) -> Vec<Violation> {
    let crd = GpuRemediationPolicy::crd();
    let schema = crd
        .spec
        .versions
        .first()
        .and_then(|v| v.schema.as_ref())
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .map(|s| serde_json::to_value(s).expect("a schema serialises to JSON"))
        .expect("the policy CRD has a schema");
    let mut out = Vec::new();
    let Some(root) = document.as_object() else {
        return out;
    };
    for (key, value) in root {
        match key.as_str() {
            "apiVersion" | "kind" | "metadata" => {}
            _ => walk_unknown(
                value,
                schema.get("properties").and_then(|p| p.get(key)),
                key,
                &mut out,
            ),
        }
    }
    out
}

fn walk_unknown(value: &Value, schema: Option<&Value>, path: &str, out: &mut Vec<Violation>) {
    let Some(schema) = schema else {
        out.push(Violation::new(path, "unknown field"));
        return;
    };
    if schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true)) {
        return;
    }
    match value {
        Value::Object(map) => {
            if let Some(properties) = schema.get("properties") {
                for (key, child) in map {
                    walk_unknown(child, properties.get(key), &format!("{path}.{key}"), out);
                }
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                walk_unknown(item, schema.get("items"), &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn fields(violations: &[Violation]) -> Vec<&str> {
        violations.iter().map(|v| v.field.as_str()).collect()
    }

    #[test]
    fn a_misspelt_field_is_reported_with_its_path_and_the_template_may_hold_anything() {
        let document = json!({
            "apiVersion": "gpuremediation.dev/v1alpha1",
            "kind": "GpuRemediationPolicy",
            "metadata": {"name": "p"},
            "spec": {
                "triggers": [{"conditionType": "GpuHealthy", "status": "False", "reason": "XID79"}],
                "safety": {"maxConcurent": 2},
                "replacement": {"strategy": "Template", "template": {"apiVersion": "v1", "kind": "X", "anything": 1}},
            },
        });
        assert_eq!(
            fields(&unknown_fields(&document)),
            ["spec.safety.maxConcurent", "spec.triggers[0].reason"]
        );
    }
}
