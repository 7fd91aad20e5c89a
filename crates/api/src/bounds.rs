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
/// The most steps a ladder has (one of each rung).
pub const LADDER_STEPS_MAX: usize = 4;
/// The most failure domains one policy may list.
pub const FAILURE_DOMAINS_MAX: u64 = 8;
/// The most remediations `rate.limit` may allow per window.
pub const RATE_LIMIT_MAX: u32 = 10_000;
/// The most remediations of one node `maxAttemptsPerNode.count` may allow per window.
pub const ATTEMPTS_MAX: u32 = 100;
/// The most new nodes a policy may validate at once (`validation.newNodes.max`).
pub const NEW_NODES_MAX: u32 = 1000;
/// The longest grace period an eviction may ask for: a day.
pub const GRACE_PERIOD_MAX_SECONDS: i64 = 86_400;
/// The most label keys `drain.gangLabels` may list.
pub const GANG_LABELS_MAX: usize = 16;
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
#[path = "bounds_tests.rs"]
mod tests;
