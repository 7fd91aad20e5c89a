//! Pure validation of a `GpuRemediationPolicy`, without an API server.
//!
//! The CRD schema (`crate::schema`) refuses bad policies at apply time; this module gives the same
//! verdict, in the same words and with the same field paths, for a policy that never met a server
//! (`gpu-remediator validate FILE`, a pre-commit check in a `GitOps` repository), and adds what CEL cannot say:
//! exact label-key lengths, duplicate triggers, template placeholders. The controller runs it too,
//! and reports `Invalid` in the policy's status instead of acting on a policy stored before the
//! schema had a rule.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::{
    bounds,
    constants::template_placeholders,
    correlated::{FailureDomain, SuspectCause},
    duration::Duration,
    ladder::STEP_TIMEOUT_MAX,
    ladder_schema,
    names::{is_label_value, is_qualified_name},
    policy::{Action, GpuRemediationPolicy, GpuRemediationPolicySpec, Replacement, Strategy},
    schema::{POLICY_NAME_MAX_LENGTH, messages},
    selector::{IntOrPercent, NodeSelector, SelectorOperator},
    unknown_fields::unknown_fields,
    violation::Violation,
};

/// Every rule a policy document breaks: fields the schema does not know, a shape that does not
/// deserialise, then everything `validate_policy` checks. For policies read from files, where no
/// server pruned or checked anything.
#[must_use]
pub fn validate_document(document: &Value) -> Vec<Violation> {
    let mut violations = unknown_fields(document);
    match serde_path_to_error::deserialize::<_, GpuRemediationPolicy>(document.clone()) {
        Ok(policy) => violations.extend(validate_policy(&policy)),
        Err(err) => {
            let message = err.inner().to_string();
            // serde names a missing field at its parent; the server names the field itself.
            let missing = message
                .strip_prefix("missing field `")
                .and_then(|rest| rest.split('`').next());
            let violation = match missing {
                Some(field) => Violation::new(format!("{}.{field}", err.path()), "Required value"),
                None => Violation::new(err.path().to_string(), message),
            };
            violations.push(violation);
        }
    }
    violations
}

/// Every rule a policy breaks, name included; empty when it is valid.
#[must_use]
pub fn validate_policy(policy: &GpuRemediationPolicy) -> Vec<Violation> {
    let mut violations = Vec::new();
    if let Some(name) = &policy.metadata.name
        && name.len() > POLICY_NAME_MAX_LENGTH
    {
        violations.push(Violation::new("metadata.name", messages::POLICY_NAME));
    }
    violations.extend(validate_spec(&policy.spec));
    violations
}

/// Every rule a policy's spec breaks; empty when it is valid.
#[must_use]
pub fn validate_spec(spec: &GpuRemediationPolicySpec) -> Vec<Violation> {
    let mut out = Vec::new();
    check_selector(&spec.node_selector, &mut out);
    check_triggers(spec, &mut out);
    check_replacement(&spec.replacement, &mut out);
    check_ladder(spec, &mut out);
    if let Some(validation) = &spec.validation {
        out.extend(crate::validation::check("spec.validation", validation));
    }
    if let Some(diagnostics) = &spec.diagnostics {
        out.extend(crate::diagnostics::check("spec.diagnostics", diagnostics));
    }
    let reboots =
        spec.action == Action::Reboot || spec.triggers.iter().any(|t| t.action == Some(Action::Reboot));
    if reboots && spec.replacement.strategy != Strategy::Template {
        out.push(Violation::new(
            "spec.replacement.strategy",
            messages::REBOOT_NEEDS_TEMPLATE,
        ));
    }
    let safety = &spec.safety;
    check_int_or_percent("spec.safety.maxConcurrent", &safety.max_concurrent, &mut out);
    check_int_or_percent("spec.safety.maxUnhealthy", &safety.max_unhealthy, &mut out);
    check_count(
        "spec.safety.maxUnhealthyCount",
        safety.max_unhealthy_count,
        &mut out,
    );
    check_failure_domains(&safety.failure_domains, &mut out);
    if let Some(suspect) = &safety.suspect {
        check_suspect(suspect, &mut out);
    }
    if safety.rate.limit < 1 {
        out.push(Violation::new("spec.safety.rate.limit", messages::RATE_LIMIT));
    }
    if safety.rate.limit > bounds::RATE_LIMIT_MAX {
        out.push(Violation::new("spec.safety.rate.limit", messages::RATE_LIMIT_MAX));
    }
    if safety.max_attempts_per_node.count < 1 {
        out.push(Violation::new(
            "spec.safety.maxAttemptsPerNode.count",
            messages::ATTEMPTS_COUNT,
        ));
    }
    if let Some(offender) = &safety.repeat_offender {
        let field = "spec.safety.repeatOffender.failures";
        if offender.failures < 1 {
            out.push(Violation::new(field, messages::OFFENDER_FAILURES));
        }
        if offender.failures > bounds::ATTEMPTS_MAX {
            out.push(Violation::new(field, messages::OFFENDER_FAILURES_MAX));
        }
    }
    if safety.max_attempts_per_node.count > bounds::ATTEMPTS_MAX {
        out.push(Violation::new(
            "spec.safety.maxAttemptsPerNode.count",
            messages::ATTEMPTS_COUNT_MAX,
        ));
    }
    if spec.drain.grace_period_seconds.is_some_and(|s| s < 0) {
        out.push(Violation::new(
            "spec.drain.gracePeriodSeconds",
            messages::GRACE_PERIOD,
        ));
    }
    if spec.drain.grace_period_seconds == Some(0) && !spec.drain.allow_zero_grace_period {
        out.push(Violation::new(
            "spec.drain.gracePeriodSeconds",
            messages::ZERO_GRACE_PERIOD,
        ));
    }
    if spec
        .drain
        .grace_period_seconds
        .is_some_and(|s| s > bounds::GRACE_PERIOD_MAX_SECONDS)
    {
        out.push(Violation::new(
            "spec.drain.gracePeriodSeconds",
            messages::GRACE_PERIOD_MAX,
        ));
    }
    for (field, duration) in [
        ("spec.replacement.timeout", spec.replacement.timeout),
        ("spec.safety.rate.per", safety.rate.per),
        (
            "spec.safety.maxAttemptsPerNode.per",
            safety.max_attempts_per_node.per,
        ),
        ("spec.drain.timeout", spec.drain.timeout),
        ("spec.release.healthyFor", spec.release.healthy_for),
        ("spec.history.ttl", spec.history.ttl),
    ] {
        check_positive(field, duration, &mut out);
    }
    if let Some(max) = &spec.quarantine.max {
        check_int_or_percent("spec.quarantine.max", max, &mut out);
    }
    check_bounded_durations(spec, &mut out);
    check_gang_labels(&spec.drain.gang_labels, &mut out);
    if let Some(offender) = &safety.repeat_offender {
        check_positive("spec.safety.repeatOffender.window", offender.window, &mut out);
        if let Some(max) = &offender.cordon_on_join_max {
            check_int_or_percent("spec.safety.repeatOffender.cordonOnJoinMax", max, &mut out);
        }
    }
    if spec.history.ttl <= safety.rate.per {
        out.push(Violation::new("spec.history.ttl", messages::TTL_VS_RATE));
    }
    if spec.history.ttl <= safety.max_attempts_per_node.per {
        out.push(Violation::new("spec.history.ttl", messages::TTL_VS_ATTEMPTS));
    }
    out
}

/// The durations bounded on both sides: `quarantine.hysteresis` (1s to 1h) and
/// `drain.unreachableAfter` (0s to 1h).
fn check_bounded_durations(spec: &GpuRemediationPolicySpec, out: &mut Vec<Violation>) {
    let hour = std::time::Duration::from_secs(3600);
    let hysteresis = spec.quarantine.hysteresis.as_std();
    if hysteresis < std::time::Duration::from_secs(1) || hysteresis > hour {
        out.push(Violation::new(
            "spec.quarantine.hysteresis",
            messages::QUARANTINE_HYSTERESIS,
        ));
    }
    if spec.drain.unreachable_after.as_std() > hour {
        out.push(Violation::new(
            "spec.drain.unreachableAfter",
            messages::DRAIN_UNREACHABLE_AFTER,
        ));
    }
    if spec.drain.notice.as_std() > hour {
        out.push(Violation::new("spec.drain.notice", messages::DRAIN_NOTICE));
    }
}

/// `drain.gangLabels`: at most [`bounds::GANG_LABELS_MAX`] label keys.
fn check_gang_labels(keys: &[String], out: &mut Vec<Violation>) {
    let field = "spec.drain.gangLabels";
    if keys.len() > bounds::GANG_LABELS_MAX {
        // The server's own words for `maxItems`.
        out.push(Violation::new(
            field,
            format!(
                "Too many: {}: must have at most {} items",
                keys.len(),
                bounds::GANG_LABELS_MAX
            ),
        ));
    }
    for key in keys.iter().filter(|k| !is_qualified_name(k)) {
        out.push(Violation::new(
            field,
            format!("every gang label {} ({key:?} is not)", messages::LABEL_KEY),
        ));
    }
}

fn check_positive(field: &str, duration: Duration, out: &mut Vec<Violation>) {
    if duration.is_zero() {
        out.push(Violation::new(field, messages::DURATION_POSITIVE));
    }
}

fn check_int_or_percent(field: &str, value: &IntOrPercent, out: &mut Vec<Violation>) {
    match value {
        IntOrPercent::Int(n) if *n < 1 => out.push(Violation::new(field, messages::COUNT_AT_LEAST_ONE)),
        IntOrPercent::Int(n) if *n > bounds::COUNT_MAX => {
            out.push(Violation::new(field, messages::COUNT_AT_MOST));
        }
        IntOrPercent::Int(_) => {}
        IntOrPercent::Percent(p) => {
            let pct = p
                .strip_suffix('%')
                .filter(|d| !d.starts_with('0'))
                .and_then(|d| d.parse::<u32>().ok());
            if !pct.is_some_and(|pct| (1..=100).contains(&pct)) {
                out.push(Violation::new(field, messages::PERCENT_RANGE));
            }
        }
    }
}

fn check_count(field: &str, count: Option<u32>, out: &mut Vec<Violation>) {
    match count {
        Some(0) => out.push(Violation::new(field, messages::COUNT_AT_LEAST_ONE)),
        Some(n) if n > bounds::COUNT_MAX => out.push(Violation::new(field, messages::COUNT_AT_MOST)),
        _ => {}
    }
}

fn check_suspect(suspect: &SuspectCause, out: &mut Vec<Violation>) {
    check_int_or_percent(
        "spec.safety.suspect.share",
        &IntOrPercent::Percent(suspect.share.clone()),
        out,
    );
    check_count("spec.safety.suspect.minFailures", Some(suspect.min_failures), out);
    if suspect.attributes.iter().any(|a| !is_qualified_name(a)) {
        out.push(Violation::new(
            "spec.safety.suspect.attributes",
            format!("every attribute {}", messages::LABEL_KEY),
        ));
    }
    check_positive("spec.safety.suspect.window", suspect.window, out);
}

fn check_failure_domains(domains: &[FailureDomain], out: &mut Vec<Violation>) {
    let mut keys = BTreeSet::new();
    if domains.len() > usize::try_from(bounds::FAILURE_DOMAINS_MAX).unwrap_or(usize::MAX) {
        out.push(Violation::new(
            "spec.safety.failureDomains",
            format!(
                "Too many: must have at most {} items",
                bounds::FAILURE_DOMAINS_MAX
            ),
        ));
    }
    for (i, domain) in domains.iter().enumerate() {
        let field = format!("spec.safety.failureDomains[{i}]");
        if !is_qualified_name(&domain.topology_key) {
            out.push(Violation::new(
                format!("{field}.topologyKey"),
                messages::LABEL_KEY,
            ));
        }
        if !keys.insert(domain.topology_key.as_str()) {
            out.push(Violation::new(
                "spec.safety.failureDomains",
                messages::DOMAIN_KEYS_DISTINCT,
            ));
        }
        if let Some(share) = &domain.max_unhealthy_share {
            check_int_or_percent(
                &format!("{field}.maxUnhealthyShare"),
                &IntOrPercent::Percent(share.clone()),
                out,
            );
        }
        check_count(
            &format!("{field}.maxUnhealthyCount"),
            domain.max_unhealthy_count,
            out,
        );
        check_count(&format!("{field}.maxInFlight"), domain.max_in_flight, out);
        if domain.max_unhealthy_share.is_none()
            && domain.max_unhealthy_count.is_none()
            && domain.max_in_flight.is_none()
        {
            out.push(Violation::new(field, messages::DOMAIN_LIMIT_REQUIRED));
        }
    }
}

fn check_triggers(spec: &GpuRemediationPolicySpec, out: &mut Vec<Violation>) {
    if spec.triggers.is_empty() {
        out.push(Violation::new("spec.triggers", messages::TRIGGERS_REQUIRED));
    }
    let mut seen: Vec<(&str, &str, BTreeSet<&str>)> = Vec::new();
    for (i, trigger) in spec.triggers.iter().enumerate() {
        let field = format!("spec.triggers[{i}]");
        if !is_qualified_name(&trigger.condition_type) {
            out.push(Violation::new(
                format!("{field}.conditionType"),
                messages::CONDITION_TYPE,
            ));
        }
        if trigger.reasons.iter().any(String::is_empty) {
            out.push(Violation::new(format!("{field}.reasons"), messages::REASON_EMPTY));
        }
        let mut reasons = BTreeSet::new();
        for (j, reason) in trigger.reasons.iter().enumerate() {
            if !reasons.insert(reason.as_str()) {
                out.push(Violation::new(
                    format!("{field}.reasons[{j}]"),
                    format!("Duplicate value: {reason:?}"),
                ));
            }
        }
        let key = (trigger.condition_type.as_str(), trigger.status.as_str(), reasons);
        if let Some(first) = seen.iter().position(|s| *s == key) {
            out.push(Violation::new(
                field,
                format!(
                    "duplicates spec.triggers[{first}]: same conditionType, status and reasons, so only one of them \
                     could ever decide the action"
                ),
            ));
        }
        seen.push(key);
    }
}

fn check_replacement(replacement: &Replacement, out: &mut Vec<Violation>) {
    let field = "spec.replacement.template";
    match (&replacement.template, replacement.strategy == Strategy::Template) {
        (None, true) => out.push(Violation::new(field, messages::TEMPLATE_REQUIRED)),
        (Some(_), false) => out.push(Violation::new(field, messages::TEMPLATE_FORBIDDEN)),
        (None, false) => {}
        (Some(template), true) => {
            for key in ["apiVersion", "kind"] {
                if template
                    .get(key)
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
                {
                    out.push(Violation::new(format!("{field}.{key}"), messages::TEMPLATE_KIND));
                }
            }
            let mut unknown = BTreeSet::new();
            collect_unknown_placeholders(template, &mut unknown);
            for placeholder in unknown {
                out.push(Violation::new(
                    field,
                    format!(
                        "unknown placeholder {placeholder}: a template may use {} and {}",
                        template_placeholders::NODE_NAME,
                        template_placeholders::REMEDIATION_NAME
                    ),
                ));
            }
        }
    }
}

/// Every `{{...}}` in the template's strings (keys included) that the controller would not
/// substitute, so a typo fails here rather than reaching the created object verbatim.
fn collect_unknown_placeholders(value: &Value, unknown: &mut BTreeSet<String>) {
    match value {
        Value::String(s) => scan_placeholders(s, unknown),
        Value::Array(items) => items
            .iter()
            .for_each(|v| collect_unknown_placeholders(v, unknown)),
        Value::Object(map) => {
            for (k, v) in map {
                scan_placeholders(k, unknown);
                collect_unknown_placeholders(v, unknown);
            }
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

fn scan_placeholders(s: &str, unknown: &mut BTreeSet<String>) {
    let mut rest = s;
    while let Some(start) = rest.find("{{") {
        let Some(len) = rest[start..].find("}}") else {
            break;
        };
        let placeholder = &rest[start..start + len + 2];
        if placeholder != template_placeholders::NODE_NAME
            && placeholder != template_placeholders::REMEDIATION_NAME
        {
            unknown.insert(placeholder.to_owned());
        }
        rest = &rest[start + len + 2..];
    }
}

fn check_selector(selector: &NodeSelector, out: &mut Vec<Violation>) {
    for (key, value) in &selector.match_labels {
        if !is_qualified_name(key) {
            out.push(Violation::new(
                "spec.nodeSelector.matchLabels",
                format!("every key {} ({key:?} is not)", messages::LABEL_KEY),
            ));
        }
        if !is_label_value(value) {
            out.push(Violation::new(
                "spec.nodeSelector.matchLabels",
                format!("every value {} ({value:?} is not)", messages::LABEL_VALUE),
            ));
        }
    }
    for (i, req) in selector.match_expressions.iter().enumerate() {
        let field = format!("spec.nodeSelector.matchExpressions[{i}]");
        if !is_qualified_name(&req.key) {
            out.push(Violation::new(format!("{field}.key"), messages::LABEL_KEY));
        }
        if req.values.iter().any(|v| !is_label_value(v)) {
            out.push(Violation::new(
                format!("{field}.values"),
                format!("every value {}", messages::LABEL_VALUE),
            ));
        }
        match req.operator {
            SelectorOperator::In | SelectorOperator::NotIn if req.values.is_empty() => {
                out.push(Violation::new(
                    format!("{field}.values"),
                    messages::SELECTOR_VALUES_REQUIRED,
                ));
            }
            SelectorOperator::Exists | SelectorOperator::DoesNotExist if !req.values.is_empty() => {
                out.push(Violation::new(
                    format!("{field}.values"),
                    messages::SELECTOR_VALUES_FORBIDDEN,
                ));
            }
            _ => {}
        }
    }
}

/// The ladder's rules (`crate::ladder_schema`) in Rust, in the schema's words.
fn check_ladder(spec: &GpuRemediationPolicySpec, out: &mut Vec<Violation>) {
    let violation = |field: String, message: &str| Violation {
        field,
        message: message.to_owned(),
    };
    for (i, step) in spec.ladder.iter().enumerate() {
        if step.timeout < Duration::from_secs(1) || step.timeout > STEP_TIMEOUT_MAX {
            out.push(violation(
                format!("spec.ladder[{i}].timeout"),
                ladder_schema::messages::STEP_TIMEOUT,
            ));
        }
        match (step.step.has_template(), step.template.is_some()) {
            (true, false) => out.push(violation(
                format!("spec.ladder[{i}].template"),
                ladder_schema::messages::STEP_TEMPLATE_REQUIRED,
            )),
            (false, true) => out.push(violation(
                format!("spec.ladder[{i}].template"),
                ladder_schema::messages::STEP_TEMPLATE_FORBIDDEN,
            )),
            _ => {}
        }
    }
    if spec.ladder.windows(2).any(|pair| pair[0].step >= pair[1].step) {
        out.push(violation(
            "spec.ladder".to_owned(),
            ladder_schema::messages::LADDER_ORDER,
        ));
    }
    if !spec.ladder.is_empty()
        && spec
            .triggers
            .iter()
            .filter_map(|t| t.start_at)
            .any(|rung| !spec.ladder.iter().any(|s| s.step == rung))
    {
        out.push(violation(
            "spec.triggers".to_owned(),
            ladder_schema::messages::START_AT,
        ));
    }
}

#[cfg(test)]
mod tests;
