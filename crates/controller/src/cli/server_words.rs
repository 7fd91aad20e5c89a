//! The API server's words for what `gpu_remediation_api::validate::validate_document` reports in
//! its own: a document that does not deserialise gets serde's message (`unknown variant`, `invalid
//! duration`, an integer out of range), and a few structural rules have messages of their own.
//! The server checks those against the CRD's `OpenAPI` schema, so the schema (the same one
//! `crds/` holds) says how it words them: `Unsupported value: "x": supported values: …` for an
//! enum, the duration rule's message, `… in body should be less than or equal to N` for a bound
//! (and, from Kubernetes 1.37, a second cause for a value past its integer format: `Checked value
//! must be of type integer with format int32 in …`), `Required value` for a required field left
//! out, `unknown field "spec.x"` under strict field validation. Pure.

use std::sync::LazyLock;

use gpu_remediation_api::{GpuRemediationPolicy, schema::messages, violation::Violation};
use kube::CustomResourceExt as _;
use serde_json::Value;

/// The policy CRD's `OpenAPI` schema, as JSON.
static SCHEMA: LazyLock<Value> = LazyLock::new(|| {
    let crd = GpuRemediationPolicy::crd();
    crd.spec
        .versions
        .first()
        .and_then(|v| v.schema.as_ref())
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .map(|s| serde_json::to_value(s).expect("a schema serialises to JSON"))
        .expect("the policy CRD has a schema")
});

/// One step of a field path: `spec`, or `[0]`.
enum Step<'a> {
    Key(&'a str),
    Index(usize),
}

/// `spec.triggers[0].status` as steps; `None` for a path that is not written that way.
fn steps(field: &str) -> Option<Vec<Step<'_>>> {
    let mut out = Vec::new();
    for part in field.split('.') {
        let (key, mut rest) = part.split_once('[').map_or((part, ""), |(k, r)| (k, r));
        if !key.is_empty() {
            out.push(Step::Key(key));
        }
        while !rest.is_empty() {
            let (index, after) = rest.split_once(']')?;
            out.push(Step::Index(index.parse().ok()?));
            rest = after.strip_prefix('[').unwrap_or(after);
        }
    }
    Some(out)
}

/// The schema of the field at `steps` (`properties` for keys, `items` for indices).
fn schema_at<'a>(schema: &'a Value, steps: &[Step<'_>]) -> Option<&'a Value> {
    steps.iter().try_fold(schema, |node, step| match step {
        Step::Key(key) => node.get("properties")?.get(*key),
        Step::Index(_) => node.get("items"),
    })
}

/// The document's value at `steps`.
fn value_at<'a>(document: &'a Value, steps: &[Step<'_>]) -> Option<&'a Value> {
    steps.iter().try_fold(document, |node, step| match step {
        Step::Key(key) => node.get(*key),
        Step::Index(i) => node.get(*i),
    })
}

/// `violation` as the API server would word it for `document`: one cause, or two for an integer
/// past both its bound and its format (a 1.37 server gives both; older ones only the bound, and
/// `validate` says what every supported minor says). Unchanged when the server's words are
/// already validate's (the CRD's CEL rules use the messages `validate` uses).
#[must_use]
pub fn in_servers_words(violation: Violation, document: &Value) -> Vec<Violation> {
    let Some(path) = steps(&violation.field) else {
        return vec![violation];
    };
    let (schema, value) = (schema_at(&SCHEMA, &path), value_at(document, &path));
    let message = &violation.message;
    let servers = if message == "unknown field" {
        vec![format!("unknown field \"{}\"", violation.field)]
    } else if message.starts_with("unknown variant `") {
        unsupported(schema, value).into_iter().collect()
    } else if message.starts_with("invalid duration") {
        vec![messages::DURATION_FORMAT.to_owned()]
    } else if message.starts_with("invalid value: integer `") {
        out_of_bounds(&violation.field, schema, value)
            .into_iter()
            .chain(past_format(&violation.field, schema, value))
            .collect()
    } else if value.is_none_or(|v| v == "") && required_by_parent(&path) {
        vec!["Required value".to_owned()]
    } else {
        Vec::new()
    };
    if servers.is_empty() {
        return vec![violation];
    }
    servers
        .into_iter()
        .map(|message| Violation {
            message,
            field: violation.field.clone(),
        })
        .collect()
}

/// `Checked value must be of type integer with format int32 in spec.priority`: the integer
/// format check Kubernetes 1.37 added to CRD validation, for a value outside `int32` (seen on
/// v1.37.2; the schema's `int64` fields are bounded at 2^53 - 1, far inside their format).
fn past_format(field: &str, schema: Option<&Value>, value: Option<&Value>) -> Option<String> {
    let int32 = schema?.get("format")? == "int32";
    let fits = value?.as_i64().is_some_and(|n| i32::try_from(n).is_ok());
    (int32 && !fits).then(|| format!("Checked value must be of type integer with format int32 in {field}"))
}

/// `Unsupported value: "Delete": supported values: "Replace", "Reboot", "None"`.
fn unsupported(schema: Option<&Value>, value: Option<&Value>) -> Option<String> {
    let allowed: Vec<String> = schema?
        .get("enum")?
        .as_array()?
        .iter()
        .map(Value::to_string)
        .collect();
    Some(format!(
        "Unsupported value: {}: supported values: {}",
        value?,
        allowed.join(", ")
    ))
}

/// `spec.priority in body should be less than or equal to 2147483647`.
fn out_of_bounds(field: &str, schema: Option<&Value>, value: Option<&Value>) -> Option<String> {
    let (schema, value) = (schema?, value?.as_f64()?);
    if let Some(max) = schema
        .get("maximum")
        .filter(|m| m.as_f64().is_some_and(|m| value > m))
    {
        return Some(format!(
            "{field} in body should be less than or equal to {}",
            bound(max)
        ));
    }
    let min = schema
        .get("minimum")
        .filter(|m| m.as_f64().is_some_and(|m| value < m))?;
    Some(format!(
        "{field} in body should be greater than or equal to {min}"
    ))
}

/// Whether the last step is a key its parent's schema requires: listed as `required`, or
/// `apiVersion` and `kind` of an embedded resource (`x-kubernetes-embedded-resource`).
fn required_by_parent(path: &[Step<'_>]) -> bool {
    let Some((Step::Key(key), parent)) = path.split_last() else {
        return false;
    };
    let Some(parent) = schema_at(&SCHEMA, parent) else {
        return false;
    };
    let embedded = parent.get("x-kubernetes-embedded-resource") == Some(&Value::Bool(true));
    (embedded && ["apiVersion", "kind"].contains(key))
        || parent
            .get("required")
            .and_then(Value::as_array)
            .is_some_and(|required| required.iter().any(|r| r == key))
}

/// A schema bound as the server prints it: `2147483647`, not `2147483647.0`.
fn bound(value: &Value) -> String {
    match value.as_f64() {
        Some(n) if n.fract().abs() < f64::EPSILON => format!("{n:.0}"),
        _ => value.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn words(field: &str, message: &str, document: &Value) -> String {
        in_servers_words(
            Violation {
                field: field.to_owned(),
                message: message.to_owned(),
            },
            document,
        )
        .into_iter()
        .map(|v| v.message)
        .collect::<Vec<_>>()
        .join("; ")
    }

    #[test]
    fn an_enum_value_is_unsupported_with_the_schemas_values() {
        let document = json!({"spec": {"triggers": [{"status": "false"}]}});
        assert_eq!(
            words(
                "spec.triggers[0].status",
                "unknown variant `false`, expected one of `True`, `False`, `Unknown`",
                &document
            ),
            r#"Unsupported value: "false": supported values: "True", "False", "Unknown""#
        );
    }

    #[test]
    fn a_malformed_duration_gets_the_schemas_duration_rule() {
        let document = json!({"spec": {"release": {"healthyFor": "1d"}}});
        assert_eq!(
            words(
                "spec.release.healthyFor",
                "invalid duration \"1d\": unknown unit",
                &document
            ),
            messages::DURATION_FORMAT
        );
    }

    #[test]
    fn an_integer_past_its_bound_names_the_bound_and_the_format_as_the_server_does() {
        let document = json!({"spec": {"priority": 3_000_000_000_u64}});
        assert_eq!(
            words(
                "spec.priority",
                "invalid value: integer `3000000000`, expected i32",
                &document
            ),
            "spec.priority in body should be less than or equal to 2147483647; \
             Checked value must be of type integer with format int32 in spec.priority"
        );
    }

    #[test]
    fn a_required_key_left_out_and_an_unknown_field_are_worded_as_the_server_does() {
        let document =
            json!({"spec": {"replacement": {"strategy": "Template", "template": {"apiVersion": "v1"}}}});
        assert_eq!(
            words("spec.replacement.template.kind", "must name the kind", &document),
            "Required value"
        );
        assert_eq!(
            words("spec.safety.maxConcurent", "unknown field", &json!({})),
            "unknown field \"spec.safety.maxConcurent\""
        );
    }

    #[test]
    fn a_rule_the_schema_words_like_validate_is_left_alone() {
        let document = json!({"spec": {"safety": {"rate": {"limit": 0}}}});
        assert_eq!(
            words("spec.safety.rate.limit", messages::RATE_LIMIT, &document),
            messages::RATE_LIMIT
        );
    }
}
