//! `history --serial S` and `history --node N`: every recycle involving a GPU across nodes, from
//! its `GpuHardwareRecord` (which outlives the remediations) and the remediations still on record
//! whose ledger lists it (failed or merely present). Pure: the objects come from the caller.

use std::fmt::Write as _;

use gpu_remediation_api::{
    GpuHardwareRecord, GpuRemediation,
    hardware::{HardwareKind, record_name},
};
use jiff::Timestamp;
use kube::ResourceExt as _;

use super::history::Row as NodeRow;

/// One recycle involving the GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recycle {
    /// The remediation.
    pub remediation: String,
    /// The node it recycled.
    pub node: String,
    /// Whether the GPU was among the failed ones (else it was only in the node).
    pub failed: bool,
    /// The fault's reason.
    pub reason: String,
    /// The action.
    pub action: String,
    /// Its phase, or `expired` when only the hardware record remembers it.
    pub phase: String,
    /// When the fault began.
    pub at: Option<Timestamp>,
    /// Whether it went straight to the last rung as a repeat offender.
    pub repeat_offender: bool,
    /// The diagnostics it collected before destroying the node's state: outcome and Job.
    pub diagnostics: Option<String>,
}

/// A diagnostics run as the table shows it: `Collected gpu-remediation/<job>`.
fn shown(record: &gpu_remediation_api::diagnostics::DiagnosticsRecord) -> String {
    let outcome = record
        .outcome
        .map_or_else(|| "Running".to_owned(), |o| format!("{o:?}"));
    format!("{outcome} {}/{}", record.namespace, record.job)
}

/// Every recycle involving GPU `serial`, oldest first.
#[must_use]
pub fn recycles_of_serial(
    serial: &str,
    record: Option<&GpuHardwareRecord>,
    remediations: &[GpuRemediation],
) -> Vec<Recycle> {
    let mut out: Vec<Recycle> = remediations
        .iter()
        .filter_map(|r| {
            let ledger = r.spec.hardware.as_ref()?;
            let has = |list: &[gpu_remediation_api::hardware::LedgerGpu]| {
                list.iter().any(|g| g.serial.as_deref() == Some(serial))
            };
            // Named failed but untrusted (a conflict, not listed before the fault): present only.
            let failed = crate::hardware::ledger::counts(ledger, serial);
            (has(&ledger.failed) || has(&ledger.gpus)).then(|| Recycle {
                remediation: r.name_any(),
                node: r.spec.node_name.clone(),
                failed,
                reason: r.spec.trigger.reason.clone(),
                action: format!("{:?}", r.spec.action),
                phase: r
                    .status
                    .as_ref()
                    .map_or_else(|| "Pending".to_owned(), |s| s.phase.to_string()),
                at: r.spec.trigger.since.as_ref().map(|t| t.0),
                repeat_offender: ledger.repeat_offender.is_some(),
                diagnostics: r.status.as_ref().and_then(|s| s.diagnostics.as_ref()).map(shown),
            })
        })
        .collect();
    let records = record.filter(|r| r.spec.kind == HardwareKind::Gpu && r.spec.id == serial);
    for failure in records.iter().flat_map(|r| &r.spec.failures) {
        if out.iter().any(|r| r.remediation == failure.remediation) {
            continue;
        }
        out.push(Recycle {
            remediation: failure.remediation.clone(),
            node: failure.node.clone(),
            failed: true,
            reason: failure.reason.clone(),
            action: format!("{:?}", failure.action),
            phase: "expired".to_owned(),
            at: Some(failure.at.0),
            repeat_offender: false,
            diagnostics: failure.diagnostics.as_ref().map(shown),
        });
    }
    out.sort_by(|a, b| (a.at, &a.remediation).cmp(&(b.at, &b.remediation)));
    out
}

/// The table for `history --serial`: a line on the record, then one line per recycle.
#[must_use]
pub fn render_serial(serial: &str, record: Option<&GpuHardwareRecord>, recycles: &[Recycle]) -> String {
    let mut out = match record {
        Some(r) => format!(
            "GPU serial {serial}: {} failure(s) on record (gpuhardwarerecord/{})\n",
            r.spec.failure_count,
            r.name_any()
        ),
        None => format!(
            "GPU serial {serial}: no failure on record (no gpuhardwarerecord/{})\n",
            record_name(HardwareKind::Gpu, serial)
        ),
    };
    if recycles.is_empty() {
        out.push_str("no recycle involved this GPU\n");
        return out;
    }
    let mut table = vec![
        [
            "REMEDIATION",
            "NODE",
            "GPU",
            "REASON",
            "ACTION",
            "PHASE",
            "AT",
            "DIAGNOSTICS",
            "NOTE",
        ]
        .map(str::to_owned),
    ];
    for r in recycles {
        table.push([
            r.remediation.clone(),
            r.node.clone(),
            if r.failed { "failed" } else { "present" }.to_owned(),
            r.reason.clone(),
            r.action.clone(),
            r.phase.clone(),
            r.at.map_or_else(|| "-".to_owned(), |t| t.to_string()),
            r.diagnostics.clone().unwrap_or_else(|| "-".to_owned()),
            if r.repeat_offender {
                "repeat offender: straight to the last rung"
            } else {
                ""
            }
            .to_owned(),
        ]);
    }
    out.push_str(&aligned(&table));
    out
}

/// The node's own table followed by, for each GPU the node holds now, its recycles elsewhere.
#[must_use]
pub fn render_node(node: &str, rows: &[NodeRow], serials: &[(String, Vec<Recycle>)]) -> String {
    let mut out = super::history::render(node, rows);
    for (serial, recycles) in serials {
        let elsewhere: Vec<Recycle> = recycles.iter().filter(|r| r.node != node).cloned().collect();
        if elsewhere.is_empty() {
            continue;
        }
        let _ = writeln!(
            out,
            "\nGPU serial {serial} (now in {node}) was recycled elsewhere:"
        );
        let lines = render_serial(serial, None, &elsewhere);
        out.extend(lines.lines().skip(1).map(|l| format!("{l}\n")));
    }
    out
}

fn aligned<const N: usize>(table: &[[String; N]]) -> String {
    let widths: Vec<usize> = (0..N)
        .map(|c| table.iter().map(|line| line[c].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for line in table {
        let mut text = String::new();
        for (cell, width) in line.iter().zip(&widths) {
            let _ = write!(text, "{cell:<width$}   ");
        }
        out.push_str(text.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn remediation(
        name: &str,
        node: &str,
        since: &str,
        failed: &str,
        present: &str,
        offender: bool,
    ) -> GpuRemediation {
        let mut hardware = json!({
            "gpus": [{"uuid": "GPU-1", "serial": present}],
            "failed": [{"uuid": "GPU-2", "serial": failed}],
        });
        if offender {
            hardware["repeatOffender"] = json!({"kind": "Gpu", "id": failed, "failures": 1, "window": "720h",
                "action": "Replace", "earlier": []});
        }
        serde_json::from_value(json!({
            "apiVersion": "gpuremediation.dev/v1alpha1", "kind": "GpuRemediation",
            "metadata": {"name": name},
            "spec": {"nodeName": node, "policyName": "h100", "action": "Replace", "mode": "Enforce",
                     "trigger": {"conditionType": "GpuHealthy", "status": "False", "reason": "XID79", "since": since},
                     "hardware": hardware},
            "status": {"phase": "Succeeded"},
        }))
        .unwrap()
    }

    fn record(serial: &str, failures: &[(&str, &str, &str)]) -> GpuHardwareRecord {
        let failures: Vec<_> = failures
            .iter()
            .map(|(r, node, at)| json!({"at": at, "node": node, "remediation": r, "reason": "XID79", "action": "None"}))
            .collect();
        serde_json::from_value(json!({
            "apiVersion": "gpuremediation.dev/v1alpha1", "kind": "GpuHardwareRecord",
            "metadata": {"name": record_name(HardwareKind::Gpu, serial)},
            "spec": {"kind": "Gpu", "id": serial, "failureCount": failures.len(), "failures": failures},
        }))
        .unwrap()
    }

    #[test]
    fn every_recycle_of_a_serial_is_listed_across_nodes_including_expired_ones_oldest_first() {
        let record = record(
            "S1",
            &[
                ("a-1", "node-a", "2026-06-01T00:00:00Z"),
                ("b-1", "node-b", "2026-06-03T00:00:00Z"),
            ],
        );
        let live = [
            remediation("b-1", "node-b", "2026-06-03T00:00:00Z", "S1", "S7", true),
            remediation("c-1", "node-c", "2026-06-02T00:00:00Z", "S9", "S1", false),
            remediation("d-1", "node-d", "2026-06-04T00:00:00Z", "S9", "S8", false),
        ];
        let recycles = recycles_of_serial("S1", Some(&record), &live);
        let names: Vec<(&str, &str, bool)> = recycles
            .iter()
            .map(|r| (r.remediation.as_str(), r.phase.as_str(), r.failed))
            .collect();
        assert_eq!(
            names,
            [
                ("a-1", "expired", true),
                ("c-1", "Succeeded", false),
                ("b-1", "Succeeded", true)
            ]
        );
        let table = render_serial("S1", Some(&record), &recycles);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines[0],
            format!(
                "GPU serial S1: 2 failure(s) on record (gpuhardwarerecord/{})",
                record.name_any()
            )
        );
        assert!(lines[1].starts_with("REMEDIATION   NODE     GPU"), "{table}");
        assert!(
            lines[4].ends_with("repeat offender: straight to the last rung"),
            "{table}"
        );
    }

    #[test]
    fn an_expired_recycle_shows_the_diagnostics_the_ledger_kept() {
        let mut record = record("S1", &[("a-1", "node-a", "2026-06-01T00:00:00Z")]);
        record.spec.failures[0].diagnostics = serde_json::from_value(json!({
            "namespace": "gpu-remediation", "job": "a-1-diagnostics", "start": "2026-06-01T00:05:00Z",
            "outcome": "Collected",
        }))
        .unwrap();
        let recycles = recycles_of_serial("S1", Some(&record), &[]);
        assert_eq!(
            recycles[0].diagnostics.as_deref(),
            Some("Collected gpu-remediation/a-1-diagnostics")
        );
        let table = render_serial("S1", Some(&record), &recycles);
        assert!(table.lines().nth(1).unwrap().contains("DIAGNOSTICS"), "{table}");
        assert!(
            table.contains("Collected gpu-remediation/a-1-diagnostics"),
            "{table}"
        );
    }

    #[test]
    fn a_serial_never_recycled_says_so() {
        let table = render_serial("1650000000001", None, &[]);
        assert_eq!(
            table,
            "GPU serial 1650000000001: no failure on record (no gpuhardwarerecord/gpu-1650000000001)\nno recycle involved this GPU\n"
        );
    }

    #[test]
    fn a_node_s_history_adds_its_gpus_recycles_on_other_nodes() {
        let live = [remediation(
            "a-1",
            "node-a",
            "2026-06-01T00:00:00Z",
            "S1",
            "S2",
            false,
        )];
        let serials = vec![("S1".to_owned(), recycles_of_serial("S1", None, &live))];
        let text = render_node("node-b", &[], &serials);
        assert!(text.starts_with("no remediations of node node-b\n\nGPU serial S1 (now in node-b) was recycled elsewhere:\nREMEDIATION"), "{text}");
        assert!(text.contains("a-1"), "{text}");
    }
}
