//! The ladder's metrics: each step's outcome and duration, and how many recycles ended without a
//! replacement (a reset or a reboot sufficed, or a person took over), with that share per policy.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use gpu_remediation_api::ladder::{Rung, StepOutcome};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct StepLabels {
    policy: String,
    step: &'static str,
    outcome: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RecycleLabels {
    policy: String,
    replaced: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct PolicyLabels {
    policy: String,
}

fn step_histogram() -> Histogram {
    // 1 s to about 4.5 h: a reset takes seconds plus the dwell, a replacement hours.
    Histogram::new(exponential_buckets(1.0, 2.0, 15))
}

/// The ladder's series (part of [`super::Metrics`]).
pub(super) struct LadderSeries {
    steps: Family<StepLabels, Counter>,
    step_duration: Family<StepLabels, Histogram>,
    recycles: Family<RecycleLabels, Counter>,
    without_replacement: Family<PolicyLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// Per policy: recycles finished, and those without a replacement.
    tally: Arc<Mutex<BTreeMap<String, (u64, u64)>>>,
}

const fn outcome_label(outcome: StepOutcome) -> &'static str {
    match outcome {
        StepOutcome::Succeeded => "Succeeded",
        StepOutcome::Transient => "Transient",
        StepOutcome::Permanent => "Permanent",
        StepOutcome::TimedOut => "TimedOut",
        StepOutcome::Superseded => "Superseded",
    }
}

impl LadderSeries {
    pub(super) fn new() -> Self {
        Self {
            steps: Family::default(),
            step_duration: Family::new_with_constructor(step_histogram),
            recycles: Family::default(),
            without_replacement: Family::default(),
            tally: Arc::default(),
        }
    }

    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "ladder_steps",
            "Ladder steps ended, by policy, step and outcome",
            self.steps.clone(),
        );
        registry.register(
            "ladder_step_duration_seconds",
            "How long each ladder step took, by policy, step and outcome",
            self.step_duration.clone(),
        );
        registry.register(
            "ladder_recycles",
            "Recycles on a ladder that finished, by policy and whether the node was replaced",
            self.recycles.clone(),
        );
        registry.register(
            "ladder_without_replacement_ratio",
            "Share of the policy's finished ladder recycles that ended without a replacement",
            self.without_replacement.clone(),
        );
    }

    pub(super) fn step_finished(&self, policy: &str, step: Rung, outcome: StepOutcome, took: Duration) {
        let labels = StepLabels {
            policy: policy.to_owned(),
            step: step.as_str(),
            outcome: outcome_label(outcome),
        };
        self.steps.get_or_create(&labels).inc();
        self.step_duration
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
    }

    pub(super) fn recycle_finished(&self, policy: &str, replaced: bool) {
        self.recycles
            .get_or_create(&RecycleLabels {
                policy: policy.to_owned(),
                replaced: if replaced { "true" } else { "false" },
            })
            .inc();
        let mut tally = self.tally.lock().unwrap_or_else(PoisonError::into_inner);
        let (total, kept) = tally.entry(policy.to_owned()).or_default();
        *total += 1;
        if !replaced {
            *kept += 1;
        }
        #[allow(
            clippy::cast_precision_loss,
            reason = "counts of recycles stay far below 2^52, where f64 is exact"
        )]
        let share = *kept as f64 / *total as f64;
        self.without_replacement
            .get_or_create(&PolicyLabels {
                policy: policy.to_owned(),
            })
            .set(share);
    }
}

#[cfg(test)]
mod tests {
    use super::super::Metrics;
    use super::*;

    #[test]
    fn step_outcomes_and_the_share_without_replacement_are_reported_per_policy() {
        let metrics = Metrics::new();
        metrics.step_finished(
            "p",
            Rung::ResetGpu,
            StepOutcome::Permanent,
            Duration::from_secs(40),
        );
        metrics.step_finished(
            "p",
            Rung::Reboot,
            StepOutcome::Succeeded,
            Duration::from_secs(300),
        );
        metrics.recycle_finished("p", false);
        metrics.recycle_finished("p", false);
        metrics.recycle_finished("p", true);
        metrics.recycle_finished("p", false);
        let text = metrics.encode();
        assert!(
            text.contains(
                r#"gpu_remediator_ladder_steps_total{policy="p",step="ResetGpu",outcome="Permanent"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"gpu_remediator_ladder_step_duration_seconds_count{policy="p",step="Reboot",outcome="Succeeded"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"gpu_remediator_ladder_recycles_total{policy="p",replaced="false"} 3"#),
            "{text}"
        );
        assert!(
            text.contains(r#"gpu_remediator_ladder_without_replacement_ratio{policy="p"} 0.75"#),
            "{text}"
        );
    }
}
