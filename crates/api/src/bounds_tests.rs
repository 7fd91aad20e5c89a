//! The CRDs' schemas against the bounds: every integer, list and string bounded, each bound's
//! message naming it.

use kube::CustomResourceExt;

use super::*;
use crate::{hardware::GpuHardwareRecord, policy::GpuRemediationPolicy, remediation::GpuRemediation};

/// Every leaf below `node` that is unbounded, by path. An int-or-string is bounded by CEL
/// rules (checked by name), an embedded object (the template) by the object it names.
fn unbounded(node: &Value, path: &str, out: &mut Vec<String>) {
    let Some(object) = node.as_object() else { return };
    let has = |key: &str| object.contains_key(key);
    let rules = || {
        object
            .get("x-kubernetes-validations")
            .map(ToString::to_string)
            .unwrap_or_default()
    };
    match object.get("type").and_then(Value::as_str) {
        Some("integer") if !(has("minimum") && has("maximum")) => out.push(path.to_owned()),
        Some("string") if !(has("maxLength") || has("enum") || has("format")) => {
            out.push(path.to_owned());
        }
        Some("array") if !has("maxItems") => out.push(path.to_owned()),
        None if has("x-kubernetes-int-or-string") && !rules().contains("self <=") => {
            out.push(path.to_owned());
        }
        _ => {}
    }
    if let Some(properties) = object.get("properties").and_then(Value::as_object) {
        for (name, property) in properties {
            if path.is_empty() && name == "metadata" {
                continue;
            }
            unbounded(property, &format!("{path}.{name}"), out);
        }
    }
    for key in ["items", "additionalProperties"] {
        if let Some(inner) = object.get(key) {
            unbounded(inner, &format!("{path}[]"), out);
        }
    }
}

fn schema_of(
    crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) -> Value {
    serde_json::to_value(
        crd.spec.versions[0]
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .expect("a schema"),
    )
    .expect("a schema serialises")
}

#[test]
fn every_integer_list_and_string_of_every_kind_is_bounded() {
    for crd in [
        GpuRemediationPolicy::crd(),
        GpuRemediation::crd(),
        GpuHardwareRecord::crd(),
    ] {
        let mut out = Vec::new();
        unbounded(&schema_of(&crd), "", &mut out);
        assert!(out.is_empty(), "{}: unbounded {out:?}", crd.spec.names.kind);
    }
}

#[test]
fn priority_is_an_i32_and_status_counts_stop_at_a_million() {
    let policy = schema_of(&GpuRemediationPolicy::crd());
    let priority = &policy["properties"]["spec"]["properties"]["priority"];
    assert_eq!(priority["maximum"].as_f64(), Some(f64::from(i32::MAX)));
    assert_eq!(priority["minimum"].as_f64(), Some(f64::from(i32::MIN)));
    let selected = &policy["properties"]["status"]["properties"]["selectedNodes"];
    assert_eq!(selected["maximum"].as_f64(), Some(f64::from(STATUS_COUNT_MAX)));
    let remediation = schema_of(&GpuRemediation::crd());
    let total = &remediation["properties"]["status"]["properties"]["drain"]["properties"]["podsTotal"];
    assert_eq!(total["maximum"].as_f64(), Some(f64::from(STATUS_COUNT_MAX)));
}

#[test]
fn each_bound_s_message_names_the_bound_it_enforces() {
    use crate::schema::messages;
    for (message, bound) in [
        (messages::COUNT_AT_MOST, i64::from(COUNT_MAX)),
        (messages::RATE_LIMIT_MAX, i64::from(RATE_LIMIT_MAX)),
        (messages::ATTEMPTS_COUNT_MAX, i64::from(ATTEMPTS_MAX)),
        (messages::GRACE_PERIOD_MAX, GRACE_PERIOD_MAX_SECONDS),
    ] {
        assert!(message.contains(&format!("at most {bound}")), "{message}");
    }
}

#[test]
fn the_safety_limits_default_rather_than_being_required_and_are_never_null() {
    let policy = schema_of(&GpuRemediationPolicy::crd());
    let safety = &policy["properties"]["spec"]["properties"]["safety"];
    let required = safety["required"].as_array().cloned().unwrap_or_default();
    for field in ["maxConcurrent", "maxUnhealthy"] {
        assert!(!required.contains(&Value::from(field)), "{field} is required");
        let property = &safety["properties"][field];
        assert!(!property["default"].is_null(), "{field} has no default");
        assert_eq!(property["nullable"], Value::Bool(false), "{field}");
    }
}
