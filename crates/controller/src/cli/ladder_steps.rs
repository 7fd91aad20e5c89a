//! A remediation's ladder steps (`status.steps`) as `explain` and `history` print them: one line
//! per step (its rung, outcome, start, end and how long it took), then, indented, its evidence
//! (the GPU UUIDs answering again, the healthy dwell, the boot IDs before and after), the pods
//! evicted for it, the object that carried it out, its validation Job (which, how it ended, how
//! long it took) and its message; before them, the diagnostics Job run before the first step that
//! destroyed the node's state, and where its output is. Pure.

use gpu_remediation_api::ladder::StepRecord;

/// One validation Job's run, for a person: which Job, how it ended and how long it took, and what
/// it reported (`validation: Job gpu-remediation/x-validate Passed in 5s: ...`, or running since).
#[must_use]
pub fn validation_line(run: &gpu_remediation_api::validation::ValidationRecord) -> String {
    job_line("validation", run)
}

/// The diagnostics Job's run, as [`validation_line`] words it, and where its output is: the Job's
/// log (while the node stands) and wherever the Job wrote its bundle.
#[must_use]
pub fn diagnostics_line(run: &gpu_remediation_api::diagnostics::DiagnosticsRecord) -> String {
    format!(
        "{}; output: kubectl logs job/{} -n {} (while the node stands), and wherever the Job wrote its bundle",
        job_line("diagnostics", run),
        run.job,
        run.namespace
    )
}

fn job_line<O: std::fmt::Debug>(what: &str, run: &gpu_remediation_api::node_job::JobRecord<O>) -> String {
    let job = format!("Job {}/{}", run.namespace, run.job);
    let how = match (&run.outcome, run.duration_seconds) {
        (Some(outcome), Some(seconds)) => format!("{outcome:?} in {}", span(i64::from(seconds))),
        (Some(outcome), None) => format!("{outcome:?}"),
        (None, _) => format!("running since {}", run.start.0),
    };
    match run.message.as_deref().filter(|m| !m.is_empty()) {
        Some(message) => format!("{what}: {job} {how}: {message}"),
        None => format!("{what}: {job} {how}"),
    }
}

/// What a record says of its diagnostics, steps and validation, as lines: the diagnostics run
/// before the first destroying step, its ladder steps (each with its own validation), then the
/// validation of a remediation without a ladder.
#[must_use]
pub fn record_lines(status: &gpu_remediation_api::GpuRemediationStatus) -> Vec<String> {
    status
        .diagnostics
        .as_ref()
        .map(diagnostics_line)
        .into_iter()
        .chain(step_lines(&status.steps))
        .chain(status.validation.as_ref().map(validation_line))
        .collect()
}

/// The lines of `steps`, in order; none for a remediation without a ladder.
#[must_use]
pub fn step_lines(steps: &[StepRecord]) -> Vec<String> {
    let mut lines = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        let outcome = step
            .outcome
            .map_or_else(|| "running".to_owned(), |o| format!("{o:?}"));
        let start = step.start.0;
        let end = match &step.end {
            Some(end) => format!(
                "{start} -> {} (took {})",
                end.0,
                span(end.0.as_second() - start.as_second())
            ),
            None => format!("since {start}"),
        };
        lines.push(format!("step {} {}: {outcome}, {end}", i + 1, step.step));
        let evidence = &step.evidence;
        let mut seen = Vec::new();
        if !evidence.gpus_answering.is_empty() {
            seen.push(format!("GPU {} answering", evidence.gpus_answering.join(", ")));
        }
        match (&evidence.healthy_since, evidence.dwell_seconds) {
            (Some(since), Some(dwell)) => seen.push(format!("healthy since {} (dwell {dwell}s)", since.0)),
            (Some(since), None) => seen.push(format!("healthy since {}", since.0)),
            (None, Some(dwell)) => seen.push(format!("dwell {dwell}s")),
            (None, None) => {}
        }
        match (&evidence.boot_id_before, &evidence.boot_id_after) {
            (Some(before), Some(after)) if before == after => {
                seen.push(format!("boot ID {before} unchanged"));
            }
            (Some(before), Some(after)) => seen.push(format!("boot ID {before} -> {after}")),
            (Some(before), None) => seen.push(format!("boot ID before {before}")),
            (None, Some(after)) => seen.push(format!("boot ID after {after}")),
            (None, None) => {}
        }
        if !seen.is_empty() {
            lines.push(format!("  evidence: {}", seen.join("; ")));
        }
        if let Some(validation) = &evidence.validation {
            lines.push(format!("  {}", validation_line(validation)));
        }
        if !step.evicted_pods.is_empty() {
            lines.push(format!(
                "  evicted ({}): {}",
                step.evicted_pods.len(),
                step.evicted_pods.join(", ")
            ));
        }
        if let Some(object) = &step.object {
            let namespace = object
                .namespace
                .as_deref()
                .map(|ns| format!("{ns}/"))
                .unwrap_or_default();
            lines.push(format!("  object: {} {namespace}{}", object.kind, object.name));
        }
        if let Some(message) = step.message.as_deref().filter(|m| !m.is_empty()) {
            lines.push(format!("  {message}"));
        }
    }
    lines
}

/// `1h2m3s`, `4m0s`, `12s`.
pub(super) fn span(seconds: i64) -> String {
    let (h, m, s) = (seconds / 3600, seconds % 3600 / 60, seconds % 60);
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, _) => format!("{m}m{s}s"),
        _ => format!("{h}h{m}m{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use gpu_remediation_api::GpuRemediationStatus;

    use super::*;

    /// A remediation's status as the API server returns it: a reset that the fault outlived,
    /// then a reboot proven by a new boot ID.
    const FIXTURE: &str = r"
phase: Succeeded
steps:
  - step: ResetGpu
    start: 2026-11-30T22:00:00Z
    end: 2026-11-30T22:00:12Z
    outcome: Permanent
    message: the fault came back within the dwell (XID95)
    object: {apiVersion: e2e.gpuremediation.dev/v1, kind: FakeReboot, namespace: ops, name: gpu-1-abc-resetgpu}
    evidence:
      gpusAnswering: [GPU-3]
      healthySince: 2026-11-30T22:00:05Z
      dwellSeconds: 30
    evictedPods: [train/worker-3]
  - step: Reboot
    start: 2026-11-30T22:00:12Z
    end: 2026-11-30T22:02:00Z
    outcome: Succeeded
    message: reboot proven
    evidence:
      bootIdBefore: boot-a
      bootIdAfter: boot-b
      healthySince: 2026-11-30T22:01:30Z
      dwellSeconds: 30
    evictedPods: [train/worker-0, train/worker-1]
  - step: Replace
    start: 2026-11-30T22:02:00Z
";

    #[test]
    fn each_step_prints_its_outcome_times_evidence_pods_object_and_message() {
        let status: GpuRemediationStatus = serde_yaml::from_str(FIXTURE).expect("the fixture parses");
        assert_eq!(
            step_lines(&status.steps),
            [
                "step 1 ResetGpu: Permanent, 2026-11-30T22:00:00Z -> 2026-11-30T22:00:12Z (took 12s)",
                "  evidence: GPU GPU-3 answering; healthy since 2026-11-30T22:00:05Z (dwell 30s)",
                "  evicted (1): train/worker-3",
                "  object: FakeReboot ops/gpu-1-abc-resetgpu",
                "  the fault came back within the dwell (XID95)",
                "step 2 Reboot: Succeeded, 2026-11-30T22:00:12Z -> 2026-11-30T22:02:00Z (took 1m48s)",
                "  evidence: healthy since 2026-11-30T22:01:30Z (dwell 30s); boot ID boot-a -> boot-b",
                "  evicted (2): train/worker-0, train/worker-1",
                "  reboot proven",
                "step 3 Replace: running, since 2026-11-30T22:02:00Z",
            ]
        );
    }

    #[test]
    fn a_reboot_that_kept_its_boot_id_says_so() {
        let steps: Vec<StepRecord> = serde_yaml::from_str(
            "- {step: Reboot, start: '2026-11-30T22:00:00Z', end: '2026-11-30T22:00:08Z', outcome: TimedOut, \
             evidence: {bootIdBefore: boot-a, bootIdAfter: boot-a}}",
        )
        .unwrap();
        assert_eq!(step_lines(&steps)[1], "  evidence: boot ID boot-a unchanged");
    }

    #[test]
    fn a_remediation_without_a_ladder_prints_no_steps() {
        assert!(step_lines(&[]).is_empty());
    }

    #[test]
    fn a_validation_says_which_job_how_it_ended_and_how_long_it_took() {
        let status: GpuRemediationStatus = serde_yaml::from_str(
            "phase: Verifying
steps:
- {step: Reboot, start: '2026-11-30T22:00:00Z', end: '2026-11-30T22:03:00Z', outcome: Permanent,
   evidence: {bootIdBefore: boot-a, bootIdAfter: boot-b,
     validation: {namespace: gpu-remediation, job: gpu-1-abc-validate-reboot, start: '2026-11-30T22:02:00Z',
       end: '2026-11-30T22:02:05Z', outcome: Failed, durationSeconds: 5, message: Job has reached the specified backoff limit}}}
validation: {namespace: gpu-remediation, job: gpu-1-abc-validate, start: '2026-11-30T22:04:00Z'}",
        )
        .unwrap();
        assert_eq!(
            record_lines(&status),
            [
                "step 1 Reboot: Permanent, 2026-11-30T22:00:00Z -> 2026-11-30T22:03:00Z (took 3m0s)",
                "  evidence: boot ID boot-a -> boot-b",
                "  validation: Job gpu-remediation/gpu-1-abc-validate-reboot Failed in 5s: Job has reached the specified backoff limit",
                "validation: Job gpu-remediation/gpu-1-abc-validate running since 2026-11-30T22:04:00Z",
            ]
        );
    }

    #[test]
    fn the_diagnostics_come_first_saying_how_they_ended_and_where_the_output_is() {
        let status: GpuRemediationStatus = serde_yaml::from_str(
            "phase: Verifying
diagnostics: {namespace: gpu-remediation, job: gpu-1-abc-diagnostics, start: '2026-11-30T21:58:00Z',
  end: '2026-11-30T21:58:42Z', outcome: TimedOut, durationSeconds: 42,
  message: reported nothing within diagnostics.timeout (42s)}
steps:
- {step: Replace, start: '2026-11-30T21:58:42Z'}",
        )
        .unwrap();
        let lines = record_lines(&status);
        assert_eq!(
            lines[0],
            "diagnostics: Job gpu-remediation/gpu-1-abc-diagnostics TimedOut in 42s: reported nothing within \
             diagnostics.timeout (42s); output: kubectl logs job/gpu-1-abc-diagnostics -n gpu-remediation (while \
             the node stands), and wherever the Job wrote its bundle"
        );
        assert!(lines[1].starts_with("step 1 Replace: running"), "{lines:?}");
    }

    #[test]
    fn spans_read_like_durations() {
        assert_eq!([span(12), span(240), span(3723)], ["12s", "4m0s", "1h2m3s"]);
    }
}
