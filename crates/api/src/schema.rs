//! What the CRD schema itself refuses: the CEL rules (`x-kubernetes-validations`), length and size
//! bounds, and list semantics that the API server enforces when a policy is applied.
//!
//! Every rule lives here, attached to the generated schema through `#[schemars(transform = ..)]` on
//! the type it guards, so `kubectl apply` of a bad policy fails with a sentence a person can act on
//! instead of the controller finding out later. The bounds (`maxLength`, `maxItems`,
//! `maxProperties`) exist so the API server can prove each rule's cost is within its budget; they
//! are far above anything a real policy needs.
//!
//! `crate::validate` repeats these checks in Rust (for files that never met a server) and adds
//! the ones CEL cannot express.

use kube::core::{Reason, Rule};
use schemars::{Schema, SchemaGenerator, json_schema};
use serde_json::{Map, Value};

use crate::bounds;

/// A Go duration (`time.ParseDuration`, which CEL's `duration()` uses), restricted to what people
/// write: no sign, no bare `0`, no leading or trailing dot.
pub const DURATION_REGEX: &str = "^([0-9]+([.][0-9]+)?(ns|us|µs|μs|ms|s|m|h))+$";
/// A label key: an optional DNS-subdomain prefix and `/`, then a name of at most 63 characters.
pub const LABEL_KEY_REGEX: &str = "^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$";
/// A label value: empty, or at most 63 characters starting and ending with a letter or digit.
pub const LABEL_VALUE_REGEX: &str = "^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$";
/// A whole percentage from 1% to 100%.
pub const PERCENT_REGEX: &str = "^(100|[1-9][0-9]?)%$";

/// The longest duration string accepted; `1h30m` needs 5.
pub const DURATION_MAX_LENGTH: u64 = 32;
/// A label key: 253 for the prefix, 1 for `/`, 63 for the name.
pub const LABEL_KEY_MAX_LENGTH: u64 = 317;
/// A label value.
pub const LABEL_VALUE_MAX_LENGTH: u64 = 63;
/// A policy name, because it becomes the `gpuremediation.dev/policy` label value of its remediations.
pub const POLICY_NAME_MAX_LENGTH: usize = 63;

pub mod messages;

/// The root rule of `GpuRemediationPolicy` (the only one that needs `metadata`).
#[must_use]
pub fn policy_name_rule() -> Rule {
    Rule::new(format!("size(self.metadata.name) <= {POLICY_NAME_MAX_LENGTH}")).message(messages::POLICY_NAME)
}

pub(crate) fn rule(expression: impl Into<String>, message: &str) -> Rule {
    Rule::new(expression).message(message)
}

/// `self` (a duration string) matches the duration grammar.
pub(crate) fn duration_ok(path: &str) -> String {
    format!("{path}.matches('{DURATION_REGEX}')")
}

pub(crate) fn add_rules(schema: &mut Map<String, Value>, rules: impl IntoIterator<Item = Rule>) {
    let list = schema
        .entry("x-kubernetes-validations")
        .or_insert_with(|| Value::Array(Vec::new()));
    let Value::Array(list) = list else {
        unreachable!("x-kubernetes-validations is always a list")
    };
    list.extend(
        rules
            .into_iter()
            .map(|r| serde_json::to_value(r).expect("a rule serialises to JSON")),
    );
}

pub(crate) fn object(schema: &mut Schema) -> &mut Map<String, Value> {
    schema.as_object_mut().expect("a struct's schema is an object")
}

pub(crate) fn property<'a>(schema: &'a mut Schema, name: &str) -> &'a mut Map<String, Value> {
    object(schema)
        .get_mut("properties")
        .and_then(|p| p.get_mut(name))
        .and_then(Value::as_object_mut)
        .unwrap_or_else(|| panic!("the schema has a property {name:?}"))
}

/// The schema of a list field's items.
fn items(list: &mut Map<String, Value>) -> &mut Map<String, Value> {
    list.get_mut("items")
        .and_then(Value::as_object_mut)
        .expect("a list's schema has items")
}

/// Property `name` is a label key (a condition type is one too): bounded, and in the grammar.
fn label_key(schema: &mut Schema, name: &str, message: &str) {
    let key = property(schema, name);
    key.insert("maxLength".into(), LABEL_KEY_MAX_LENGTH.into());
    add_rules(key, [rule(format!("self.matches('{LABEL_KEY_REGEX}')"), message)]);
}

/// Property `name` is a share: `"1%"`..`"100%"`.
fn percent(schema: &mut Schema, name: &str) {
    let share = property(schema, name);
    share.insert("maxLength".into(), 4.into());
    add_rules(
        share,
        [rule(
            format!("self.matches('{PERCENT_REGEX}')"),
            messages::PERCENT_RANGE,
        )],
    );
}

pub(crate) fn make_positive(schema: &mut Schema, duration_field: &str) {
    add_rules(
        property(schema, duration_field),
        [rule(
            format!("!{} || duration(self) > duration('0s')", duration_ok("self")),
            messages::DURATION_POSITIVE,
        )],
    );
}

/// The schema of every duration field: a bounded string in Go's grammar.
pub(crate) fn duration(_: &mut SchemaGenerator) -> Schema {
    let mut schema = json_schema!({
        "type": "string",
        "maxLength": DURATION_MAX_LENGTH,
        "description": "A duration such as 30s, 2m or 1h30m (Go syntax: units ns, us, ms, s, m, h).",
    });
    add_rules(
        object(&mut schema),
        [rule(duration_ok("self"), messages::DURATION_FORMAT)],
    );
    schema
}

/// The schema of `maxConcurrent` and `maxUnhealthy`: an integer of at least 1 or `"1%"`..`"100%"`.
pub(crate) fn int_or_percent(_: &mut SchemaGenerator) -> Schema {
    let mut schema = json_schema!({
        "x-kubernetes-int-or-string": true,
        "anyOf": [{"type": "integer"}, {"type": "string"}],
    });
    add_rules(
        object(&mut schema),
        [
            rule("type(self) != int || self >= 1", messages::COUNT_AT_LEAST_ONE),
            rule(
                format!("type(self) != int || self <= {}", bounds::COUNT_MAX),
                messages::COUNT_AT_MOST,
            ),
            rule(
                format!("type(self) != string || self.matches('{PERCENT_REGEX}')"),
                messages::PERCENT_RANGE,
            ),
        ],
    );
    schema
}

/// `spec`: triggers present, Reboot only with a template, history outliving the limits' windows.
pub(crate) fn policy_spec(schema: &mut Schema) {
    let triggers = property(schema, "triggers");
    triggers.insert("maxItems".into(), 32.into());
    add_rules(
        triggers,
        [rule("size(self) > 0", messages::TRIGGERS_REQUIRED).reason(Reason::FieldValueRequired)],
    );
    let ttl_longer_than = |per: &str, message: &str| {
        rule(
            format!(
                "!({} && {}) || duration(self.history.ttl) > duration({per})",
                duration_ok("self.history.ttl"),
                duration_ok(per),
            ),
            message,
        )
        .field_path(".history.ttl")
    };
    add_rules(
        object(schema),
        [
            rule(
                "(self.action != 'Reboot' && !self.triggers.exists(t, has(t.action) && t.action == 'Reboot')) \
                 || self.replacement.strategy == 'Template'",
                messages::REBOOT_NEEDS_TEMPLATE,
            )
            .field_path(".replacement.strategy"),
            ttl_longer_than("self.safety.rate.per", messages::TTL_VS_RATE),
            ttl_longer_than("self.safety.maxAttemptsPerNode.per", messages::TTL_VS_ATTEMPTS),
        ],
    );
}

/// A trigger: a well-formed condition type, non-empty distinct reasons.
pub(crate) fn trigger(schema: &mut Schema) {
    label_key(schema, "conditionType", messages::CONDITION_TYPE);
    let reasons = property(schema, "reasons");
    reasons.insert("maxItems".into(), 32.into());
    reasons.insert("x-kubernetes-list-type".into(), "set".into());
    items(reasons).insert("maxLength".into(), 128.into());
    add_rules(
        reasons,
        [rule("self.all(r, size(r) > 0)", messages::REASON_EMPTY)],
    );
}

/// `replacement`: a template exactly when the strategy is `Template`. That the template names its
/// `apiVersion` and `kind` needs no rule: `x-kubernetes-embedded-resource` makes the server require both.
pub(crate) fn replacement(schema: &mut Schema) {
    make_positive(schema, "timeout");
    add_rules(
        object(schema),
        [
            rule(
                "self.strategy != 'Template' || has(self.template)",
                messages::TEMPLATE_REQUIRED,
            )
            .field_path(".template")
            .reason(Reason::FieldValueRequired),
            rule(
                "!has(self.template) || self.strategy == 'Template'",
                messages::TEMPLATE_FORBIDDEN,
            )
            .field_path(".template")
            .reason(Reason::FieldValueForbidden),
        ],
    );
}

/// `safety`: the two int-or-percent limits are optional and defaulted, never null.
///
/// kube's schema transform makes an optional int-or-string `nullable`, and a stored `null` would
/// break every reader of the policy; an explicit `nullable: false` keeps it from doing so, and the
/// server then prunes a `null` and applies the default. They are not `required`, so `kubectl
/// explain` shows what the README says: both default.
pub(crate) fn safety(schema: &mut Schema) {
    for name in ["maxConcurrent", "maxUnhealthy"] {
        property(schema, name).insert("nullable".into(), false.into());
    }
    add_ranges(schema, "spec.safety");
    let domains = property(schema, "failureDomains");
    domains.insert("maxItems".into(), bounds::FAILURE_DOMAINS_MAX.into());
    add_rules(
        domains,
        [rule(
            "self.all(a, self.exists_one(b, b.topologyKey == a.topologyKey))",
            messages::DOMAIN_KEYS_DISTINCT,
        )],
    );
}

/// A range CEL enforces on an integer field: `self >= min` and `self <= max`, each with the
/// sentence the API server answers when it fails.
struct Range {
    min: i64,
    min_message: &'static str,
    max: i64,
    max_message: &'static str,
}

/// A count in the safety limits: at least 1, at most [`bounds::COUNT_MAX`].
const COUNT: Range = Range {
    min: 1,
    min_message: messages::COUNT_AT_LEAST_ONE,
    max: wide(bounds::COUNT_MAX),
    max_message: messages::COUNT_AT_MOST,
};

/// `value` as an `i64`, in a constant (`i64::from` is not `const`).
#[allow(
    clippy::cast_lossless,
    reason = "a u32 always fits an i64; i64::from cannot run in a const"
)]
const fn wide(value: u32) -> i64 {
    value as i64
}

/// Every integer field with a range in CEL, by its path in the policy (a `[]` for each list): the
/// one table [`add_ranges`] writes the rules from, and the bounds test reads.
const RANGES: [(&str, Range); 9] = [
    ("spec.safety.maxUnhealthyCount", COUNT),
    ("spec.safety.suspect.minFailures", COUNT),
    ("spec.safety.failureDomains[].maxUnhealthyCount", COUNT),
    ("spec.safety.failureDomains[].maxInFlight", COUNT),
    (
        "spec.safety.rate.limit",
        Range {
            min: 1,
            min_message: messages::RATE_LIMIT,
            max: wide(bounds::RATE_LIMIT_MAX),
            max_message: messages::RATE_LIMIT_MAX,
        },
    ),
    (
        "spec.safety.maxAttemptsPerNode.count",
        Range {
            min: 1,
            min_message: messages::ATTEMPTS_COUNT,
            max: wide(bounds::ATTEMPTS_MAX),
            max_message: messages::ATTEMPTS_COUNT_MAX,
        },
    ),
    (
        "spec.safety.repeatOffender.failures",
        Range {
            min: 1,
            min_message: messages::OFFENDER_FAILURES,
            max: wide(bounds::ATTEMPTS_MAX),
            max_message: messages::OFFENDER_FAILURES_MAX,
        },
    ),
    (
        "spec.validation.newNodes.max",
        Range {
            min: 1,
            min_message: messages::NEW_NODES_MAX,
            max: wide(bounds::NEW_NODES_MAX),
            max_message: messages::NEW_NODES_MAX_ABOVE,
        },
    ),
    (
        "spec.drain.gracePeriodSeconds",
        Range {
            min: 0,
            min_message: messages::GRACE_PERIOD,
            max: bounds::GRACE_PERIOD_MAX_SECONDS,
            max_message: messages::GRACE_PERIOD_MAX,
        },
    ),
];

/// Adds the range rules of [`RANGES`] to the fields of the struct at `path` (its schema `schema`).
fn add_ranges(schema: &mut Schema, path: &str) {
    for (field_path, range) in &RANGES {
        let Some(field) = field_path
            .strip_prefix(path)
            .and_then(|rest| rest.strip_prefix('.'))
        else {
            continue;
        };
        if field.contains('.') {
            continue;
        }
        add_rules(
            property(schema, field),
            [
                rule(format!("self >= {}", range.min), range.min_message),
                rule(format!("self <= {}", range.max), range.max_message),
            ],
        );
    }
}

/// `safety.suspect`: a positive window, a share, at least one failure, label-key attributes.
pub(crate) fn suspect(schema: &mut Schema) {
    make_positive(schema, "window");
    percent(schema, "share");
    add_ranges(schema, "spec.safety.suspect");
    let attributes = property(schema, "attributes");
    attributes.insert("maxItems".into(), 16.into());
    attributes.insert("x-kubernetes-list-type".into(), "set".into());
    items(attributes).insert("maxLength".into(), LABEL_KEY_MAX_LENGTH.into());
    add_rules(
        attributes,
        [rule(
            format!("self.all(a, a.matches('{LABEL_KEY_REGEX}'))"),
            &format!("every attribute {}", messages::LABEL_KEY),
        )],
    );
}

/// A failure domain: a label key, at least one limit, each count at least 1.
pub(crate) fn failure_domain(schema: &mut Schema) {
    label_key(schema, "topologyKey", messages::LABEL_KEY);
    add_ranges(schema, "spec.safety.failureDomains[]");
    percent(schema, "maxUnhealthyShare");
    add_rules(
        object(schema),
        [rule(
            "has(self.maxUnhealthyShare) || has(self.maxUnhealthyCount) || has(self.maxInFlight)",
            messages::DOMAIN_LIMIT_REQUIRED,
        )
        .reason(Reason::FieldValueRequired)],
    );
}

/// `safety.rate`: at least one per window, a positive window.
pub(crate) fn rate(schema: &mut Schema) {
    make_positive(schema, "per");
    add_ranges(schema, "spec.safety.rate");
}

/// `safety.maxAttemptsPerNode`: at least one attempt, a positive window.
pub(crate) fn attempts(schema: &mut Schema) {
    make_positive(schema, "per");
    add_ranges(schema, "spec.safety.maxAttemptsPerNode");
}

/// `safety.repeatOffender`: one to a hundred failures, a positive window.
pub(crate) fn repeat_offender(schema: &mut Schema) {
    make_positive(schema, "window");
    add_ranges(schema, "spec.safety.repeatOffender");
}

/// `validation.newNodes`: `max` from 1 to `bounds::NEW_NODES_MAX`.
pub(crate) fn new_nodes(schema: &mut Schema) {
    add_ranges(schema, "spec.validation.newNodes");
}

/// `drain`: a positive timeout, a non-negative grace period, zero only when explicitly allowed.
pub(crate) fn drain(schema: &mut Schema) {
    make_positive(schema, "timeout");
    add_ranges(schema, "spec.drain");
    add_rules(
        object(schema),
        [rule(
            "!has(self.gracePeriodSeconds) || self.gracePeriodSeconds != 0 \
             || (has(self.allowZeroGracePeriod) && self.allowZeroGracePeriod)",
            messages::ZERO_GRACE_PERIOD,
        )
        .field_path(".gracePeriodSeconds")],
    );
    add_rules(
        property(schema, "unreachableAfter"),
        [rule(
            format!(
                "!{} || (duration(self) >= duration('0s') && duration(self) <= duration('1h'))",
                duration_ok("self")
            ),
            messages::DRAIN_UNREACHABLE_AFTER,
        )],
    );
    add_rules(
        property(schema, "notice"),
        [rule(
            format!(
                "!{} || (duration(self) >= duration('0s') && duration(self) <= duration('1h'))",
                duration_ok("self")
            ),
            messages::DRAIN_NOTICE,
        )],
    );
    let gang_labels = property(schema, "gangLabels");
    gang_labels.insert("maxItems".into(), bounds::GANG_LABELS_MAX.into());
    gang_labels.insert("x-kubernetes-list-type".into(), "set".into());
    items(gang_labels).insert("maxLength".into(), LABEL_KEY_MAX_LENGTH.into());
    add_rules(
        gang_labels,
        [rule(
            format!("self.all(k, k.matches('{LABEL_KEY_REGEX}'))"),
            &format!("every gang label {}", messages::LABEL_KEY),
        )],
    );
}

/// `release`: a positive healthy period.
pub(crate) fn release(schema: &mut Schema) {
    make_positive(schema, "healthyFor");
}

/// `quarantine`: a hysteresis from 1s to 1h.
pub(crate) fn quarantine(schema: &mut Schema) {
    add_rules(
        property(schema, "hysteresis"),
        [rule(
            format!(
                "!{} || (duration(self) >= duration('1s') && duration(self) <= duration('1h'))",
                duration_ok("self")
            ),
            messages::QUARANTINE_HYSTERESIS,
        )],
    );
}

/// `history`: a positive time to live.
pub(crate) fn history(schema: &mut Schema) {
    make_positive(schema, "ttl");
}

/// `nodeSelector`: label keys and values well formed.
pub(crate) fn node_selector(schema: &mut Schema) {
    let labels = property(schema, "matchLabels");
    labels.insert("maxProperties".into(), 32.into());
    labels
        .get_mut("additionalProperties")
        .and_then(Value::as_object_mut)
        .expect("matchLabels has additionalProperties")
        .insert("maxLength".into(), LABEL_VALUE_MAX_LENGTH.into());
    add_rules(
        labels,
        [
            rule(
                format!("self.all(k, size(k) <= {LABEL_KEY_MAX_LENGTH} && k.matches('{LABEL_KEY_REGEX}'))"),
                &format!("every key {}", messages::LABEL_KEY),
            ),
            rule(
                format!("self.all(k, self[k].matches('{LABEL_VALUE_REGEX}'))"),
                &format!("every value {}", messages::LABEL_VALUE),
            ),
        ],
    );
    property(schema, "matchExpressions").insert("maxItems".into(), 16.into());
}

/// A `matchExpressions` entry: a valid key, values exactly when the operator takes them.
pub(crate) fn selector_requirement(schema: &mut Schema) {
    label_key(schema, "key", messages::LABEL_KEY);
    let values = property(schema, "values");
    values.insert("maxItems".into(), 64.into());
    items(values).insert("maxLength".into(), LABEL_VALUE_MAX_LENGTH.into());
    add_rules(
        values,
        [rule(
            format!("self.all(v, v.matches('{LABEL_VALUE_REGEX}'))"),
            &format!("every value {}", messages::LABEL_VALUE),
        )],
    );
    add_rules(
        object(schema),
        [
            rule(
                "!(self.operator in ['In', 'NotIn']) || (has(self.values) && size(self.values) > 0)",
                messages::SELECTOR_VALUES_REQUIRED,
            )
            .field_path(".values")
            .reason(Reason::FieldValueRequired),
            rule(
                "!(self.operator in ['Exists', 'DoesNotExist']) || !has(self.values) || size(self.values) == 0",
                messages::SELECTOR_VALUES_FORBIDDEN,
            )
            .field_path(".values")
            .reason(Reason::FieldValueForbidden),
        ],
    );
}

/// `GpuRemediation.spec.policySnapshot`: a copy the controller takes of a policy it already
/// validated, never edited (the spec is immutable). Stored as it is written: the policy's own CEL
/// rules, repeated here, would exceed the API server's cost budget for nothing.
pub(crate) fn policy_snapshot(schema: &mut Schema) {
    let description = object(schema).get("description").cloned();
    let mut kept = Map::new();
    kept.insert("type".into(), "object".into());
    kept.insert("x-kubernetes-preserve-unknown-fields".into(), true.into());
    if let Some(description) = description {
        kept.insert("description".into(), description);
    }
    *object(schema) = kept;
}

/// `GpuRemediation.spec`: written once by the controller, then the audit record.
pub(crate) fn remediation_spec(schema: &mut Schema) {
    add_rules(
        object(schema),
        [rule("self == oldSelf", messages::REMEDIATION_SPEC_IMMUTABLE)],
    );
}

#[cfg(test)]
mod tests;
