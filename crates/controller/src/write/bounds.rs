//! The schema's limits, enforced on what we write: every string longer than the `maxLength` its
//! CRD declares is cut (with a visible marker, inside the limit) and every list longer than its
//! `maxItems` is shortened, so that no value a node reports about itself (a condition message, a
//! GPU serial, a blocker's words) can make a write fail with 422 and stop a record or a policy.
//! The limits are read from the CRD the API crate generates, the same one the server enforces:
//! they cannot drift apart.

use serde_json::Value;

/// What a cut string ends with: `…[cut N chars]`, N the characters left out.
fn marker(left_out: usize) -> String {
    format!("…[cut {left_out} chars]")
}

/// `value` cut to at most `max` characters (the API server counts characters, not bytes), ending
/// with the marker; `None` when it fits.
#[must_use]
pub fn cut(value: &str, max: usize) -> Option<String> {
    let count = value.chars().count();
    if count <= max {
        return None;
    }
    // The marker names how much was left out, which depends on how much is kept: keep all that
    // leaves room for the marker, which settles within a few rounds (the count changes by at most
    // a digit); the smaller keep is taken if it has not.
    let mut keep = max;
    for _ in 0..4 {
        let room = max.saturating_sub(marker(count - keep).chars().count());
        if room == keep {
            break;
        }
        keep = room.min(keep);
    }
    let tail = marker(count - keep);
    let mut cut: String = value.chars().take(keep).collect();
    cut.push_str(&tail);
    // A limit shorter than the marker itself keeps only what fits of the marker.
    Some(cut.chars().take(max).collect())
}

/// One value that was cut or shortened, for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cut {
    /// Where, as a JSON path (`.status.blockers[0].message`).
    pub path: String,
    /// How long it was (characters or items).
    pub was: usize,
    /// The limit.
    pub limit: usize,
}

/// Cuts `value` to the bounds `schema` (an `OpenAPI` v3 schema as a CRD carries it) declares, and
/// says what it cut.
pub fn enforce(value: &mut Value, schema: &Value) -> Vec<Cut> {
    let mut cuts = Vec::new();
    walk(value, schema, &mut String::new(), &mut cuts);
    cuts
}

fn limit(schema: &Value, key: &str) -> Option<usize> {
    schema
        .get(key)
        .and_then(Value::as_u64)
        .and_then(|n| usize::try_from(n).ok())
}

fn walk(value: &mut Value, schema: &Value, path: &mut String, cuts: &mut Vec<Cut>) {
    match value {
        Value::String(text) => {
            if let Some(max) = limit(schema, "maxLength")
                && let Some(shorter) = cut(text, max)
            {
                cuts.push(Cut {
                    path: path.clone(),
                    was: text.chars().count(),
                    limit: max,
                });
                *text = shorter;
            }
        }
        Value::Array(items) => {
            if let Some(max) = limit(schema, "maxItems")
                && items.len() > max
            {
                cuts.push(Cut {
                    path: path.clone(),
                    was: items.len(),
                    limit: max,
                });
                items.truncate(max);
            }
            if let Some(item_schema) = schema.get("items") {
                for (index, item) in items.iter_mut().enumerate() {
                    let len = path.len();
                    path.push('[');
                    path.push_str(&index.to_string());
                    path.push(']');
                    walk(item, item_schema, path, cuts);
                    path.truncate(len);
                }
            }
        }
        Value::Object(fields) => {
            let properties = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|s| s.is_object());
            for (key, field) in fields.iter_mut() {
                let Some(field_schema) = properties.and_then(|p| p.get(key)).or(additional) else {
                    continue;
                };
                let len = path.len();
                path.push('.');
                path.push_str(key);
                walk(field, field_schema, path, cuts);
                path.truncate(len);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_string_within_its_limit_is_left_alone() {
        assert_eq!(cut("XID79", 5), None);
        assert_eq!(cut("", 0), None);
    }

    #[test]
    fn a_long_string_is_cut_to_exactly_its_limit_with_a_marker_that_counts_what_went() {
        let long = "x".repeat(100_000);
        let cut = cut(&long, 32_768).unwrap();
        assert_eq!(cut.chars().count(), 32_768);
        let kept = cut.chars().take_while(|c| *c == 'x').count();
        assert!(
            cut.ends_with(&format!("…[cut {} chars]", 100_000 - kept)),
            "{}",
            &cut[kept..]
        );
    }

    #[test]
    fn characters_are_counted_not_bytes_and_never_split() {
        let long = "é".repeat(50);
        let cut = cut(&long, 40).unwrap();
        assert_eq!(cut.chars().count(), 40);
        assert!(cut.starts_with('é'));
        assert!(cut.contains("…[cut"));
    }

    #[test]
    fn a_limit_shorter_than_the_marker_keeps_what_fits() {
        let cut = cut("abcdefghij", 4).unwrap();
        assert_eq!(cut.chars().count(), 4);
        assert!(cut.starts_with('…'), "{cut}");
    }

    #[test]
    fn enforce_follows_properties_items_and_maps_and_reports_each_cut() {
        let schema = json!({
            "type": "object",
            "properties": {
                "status": {"type": "object", "properties": {
                    "message": {"type": "string", "maxLength": 10},
                    "blockers": {"type": "array", "maxItems": 2, "items": {"type": "object", "properties": {
                        "message": {"type": "string", "maxLength": 8}}}},
                }},
                "labels": {"type": "object", "additionalProperties": {"type": "string", "maxLength": 3}},
            },
        });
        let mut value = json!({
            "status": {
                "message": "0123456789abc",
                "blockers": [{"message": "short"}, {"message": "far too long a message"}, {"message": "x"}],
                "unknown": "z".repeat(100),
            },
            "labels": {"a": "abcd", "b": "ok"},
        });
        let cuts = enforce(&mut value, &schema);
        let mut paths: Vec<&str> = cuts.iter().map(|c| c.path.as_str()).collect();
        paths.sort_unstable();
        assert_eq!(
            paths,
            [
                ".labels.a",
                ".status.blockers",
                ".status.blockers[1].message",
                ".status.message"
            ]
        );
        assert_eq!(value["status"]["message"].as_str().unwrap().chars().count(), 10);
        assert_eq!(value["status"]["blockers"].as_array().unwrap().len(), 2);
        assert_eq!(value["status"]["blockers"][0]["message"], "short");
        assert_eq!(value["labels"]["b"], "ok");
        assert_eq!(
            value["status"]["unknown"].as_str().unwrap().len(),
            100,
            "no schema, no bound"
        );
    }
}
