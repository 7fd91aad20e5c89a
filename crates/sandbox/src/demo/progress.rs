//! What `make demo` shows: one line per change of a remediation (its phase, as `kubectl get
//! gpuremediations -w` shows it, with a drain progress bar), whether every PDB held, what the
//! controller's `/metrics` say about evictions, and the closing summary. Pure.

use std::{collections::BTreeMap, fmt::Write as _, time::Duration};

use gpu_remediation_api::{GpuRemediation, Phase};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;

/// What one remediation looked like when last shown.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    /// Its phase.
    pub phase: Phase,
    /// Pods evicted so far, and in all.
    pub evicted: u32,
    /// Pods the drain has to move.
    pub total: u32,
    /// Pods refused by a budget right now.
    pub blocked: usize,
}

/// The state of `remediation` as the demo shows it.
#[must_use]
pub fn seen(remediation: &GpuRemediation) -> Seen {
    let status = remediation.status.clone().unwrap_or_default();
    let drain = status.drain.unwrap_or_default();
    Seen {
        phase: status.phase,
        evicted: drain.pods_evicted,
        total: drain.pods_total,
        blocked: drain.blockers.len(),
    }
}

/// `[#####.....]` for `done` of `total`, `width` wide.
#[must_use]
pub fn bar(done: u32, total: u32, width: usize) -> String {
    let filled = if total == 0 {
        width
    } else {
        let share = usize::try_from(done.min(total)).unwrap_or(0) * width;
        share / usize::try_from(total).unwrap_or(1)
    };
    format!("[{}{}]", "#".repeat(filled), ".".repeat(width - filled))
}

/// One progress line, or `None` when nothing the demo shows changed since `before`.
#[must_use]
pub fn line(elapsed: Duration, name: &str, node: &str, now: &Seen, before: Option<&Seen>) -> Option<String> {
    if before == Some(now) {
        return None;
    }
    let mut text = format!(
        "[{:>6.1}s] {name:<28} {node:<12} {:<16}",
        elapsed.as_secs_f64(),
        now.phase.to_string()
    );
    if now.total > 0 || matches!(now.phase, Phase::Draining | Phase::Blocked) {
        let _ = write!(
            text,
            " {} {}/{} pods evicted",
            bar(now.evicted, now.total, 20),
            now.evicted,
            now.total
        );
    }
    if now.blocked > 0 {
        let _ = write!(
            text,
            ", {} refused by a PDB (retried when it allows)",
            now.blocked
        );
    }
    Some(text.trim_end().to_owned())
}

/// The PDB watch: how close any budget came to being broken.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BudgetRecord {
    /// Samples taken.
    pub samples: u32,
    /// Budgets seen.
    pub budgets: usize,
    /// The smallest `currentHealthy - desiredHealthy` seen over all budgets (negative: broken).
    pub lowest_margin: Option<i32>,
    /// Budgets seen below their desired healthy count, by `namespace/name`.
    pub broken: BTreeMap<String, i32>,
}

impl BudgetRecord {
    /// Adds one sample of every budget.
    pub fn sample(&mut self, budgets: &[PodDisruptionBudget]) {
        self.samples += 1;
        self.budgets = self.budgets.max(budgets.len());
        for pdb in budgets {
            let Some(status) = &pdb.status else { continue };
            // A budget the disruption controller has not observed yet says nothing.
            if status.observed_generation.is_none() {
                continue;
            }
            let margin = status.current_healthy - status.desired_healthy;
            self.lowest_margin = Some(self.lowest_margin.map_or(margin, |m| m.min(margin)));
            if margin < 0 {
                let name = format!(
                    "{}/{}",
                    pdb.metadata.namespace.as_deref().unwrap_or_default(),
                    pdb.metadata.name.as_deref().unwrap_or_default()
                );
                self.broken.entry(name).or_insert(margin);
            }
        }
    }

    /// Whether no budget was ever seen below its desired healthy count.
    #[must_use]
    pub fn honoured(&self) -> bool {
        self.samples > 0 && self.broken.is_empty()
    }
}

/// Eviction attempts by result, from the controller's `/metrics` text
/// (`gpu_remediator_evictions_total{result="Evicted"} 4`).
#[must_use]
pub fn evictions_by_result(metrics: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("gpu_remediator_evictions_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let result = labels
            .split(',')
            .find_map(|l| l.strip_prefix("result=\""))
            .and_then(|r| r.strip_suffix('"'));
        if let (Some(result), Ok(value)) = (result, value.trim().parse::<f64>()) {
            #[allow(
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss,
                reason = "a counter of attempts is a small whole number"
            )]
            let count = value as u64;
            *out.entry(result.to_owned()).or_default() += count;
        }
    }
    out
}

/// The figures the summary reports, each measured from the fault injection as the demo observed it.
#[derive(Clone, Debug, Default)]
pub struct Figures {
    /// The remediation.
    pub remediation: String,
    /// The node that broke.
    pub node: String,
    /// The trigger's `for`.
    pub trigger_for: Duration,
    /// When each phase was first seen, from the fault.
    pub phase_seen: BTreeMap<String, Duration>,
    /// Pods the drain moved.
    pub pods_evicted: u32,
    /// Eviction attempts by result, from the controller's metrics (`None`: unreadable).
    pub evictions: Option<BTreeMap<String, u64>>,
    /// The node that replaced the broken one, if it came.
    pub replacement_node: Option<String>,
    /// The PDB watch.
    pub budgets: BudgetRecord,
    /// The demo's wall time so far.
    pub wall: Duration,
}

fn at(figures: &Figures, phase: Phase) -> String {
    figures.phase_seen.get(&phase.to_string()).map_or_else(
        || "not reached".to_owned(),
        |d| format!("{:.1}s", d.as_secs_f64()),
    )
}

/// The closing summary.
#[must_use]
pub fn summary(figures: &Figures) -> String {
    let mut text = String::new();
    let _ = writeln!(
        text,
        "summary: {} recycled node {}",
        figures.remediation, figures.node
    );
    let _ = writeln!(
        text,
        "  time to cordon:    {} after the fault (the trigger must hold {}s first, counted from the condition's \
         lastTransitionTime, which has whole-second precision)",
        at(figures, Phase::Cordoned),
        figures.trigger_for.as_secs()
    );
    let _ = writeln!(
        text,
        "  time to drained:   {} (replacement started)",
        at(figures, Phase::Replacing)
    );
    let replaced = figures
        .replacement_node
        .as_ref()
        .map_or_else(String::new, |n| format!(", the node group brought up {n}"));
    let _ = writeln!(
        text,
        "  time to replaced:  {} (node deleted{replaced})",
        at(figures, Phase::Succeeded)
    );
    let attempts = figures.evictions.as_ref().map_or_else(
        || "the controller's /metrics could not be read for the attempts".to_owned(),
        |counts| {
            let count = |result: &str| counts.get(result).copied().unwrap_or(0);
            format!(
                "{} attempts refused by a PDB (429) and retried; {} force-deleted",
                count("Blocked"),
                count("ForceDeleted")
            )
        },
    );
    let _ = writeln!(
        text,
        "  pods evicted:      {} through the Eviction API; {attempts}",
        figures.pods_evicted
    );
    let budgets = &figures.budgets;
    let verdict = if budgets.honoured() {
        format!(
            "yes: {} budgets, none ever below its desired healthy pods over {} samples (closest margin {})",
            budgets.budgets,
            budgets.samples,
            budgets.lowest_margin.unwrap_or_default()
        )
    } else if budgets.samples == 0 {
        "unknown: no sample taken".to_owned()
    } else {
        format!("NO: below desired healthy: {:?}", budgets.broken)
    };
    let _ = writeln!(text, "  PDBs honoured:     {verdict}");
    let _ = writeln!(text, "  demo wall time:    {:.1}s", figures.wall.as_secs_f64());
    text
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pdb(name: &str, current: i32, desired: i32) -> PodDisruptionBudget {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "w"},
            "status": {"currentHealthy": current, "desiredHealthy": desired, "disruptionsAllowed": 0,
                       "expectedPods": current, "observedGeneration": 1},
        }))
        .unwrap()
    }

    #[test]
    fn the_bar_fills_with_the_share_done() {
        assert_eq!(bar(0, 4, 8), "[........]");
        assert_eq!(bar(2, 4, 8), "[####....]");
        assert_eq!(bar(4, 4, 8), "[########]");
        assert_eq!(bar(0, 0, 4), "[####]", "nothing to move is done");
    }

    #[test]
    fn a_line_is_printed_only_when_something_shown_changed() {
        let draining = Seen {
            phase: Phase::Draining,
            evicted: 1,
            total: 4,
            blocked: 1,
        };
        let shown = line(Duration::from_millis(2500), "gpu-3-abc", "gpu-3", &draining, None).unwrap();
        assert!(shown.contains("Draining"), "{shown}");
        assert!(
            shown.contains("[#####...............] 1/4 pods evicted"),
            "{shown}"
        );
        assert!(shown.contains("1 refused by a PDB"), "{shown}");
        assert_eq!(
            line(Duration::ZERO, "gpu-3-abc", "gpu-3", &draining, Some(&draining)),
            None
        );
    }

    #[test]
    fn a_budget_below_its_desired_healthy_count_is_reported_as_broken() {
        let mut record = BudgetRecord::default();
        record.sample(&[pdb("a", 4, 3), pdb("b", 3, 3)]);
        assert!(record.honoured());
        assert_eq!(record.lowest_margin, Some(0));
        record.sample(&[pdb("a", 2, 3)]);
        assert!(!record.honoured());
        assert_eq!(record.broken.get("w/a"), Some(&-1));
    }

    #[test]
    fn no_sample_means_no_claim_that_budgets_held() {
        assert!(!BudgetRecord::default().honoured());
    }

    #[test]
    fn eviction_counts_are_read_by_result_from_the_metrics_text() {
        let text = "# TYPE gpu_remediator_evictions counter\n\
                    gpu_remediator_evictions_total{result=\"Evicted\"} 4\n\
                    gpu_remediator_evictions_total{result=\"Blocked\"} 3\n\
                    gpu_remediator_leader 1\n";
        let counts = evictions_by_result(text);
        assert_eq!(counts.get("Evicted"), Some(&4));
        assert_eq!(counts.get("Blocked"), Some(&3));
        assert_eq!(counts.len(), 2);
    }

    #[test]
    fn the_summary_gives_each_time_from_the_fault_and_says_whether_budgets_held() {
        let mut budgets = BudgetRecord::default();
        budgets.sample(&[pdb("a", 8, 7)]);
        let figures = Figures {
            remediation: "gpu-3-abc".into(),
            node: "gpu-3".into(),
            trigger_for: Duration::from_secs(5),
            phase_seen: [
                (Phase::Cordoned.to_string(), Duration::from_millis(5300)),
                (Phase::Replacing.to_string(), Duration::from_millis(9100)),
            ]
            .into_iter()
            .collect(),
            pods_evicted: 4,
            evictions: Some([("Blocked".to_owned(), 2)].into_iter().collect()),
            replacement_node: None,
            budgets,
            wall: Duration::from_secs(40),
        };
        let text = summary(&figures);
        assert!(text.contains("time to cordon:    5.3s"), "{text}");
        assert!(text.contains("time to drained:   9.1s"), "{text}");
        assert!(text.contains("time to replaced:  not reached"), "{text}");
        assert!(
            text.contains("4 through the Eviction API; 2 attempts refused"),
            "{text}"
        );
        assert!(text.contains("PDBs honoured:     yes: 1 budgets"), "{text}");
    }
}
