//! Bounds on every number, list and string the two CRDs store, so no object the API server
//! accepts can fail to decode in the controller (a `priority` of 3000000000 is not an `i32`, a
//! `rate.limit` of 5000000000 not a `u32`).
//!
//! The limits that mean something to a person (`rate.limit`, `maxAttemptsPerNode.count`, a count
//! in `maxConcurrent`/`maxUnhealthy`, `gracePeriodSeconds`) are CEL rules with a sentence, in
//! `crate::schema`; this module adds, below each spec and status root, whatever bound a field still
//! lacks: an integer's range from its Rust type (`format`), a list's length and a string's size.

use schemars::Schema;
use serde_json::{Map, Value};

/// The most a count in `maxConcurrent` or `maxUnhealthy` may be.
pub const COUNT_MAX: u32 = 100_000;
/// The most failure domains one policy may list.
pub const FAILURE_DOMAINS_MAX: u64 = 8;
/// The most remediations `rate.limit` may allow per window.
pub const RATE_LIMIT_MAX: u32 = 10_000;
/// The most remediations of one node `maxAttemptsPerNode.count` may allow per window.
pub const ATTEMPTS_MAX: u32 = 100;
/// The longest grace period an eviction may ask for: a day.
pub const GRACE_PERIOD_MAX_SECONDS: i64 = 86_400;
/// The most any count in a status may be (nodes, pods, remediations): a million.
pub const STATUS_COUNT_MAX: u32 = 1_000_000;
/// The longest list any field may hold.
pub const LIST_MAX_ITEMS: u64 = 10_000;
/// The longest string any field may hold (a condition message's limit in Kubernetes).
pub const STRING_MAX_LENGTH: u64 = 32_768;
/// The largest `int64` a field may hold: the largest integer a float64 (JSON in most clients)
/// represents exactly.
pub const INT64_MAX: i64 = (1 << 53) - 1;

/// Adds the missing bounds below a spec's root: integers within their Rust type.
pub(crate) fn spec(schema: &mut Schema) {
    if let Some(object) = schema.as_object_mut() {
        walk(object, u64::from(u32::MAX));
    }
}

/// Adds the missing bounds below a status's root: counts at most [`STATUS_COUNT_MAX`].
pub(crate) fn status(schema: &mut Schema) {
    if let Some(object) = schema.as_object_mut() {
        walk(object, u64::from(STATUS_COUNT_MAX));
    }
}

/// Bounds `schema` and everything below it; `unsigned_max` is the maximum of an unsigned integer
/// that has none yet. `anyOf` branches (int-or-string) are left alone: their bounds are CEL rules.
fn walk(schema: &mut Map<String, Value>, unsigned_max: u64) {
    // An `Option` is `type: [T, "null"]` until kube rewrites it to `nullable`.
    let kind = match schema.get("type") {
        Some(Value::String(kind)) => Some(kind.clone()),
        Some(Value::Array(kinds)) => kinds
            .iter()
            .filter_map(Value::as_str)
            .find(|k| *k != "null")
            .map(str::to_owned),
        _ => None,
    };
    let format = schema.get("format").and_then(Value::as_str).map(str::to_owned);
    match kind.as_deref() {
        Some("integer") => {
            let (min, max): (i64, i64) = match format.as_deref() {
                Some("int32") => (i64::from(i32::MIN), i64::from(i32::MAX)),
                Some("int64") => (-INT64_MAX, INT64_MAX),
                Some("uint16") => (0, i64::from(u16::MAX)),
                _ => (0, i64::try_from(unsigned_max).unwrap_or(i64::MAX)),
            };
            schema.entry("minimum").or_insert_with(|| min.into());
            schema.entry("maximum").or_insert_with(|| max.into());
        }
        Some("string") if !schema.contains_key("enum") && !schema.contains_key("format") => {
            schema
                .entry("maxLength")
                .or_insert_with(|| STRING_MAX_LENGTH.into());
        }
        Some("array") => {
            schema.entry("maxItems").or_insert_with(|| LIST_MAX_ITEMS.into());
        }
        _ => {}
    }
    if let Some(Value::Object(properties)) = schema.get_mut("properties") {
        for property in properties.values_mut().filter_map(Value::as_object_mut) {
            walk(property, unsigned_max);
        }
    }
    for key in ["items", "additionalProperties"] {
        if let Some(Value::Object(inner)) = schema.get_mut(key) {
            walk(inner, unsigned_max);
        }
    }
}

#[cfg(test)]
mod tests {
    use kube::CustomResourceExt;

    use super::*;
    use crate::{GpuRemediation, GpuRemediationPolicy};

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
            crate::GpuHardwareRecord::crd(),
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
}
