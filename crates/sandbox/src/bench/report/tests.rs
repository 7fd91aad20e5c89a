//! The report's tables from hand-made results.

use super::super::audit::RequestCounts;
use super::super::drain::DrainPeerResult;
use super::super::drain_links::{DrainLinks, Spread};
use super::*;
use crate::bench::percentile::percentile;

/// A latency round of `faults` on `nodes` nodes with these cordon and quarantine samples (sorted).
fn round_of(nodes: usize, faults: usize, cordon: Vec<f64>, quarantine: Vec<f64>) -> LatencyResult {
    LatencyResult {
        nodes,
        pods: 0,
        faults,
        cordoned: cordon.len(),
        p50_ms: percentile(&cordon, 50.0).unwrap_or(f64::NAN),
        p99_ms: percentile(&cordon, 99.0).unwrap_or(f64::NAN),
        max_ms: cordon.last().copied().unwrap_or(f64::NAN),
        samples_ms: cordon,
        quarantine: Spread::of(&quarantine),
        quarantine_samples_ms: quarantine,
        controller_peak_rss_mib: 250.0,
        due: String::new(),
        requests: Vec::new(),
    }
}

#[test]
fn the_scale_tables_give_each_round_its_cordon_and_its_quarantine_and_the_probes_refusals() {
    let round =
        |faults: usize, cordon: Vec<f64>, quarantine: Vec<f64>| round_of(50_000, faults, cordon, quarantine);
    let fleet = ScaleResult {
        nodes: 50_000,
        labels: crate::bench::scale::ScaleLabels::Bench,
        registration_seconds: 150.0,
        ready_seconds: 9.0,
        idle_peak_rss_mib: 248.0,
        idle_cpu_seconds: 7.0,
        idle_requests_per_second: 1.0,
        // The second round's quarantine was seen for one node of two, the third's for none.
        rounds: vec![
            round(1, vec![24.0], vec![56.0]),
            round(2, vec![90.0, 140.0], vec![52.0]),
            round(1, vec![30.0], vec![]),
        ],
        peak_rss_mib: 250.0,
        rounds_cpu_seconds: 1.2,
        load_average: ["1".to_owned(), "2".to_owned()],
        fence: None,
        approval: Some(super::super::scale::ApprovalCheck {
            probe_refusal: "an approval names its approver".to_owned(),
            records_refused: 0,
        }),
        churn: None,
        cordon_floor: Vec::new(),
    };
    let tables = scale_tables(&[fleet]);
    assert!(
        !tables.contains("under their own traffic"),
        "no churn, no churn table: {tables}"
    );
    let rows: Vec<&str> = tables
        .lines()
        .filter(|l| l.starts_with("| gpu-remediator"))
        .collect();
    assert_eq!(
        rows[..3],
        [
            "| gpu-remediator (measured here) | 50000 | 1 | 1/1 | 24 ms | 24 ms | 24 ms | 1/1 | 56 ms | 56 ms | 56 ms | 1 → 2 |",
            "| gpu-remediator (measured here) | 50000 | 2 | 2/2 | 90 ms | 140 ms | 140 ms | 1/2 | 52 ms | 52 ms | 52 ms | 1 → 2 |",
            "| gpu-remediator (measured here) | 50000 | 1 | 1/1 | 30 ms | 30 ms | 30 ms | 0/1 | - | - | - | 1 → 2 |",
        ]
    );
    assert!(tables.contains("first signal to quarantine"), "{tables}");
    assert!(
        tables.contains("was refused: \"an approval names its approver\"; the controller's creates and updates of remediations refused during the idle window and the rounds: 0."),
        "{tables}"
    );
}

#[test]
fn the_leak_table_has_one_row_per_arm_and_no_latency_without_quarantine() {
    let arm = |quarantine: bool, leaked: Vec<usize>, samples: Vec<f64>| QuarantineResult {
        quarantine,
        nodes: 6,
        faults: leaked.len(),
        trigger_for_seconds: 6,
        pods_per_second: 4.0,
        leaked_total: leaked.iter().sum(),
        leaked,
        fault_to_quarantine_p50_ms: percentile(&samples, 50.0),
        fault_to_quarantine_p99_ms: percentile(&samples, 99.0),
        samples_ms: samples,
    };
    let table = quarantine_table(&[
        arm(false, vec![5, 3], vec![]),
        arm(true, vec![0, 0], vec![20.0, 40.0]),
    ]);
    let rows: Vec<&str> = table.lines().filter(|l| l.starts_with("| o")).collect();
    assert_eq!(
        rows,
        [
            "| off | 6 | 2 | 6 s | 4.0/s | 8 (5, 3) | n/a | n/a |",
            "| on | 6 | 2 | 6 s | 4.0/s | 0 (0, 0) | 20 ms | 40 ms |"
        ]
    );
}

#[test]
fn the_drain_links_table_has_a_row_per_peer_and_the_fifth_of_kubectls_time() {
    let peer = |peer: &str, seconds: f64, chain: Option<(String, f64)>| DrainPeerResult {
        peer: peer.to_owned(),
        seconds,
        pods: 100,
        violations: 0,
        least_margin: 0,
        requests: RequestCounts::default(),
        links: DrainLinks {
            links: 84,
            unattributed: 0,
            budget: Spread {
                p50_ms: 434.0,
                p99_ms: 1182.0,
                max_ms: 1182.0,
            },
            drainer: Spread {
                p50_ms: 87.0,
                p99_ms: 311.0,
                max_ms: 311.0,
            },
            drainer_behind_own_requests: Spread {
                p50_ms: 63.0,
                p99_ms: 280.0,
                max_ms: 280.0,
            },
            longest_server_chain: chain.clone().map(|(name, seconds)| (name, seconds + 1.0)),
            longest_chain: chain,
            workload: Spread {
                p50_ms: 120.0,
                p99_ms: 300.0,
                max_ms: 310.0,
            },
            disruption_controller: Spread {
                p50_ms: 290.0,
                p99_ms: 900.0,
                max_ms: 950.0,
            },
            ready_not_seen: 2,
            budget_writes: 205,
            budget_writes_overlapping: 0,
            budget_write: Spread {
                p50_ms: 13.0,
                p99_ms: 30.0,
                max_ms: 31.0,
            },
            between_budget_writes: Spread {
                p50_ms: 4.0,
                p99_ms: 40.0,
                max_ms: 41.0,
            },
        },
    };
    let table = drain_links_table(&DrainComparison {
        controller: peer("gpu-remediator", 5.7, Some(("app-06".to_owned(), 3.7))),
        kubectl: peer("kubectl drain", 18.5, None),
        ratio: 18.5 / 5.7,
    });
    assert!(
        table.contains(
            "| gpu-remediator | 84 (0) | 434 / 1182 / 1182 ms | 87 / 311 / 311 ms | 63 / 280 ms | 3.7 s (app-06) |"
        ),
        "{table}"
    );
    assert!(
        table.contains("| kubectl drain | 84 (0) |") && table.contains("| - |"),
        "{table}"
    );
    assert!(
        table.contains("| gpu-remediator | 120 / 300 / 310 ms | 290 / 900 / 950 ms | 2 | 205 (0) | 13 / 30 ms | 4 / 40 ms |"),
        "{table}"
    );
    assert!(
        table.contains("a fifth of `kubectl drain`'s time is 3.7 s"),
        "{table}"
    );
    // The drain floor: the controller's 5.7 s over its budgets' 3.7 s; kubectl's drain, whose
    // chain was not split, has no floor line.
    assert!(
        table.contains(
            "Drain floor, gpu-remediator: 5.7 s for the drain beside its budgets' 3.7 s (app-06's chain): \
             1.54x the floor; beside the server's 4.7 s with the evictions' time in it (app-06's chain): 1.21x."
        ),
        "{table}"
    );
    assert!(!table.contains("Drain floor, kubectl drain"), "{table}");
}

#[test]
fn the_report_names_the_release_it_ran_on() {
    let results = BenchResults {
        kubernetes: "v1.37.2".to_owned(),
        ..BenchResults::default()
    };
    assert!(
        markdown(&results).starts_with("_On Kubernetes v1.37.2 (`e2e/controlplane/`)._\n"),
        "{}",
        markdown(&results)
    );
}

#[test]
fn the_churn_tables_give_the_cost_per_thousand_updates_and_each_round_under_churn_beside_quiet() {
    let round = |faults: usize, cordon: Vec<f64>| round_of(10_000, faults, cordon, Vec::new());
    let churn = super::super::scale_churn::ChurnResult {
        target_per_second: 500.0,
        reached_per_second: 480.4,
        real_fleet_per_second: 66.7,
        window_updates: 28_824,
        window_seconds: 60.0,
        window_cpu_seconds: 5.9,
        cpu_seconds_per_1000_updates: 0.2047,
        quiet_cpu_per_second: 0.0123,
        peak_rss_mib: 120.5,
        rounds: vec![round(1, vec![40.0]), round(10, vec![50.0, 80.0])],
        total_updates: 40_000,
        load_average: ["1.5".to_owned(), "1.9".to_owned()],
    };
    let fleet = ScaleResult {
        nodes: 10_000,
        labels: crate::bench::scale::ScaleLabels::Bench,
        registration_seconds: 30.0,
        ready_seconds: 2.0,
        idle_peak_rss_mib: 100.0,
        idle_cpu_seconds: 2.0,
        idle_requests_per_second: 1.0,
        rounds: vec![round(1, vec![30.0]), round(100, vec![60.0])],
        peak_rss_mib: 110.0,
        rounds_cpu_seconds: 1.0,
        load_average: ["1".to_owned(), "2".to_owned()],
        fence: None,
        approval: None,
        churn: Some(churn),
        cordon_floor: vec![
            floor_round(1, 1, 12.0),
            floor_round(100, 100, 40.0),
            // The paced arm: the hundred, 16 at a time.
            floor_round(100, 16, 50.0),
        ],
    };
    let tables = scale_tables(&[fleet]);
    assert!(
        tables.contains("| 10000 | 500 | 480 | 67 | 0.205 s | 0.0123 | 120.5 MiB | 1.5 → 1.9 |"),
        "{tables}"
    );
    assert!(
        tables.contains("| 10000 | 1 | 1/1 | 30 ms | 30 ms | 1/1 | 40 ms | 40 ms | 40 ms |"),
        "{tables}"
    );
    // No quiet round of ten faults ran: the quiet side says so, the churn's figures stand.
    assert!(
        tables.contains("| 10000 | 10 | - | - | - | 2/10 | 50 ms | 80 ms | 80 ms |"),
        "{tables}"
    );
    // Every table's header starts its line, after a blank one (Markdown tables).
    for header in [
        "\n\n| nodes | simultaneous faults | controller p50 | p99 | floor p50 | p99 | p99 over the floor's \
         | paced floor (in flight) p99 | p99 over the paced floor's |\n|---:|",
        "\n\n| nodes | writes/s asked | writes/s reached | a real fleet sends | CPU per 1,000 updates | quiet CPU (s/s) |",
        "\n\n| nodes | simultaneous faults | quiet: cordoned | p50 | p99 | under churn: cordoned | p50 | p99 | max |\n",
    ] {
        assert!(tables.contains(header), "{header}\n{tables}");
    }
    assert!(
        !tables.contains("  "),
        "no run of spaces from a broken line continuation: {tables}"
    );
    // The floor beside the quiet round of the same size: 30 ms over 12 ms; no paced arm for one.
    assert!(
        tables.contains("| 10000 | 1 | 30 ms | 30 ms | 12 ms | 12 ms | 2.50x | - | - |"),
        "{tables}"
    );
    // A hundred: beside the floor (60 over 40 ms) and beside the paced floor (60 over 50 ms).
    assert!(
        tables.contains("| 10000 | 100 | 60 ms | 60 ms | 40 ms | 40 ms | 1.50x | 50 ms (16) | 1.20x |"),
        "{tables}"
    );
}

fn floor_round(faults: usize, in_flight: usize, p99_ms: f64) -> super::super::cordon_floor::FloorRound {
    super::super::cordon_floor::FloorRound {
        faults,
        in_flight,
        cordoned: faults,
        p50_ms: p99_ms,
        p99_ms,
        max_ms: p99_ms,
    }
}
