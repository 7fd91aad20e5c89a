//! Unit tests of `metrics`.

use super::*;

fn line_value(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|line| line.starts_with(prefix) && line[prefix.len()..].starts_with(' '))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
}

#[test]
fn started_and_finished_remediations_are_counted_by_policy_action_and_outcome() {
    let metrics = Metrics::new();
    metrics.remediation_started("gpus", Action::Replace);
    metrics.remediation_started("gpus", Action::Replace);
    metrics.remediation_finished("gpus", Action::Replace, Phase::Succeeded);
    let text = metrics.encode();
    assert_eq!(
        line_value(
            &text,
            r#"gpu_remediator_remediations_started_total{policy="gpus",action="Replace"}"#
        ),
        Some(2.0)
    );
    assert_eq!(
        line_value(
            &text,
            r#"gpu_remediator_remediations_finished_total{policy="gpus",action="Replace",outcome="Succeeded"}"#
        ),
        Some(1.0)
    );
}

#[test]
fn gauges_are_set_not_accumulated() {
    let metrics = Metrics::new();
    metrics.set_in_flight("gpus", 3);
    metrics.set_in_flight("gpus", 1);
    metrics.set_budget_remaining("gpus", 2);
    metrics.set_circuit_open("gpus", true);
    metrics.set_leader(true);
    let text = metrics.encode();
    assert_eq!(
        line_value(&text, r#"gpu_remediator_remediations_in_flight{policy="gpus"}"#),
        Some(1.0)
    );
    assert_eq!(
        line_value(&text, r#"gpu_remediator_budget_remaining{policy="gpus"}"#),
        Some(2.0)
    );
    assert_eq!(
        line_value(&text, r#"gpu_remediator_circuit_open{policy="gpus"}"#),
        Some(1.0)
    );
    assert_eq!(line_value(&text, "gpu_remediator_leader"), Some(1.0));
}

#[test]
fn a_forgotten_policy_stops_being_reported() {
    let metrics = Metrics::new();
    metrics.set_in_flight("old", 1);
    metrics.forget_policy("old");
    assert!(!metrics.encode().contains(r#"policy="old""#));
}

#[test]
fn durations_land_in_histograms_in_seconds() {
    let metrics = Metrics::new();
    metrics.phase_finished("gpus", Phase::Draining, Duration::from_secs(90));
    metrics.detected_to_cordoned("gpus", Duration::from_millis(1500));
    let text = metrics.encode();
    assert_eq!(
        line_value(
            &text,
            r#"gpu_remediator_phase_duration_seconds_sum{policy="gpus",phase="Draining"}"#
        ),
        Some(90.0)
    );
    assert_eq!(
        line_value(
            &text,
            r#"gpu_remediator_detection_to_cordon_seconds_count{policy="gpus"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        line_value(
            &text,
            r#"gpu_remediator_detection_to_cordon_seconds_sum{policy="gpus"}"#
        ),
        Some(1.5)
    );
}

#[test]
fn time_to_recovery_is_observed_in_seconds_by_policy_and_outcome() {
    let metrics = Metrics::new();
    metrics.time_to_recovery("gpus", Phase::Succeeded, Duration::from_secs(600));
    metrics.time_to_recovery("gpus", Phase::Succeeded, Duration::from_secs(60));
    let text = metrics.encode();
    assert_eq!(
        line_value(
            &text,
            r#"gpu_remediator_time_to_recovery_seconds_sum{policy="gpus",outcome="Succeeded"}"#
        ),
        Some(660.0)
    );
    assert_eq!(
        line_value(
            &text,
            r#"gpu_remediator_time_to_recovery_seconds_bucket{le="120.0",policy="gpus",outcome="Succeeded"}"#
        ),
        Some(1.0)
    );
}

#[test]
fn evictions_and_reconcile_errors_are_counted_by_result_and_reconciler() {
    let metrics = Metrics::new();
    metrics.eviction(EvictionResult::Evicted);
    metrics.eviction(EvictionResult::Blocked);
    metrics.eviction(EvictionResult::Blocked);
    metrics.reconcile_error("remediation", "conflict");
    let text = metrics.encode();
    assert_eq!(
        line_value(&text, r#"gpu_remediator_evictions_total{result="Blocked"}"#),
        Some(2.0)
    );
    assert_eq!(
        line_value(&text, r#"gpu_remediator_evictions_total{result="Evicted"}"#),
        Some(1.0)
    );
    assert_eq!(
        line_value(
            &text,
            r#"gpu_remediator_reconcile_errors_total{reconciler="remediation"}"#
        ),
        Some(1.0)
    );
}

#[test]
fn error_and_eviction_counters_read_zero_before_anything_happens() {
    let text = Metrics::new().encode();
    assert_eq!(
        line_value(
            &text,
            r#"gpu_remediator_reconcile_errors_total{reconciler="remediation"}"#
        ),
        Some(0.0)
    );
    assert_eq!(
        line_value(
            &text,
            r#"gpu_remediator_reconcile_errors_total{reconciler="policy"}"#
        ),
        Some(0.0)
    );
    assert_eq!(
        line_value(&text, r#"gpu_remediator_evictions_total{result="Blocked"}"#),
        Some(0.0)
    );
}

#[test]
fn the_output_is_openmetrics_terminated_by_eof() {
    assert!(Metrics::new().encode().ends_with("# EOF\n"));
}
