//! `validate_spec` against policies that break each rule once.

use serde_json::json;

use super::*;
use crate::{
    policy::{ConditionStatus, Trigger},
    selector::SelectorRequirement,
};

fn spec() -> GpuRemediationPolicySpec {
    serde_json::from_value(json!({"triggers": [{"conditionType": "GpuHealthy", "status": "False"}]})).unwrap()
}

fn fields(violations: &[Violation]) -> Vec<&str> {
    violations.iter().map(|v| v.field.as_str()).collect()
}

#[test]
fn a_policy_of_defaults_and_one_trigger_is_valid() {
    assert_eq!(validate_spec(&spec()), vec![]);
}

#[test]
fn failure_domains_need_a_label_key_a_limit_distinct_keys_and_counts_of_at_least_one() {
    let mut spec = spec();
    spec.safety.max_unhealthy_count = Some(0);
    spec.safety.failure_domains = serde_json::from_value(json!([
        {"topologyKey": "example.com/rack", "maxUnhealthyShare": "50%", "maxUnhealthyCount": 2},
        {"topologyKey": "not a key", "maxInFlight": 0},
        {"topologyKey": "example.com/rack"},
    ]))
    .unwrap();
    assert_eq!(
        fields(&validate_spec(&spec)),
        [
            "spec.safety.maxUnhealthyCount",
            "spec.safety.failureDomains[1].topologyKey",
            "spec.safety.failureDomains[1].maxInFlight",
            "spec.safety.failureDomains",
            "spec.safety.failureDomains[2]",
        ]
    );
    spec.safety.max_unhealthy_count = Some(3);
    spec.safety.failure_domains.truncate(1);
    assert_eq!(validate_spec(&spec), vec![]);
}

#[test]
fn a_policy_without_triggers_is_refused() {
    let mut spec = spec();
    spec.triggers.clear();
    assert_eq!(fields(&validate_spec(&spec)), ["spec.triggers"]);
}

#[test]
fn two_triggers_on_the_same_condition_status_and_reasons_are_refused_as_duplicates() {
    let mut spec = spec();
    let trigger = |reasons: &[&str]| Trigger {
        condition_type: "GpuHealthy".into(),
        status: ConditionStatus::False,
        reasons: reasons.iter().map(|r| (*r).to_owned()).collect(),
        for_: Duration::from_secs(0),
        action: None,
        quarantine: None,
        start_at: None,
    };
    spec.triggers = vec![
        trigger(&["XID79", "GpuMissing"]),
        trigger(&["XID48"]),
        trigger(&["GpuMissing", "XID79"]),
    ];
    let violations = validate_spec(&spec);
    assert_eq!(fields(&violations), ["spec.triggers[2]"]);
    assert!(
        violations[0].message.contains("duplicates spec.triggers[0]"),
        "{}",
        violations[0]
    );
}

#[test]
fn zero_counts_and_percentages_outside_one_to_a_hundred_are_refused() {
    for (value, ok) in [
        (IntOrPercent::Int(0), false),
        (IntOrPercent::Int(1), true),
        (IntOrPercent::Percent("0%".into()), false),
        (IntOrPercent::Percent("1%".into()), true),
        (IntOrPercent::Percent("100%".into()), true),
        (IntOrPercent::Percent("101%".into()), false),
        (IntOrPercent::Percent("05%".into()), false),
        (IntOrPercent::Percent("ten".into()), false),
    ] {
        let mut out = Vec::new();
        check_int_or_percent("f", &value, &mut out);
        assert_eq!(out.is_empty(), ok, "{value}");
    }
}

#[test]
fn a_template_with_an_unknown_placeholder_is_refused_and_the_known_ones_are_not() {
    let mut spec = spec();
    spec.replacement.strategy = Strategy::Template;
    spec.replacement.template = Some(json!({
        "apiVersion": "remediation.medik8s.io/v1alpha1",
        "kind": "SelfNodeRemediation",
        "metadata": {"name": "{{remediationName}}"},
        "spec": {"node": "{{nodeName}}", "other": "{{node}}"},
    }));
    let violations = validate_spec(&spec);
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert!(
        violations[0].message.contains("unknown placeholder {{node}}"),
        "{}",
        violations[0]
    );
}

#[test]
fn a_template_without_a_kind_is_refused() {
    let mut spec = spec();
    spec.replacement.strategy = Strategy::Template;
    spec.replacement.template = Some(json!({"apiVersion": "v1"}));
    assert_eq!(
        validate_spec(&spec),
        vec![Violation::new(
            "spec.replacement.template.kind",
            messages::TEMPLATE_KIND
        )]
    );
}

#[test]
fn history_must_outlive_both_limit_windows() {
    let mut spec = spec();
    spec.history.ttl = Duration::from_hours(24);
    assert_eq!(
        validate_spec(&spec),
        vec![Violation::new("spec.history.ttl", messages::TTL_VS_ATTEMPTS)]
    );
    spec.history.ttl = Duration::from_hours(1);
    assert_eq!(validate_spec(&spec).len(), 2);
}

#[test]
fn a_drain_unreachable_after_past_an_hour_is_refused() {
    let mut spec = spec();
    for (secs, ok) in [(0, true), (300, true), (3600, true), (3601, false)] {
        spec.drain.unreachable_after = Duration::from_secs(secs);
        assert_eq!(validate_spec(&spec).is_empty(), ok, "{secs}s");
    }
}

#[test]
fn a_quarantine_hysteresis_outside_a_second_to_an_hour_and_a_zero_limit_are_refused() {
    let mut spec = spec();
    for (secs, ok) in [(0, false), (1, true), (3600, true), (3601, false)] {
        spec.quarantine.hysteresis = Duration::from_secs(secs);
        assert_eq!(validate_spec(&spec).is_empty(), ok, "{secs}s");
    }
    spec.quarantine.hysteresis = Duration::from_secs(30);
    spec.quarantine.max = Some(IntOrPercent::Int(0));
    assert_eq!(
        validate_spec(&spec),
        vec![Violation::new(
            "spec.quarantine.max",
            messages::COUNT_AT_LEAST_ONE
        )]
    );
}

#[test]
fn a_zero_or_unreadable_cordon_on_join_limit_is_refused_like_the_quarantine_limit() {
    let mut spec = spec();
    spec.safety.repeat_offender = Some(crate::safety::RepeatOffender {
        failures: 1,
        window: Duration::from_hours(24),
        action: crate::safety::OffenderAction::Replace,
        cordon_on_join: true,
        cordon_on_join_max: Some(IntOrPercent::Percent("10%".into())),
    });
    assert!(validate_spec(&spec).is_empty());
    spec.safety.repeat_offender.as_mut().unwrap().cordon_on_join_max = Some(IntOrPercent::Int(0));
    assert_eq!(
        validate_spec(&spec),
        vec![Violation::new(
            "spec.safety.repeatOffender.cordonOnJoinMax",
            messages::COUNT_AT_LEAST_ONE
        )]
    );
}

#[test]
fn selector_operators_take_values_exactly_when_they_compare_them() {
    let mut spec = spec();
    let req = |operator, values: &[&str]| SelectorRequirement {
        key: "nvidia.com/gpu.product".into(),
        operator,
        values: values.iter().map(|v| (*v).to_owned()).collect(),
    };
    spec.node_selector.match_expressions = vec![
        req(SelectorOperator::In, &[]),
        req(SelectorOperator::Exists, &["x"]),
        req(SelectorOperator::NotIn, &["A100"]),
        req(SelectorOperator::DoesNotExist, &[]),
    ];
    let violations = validate_spec(&spec);
    assert_eq!(
        violations,
        vec![
            Violation::new(
                "spec.nodeSelector.matchExpressions[0].values",
                messages::SELECTOR_VALUES_REQUIRED
            ),
            Violation::new(
                "spec.nodeSelector.matchExpressions[1].values",
                messages::SELECTOR_VALUES_FORBIDDEN
            ),
        ]
    );
}

#[test]
fn drain_gangs_default_to_members_and_parse_together_with_bounded_label_keys() {
    assert_eq!(spec().drain.gangs, crate::policy::GangDrain::Members);
    let together: GpuRemediationPolicySpec = serde_json::from_value(json!({
        "triggers": [{"conditionType": "GpuHealthy", "status": "False"}],
        "drain": {"gangs": "Together", "gangLabels": ["example.com/gang"]},
    }))
    .unwrap();
    assert_eq!(together.drain.gangs, crate::policy::GangDrain::Together);
    assert_eq!(validate_spec(&together), vec![]);
    let mut spec = together;
    spec.drain.gang_labels = vec!["example.com/gang".into(), "not a key".into()];
    let violations = validate_spec(&spec);
    assert_eq!(fields(&violations), ["spec.drain.gangLabels"]);
    assert!(violations[0].message.contains("\"not a key\""), "{violations:?}");
    spec.drain.gang_labels = (0..=bounds::GANG_LABELS_MAX)
        .map(|i| format!("example.com/gang-{i}"))
        .collect();
    assert_eq!(
        validate_spec(&spec),
        vec![Violation::new(
            "spec.drain.gangLabels",
            "Too many: 17: must have at most 16 items"
        )]
    );
}
