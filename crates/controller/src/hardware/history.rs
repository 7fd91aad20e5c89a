//! The failure history of each GPU serial and host, from the `GpuHardwareRecord`s and the
//! remediations still on record (each failure with the diagnostics its remediation collected,
//! once they ended); which hardware is past a policy's `safety.repeatOffender` limit;
//! which records to write so every remediation's failures are in them; and which records to
//! forget. Pure.
//!
//! Bounds: a record keeps its latest [`RECORD_FAILURES_MAX`] failures (newest first) and counts all
//! of them in `failureCount` (a failure older than every one a full record keeps was dropped, and
//! counted, when written: it is not added again); a record whose latest failure is older than [`RECORD_RETENTION`] is
//! deleted, and past [`RECORDS_MAX`] records the ones whose latest failure is oldest go first.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    sync::Arc,
};

use gpu_remediation_api::{
    GpuHardwareRecord, GpuHardwareRecordSpec, GpuRemediation,
    hardware::{
        HardwareFailure, HardwareKind, HardwareLedger, OFFENCE_EARLIER_MAX, RECORD_FAILURES_MAX,
        RepeatOffence, record_name,
    },
    safety::RepeatOffender,
};
use jiff::Timestamp;
use kube::ResourceExt;

use super::ledger::failed_serials;

/// How long a record outlives its latest failure: about 13 months, a year of RMA history.
pub const RECORD_RETENTION: std::time::Duration = std::time::Duration::from_secs(400 * 24 * 3600);
/// The most records kept; past it, those whose latest failure is oldest are deleted.
pub const RECORDS_MAX: usize = 10_000;

/// A piece of hardware: `Gpu` by serial, `Host` by system UUID or provider ID.
pub type Hardware = (HardwareKind, String);

/// Every known failure of each piece of hardware, newest first, each remediation once.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Failures {
    by_hardware: BTreeMap<Hardware, Vec<HardwareFailure>>,
}

impl Failures {
    /// Whether no failure is on record at all.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.by_hardware.is_empty()
    }

    /// The failures of `hardware`, newest first.
    #[must_use]
    pub fn of(&self, kind: HardwareKind, id: &str) -> &[HardwareFailure] {
        self.by_hardware
            .get(&(kind, id.to_owned()))
            .map_or(&[], Vec::as_slice)
    }

    fn add(&mut self, hardware: Hardware, failure: HardwareFailure) {
        let list = self.by_hardware.entry(hardware).or_default();
        if let Some(known) = list.iter_mut().find(|f| f.remediation == failure.remediation) {
            // The record's entry, written before the diagnostics ended, completed by them.
            if known.diagnostics.is_none() && failure.diagnostics.is_some() {
                known.diagnostics = failure.diagnostics;
            }
        } else {
            list.push(failure);
            list.sort_by(newest_first);
        }
    }
}

/// The order of a record's failures: newest first, then by remediation.
fn newest_first(a: &HardwareFailure, b: &HardwareFailure) -> std::cmp::Ordering {
    b.at.0
        .cmp(&a.at.0)
        .then_with(|| a.remediation.cmp(&b.remediation))
}

/// The failures a remediation's ledger names: one per failed GPU serial, and one for the host.
#[must_use]
pub fn failures_of(remediation: &GpuRemediation) -> Vec<(Hardware, HardwareFailure)> {
    let spec = &remediation.spec;
    let Some(ledger) = &spec.hardware else {
        return Vec::new();
    };
    let Some(at) = spec
        .trigger
        .since
        .clone()
        .or_else(|| remediation.creation_timestamp())
    else {
        return Vec::new();
    };
    // The diagnostics once they ended: an entry written before is completed then (see
    // `records_to_write`).
    let diagnostics = remediation
        .status
        .as_ref()
        .and_then(|s| s.diagnostics.clone())
        .filter(|d| d.outcome.is_some());
    let failure = |gpu: Option<String>| HardwareFailure {
        at: at.clone(),
        node: spec.node_name.clone(),
        node_uid: spec.node_uid.clone(),
        remediation: remediation.name_any(),
        reason: spec.trigger.reason.clone(),
        gpu,
        host: ledger.host.clone(),
        action: spec.action,
        diagnostics: diagnostics.clone(),
    };
    let mut out: Vec<(Hardware, HardwareFailure)> = failed_serials(ledger)
        .into_iter()
        .map(|serial| {
            let uuids: Vec<&str> = ledger
                .failed
                .iter()
                .filter(|g| g.serial.as_deref() == Some(serial.as_str()))
                .map(|g| g.uuid.as_str())
                .collect();
            ((HardwareKind::Gpu, serial), failure(Some(uuids.join(","))))
        })
        .collect();
    if let Some(host) = &ledger.host {
        let serials = failed_serials(ledger).join(",");
        out.push((
            (HardwareKind::Host, host.clone()),
            failure((!serials.is_empty()).then_some(serials)),
        ));
    }
    out
}

/// Every failure on record: the records' entries and those of the remediations not yet in them.
#[must_use]
pub fn failures(records: &[Arc<GpuHardwareRecord>], remediations: &[Arc<GpuRemediation>]) -> Failures {
    let mut all = Failures::default();
    for record in records {
        for failure in &record.spec.failures {
            all.add((record.spec.kind, record.spec.id.clone()), failure.clone());
        }
    }
    for remediation in remediations {
        for (hardware, failure) in failures_of(remediation) {
            all.add(hardware, failure);
        }
    }
    all
}

/// The failures of `hardware` within `rule.window` before `now`, leaving out `remediation`'s own.
fn earlier<'f>(
    failures: &'f Failures,
    (kind, id): (HardwareKind, &str),
    rule: &RepeatOffender,
    now: Timestamp,
    remediation: Option<&str>,
) -> Vec<&'f HardwareFailure> {
    let horizon = crate::time::minus(now, crate::time::signed(rule.window.as_std()));
    failures
        .of(kind, id)
        .iter()
        .filter(|f| Some(f.remediation.as_str()) != remediation)
        .filter(|f| f.at.0 >= horizon && f.at.0 <= now)
        .collect()
}

/// The worst repeat offence among `hardware` (GPUs before the host, then most failures): `None`
/// when none has `rule.failures` earlier failures within the window. `remediation` is the record
/// being admitted, whose own failures do not count.
#[must_use]
pub fn offence<'h>(
    failures: &Failures,
    hardware: impl IntoIterator<Item = (HardwareKind, &'h str)>,
    rule: &RepeatOffender,
    now: Timestamp,
    remediation: Option<&str>,
) -> Option<RepeatOffence> {
    let mut worst: Option<RepeatOffence> = None;
    for (kind, id) in hardware {
        let found = earlier(failures, (kind, id), rule, now, remediation);
        let count = u32::try_from(found.len()).unwrap_or(u32::MAX);
        if count < rule.failures || worst.as_ref().is_some_and(|w| w.failures >= count) {
            continue;
        }
        worst = Some(RepeatOffence {
            kind,
            id: id.to_owned(),
            failures: count,
            window: rule.window,
            action: rule.action,
            earlier: found.into_iter().take(OFFENCE_EARLIER_MAX).cloned().collect(),
        });
    }
    worst
}

/// The hardware a fault names: each failed serial, then the host.
#[must_use]
pub fn failed_hardware(ledger: &HardwareLedger) -> Vec<(HardwareKind, String)> {
    let mut out: Vec<(HardwareKind, String)> = failed_serials(ledger)
        .into_iter()
        .map(|s| (HardwareKind::Gpu, s))
        .collect();
    out.extend(ledger.host.clone().map(|h| (HardwareKind::Host, h)));
    out
}

/// The hardware a node carries: every serial of its inventory, then its host.
#[must_use]
pub fn carried_hardware(ledger: &HardwareLedger) -> Vec<(HardwareKind, String)> {
    let mut serials: Vec<String> = ledger.gpus.iter().filter_map(|g| g.serial.clone()).collect();
    serials.sort();
    serials.dedup();
    let mut out: Vec<(HardwareKind, String)> = serials.into_iter().map(|s| (HardwareKind::Gpu, s)).collect();
    out.extend(ledger.host.clone().map(|h| (HardwareKind::Host, h)));
    out
}

/// One sentence naming an offence and its evidence (each earlier failure it lists, newest first:
/// which remediation, on which node, when, why), for status, Events and people.
#[must_use]
pub fn describe(offence: &RepeatOffence) -> String {
    let what = match offence.kind {
        HardwareKind::Gpu => format!("GPU serial {}", offence.id),
        HardwareKind::Host => format!("host {}", offence.id),
    };
    let mut evidence = String::new();
    for (i, f) in offence.earlier.iter().enumerate() {
        let lead = if i == 0 { "; evidence:" } else { ";" };
        // Writing to a String cannot fail.
        let _ = write!(
            evidence,
            "{lead} remediation {} on node {} at {} ({})",
            f.remediation, f.node, f.at.0, f.reason
        );
    }
    format!(
        "{what} failed {} time(s) within {} before{evidence}: a repeat offender",
        offence.failures, offence.window
    )
}

/// The records to write so that every remediation's failures are in them: each record that
/// gains an entry, as it should be stored (existing records keep their metadata, and so their
/// resourceVersion, for a conflict-checked replace).
///
/// A remediation still `Pending` (its cordon not yet made, or not yet reported) is left for a
/// later pass: in a burst of faults the records would compete with the cordons for the API
/// server, and nothing decided meanwhile needs them, since [`failures`] counts the remediations
/// on record as well as the records.
#[must_use]
pub fn records_to_write(
    records: &[Arc<GpuHardwareRecord>],
    remediations: &[Arc<GpuRemediation>],
) -> Vec<GpuHardwareRecord> {
    let by_name: BTreeMap<String, &Arc<GpuHardwareRecord>> =
        records.iter().map(|r| (r.name_any(), r)).collect();
    let mut changed: BTreeMap<String, GpuHardwareRecord> = BTreeMap::new();
    let mut ordered: Vec<&Arc<GpuRemediation>> = remediations
        .iter()
        .filter(|r| r.metadata.deletion_timestamp.is_none() && past_pending(r))
        .collect();
    ordered.sort_by_key(|r| (r.spec.trigger.since.as_ref().map(|t| t.0), r.name_any()));
    for remediation in ordered {
        for ((kind, id), failure) in failures_of(remediation) {
            let name = record_name(kind, &id);
            let record = changed
                .entry(name.clone())
                .or_insert_with(|| match by_name.get(&name) {
                    Some(existing) => GpuHardwareRecord::clone(existing),
                    None => GpuHardwareRecord::new(
                        &name,
                        GpuHardwareRecordSpec {
                            kind,
                            id: id.clone(),
                            failure_count: 0,
                            failures: Vec::new(),
                        },
                    ),
                });
            // Another identity hashed to this name: never mix two histories.
            if record.spec.id != id || record.spec.kind != kind {
                continue;
            }
            if let Some(known) = record
                .spec
                .failures
                .iter_mut()
                .find(|f| f.remediation == failure.remediation)
            {
                // Written when the remediation passed Pending; its diagnostics end later and
                // complete the entry once (never rewritten after).
                if known.diagnostics.is_none() && failure.diagnostics.is_some() {
                    known.diagnostics = failure.diagnostics;
                }
                continue;
            }
            // A full record whose oldest kept entry is newer dropped this one (or would at
            // once): counted when it was written, never again (no rewrite every pass).
            if record.spec.failures.len() >= RECORD_FAILURES_MAX
                && record
                    .spec
                    .failures
                    .last()
                    .is_some_and(|oldest| newest_first(oldest, &failure).is_lt())
            {
                continue;
            }
            record.spec.failure_count = record.spec.failure_count.saturating_add(1);
            record.spec.failures.push(failure);
            record.spec.failures.sort_by(newest_first);
            record.spec.failures.truncate(RECORD_FAILURES_MAX);
        }
    }
    changed
        .into_values()
        .filter(|record| {
            by_name
                .get(&record.name_any())
                .is_none_or(|old| old.spec != record.spec)
        })
        .collect()
}

/// The records to delete at `now`: those whose latest failure is past [`RECORD_RETENTION`], then,
/// past [`RECORDS_MAX`], those whose latest failure is oldest.
#[must_use]
pub fn records_to_forget(records: &[Arc<GpuHardwareRecord>], now: Timestamp) -> Vec<String> {
    let horizon = crate::time::minus(now, crate::time::signed(RECORD_RETENTION));
    let latest = |r: &GpuHardwareRecord| {
        r.spec
            .failures
            .iter()
            .map(|f| f.at.0)
            .max()
            .or_else(|| r.creation_timestamp().map(|t| t.0))
    };
    let mut kept: Vec<(Option<Timestamp>, String)> = Vec::new();
    let mut forget: BTreeSet<String> = BTreeSet::new();
    for record in records.iter().filter(|r| r.metadata.deletion_timestamp.is_none()) {
        let at = latest(record);
        if at.is_some_and(|at| at < horizon) {
            forget.insert(record.name_any());
        } else {
            kept.push((at, record.name_any()));
        }
    }
    kept.sort();
    let excess = kept.len().saturating_sub(RECORDS_MAX);
    forget.extend(kept.into_iter().take(excess).map(|(_, name)| name));
    forget.into_iter().collect()
}

/// Whether the remediation has left `Pending` as its status says.
fn past_pending(remediation: &GpuRemediation) -> bool {
    remediation
        .status
        .as_ref()
        .is_some_and(|status| status.phase != gpu_remediation_api::Phase::Pending)
}

#[cfg(test)]
pub(crate) mod tests {
    use gpu_remediation_api::{
        GpuRemediationSpec, GpuRemediationStatus, Phase,
        hardware::LedgerGpu,
        policy::{Action, ConditionStatus},
        remediation::TriggerRecord,
        safety::OffenderAction,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    pub(crate) fn at(hours: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + hours * 3600).unwrap()
    }

    /// A remediation of `node` at hour `hour` whose fault names GPU `serial`, on `host`, past its
    /// cordon (`Draining`; see [`with_phase`]).
    pub(crate) fn remediation(
        name: &str,
        node: &str,
        hour: i64,
        serial: &str,
        host: Option<&str>,
    ) -> Arc<GpuRemediation> {
        let mut r = GpuRemediation::new(
            name,
            GpuRemediationSpec {
                node_name: node.to_owned(),
                policy_name: "p".to_owned(),
                trigger: TriggerRecord {
                    condition_type: "GpuHealthy".to_owned(),
                    status: ConditionStatus::False,
                    reason: "XID79".to_owned(),
                    message: String::new(),
                    since: Some(Time(at(hour))),
                },
                action: Action::None,
                mode: gpu_remediation_api::policy::Mode::Enforce,
                node_uid: Some(format!("uid-{node}")),
                previous_incident: None,
                policy_snapshot: None,
                hardware: Some(HardwareLedger {
                    gpus: Vec::new(),
                    failed: vec![LedgerGpu {
                        uuid: format!("GPU-{serial}"),
                        serial: Some(serial.to_owned()),
                        ..LedgerGpu::default()
                    }],
                    host: host.map(str::to_owned),
                    repeat_offender: None,
                    untrusted: Vec::new(),
                }),
            },
        );
        r.metadata.creation_timestamp = Some(Time(at(hour)));
        r.status = Some(GpuRemediationStatus {
            phase: Phase::Draining,
            ..GpuRemediationStatus::default()
        });
        Arc::new(r)
    }

    /// `remediation` with no status (`None`: as just admitted) or one in `phase`.
    fn with_phase(remediation: &GpuRemediation, phase: Option<Phase>) -> Arc<GpuRemediation> {
        let mut r = remediation.clone();
        r.status = phase.map(|phase| GpuRemediationStatus {
            phase,
            ..GpuRemediationStatus::default()
        });
        Arc::new(r)
    }

    pub(crate) fn rule(failures: u32, window_hours: u64) -> RepeatOffender {
        RepeatOffender {
            failures,
            window: gpu_remediation_api::Duration::from_hours(window_hours),
            action: OffenderAction::Replace,
            cordon_on_join: false,
            cordon_on_join_max: None,
        }
    }

    fn stored(records: Vec<GpuHardwareRecord>) -> Vec<Arc<GpuHardwareRecord>> {
        records
            .into_iter()
            .map(|mut r| {
                r.metadata.resource_version = Some("1".to_owned());
                Arc::new(r)
            })
            .collect()
    }

    #[test]
    fn each_failed_serial_and_the_host_get_a_record_holding_the_failure() {
        let written = records_to_write(&[], &[remediation("a-1", "node-a", 0, "S1", Some("host-1"))]);
        let names: Vec<String> = written.iter().map(ResourceExt::name_any).collect();
        assert_eq!(
            names,
            ["gpu-hash-".to_owned() + &names[0][9..], "host-host-1".to_owned()]
        );
        let gpu = &written[0].spec;
        assert_eq!(
            (gpu.kind, gpu.id.as_str(), gpu.failure_count),
            (HardwareKind::Gpu, "S1", 1)
        );
        assert_eq!(gpu.failures[0].node, "node-a");
        assert_eq!(gpu.failures[0].remediation, "a-1");
        assert_eq!(gpu.failures[0].gpu.as_deref(), Some("GPU-S1"));
    }

    #[test]
    fn a_remediation_still_pending_is_recorded_once_it_reports_its_cordon_and_counted_meanwhile() {
        let cordoned = remediation("a-1", "node-a", 0, "S1", None);
        for admitted in [
            with_phase(&cordoned, None),
            with_phase(&cordoned, Some(Phase::Pending)),
        ] {
            assert!(records_to_write(&[], std::slice::from_ref(&admitted)).is_empty());
            // Decisions made meanwhile still see the failure.
            assert_eq!(failures(&[], &[admitted]).of(HardwareKind::Gpu, "S1").len(), 1);
        }
        let written = records_to_write(&[], &[with_phase(&cordoned, Some(Phase::Cordoned))]);
        assert_eq!(written.len(), 1);
        // A remediation that ended before its cordon is recorded too.
        assert_eq!(
            records_to_write(&[], &[with_phase(&cordoned, Some(Phase::Cancelled))]).len(),
            1
        );
    }

    #[test]
    fn a_record_outlives_the_remediation_and_is_not_written_twice() {
        let first = remediation("a-1", "node-a", 0, "1650000000001", None);
        let records = stored(records_to_write(&[], std::slice::from_ref(&first)));
        assert!(records_to_write(&records, &[first]).is_empty());
        // The remediation expired (history.ttl): the record still knows.
        let all = failures(&records, &[]);
        assert_eq!(all.of(HardwareKind::Gpu, "1650000000001").len(), 1);
        // A second failure on another node extends the same record and keeps its resourceVersion.
        let second = remediation("b-1", "node-b", 5, "1650000000001", None);
        let written = records_to_write(&records, &[second]);
        assert_eq!(written.len(), 1);
        assert_eq!(written[0].spec.failure_count, 2);
        assert_eq!(written[0].spec.failures[0].node, "node-b");
        assert_eq!(written[0].metadata.resource_version.as_deref(), Some("1"));
    }

    /// `remediation` whose diagnostics ran: ended with `outcome`, or still running (`None`).
    fn with_diagnostics(
        remediation: &GpuRemediation,
        outcome: Option<gpu_remediation_api::diagnostics::DiagnosticsOutcome>,
    ) -> Arc<GpuRemediation> {
        let mut r = remediation.clone();
        r.status
            .get_or_insert_with(GpuRemediationStatus::default)
            .diagnostics = Some(gpu_remediation_api::diagnostics::DiagnosticsRecord {
            namespace: "gpu-remediation".into(),
            job: "a-1-diagnostics".into(),
            uid: None,
            start: Time(at(0)),
            end: outcome.map(|_| Time(at(1))),
            outcome,
            duration_seconds: outcome.map(|_| 3600),
            message: outcome.map(|_| "reported condition Complete=True".into()),
        });
        Arc::new(r)
    }

    #[test]
    fn the_diagnostics_complete_the_entry_once_they_ended_and_never_rewrite_it() {
        use gpu_remediation_api::diagnostics::DiagnosticsOutcome;
        let first = remediation("a-1", "node-a", 0, "1650000000001", Some("host-a"));
        let records = stored(records_to_write(&[], std::slice::from_ref(&first)));
        assert!(records.iter().all(|r| r.spec.failures[0].diagnostics.is_none()));
        // Still running: nothing to add.
        let running = with_diagnostics(&first, None);
        assert!(records_to_write(&records, &[running]).is_empty());
        // Ended: the GPU's and the host's entries are completed, their count unchanged.
        let collected = with_diagnostics(&first, Some(DiagnosticsOutcome::Collected));
        let written = records_to_write(&records, std::slice::from_ref(&collected));
        assert_eq!(written.len(), 2, "the GPU's record and the host's");
        for record in &written {
            assert_eq!(record.spec.failure_count, 1);
            let diagnostics = record.spec.failures[0].diagnostics.as_ref().expect("completed");
            assert_eq!(diagnostics.outcome, Some(DiagnosticsOutcome::Collected));
            assert_eq!(diagnostics.job, "a-1-diagnostics");
        }
        // Written: nothing more to write, and the history shows them.
        let records = stored(written);
        assert!(records_to_write(&records, std::slice::from_ref(&collected)).is_empty());
        let all = failures(&records, &[first]);
        assert!(all.of(HardwareKind::Host, "host-a")[0].diagnostics.is_some());
        // The remediation's view completes an entry not yet written, too.
        let fresh = failures(&[], &[collected]);
        assert!(
            fresh.of(HardwareKind::Gpu, "1650000000001")[0]
                .diagnostics
                .is_some()
        );
    }

    #[test]
    fn a_record_keeps_the_latest_sixteen_failures_and_counts_them_all() {
        let many: Vec<_> = (0..20)
            .map(|i| remediation(&format!("r-{i}"), "node-a", i, "1650000000001", None))
            .collect();
        let written = records_to_write(&[], &many);
        assert_eq!(written[0].spec.failure_count, 20);
        assert_eq!(written[0].spec.failures.len(), RECORD_FAILURES_MAX);
        assert_eq!(written[0].spec.failures[0].remediation, "r-19");
    }

    #[test]
    fn a_full_record_is_not_rewritten_for_the_failures_it_dropped() {
        let many: Vec<_> = (0..20)
            .map(|i| remediation(&format!("r-{i}"), "node-a", i, "1650000000001", None))
            .collect();
        let records = stored(records_to_write(&[], &many));
        assert!(records_to_write(&records, &many).is_empty());
    }

    #[test]
    fn the_history_prefers_the_entry_carrying_the_diagnostics() {
        use gpu_remediation_api::diagnostics::DiagnosticsOutcome;
        let first = remediation("a-1", "node-a", 0, "1650000000001", None);
        let collected = with_diagnostics(&first, Some(DiagnosticsOutcome::Collected));
        let outcome = |all: &Failures| {
            let list = all.of(HardwareKind::Gpu, "1650000000001");
            assert_eq!(list.len(), 1, "one entry per remediation");
            list[0].diagnostics.as_ref().and_then(|d| d.outcome)
        };
        // The record written before they ended, the remediation since completed: its run shows.
        let bare = stored(records_to_write(&[], std::slice::from_ref(&first)));
        assert_eq!(
            outcome(&failures(&bare, std::slice::from_ref(&collected))),
            Some(DiagnosticsOutcome::Collected)
        );
        // The record completed, the remediation's run still without outcome: the record's shows.
        let complete = stored(records_to_write(&bare, std::slice::from_ref(&collected)));
        let running = with_diagnostics(&first, None);
        assert_eq!(
            outcome(&failures(&complete, &[running])),
            Some(DiagnosticsOutcome::Collected)
        );
        // Neither has one: none is made up.
        assert_eq!(outcome(&failures(&bare, &[with_diagnostics(&first, None)])), None);
    }

    #[test]
    fn hardware_past_the_limit_within_the_window_is_a_repeat_offender_naming_the_earlier_failure() {
        let all = failures(&[], &[remediation("a-1", "node-a", 0, "S1", None)]);
        let found = offence(
            &all,
            [(HardwareKind::Gpu, "S1")],
            &rule(1, 24),
            at(3),
            Some("b-1"),
        )
        .expect("an offence");
        assert_eq!(
            (found.kind, found.id.as_str(), found.failures),
            (HardwareKind::Gpu, "S1", 1)
        );
        assert_eq!(found.earlier[0].remediation, "a-1");
        assert!(
            describe(&found).contains("remediation a-1 on node node-a"),
            "{}",
            describe(&found)
        );
    }

    #[test]
    fn a_verdict_names_every_fault_it_rests_on_with_node_and_time() {
        let history =
            [("a-1", "node-a", 0), ("c-1", "node-c", 2)].map(|(r, n, h)| remediation(r, n, h, "S1", None));
        let all = failures(&[], &history);
        let found = offence(&all, [(HardwareKind::Gpu, "S1")], &rule(2, 24), at(3), None).unwrap();
        let said = describe(&found);
        assert!(said.contains("failed 2 time(s)"), "{said}");
        let newest = said.find(&format!("remediation c-1 on node node-c at {}", at(2)));
        let oldest = said.find(&format!("remediation a-1 on node node-a at {}", at(0)));
        assert!(newest.is_some() && oldest.is_some() && newest < oldest, "{said}");
    }

    #[test]
    fn failures_outside_the_window_the_remediation_s_own_and_below_the_limit_do_not_count() {
        let all = failures(&[], &[remediation("a-1", "node-a", 0, "S1", None)]);
        assert_eq!(
            offence(&all, [(HardwareKind::Gpu, "S1")], &rule(1, 2), at(3), None),
            None
        );
        assert_eq!(
            offence(
                &all,
                [(HardwareKind::Gpu, "S1")],
                &rule(1, 24),
                at(3),
                Some("a-1")
            ),
            None
        );
        assert_eq!(
            offence(&all, [(HardwareKind::Gpu, "S1")], &rule(2, 24), at(3), None),
            None
        );
        assert_eq!(
            offence(&all, [(HardwareKind::Gpu, "S2")], &rule(1, 24), at(3), None),
            None
        );
    }

    #[test]
    fn a_host_with_failures_is_a_repeat_offender_whatever_gpus_it_holds() {
        let all = failures(&[], &[remediation("a-1", "node-a", 0, "S1", Some("i-0abc"))]);
        let found = offence(
            &all,
            [(HardwareKind::Gpu, "S9"), (HardwareKind::Host, "i-0abc")],
            &rule(1, 24),
            at(1),
            None,
        );
        assert_eq!(found.map(|o| o.kind), Some(HardwareKind::Host));
    }

    #[test]
    fn records_past_their_retention_are_forgotten_and_the_oldest_go_past_the_cap() {
        let records = stored(records_to_write(
            &[],
            &[
                remediation("old", "node-a", 0, "S-old", None),
                remediation("new", "node-b", 24 * 400, "S-new", None),
            ],
        ));
        let forgotten = records_to_forget(&records, at(24 * 401));
        assert_eq!(forgotten.len(), 1);
        assert!(
            records
                .iter()
                .any(|r| r.name_any() == forgotten[0] && r.spec.id == "S-old")
        );
        assert!(records_to_forget(&records, at(24 * 10)).is_empty());
    }
}
