//! A scale fleet under its own traffic (`gpu-bench --scale N --scale-churn RATE`): after the quiet
//! rounds, the fleet's nodes report status at `RATE` writes a second (the [`Mix::Fleet`] mix:
//! kubelet reports and agent resyncs, one in a hundred a real change), and the bench measures what
//! the controller pays for it and how fast it still cordons.
//!
//! Method, in this order, on the same fleet and controller as the quiet rounds:
//! 1. *Quiet baseline*: [`SETTLE`] after the quiet rounds, the controller's CPU over [`BASELINE`]
//!    with nothing written (its resyncs and lease renewals), as CPU seconds a second.
//! 2. *Churn*: the churn starts; after [`SETTLE`] (the rate reached, the watch's backlog, if any,
//!    drained), the controller's CPU and the writes the server accepted are taken over the window.
//!    CPU per 1,000 updates is the window's CPU, all of it (the quiet baseline not taken off, so an
//!    upper bound), over its accepted writes.
//! 3. *Rounds under churn*: the same fault rounds as the quiet ones, on nodes neither the quiet
//!    rounds nor the churn touch (the churn's agent writes say `GpuHealthy=True`, which would heal a
//!    broken node), while the churn goes on.
//!
//! The churn writes the nodes after the first `2 × Σ faults` in turn; the rounds break nodes from
//! the second `Σ faults`. What a real fleet of that size sends is given beside the rate reached:
//! each node's kubelet and agent once per [`REAL_FLEET_PERIOD`] each when nothing changes.

use std::time::{Duration, Instant};

use super::actor::ControllerProcess;
use super::bench_env::BenchEnv;
use super::cordon_watch::CordonWatch;
use super::latency::{self, LatencyOptions, LatencyResult};
use super::node_churn::{Mix, NodeChurn, REAL_FLEET_PERIOD};
use super::setup::BenchSetupError;
use crate::controlplane::usage::{ComponentUsage, load_average};

/// The quiet window the baseline CPU is taken over.
pub const BASELINE: Duration = Duration::from_secs(20);

/// How long the quiet rounds' remediations are given to finish before the quiet baseline, and the
/// churn to reach its pace before its window.
pub const SETTLE: Duration = Duration::from_secs(15);

/// What the churn phase is asked to do.
#[derive(Debug, Clone, Copy)]
pub struct ChurnOptions {
    /// Node status writes a second over the fleet (the churn's target).
    pub per_second: f64,
    /// The window the controller's CPU is taken over.
    pub window: Duration,
}

/// The churn's rate as asked on the command line: writes a second, or `real`, what a real fleet of
/// each size sends ([`real_fleet_rate`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ChurnRate {
    /// What a real fleet of the size sends.
    Real,
    /// Writes a second over the fleet.
    PerSecond(f64),
}

impl std::str::FromStr for ChurnRate {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text == "real" {
            return Ok(Self::Real);
        }
        match text.parse::<f64>() {
            Ok(rate) if rate.is_finite() && rate > 0.0 => Ok(Self::PerSecond(rate)),
            _ => Err(format!(
                "{text:?}: a churn rate is `real` or writes a second above 0, e.g. 500"
            )),
        }
    }
}

impl ChurnRate {
    /// Writes a second on a fleet of `nodes`.
    #[must_use]
    pub fn on(self, nodes: usize) -> f64 {
        match self {
            Self::Real => real_fleet_rate(nodes),
            Self::PerSecond(rate) => rate,
        }
    }
}

/// A scale fleet's figures under churn.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ChurnResult {
    /// The target rate, writes a second.
    pub target_per_second: f64,
    /// The rate the server accepted over the window.
    pub reached_per_second: f64,
    /// What a real fleet of this size sends in steady state (kubelet reports and agent resyncs,
    /// each once per 5 minutes per node).
    pub real_fleet_per_second: f64,
    /// Node status writes the server accepted over the window.
    pub window_updates: u64,
    /// The window, seconds.
    pub window_seconds: f64,
    /// The controller's CPU seconds over the window.
    pub window_cpu_seconds: f64,
    /// The controller's CPU seconds per 1,000 accepted writes over the window (all of its CPU).
    pub cpu_seconds_per_1000_updates: f64,
    /// The controller's CPU seconds a second with nothing written, just before the churn.
    pub quiet_cpu_per_second: f64,
    /// The controller's peak RSS after the rounds under churn.
    pub peak_rss_mib: f64,
    /// The fault rounds under churn.
    pub rounds: Vec<LatencyResult>,
    /// Node status writes the churn made in all (settle, window and rounds).
    pub total_updates: u64,
    /// The machine's load averages when the churn's window ended and when its rounds ended.
    pub load_average: [String; 2],
}

/// What a real fleet of `nodes` nodes sends a second when nothing changes.
#[must_use]
pub fn real_fleet_rate(nodes: usize) -> f64 {
    #[allow(clippy::cast_precision_loss, reason = "fleet sizes are far below 2^52")]
    let nodes = nodes as f64;
    2.0 * nodes / REAL_FLEET_PERIOD.as_secs_f64()
}

/// The nodes the churn writes and the nodes its rounds break, of the sorted `names`: `None` when the
/// fleet is too small to keep them apart from the quiet rounds' and from each other.
#[must_use]
pub fn split<'a>(names: &'a [String], faults: &[usize]) -> Option<(&'a [String], &'a [String])> {
    let per_rounds: usize = faults.iter().sum();
    let churned = names.get(2 * per_rounds..).filter(|rest| !rest.is_empty())?;
    Some((churned, &names[per_rounds..2 * per_rounds]))
}

fn gone(controller: &ControllerProcess) -> BenchSetupError {
    BenchSetupError::Step(format!("the controller exited:\n{}", controller.log_tail(30)))
}

#[allow(clippy::cast_precision_loss, reason = "write counts are far below 2^52")]
fn per_second(count: u64, seconds: f64) -> f64 {
    count as f64 / seconds
}

/// Runs the churn phase over a fleet whose quiet rounds are done.
///
/// # Errors
/// The fleet is too small for the phase, the controller exited, or a round's setup failed.
pub async fn run(
    env: &BenchEnv,
    scope: &str,
    names: &[String],
    latency_options: &LatencyOptions,
    options: ChurnOptions,
    watch: &CordonWatch,
    controller: &ControllerProcess,
) -> Result<ChurnResult, BenchSetupError> {
    let (churned, broken) = split(names, &latency_options.faults).ok_or_else(|| {
        BenchSetupError::Step(format!(
            "{} nodes are too few for the churn's rounds of {:?} faults beside the quiet ones",
            names.len(),
            latency_options.faults
        ))
    })?;
    // The quiet rounds' remediations finish first (they end soon after their cordons: `action:
    // None`), so the quiet figure is the controller at rest.
    tokio::time::sleep(SETTLE).await;
    let quiet_from = controller.usage().ok_or_else(|| gone(controller))?;
    tokio::time::sleep(BASELINE).await;
    let quiet_to = controller.usage().ok_or_else(|| gone(controller))?;
    let quiet_cpu_per_second = (quiet_to.cpu_seconds - quiet_from.cpu_seconds) / BASELINE.as_secs_f64();

    eprintln!(
        "scale: churn at {:.0} writes/s over {} nodes (a real fleet of {} sends about {:.0}/s)",
        options.per_second,
        churned.len(),
        names.len(),
        real_fleet_rate(names.len())
    );
    let churn = NodeChurn::at_rate(
        env.client.clone(),
        churned.to_vec(),
        options.per_second,
        Mix::Fleet,
    );
    tokio::time::sleep(SETTLE).await;
    let (cpu_from, written_from, started) = (
        controller.usage().ok_or_else(|| gone(controller))?,
        churn.written(),
        Instant::now(),
    );
    tokio::time::sleep(options.window).await;
    let (cpu_to, written_to, window_seconds) = (
        controller.usage().ok_or_else(|| gone(controller))?,
        churn.written(),
        started.elapsed().as_secs_f64(),
    );
    let load_window = load_average();
    let window_updates = written_to - written_from;
    let window_cpu_seconds = cpu_to.cpu_seconds - cpu_from.cpu_seconds;
    let rounds = latency::run_rounds(env, latency_options, scope, broken, watch, controller).await;
    let after = controller.usage();
    let total_updates = churn.stop().await;
    let rounds = rounds?;
    let result = ChurnResult {
        target_per_second: options.per_second,
        reached_per_second: per_second(window_updates, window_seconds),
        real_fleet_per_second: real_fleet_rate(names.len()),
        window_updates,
        window_seconds,
        window_cpu_seconds,
        cpu_seconds_per_1000_updates: if window_updates == 0 {
            f64::NAN
        } else {
            window_cpu_seconds / per_second(window_updates, 1000.0)
        },
        quiet_cpu_per_second,
        peak_rss_mib: after.as_ref().map_or(f64::NAN, ComponentUsage::peak_rss_mib),
        rounds,
        total_updates,
        load_average: [load_window, load_average()],
    };
    eprintln!(
        "scale: churn reached {:.0} writes/s; controller {:.3} CPU s per 1,000 updates (quiet {:.3} CPU s/s)",
        result.reached_per_second, result.cpu_seconds_per_1000_updates, result.quiet_cpu_per_second
    );
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_real_fleet_of_50000_sends_about_333_writes_a_second() {
        assert!((real_fleet_rate(50_000) - 333.33).abs() < 0.01);
    }

    #[test]
    fn a_rate_is_real_or_a_positive_number_and_anything_else_is_refused_with_the_forms() {
        assert_eq!("real".parse::<ChurnRate>(), Ok(ChurnRate::Real));
        assert_eq!("500".parse::<ChurnRate>(), Ok(ChurnRate::PerSecond(500.0)));
        assert!((ChurnRate::Real.on(10_000) - 66.67).abs() < 0.01);
        assert!((ChurnRate::PerSecond(500.0).on(10_000) - 500.0).abs() < f64::EPSILON);
        for bad in ["0", "-5", "NaN", "inf", "fast", ""] {
            let error = bad.parse::<ChurnRate>().unwrap_err();
            assert!(error.contains("`real` or writes a second"), "{bad}: {error}");
        }
    }

    #[test]
    fn the_churn_and_its_rounds_keep_clear_of_the_quiet_rounds_and_of_each_other() {
        let names: Vec<String> = (0..300).map(|i| format!("n{i:03}")).collect();
        let (churned, broken) = split(&names, &[1, 10, 100]).unwrap();
        assert_eq!(broken, &names[111..222]);
        assert_eq!(churned, &names[222..]);
        assert!(
            split(&names[..222], &[1, 10, 100]).is_none(),
            "no node left to churn"
        );
        assert!(split(&names[..150], &[1, 10, 100]).is_none());
    }
}
