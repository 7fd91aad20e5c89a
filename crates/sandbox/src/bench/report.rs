//! Turning measurements into figures: nearest-rank percentiles, and the Markdown tables `make
//! bench` prints and `docs/benchmarks.md` keeps.

use std::fmt::Write as _;

use super::drain::DrainComparison;
use super::footprint::FootprintResult;
use super::latency::LatencyResult;
use super::quarantine::QuarantineResult;
use super::scale::ScaleResult;

/// NVIDIA `NVSentinel`'s published scale figures (their report, their hardware, KWOK nodes): shown
/// beside ours, marked as theirs, never measured here.
pub const NVSENTINEL: &str = "NVSentinel (published, theirs: KWOK nodes, their hardware)";

/// Everything one run measured.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct BenchResults {
    /// When the run started.
    pub started: String,
    /// What ran the controller (binary path and whether it is a release build).
    pub controller_binary: String,
    /// The control plane's Kubernetes release (`v1.37.2`).
    pub kubernetes: String,
    /// Whether the shipped FlowSchemas were installed (`--without-flow-schemas` leaves them out).
    pub flow_schemas: bool,
    /// Whether the shipped fence policy was in force and the controller elected (`--with-fence`).
    pub fence: bool,
    /// Whether the shipped approval policy checked every remediation's create and update
    /// (`--with-approval`).
    pub approval: bool,
    /// Detection-to-cordon latency.
    pub latency: Vec<LatencyResult>,
    /// The drain against `kubectl drain`.
    pub drain: Option<DrainComparison>,
    /// RSS and CPU by fleet size.
    pub footprint: Vec<FootprintResult>,
    /// Scale fleets (`--scale`).
    pub scale: Vec<ScaleResult>,
    /// The leak under a stream of GPU pods, quarantine off and on.
    pub quarantine: Vec<QuarantineResult>,
    /// The GPU-seconds a recycle costs a training gang, per arm (`--only gang`).
    pub gang: Vec<super::gang::GangResult>,
    /// Karpenter's node repair against the policy (`--only karpenter-peer`).
    pub karpenter_peer: Option<super::karpenter_peer::PeerComparison>,
    /// Scenarios that failed, with why (the others still ran).
    pub failures: Vec<String>,
}

/// What the run was, before its tables: its failures, the release, and the policies in force.
fn preamble(results: &BenchResults) -> String {
    let mut out = String::new();
    for failure in &results.failures {
        let _ = writeln!(out, "**Failed:** {failure}\n");
    }
    let _ = writeln!(
        out,
        "_On Kubernetes {} (`e2e/controlplane/`)._\n",
        results.kubernetes
    );
    if !results.flow_schemas {
        out.push_str(
            "_Without the shipped FlowSchemas (`--without-flow-schemas`): every request of the \
             controller in the cluster's default `service-accounts` flow._\n\n",
        );
    }
    out.push_str(if results.fence {
        "_With the shipped fence policy in force (`--with-fence`): the controller elected on a Lease \
         in the bench namespace, every write carrying its claim._\n\n"
    } else {
        "_Without the fence policy: the controller ran alone, its writes carried no claim and no \
         admission policy checked them (`--with-fence` runs it as installed)._\n\n"
    });
    if results.approval {
        out.push_str(
            "_With the shipped approval policy in force (`--with-approval`): every create and update of \
             a remediation checked by the API server._\n\n",
        );
    }
    out
}

/// The tables, in Markdown.
#[must_use]
pub fn markdown(results: &BenchResults) -> String {
    let mut out = preamble(results);
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
        out.push_str(&drain_links_table(d));
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
    if !results.footprint.is_empty() {
        out.push_str(&writes_tables(&results.footprint));
    }
    if !results.scale.is_empty() {
        out.push_str(&scale_tables(&results.scale));
    }
    out.push_str(&quarantine_table(&results.quarantine));
    out.push_str(&super::gang::table(&results.gang));
    if let Some(peer) = &results.karpenter_peer {
        out.push_str(&super::karpenter_peer::markdown(peer));
    }
    out
}

/// Each peer's drain split link by link (`drain_links`): the budgets' part, the drainer's part
/// (and how much of it the drainer still had its own evictions unanswered), and the longest
/// Deployment's chain of budget parts beside a fifth of `kubectl drain`'s time.
#[must_use]
pub fn drain_links_table(d: &DrainComparison) -> String {
    let mut out = String::from(
        "Where the drain's time goes, link by link (one Deployment's eviction granted → its budget \
         written with room again → the peer's next eviction of it received; audit log):\n\n\
         | peer | links (not split) | budget's part p50 / p99 / max | drainer's part p50 / p99 / max | of it, own evictions unanswered p50 / max | longest chain of budget parts |\n\
         |---|---:|---:|---:|---:|---:|\n",
    );
    for p in [&d.controller, &d.kubectl] {
        let l = &p.links;
        let chain = l
            .longest_chain
            .as_ref()
            .map_or_else(|| "-".to_owned(), |(name, s)| format!("{s:.1} s ({name})"));
        let _ = writeln!(
            out,
            "| {} | {} ({}) | {:.0} / {:.0} / {:.0} ms | {:.0} / {:.0} / {:.0} ms | {:.0} / {:.0} ms | {chain} |",
            p.peer,
            l.links,
            l.unattributed,
            l.budget.p50_ms,
            l.budget.p99_ms,
            l.budget.max_ms,
            l.drainer.p50_ms,
            l.drainer.p99_ms,
            l.drainer.max_ms,
            l.drainer_behind_own_requests.p50_ms,
            l.drainer_behind_own_requests.max_ms,
        );
    }
    out.push_str(
        "\nThe budget's part split at the replacement's Ready (the simulated kubelet's status write), \
         and the budget writes (kube-controller-manager's disruption controller syncs one budget at a \
         time):\n\n\
         | peer | workload's part p50 / p99 / max | disruption controller's part p50 / p99 / max | links with no Ready seen | its budget writes while the peer evicted (received while another was unanswered) | each in the server p50 / p99 | between one answered and the next received p50 / p99 |\n\
         |---|---:|---:|---:|---:|---:|---:|\n",
    );
    for p in [&d.controller, &d.kubectl] {
        let l = &p.links;
        let _ = writeln!(
            out,
            "| {} | {:.0} / {:.0} / {:.0} ms | {:.0} / {:.0} / {:.0} ms | {} | {} ({}) | {:.0} / {:.0} ms | {:.0} / {:.0} ms |",
            p.peer,
            l.workload.p50_ms,
            l.workload.p99_ms,
            l.workload.max_ms,
            l.disruption_controller.p50_ms,
            l.disruption_controller.p99_ms,
            l.disruption_controller.max_ms,
            l.ready_not_seen,
            l.budget_writes,
            l.budget_writes_overlapping,
            l.budget_write.p50_ms,
            l.budget_write.p99_ms,
            l.between_budget_writes.p50_ms,
            l.between_budget_writes.p99_ms,
        );
    }
    if let Some((name, chain)) = &d.controller.links.longest_chain {
        let _ = writeln!(
            out,
            "\nIn the controller's drain the budgets alone took {chain:.1} s along {name}'s chain (this \
             drain's figure: it grows with the replacements running at once); a fifth of `kubectl \
             drain`'s time is {:.1} s.\n",
            d.kubectl.seconds / 5.0
        );
    }
    out.push_str(&drain_floor_line(d));
    out
}

/// Each peer's drain beside its drain floors, from its own drain's longest chains: the budget parts
/// alone (the least time those budgets allowed a drain that evicts the instant a budget has room),
/// and the server's parts (the budgets, and each granted eviction's time in the server before the
/// next replacement could start).
#[must_use]
pub fn drain_floor_line(d: &DrainComparison) -> String {
    let mut out = String::new();
    for p in [&d.controller, &d.kubectl] {
        let Some((name, chain)) = &p.links.longest_chain else {
            continue;
        };
        let _ = write!(
            out,
            "Drain floor, {}: {:.1} s for the drain beside its budgets' {chain:.1} s ({name}'s chain): \
             {:.2}x the floor",
            p.peer,
            p.seconds,
            p.seconds / chain
        );
        if let Some((name, chain)) = &p.links.longest_server_chain {
            let _ = write!(
                out,
                "; beside the server's {chain:.1} s with the evictions' time in it ({name}'s chain): {:.2}x",
                p.seconds / chain
            );
        }
        out.push_str(".\n\n");
    }
    out
}

/// The leak with quarantine off and on, and the time from a fault to its quarantine.
#[must_use]
pub fn quarantine_table(arms: &[QuarantineResult]) -> String {
    let mut out = String::new();
    if arms.is_empty() {
        return out;
    }
    out.push_str("### The leak: pods bound to a faulty node before its cordon, quarantine off and on\n\n");
    out.push_str(
        "| quarantine | nodes | faults | `for` | new GPU pods | leaked pods (per fault) | fault to quarantine p50 | p99 |\n",
    );
    out.push_str("|---|---:|---:|---:|---:|---|---:|---:|\n");
    let ms = |v: Option<f64>| v.map_or_else(|| "n/a".to_owned(), |v| format!("{v:.0} ms"));
    for a in arms {
        let per: Vec<String> = a.leaked.iter().map(ToString::to_string).collect();
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} s | {:.1}/s | {} ({}) | {} | {} |",
            if a.quarantine { "on" } else { "off" },
            a.nodes,
            a.faults,
            a.trigger_for_seconds,
            a.pods_per_second,
            a.leaked_total,
            per.join(", "),
            ms(a.fault_to_quarantine_p50_ms),
            ms(a.fault_to_quarantine_p99_ms),
        );
    }
    out.push('\n');
    out
}

/// Writes and pod lists per remediation of every footprint run, and every write of a run that
/// remediated one node, in order.
#[must_use]
pub fn writes_tables(footprint: &[FootprintResult]) -> String {
    let mut out = String::new();
    out.push_str(
        "### Writes and pod lists per remediation (audit log, the controller's account)

",
    );
    out.push_str("| nodes (+ bare) | pods | remediations | node status writes by others | evictions each | writes each | writes less evictions | pod lists each | seconds |\n");
    out.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for f in footprint {
        #[allow(clippy::cast_precision_loss, reason = "request counts are small")]
        let evictions = f
            .requests
            .by_kind
            .get("create pods/eviction")
            .copied()
            .unwrap_or(0) as f64
            / f.remediations.max(1) as f64;
        let churn = f.churn_period_seconds.map_or_else(
            || "none".to_owned(),
            |p| format!("{} (each node every {p:.0} s)", f.node_status_writes),
        );
        let _ = writeln!(
            out,
            "| {} (+ {}) | {} | {} | {churn} | {evictions:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
            f.nodes,
            f.bystanders,
            f.pods,
            f.remediations,
            f.writes_per_remediation,
            f.writes_per_remediation - evictions,
            f.pod_lists_per_remediation,
            f.remediation_seconds
        );
    }
    out.push('\n');
    for f in footprint.iter().filter(|f| f.remediations == 1) {
        let _ = writeln!(
            out,
            "Every write of the one remediation on {} nodes ({} pods), in order (evictions folded):\n",
            f.nodes, f.pods
        );
        out.push_str("| # | received | request | object | answer |\n|---:|---|---|---|---:|\n");
        let mut row = 0;
        let mut i = 0;
        while i < f.writes.len() {
            let w = &f.writes[i];
            let mut run = 1;
            if w.resource == "pods/eviction" {
                while f.writes.get(i + run).is_some_and(|n| n.resource == w.resource) {
                    run += 1;
                }
            }
            row += 1;
            let object = if run > 1 {
                format!("{run} pods")
            } else {
                w.name.clone().unwrap_or_default()
            };
            let codes: std::collections::BTreeMap<u64, usize> =
                f.writes[i..i + run]
                    .iter()
                    .fold(std::collections::BTreeMap::new(), |mut m, w| {
                        *m.entry(w.code.unwrap_or(0)).or_default() += 1;
                        m
                    });
            let answer = codes
                .iter()
                .map(|(c, n)| {
                    if run > 1 {
                        format!("{n}×{c}")
                    } else {
                        c.to_string()
                    }
                })
                .collect::<Vec<_>>()
                .join(", ");
            let _ = writeln!(
                out,
                "| {row} | {} | {} {} | {object} | {answer} |",
                w.at, w.verb, w.resource
            );
            i += run;
        }
        out.push('\n');
    }
    out
}

mod scale_tables;
pub use scale_tables::{churn_tables, floor_table, scale_tables};

#[cfg(test)]
mod tests;
