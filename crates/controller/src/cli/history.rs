//! `kubectl gpu history NODE`: a node's `GpuRemediation` records, oldest first, one line each
//! with its policy, phase, trigger reason, action, and when it started and finished, followed by
//! its ladder steps where it climbed one (see [`super::ladder_steps`]). Pure: the records come
//! from the caller.

use std::fmt::Write as _;

use gpu_remediation_api::{GpuRemediation, Phase};
use jiff::Timestamp;
use kube::ResourceExt as _;

/// One record, as the table shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    /// The record's name (what `kubectl gpu approve` takes).
    pub name: String,
    /// The governing policy.
    pub policy: String,
    /// The current phase.
    pub phase: Phase,
    /// The trigger's reason (`XID79`), or its condition type when the condition gave none.
    pub reason: String,
    /// What is done after the drain.
    pub action: String,
    /// When the record was created.
    pub created: Option<Timestamp>,
    /// When it entered its final phase, if it has.
    pub finished: Option<Timestamp>,
    /// Its ladder steps, as lines (none without a ladder).
    pub steps: Vec<String>,
}

/// The records of `node` among `remediations` (any order, any nodes), oldest first.
#[must_use]
pub fn rows(node: &str, remediations: &[GpuRemediation]) -> Vec<Row> {
    let mut rows: Vec<Row> = remediations
        .iter()
        .filter(|r| r.spec.node_name == node)
        .map(|r| {
            let status = r.status.clone().unwrap_or_default();
            let finished = status
                .phase
                .is_terminal()
                .then(|| {
                    status
                        .phase_history
                        .iter()
                        .rev()
                        .find(|t| t.phase == status.phase)
                        .map(|t| t.at.0)
                })
                .flatten();
            let trigger = &r.spec.trigger;
            Row {
                name: r.name_any(),
                policy: r.spec.policy_name.clone(),
                phase: status.phase,
                reason: if trigger.reason.is_empty() {
                    trigger.condition_type.clone()
                } else {
                    trigger.reason.clone()
                },
                action: format!("{:?}", r.spec.action),
                created: r.metadata.creation_timestamp.as_ref().map(|t| t.0),
                finished,
                steps: super::ladder_steps::record_lines(&status),
            }
        })
        .collect();
    rows.sort_by(|a, b| (a.created, &a.name).cmp(&(b.created, &b.name)));
    rows
}

/// The table: a header and one aligned line per row, or a sentence when there is none.
#[must_use]
pub fn render(node: &str, rows: &[Row]) -> String {
    if rows.is_empty() {
        return format!("no remediations of node {node}\n");
    }
    let time = |t: Option<Timestamp>| t.map_or_else(|| "-".to_owned(), |t| t.to_string());
    let mut table = vec![
        [
            "NAME", "POLICY", "PHASE", "REASON", "ACTION", "STARTED", "FINISHED", "TOOK",
        ]
        .map(str::to_owned),
    ];
    for row in rows {
        let took = match (row.created, row.finished) {
            (Some(start), Some(end)) => super::ladder_steps::span(end.as_second() - start.as_second()),
            _ => "-".to_owned(),
        };
        table.push([
            row.name.clone(),
            row.policy.clone(),
            row.phase.to_string(),
            row.reason.clone(),
            row.action.clone(),
            time(row.created),
            time(row.finished),
            took,
        ]);
    }
    let widths: Vec<usize> = (0..8)
        .map(|c| table.iter().map(|line| line[c].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    // The header, then each row followed by its steps.
    let steps = std::iter::once(&[][..]).chain(rows.iter().map(|r| r.steps.as_slice()));
    for (line, steps) in table.iter().zip(steps) {
        let mut text = String::new();
        for (cell, width) in line.iter().zip(&widths) {
            let _ = write!(text, "{cell:<width$}   ");
        }
        out.push_str(text.trim_end());
        out.push('\n');
        for step in steps {
            let _ = writeln!(out, "    {step}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn record(
        name: &str,
        node: &str,
        created: &str,
        phases: &[(&str, &str)],
        reason: &str,
    ) -> GpuRemediation {
        let history: Vec<_> = phases
            .iter()
            .map(|(p, at)| json!({"phase": p, "at": at}))
            .collect();
        serde_json::from_value(json!({
            "apiVersion": "gpuremediation.dev/v1alpha1", "kind": "GpuRemediation",
            "metadata": {"name": name, "creationTimestamp": created},
            "spec": {"nodeName": node, "policyName": "h100", "action": "Replace", "mode": "Enforce",
                     "trigger": {"conditionType": "GpuHealthy", "status": "False", "reason": reason}},
            "status": {"phase": phases.last().map_or("Pending", |p| p.0), "phaseHistory": history},
        }))
        .unwrap()
    }

    #[test]
    fn only_the_nodes_records_oldest_first_with_the_time_the_last_one_finished() {
        let records = [
            record(
                "n1-b",
                "n1",
                "2026-06-02T10:00:00Z",
                &[("Cordoned", "2026-06-02T10:00:01Z")],
                "XID79",
            ),
            record("other-a", "n2", "2026-06-01T09:00:00Z", &[], "XID79"),
            record(
                "n1-a",
                "n1",
                "2026-06-01T09:00:00Z",
                &[
                    ("Cordoned", "2026-06-01T09:00:01Z"),
                    ("Succeeded", "2026-06-01T10:02:03Z"),
                ],
                "",
            ),
        ];
        let rows = rows("n1", &records);
        let names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["n1-a", "n1-b"]);
        assert_eq!(rows[0].reason, "GpuHealthy", "no reason: the condition type");
        assert_eq!(rows[0].finished, Some("2026-06-01T10:02:03Z".parse().unwrap()));
        assert_eq!(rows[1].finished, None, "still in flight");
        let table = render("n1", &rows);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3, "{table}");
        assert!(lines[0].starts_with("NAME   POLICY   PHASE"), "{table}");
        assert!(
            lines[1].contains(
                "Succeeded   GpuHealthy   Replace   2026-06-01T09:00:00Z   2026-06-01T10:02:03Z   1h2m3s"
            ),
            "{table}"
        );
        assert!(
            lines[2].ends_with(
                "Cordoned    XID79        Replace   2026-06-02T10:00:00Z   -                      -"
            ),
            "{table}"
        );
    }

    #[test]
    fn a_record_that_climbed_the_ladder_lists_its_steps_under_its_line() {
        let mut climbed = record(
            "n1-a",
            "n1",
            "2026-11-30T22:00:00Z",
            &[("Succeeded", "2026-11-30T22:00:20Z")],
            "XID95",
        );
        climbed.status.as_mut().unwrap().steps = serde_yaml::from_str(
            "- {step: ResetGpu, start: '2026-11-30T22:00:05Z', end: '2026-11-30T22:00:20Z', outcome: Succeeded, \
             evictedPods: [train/worker-3], evidence: {gpusAnswering: [GPU-3], dwellSeconds: 3}}",
        )
        .unwrap();
        let table = render("n1", &rows("n1", &[climbed]));
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines[2..],
            [
                "    step 1 ResetGpu: Succeeded, 2026-11-30T22:00:05Z -> 2026-11-30T22:00:20Z (took 15s)",
                "      evidence: GPU GPU-3 answering; dwell 3s",
                "      evicted (1): train/worker-3",
            ],
            "{table}"
        );
    }

    #[test]
    fn a_node_without_records_says_so() {
        assert_eq!(render("n9", &rows("n9", &[])), "no remediations of node n9\n");
    }
}
