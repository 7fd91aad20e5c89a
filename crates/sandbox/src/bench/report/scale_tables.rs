//! The scale fleets' tables (`gpu-bench --scale`): detection to cordon and first signal to
//! quarantine beside `NVSentinel`'s published figures, the controller's cost, the cordon floor, and
//! the same fleets under their own traffic.

use std::fmt::Write as _;

use super::NVSENTINEL;
use crate::bench::scale::ScaleResult;
use crate::bench::scale_churn::ChurnResult;

/// The scale fleets' tables, `NVSentinel`'s published figures beside ours and marked as theirs.
#[must_use]
pub fn scale_tables(scale: &[ScaleResult]) -> String {
    let mut out = String::new();
    out.push_str(
        "### Scale fleets: detection to cordon and first signal to quarantine (bare Node objects, no \
         kubelets or heartbeats)\n\n_Cordoned: from the instant `for` elapsed to the node seen \
         unschedulable and tainted. Quarantined: from the fault seen to the quarantine taint seen, both \
         by the bench's node watch; from then on no new pod lands on the node. NVSentinel's cordon is \
         taken when the health event arrives: their figure sits beside our quarantine._\n\n",
    );
    out.push_str(
        "| who | nodes | simultaneous faults | cordoned | p50 | p99 | max | quarantined | p50 | p99 | max \
         | load average (1 5 15 min) |\n",
    );
    out.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
    for s in scale {
        for r in &s.rounds {
            let quarantined = r.quarantine_samples_ms.len();
            let quarantine = if quarantined == 0 {
                "- | - | -".to_owned()
            } else {
                format!(
                    "{:.0} ms | {:.0} ms | {:.0} ms",
                    r.quarantine.p50_ms, r.quarantine.p99_ms, r.quarantine.max_ms
                )
            };
            let _ = writeln!(
                out,
                "| gpu-remediator (measured here) | {} | {} | {}/{} | {:.0} ms | {:.0} ms | {:.0} ms | {}/{} | {} | {} → {} |",
                s.nodes,
                r.faults,
                r.cordoned,
                r.faults,
                r.p50_ms,
                r.p99_ms,
                r.max_ms,
                quarantined,
                r.faults,
                quarantine,
                s.load_average[0],
                s.load_average[1]
            );
        }
    }
    let _ = writeln!(
        out,
        "| {NVSENTINEL}: health event to cordon | 50,000 | (not stated per fault count) | - | - | - | - | - \
         | 26 ms | 165 ms | 373 ms | - |\n"
    );
    out.push_str("### Scale fleets: the controller's cost\n\n");
    out.push_str("| who | nodes | registration (harness) | start to /readyz | idle RSS | idle CPU | idle requests/s | peak RSS after the rounds | CPU during the rounds |\n");
    out.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for s in scale {
        let _ = writeln!(
            out,
            "| gpu-remediator (measured here{}) | {} | {:.1} s | {:.2} s | {:.1} MiB | {:.2} s | {:.2} | {:.1} MiB | {:.2} s |",
            match s.labels {
                crate::bench::scale::ScaleLabels::Bench => "",
                crate::bench::scale::ScaleLabels::Operator => ", a GPU operator's 123 labels a node",
            },
            s.nodes,
            s.registration_seconds,
            s.ready_seconds,
            s.idle_peak_rss_mib,
            s.idle_cpu_seconds,
            s.idle_requests_per_second,
            s.peak_rss_mib,
            s.rounds_cpu_seconds
        );
    }
    let _ = writeln!(
        out,
        "| {NVSENTINEL} | 100,000 | - | - | 235 GB in all (65 GB of components, 170 GB of MongoDB) | - | - | - | - |\n"
    );
    out.push_str(&floor_table(scale));
    out.push_str(&churn_tables(scale));
    for s in scale {
        if let Some(fence) = &s.fence {
            let _ = writeln!(
                out,
                "The fence on {} nodes: the probe (a dry-run write without a claim) was refused: \"{}\"; \
                 the controller's writes refused during the idle window and the rounds: {}.\n",
                s.nodes, fence.probe_refusal, fence.writes_refused
            );
        }
        if let Some(approval) = &s.approval {
            let _ = writeln!(
                out,
                "The approval policy on {} nodes: the probe (a dry-run create approved in another user's \
                 name) was refused: \"{}\"; the controller's creates and updates of remediations refused \
                 during the idle window and the rounds: {}.\n",
                s.nodes, approval.probe_refusal, approval.records_refused
            );
        }
    }
    out
}

/// Each scale fleet's detection to cordon beside its cordon floor (the same writes sent by the
/// bench itself, `cordon_floor`), round by round of the same size, and, for rounds larger than the
/// controller's starting concurrency, beside the floor sent at that concurrency. Empty when no fleet
/// has a floor.
#[must_use]
pub fn floor_table(scale: &[ScaleResult]) -> String {
    if scale.iter().all(|s| s.cordon_floor.is_empty()) {
        return String::new();
    }
    let mut out = String::from(
        "### Scale fleets: detection to cordon beside the cordon floor\n\n_The floor: for each fault, \
         the writes the controller makes before its cordon (a fresh read of the node, the record's \
         create, the cordon), sent by the bench itself from one instant, on the same fleet and seen by \
         the same watch, after the controller stopped; every fault's writes in flight at once. The \
         paced floor: the same with as many faults at a time as the controller starts at once._\n\n\
         | nodes | simultaneous faults | controller p50 | p99 | floor p50 | p99 | p99 over the floor's \
         | paced floor (in flight) p99 | p99 over the paced floor's |\n\
         |---:|---:|---:|---:|---:|---:|---:|---|---:|\n",
    );
    for s in scale {
        for floor in s.cordon_floor.iter().filter(|f| f.in_flight == f.faults) {
            let Some(ours) = s.rounds.iter().find(|r| r.faults == floor.faults) else {
                continue;
            };
            let paced = s
                .cordon_floor
                .iter()
                .find(|f| f.faults == floor.faults && f.in_flight < f.faults);
            let _ = writeln!(
                out,
                "| {} | {} | {:.0} ms | {:.0} ms | {:.0} ms | {:.0} ms | {:.2}x | {} | {} |",
                s.nodes,
                floor.faults,
                ours.p50_ms,
                ours.p99_ms,
                floor.p50_ms,
                floor.p99_ms,
                ours.p99_ms / floor.p99_ms,
                paced.map_or_else(
                    || "-".to_owned(),
                    |p| format!("{:.0} ms ({})", p.p99_ms, p.in_flight)
                ),
                paced.map_or_else(|| "-".to_owned(), |p| format!("{:.2}x", ours.p99_ms / p.p99_ms)),
            );
        }
    }
    out.push('\n');
    out
}

/// The scale fleets under their own traffic (`--scale-churn`): the controller's cost per 1,000
/// node updates, and each round's cordon under churn beside the same round quiet. Empty when no
/// fleet ran with churn.
#[must_use]
pub fn churn_tables(scale: &[ScaleResult]) -> String {
    let churned: Vec<(&ScaleResult, &ChurnResult)> = scale
        .iter()
        .filter_map(|s| Some((s, s.churn.as_ref()?)))
        .collect();
    if churned.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "### Scale fleets under their own traffic: node status writes (kubelet reports and agent \
         resyncs, one in a hundred a real change)\n\n_CPU per 1,000 updates: all of the controller's \
         CPU over the window (its quiet cost not taken off) over the writes the server accepted in it. \
         A real fleet: each node's kubelet and agent report once per 5 minutes each._\n\n\
         | nodes | writes/s asked | writes/s reached | a real fleet sends | CPU per 1,000 updates \
         | quiet CPU (s/s) | peak RSS under churn | load average (1 5 15 min) |\n\
         |---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for (s, c) in &churned {
        let _ = writeln!(
            out,
            "| {} | {:.0} | {:.0} | {:.0} | {:.3} s | {:.4} | {:.1} MiB | {} → {} |",
            s.nodes,
            c.target_per_second,
            c.reached_per_second,
            c.real_fleet_per_second,
            c.cpu_seconds_per_1000_updates,
            c.quiet_cpu_per_second,
            c.peak_rss_mib,
            c.load_average[0],
            c.load_average[1]
        );
    }
    out.push_str(
        "\n| nodes | simultaneous faults | quiet: cordoned | p50 | p99 | under churn: cordoned | p50 | p99 \
         | max |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for (s, c) in &churned {
        for r in &c.rounds {
            let quiet = s.rounds.iter().find(|q| q.faults == r.faults).map_or_else(
                || "- | - | -".to_owned(),
                |q| {
                    format!(
                        "{}/{} | {:.0} ms | {:.0} ms",
                        q.cordoned, q.faults, q.p50_ms, q.p99_ms
                    )
                },
            );
            let _ = writeln!(
                out,
                "| {} | {} | {quiet} | {}/{} | {:.0} ms | {:.0} ms | {:.0} ms |",
                s.nodes, r.faults, r.cordoned, r.faults, r.p50_ms, r.p99_ms, r.max_ms
            );
        }
    }
    out.push('\n');
    out
}
