//! Turning measurements into figures: nearest-rank percentiles, and the Markdown tables `make
//! bench` prints and `docs/benchmarks.md` keeps.

use std::fmt::Write as _;

use super::drain::DrainComparison;
use super::footprint::FootprintResult;
use super::latency::LatencyResult;

/// The nearest-rank `p`-th percentile (0 < p <= 100) of `values`, or `None` when empty.
#[must_use]
pub fn percentile(values: &[f64], p: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss,
        reason = "a rank among at most a few thousand samples"
    )]
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    Some(sorted[rank.min(sorted.len()) - 1])
}

/// Everything one run measured.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct BenchResults {
    /// When the run started.
    pub started: String,
    /// What ran the controller (binary path and whether it is a release build).
    pub controller_binary: String,
    /// Detection-to-cordon latency.
    pub latency: Vec<LatencyResult>,
    /// The drain against `kubectl drain`.
    pub drain: Option<DrainComparison>,
    /// RSS and CPU by fleet size.
    pub footprint: Vec<FootprintResult>,
    /// Scenarios that failed, with why (the others still ran).
    pub failures: Vec<String>,
}

/// The tables, in Markdown.
#[must_use]
pub fn markdown(results: &BenchResults) -> String {
    let mut out = String::new();
    for failure in &results.failures {
        let _ = writeln!(out, "**Failed:** {failure}\n");
    }
    if !results.latency.is_empty() {
        out.push_str("### Detection to cordon (from the moment `for` elapses)\n\n");
        out.push_str(
            "| nodes | pods | simultaneous faults | cordoned | p50 | p99 | max | controller peak RSS |\n",
        );
        out.push_str("|---:|---:|---:|---:|---:|---:|---:|---:|\n");
        for r in &results.latency {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {}/{} | {:.0} ms | {:.0} ms | {:.0} ms | {:.1} MiB |",
                r.nodes,
                r.pods,
                r.faults,
                r.cordoned,
                r.faults,
                r.p50_ms,
                r.p99_ms,
                r.max_ms,
                r.controller_peak_rss_mib
            );
        }
        out.push('\n');
    }
    if let Some(d) = &results.drain {
        out.push_str(
            "### Drain of one node holding 100 pods (Deployments of 3-10 replicas, PDB maxUnavailable 1)\n\n",
        );
        out.push_str("| peer | cordon to empty | pods evicted | PDB violations (least margin) | requests | evictions (429) |\n");
        out.push_str("|---|---:|---:|---:|---:|---:|\n");
        for p in [&d.controller, &d.kubectl] {
            let evictions = p
                .requests
                .by_kind
                .get("create pods/eviction")
                .copied()
                .unwrap_or(0);
            let refused = p
                .requests
                .refused_429
                .get("create pods/eviction")
                .copied()
                .unwrap_or(0);
            let _ = writeln!(
                out,
                "| {} | {:.1} s | {} | {} ({}) | {} | {} ({}) |",
                p.peer, p.seconds, p.pods, p.violations, p.least_margin, p.requests.total, evictions, refused
            );
        }
        let _ = writeln!(
            out,
            "\nRatio (kubectl drain time / gpu-remediator drain time): **{:.2}x**\n",
            d.ratio
        );
    }
    if !results.footprint.is_empty() {
        out.push_str("### Controller footprint (separate process; VmHWM and utime+stime from /proc)\n\n");
        out.push_str("| nodes | pods | idle RSS | idle CPU | peak RSS after a 10-node remediation | CPU during it | requests per remediation |\n");
        out.push_str("|---:|---:|---:|---:|---:|---:|---:|\n");
        for f in &results.footprint {
            let _ = writeln!(
                out,
                "| {} | {} | {:.1} MiB | {:.2} s | {:.1} MiB | {:.2} s | {:.1} |",
                f.nodes,
                f.pods,
                f.idle_peak_rss_mib,
                f.idle_cpu_seconds,
                f.remediation_peak_rss_mib,
                f.remediation_cpu_seconds,
                f.requests_per_remediation
            );
        }
        out.push('\n');
        if let Some(f) = results.footprint.iter().max_by_key(|f| f.nodes) {
            out.push_str("Requests per remediation by verb and resource (largest fleet):\n\n");
            out.push_str("| request | count per remediation |\n|---|---:|\n");
            for (kind, n) in &f.requests.by_kind {
                #[allow(clippy::cast_precision_loss, reason = "request counts are small")]
                let per = *n as f64 / f.remediations.max(1) as f64;
                let _ = writeln!(out, "| {kind} | {per:.1} |");
            }
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles_pick_a_sample() {
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&values, 50.0), Some(50.0));
        assert_eq!(percentile(&values, 99.0), Some(99.0));
        assert_eq!(percentile(&values, 100.0), Some(100.0));
        assert_eq!(percentile(&[7.0], 99.0), Some(7.0));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn a_single_fault_has_the_same_p50_and_p99() {
        assert_eq!(percentile(&[3.0, 1.0, 2.0], 50.0), Some(2.0));
        assert_eq!(percentile(&[3.0, 1.0, 2.0], 99.0), Some(3.0));
    }
}
