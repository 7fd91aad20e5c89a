//! Unit tests of `budget`.

use gpu_remediation_api::{
    safety::{Attempts, Rate},
    selector::IntOrPercent,
};

use super::*;
use crate::test_fixtures::at;

fn safety(max_concurrent: u32, max_unhealthy: &str, rate: (u32, u64)) -> Safety {
    Safety {
        max_concurrent: IntOrPercent::Int(max_concurrent),
        max_unhealthy: IntOrPercent::Percent(max_unhealthy.into()),
        max_unhealthy_count: None,
        failure_domains: Vec::new(),
        slow_start: false,
        suspect: None,
        settle: None,
        rate: Rate {
            limit: rate.0,
            per: Duration::from_secs(rate.1),
        },
        max_attempts_per_node: Attempts {
            count: 2,
            per: Duration::from_hours(24),
        },
        repeat_offender: None,
    }
}

fn candidate(node: &str, since: i64) -> Candidate {
    Candidate {
        node: node.into(),
        since: at(since),
        approved_past_attempts: false,
    }
}

fn started(node: &str, secs: i64, in_flight: bool) -> Started {
    Started {
        node: node.into(),
        at: at(secs),
        in_flight,
    }
}

fn inputs<'a>(safety: &'a Safety, started: &'a [Started], candidates: Vec<Candidate>) -> Inputs<'a> {
    Inputs {
        safety,
        paused: false,
        selected: 10,
        unhealthy: u32::try_from(candidates.len()).unwrap(),
        started,
        candidates,
        domains: Domains::default(),
        slow_start: None,
        suspect_hold: None,
        settling: BTreeMap::new(),
        recovering: None,
        now: at(1000),
    }
}

#[test]
fn a_breaker_closed_only_by_unsettled_recoveries_holds_until_they_settle() {
    // Two of ten may be unhealthy: one is, two more recovered a moment ago.
    let safety = safety(5, "20%", (10, 3600));
    let mut held = inputs(&safety, &[], vec![candidate("third", 100)]);
    held.recovering = Some((2, at(1002)));
    let decision = admit(held.clone());
    assert!(decision.admitted.is_empty());
    assert_eq!(
        decision.waiting[0].deferral,
        Deferral::RecoveriesSettling {
            recovering: 2,
            until: at(1002)
        }
    );
    assert_eq!(decision.remaining, 0);
    // Settled: admitted.
    held.now = at(1002);
    assert_eq!(admit(held.clone()).admitted, vec![candidate("third", 100)]);
    // A recovery that would not reopen the breaker holds nothing.
    held.now = at(1000);
    held.recovering = Some((1, at(1002)));
    assert_eq!(admit(held).admitted, vec![candidate("third", 100)]);
}

#[test]
fn the_longest_unhealthy_node_is_admitted_first() {
    let safety = safety(1, "50%", (4, 3600));
    let decision = admit(inputs(
        &safety,
        &[],
        vec![candidate("young", 900), candidate("old", 100)],
    ));
    assert_eq!(decision.admitted, vec![candidate("old", 100)]);
    assert_eq!(decision.waiting[0].candidate.node, "young");
    assert_eq!(
        decision.waiting[0].deferral,
        Deferral::Concurrency {
            in_flight: 0,
            limit: 1
        }
    );
}

#[test]
fn nothing_new_starts_while_max_concurrent_remediations_are_in_flight() {
    let safety = safety(1, "50%", (4, 3600));
    let running = [started("a", 500, true)];
    let decision = admit(inputs(&safety, &running, vec![candidate("b", 100)]));
    assert!(decision.admitted.is_empty());
    assert_eq!(decision.remaining, 0);
    assert_eq!(
        decision.waiting[0].deferral,
        Deferral::Concurrency {
            in_flight: 1,
            limit: 1
        }
    );
}

#[test]
fn an_unhealthy_share_above_max_unhealthy_opens_the_circuit_for_every_node() {
    let safety = safety(5, "30%", (10, 3600));
    let mut inputs = inputs(&safety, &[], vec![candidate("a", 1), candidate("b", 2)]);
    inputs.unhealthy = 4;
    let decision = admit(inputs);
    assert!(decision.circuit_open);
    assert!(decision.admitted.is_empty());
    assert_eq!(decision.remaining, 0);
    assert!(decision.waiting.iter().all(|w| matches!(
        &w.deferral,
        Deferral::CircuitOpen { unhealthy: 4, selected: 10, limit } if limit == "maxUnhealthy 30%"
    )));
}

#[test]
fn an_unhealthy_share_exactly_at_max_unhealthy_keeps_the_circuit_closed() {
    let safety = safety(5, "30%", (10, 3600));
    let mut inputs = inputs(&safety, &[], vec![candidate("a", 1)]);
    inputs.unhealthy = 3;
    assert!(!admit(inputs).circuit_open);
}

#[test]
fn a_full_rate_window_defers_with_the_time_the_next_slot_frees() {
    let safety = safety(5, "100%", (2, 3600));
    let history = [started("a", 100, false), started("b", 400, false)];
    let decision = admit(inputs(&safety, &history, vec![candidate("c", 0)]));
    assert!(decision.admitted.is_empty());
    assert_eq!(decision.started_in_window, 2);
    assert_eq!(decision.next_slot_at, Some(at(3700)));
    assert!(matches!(
        decision.waiting[0].deferral,
        Deferral::Rate { started: 2, limit: 2, next_slot_at: Some(t), .. } if t == at(3700)
    ));
}

#[test]
fn remediations_older_than_the_rate_window_no_longer_count() {
    let safety = safety(5, "100%", (1, 600));
    let decide = |start: i64| {
        admit(inputs(
            &safety,
            &[started("a", start, false)],
            vec![candidate("c", 0)],
        ))
    };
    let inside = decide(401);
    assert_eq!(inside.started_in_window, 1);
    assert!(inside.admitted.is_empty());
    let aged_out = decide(400);
    assert_eq!(
        aged_out.started_in_window, 0,
        "a start exactly one window ago has aged out"
    );
    assert_eq!(aged_out.admitted.len(), 1);
}

#[test]
fn one_concurrent_slot_and_two_per_hour_admit_one_node_at_a_time() {
    let safety = safety(1, "100%", (2, 3600));
    let candidates = vec![candidate("a", 1), candidate("b", 2), candidate("c", 3)];
    let decision = admit(inputs(&safety, &[], candidates));
    assert_eq!(decision.admitted, vec![candidate("a", 1)]);

    let history = [started("a", 900, false)];
    let decision = admit(inputs(
        &safety,
        &history,
        vec![candidate("b", 2), candidate("c", 3)],
    ));
    assert_eq!(decision.admitted, vec![candidate("b", 2)]);

    let history = [started("a", 900, false), started("b", 950, false)];
    let decision = admit(inputs(&safety, &history, vec![candidate("c", 3)]));
    assert!(decision.admitted.is_empty());
    assert_eq!(decision.next_slot_at, Some(at(4500)));
}

#[test]
fn a_paused_policy_starts_nothing() {
    let safety = safety(5, "100%", (5, 3600));
    let mut inputs = inputs(&safety, &[], vec![candidate("a", 1)]);
    inputs.paused = true;
    let decision = admit(inputs);
    assert!(decision.admitted.is_empty());
    assert_eq!(decision.waiting[0].deferral, Deferral::Paused);
}

#[test]
fn a_node_that_used_up_its_attempts_waits_for_a_person_and_frees_its_slot() {
    let safety = safety(1, "100%", (10, 3600));
    let history = [started("a", 10, false), started("a", 20, false)];
    let decision = admit(inputs(
        &safety,
        &history,
        vec![candidate("a", 1), candidate("b", 2)],
    ));
    assert_eq!(decision.admitted, vec![candidate("b", 2)]);
    assert!(matches!(
        decision.waiting[0].deferral,
        Deferral::AttemptsExhausted {
            attempts: 2,
            limit: 2,
            ..
        }
    ));
}

#[test]
fn a_person_approving_past_the_attempts_limit_still_waits_for_a_slot() {
    let safety = safety(1, "100%", (10, 3600));
    let history = [
        started("a", 10, false),
        started("a", 20, false),
        started("b", 30, true),
    ];
    let approved = Candidate {
        approved_past_attempts: true,
        ..candidate("a", 1)
    };
    let decision = admit(inputs(&safety, &history, vec![approved.clone()]));
    assert!(decision.admitted.is_empty());
    assert!(
        matches!(decision.waiting[0].deferral, Deferral::Concurrency { .. }),
        "{:?}",
        decision.waiting
    );
    let decision = admit(inputs(&safety, &history[..2], vec![approved.clone()]));
    assert_eq!(decision.admitted, vec![approved]);
}

#[test]
fn a_percentage_of_max_concurrent_rounds_up() {
    let mut safety = safety(1, "100%", (10, 3600));
    safety.max_concurrent = IntOrPercent::Percent("10%".into());
    let mut inputs = inputs(&safety, &[], vec![candidate("a", 1), candidate("b", 2)]);
    inputs.selected = 15;
    assert_eq!(admit(inputs).admitted.len(), 2);
}

#[test]
fn max_unhealthy_given_as_a_count_and_a_share_opens_at_the_lower() {
    // 30% of 20 is 6; the count 3 is lower and opens the circuit at 4.
    let mut safety = safety(5, "30%", (10, 3600));
    safety.max_unhealthy_count = Some(3);
    let decide = |unhealthy: u32, selected: u32| {
        let mut inputs = inputs(&safety, &[], vec![candidate("a", 1)]);
        inputs.unhealthy = unhealthy;
        inputs.selected = selected;
        admit(inputs)
    };
    assert!(!decide(3, 20).circuit_open);
    let open = decide(4, 20);
    assert!(open.circuit_open);
    assert!(matches!(
        &open.waiting[0].deferral,
        Deferral::CircuitOpen { limit, .. } if limit == "maxUnhealthy 30% and maxUnhealthyCount 3 (the lower wins)"
    ));
    // 30% of 5 is 1.5: the share is lower than the count and opens the circuit at 2.
    assert!(!decide(1, 5).circuit_open);
    assert!(decide(2, 5).circuit_open);
}

fn rack_domain(max_unhealthy_count: Option<u32>) -> gpu_remediation_api::correlated::FailureDomain {
    gpu_remediation_api::correlated::FailureDomain {
        topology_key: "rack".into(),
        max_unhealthy_share: None,
        max_unhealthy_count,
        max_in_flight: Some(1),
    }
}

/// Racks `a` and `b` of three nodes each (`a0`..`b2`).
fn racks_of_three(
    specs: &[gpu_remediation_api::correlated::FailureDomain],
    unhealthy: &[&str],
    in_flight: &[&str],
) -> Domains {
    let nodes: Vec<(String, std::collections::BTreeMap<String, String>)> =
        ["a0", "a1", "a2", "b0", "b1", "b2"]
            .map(|n| (n.to_owned(), [("rack".to_owned(), n[..1].to_owned())].into()))
            .to_vec();
    Domains::count(
        specs,
        nodes.iter().map(|(node, labels)| domains::Member {
            node,
            labels,
            unhealthy: unhealthy.contains(&node.as_str()),
            in_flight: in_flight.contains(&node.as_str()),
        }),
    )
}

#[test]
fn a_held_rack_waits_without_taking_a_slot_and_another_rack_s_node_is_admitted() {
    let safety = safety(1, "100%", (10, 3600));
    let mut inputs = inputs(
        &safety,
        &[],
        vec![candidate("b0", 1), candidate("b1", 2), candidate("a2", 3)],
    );
    inputs.domains = racks_of_three(&[rack_domain(Some(1))], &["b0", "b1", "a2"], &[]);
    let decision = admit(inputs);
    assert_eq!(decision.admitted, vec![candidate("a2", 3)]);
    assert_eq!(decision.held_domains.len(), 1);
    assert_eq!(decision.held_domains[0].name(), "rack=b");
    assert!(
        decision
            .waiting
            .iter()
            .all(|w| w.deferral.reason() == "DomainHeld"
                && w.deferral.message().contains("rack=b: 2 of 3 nodes unhealthy"))
    );
}

#[test]
fn a_rack_at_max_in_flight_admits_one_per_pass_and_others_use_the_free_slots() {
    let safety = safety(5, "100%", (10, 3600));
    let mut inputs = inputs(
        &safety,
        &[],
        vec![candidate("a0", 1), candidate("a1", 2), candidate("b0", 3)],
    );
    inputs.domains = racks_of_three(&[rack_domain(None)], &["a0", "a1", "b0"], &[]);
    let decision = admit(inputs);
    assert_eq!(decision.admitted, vec![candidate("a0", 1), candidate("b0", 3)]);
    assert_eq!(
        decision.waiting[0].deferral,
        Deferral::DomainInFlight {
            domain: "rack=a".into(),
            in_flight: 1,
            limit: 1,
            slow_start: false,
        }
    );
    assert!(decision.held_domains.is_empty());
}

#[test]
fn slow_start_admits_up_to_its_allowance_and_says_so() {
    let safety = safety(4, "100%", (10, 3600));
    let candidates = || vec![candidate("a", 1), candidate("b", 2), candidate("c", 3)];
    let mut first = inputs(&safety, &[], candidates());
    first.slow_start = Some(1);
    let decision = admit(first);
    assert_eq!(decision.admitted, vec![candidate("a", 1)]);
    assert_eq!(
        decision.waiting[0].deferral,
        Deferral::SlowStart {
            in_flight: 0,
            allowed: 1,
            max_concurrent: 4
        }
    );
    assert_eq!(decision.waiting[0].deferral.reason(), "DeferredBySlowStart");
    let running = [started("a", 900, true)];
    let mut doubled = inputs(&safety, &running, candidates()[1..].to_vec());
    doubled.slow_start = Some(2);
    assert_eq!(admit(doubled).admitted, vec![candidate("b", 2)]);
}

#[test]
fn an_allowance_above_max_concurrent_is_held_to_max_concurrent() {
    let safety = safety(1, "100%", (10, 3600));
    let mut inputs = inputs(&safety, &[], vec![candidate("a", 1), candidate("b", 2)]);
    inputs.slow_start = Some(8);
    let decision = admit(inputs);
    assert_eq!(decision.admitted.len(), 1);
    assert!(matches!(
        decision.waiting[0].deferral,
        Deferral::Concurrency { .. }
    ));
}

#[test]
fn a_node_carrying_the_held_suspect_waits_and_one_without_it_starts() {
    let safety = safety(5, "100%", (10, 3600));
    let suspect = SuspectStatus {
        attribute: "nvidia.com/cuda.driver.major".into(),
        value: "570".into(),
        failures: 5,
        of: 6,
        holding: true,
        message: "5 of 6 failures in the last 1h are on nvidia.com/cuda.driver.major=570".into(),
    };
    let mut inputs = inputs(&safety, &[], vec![candidate("on-570", 1), candidate("on-550", 2)]);
    inputs.suspect_hold = Some((suspect, ["on-570".to_owned()].into()));
    let decision = admit(inputs);
    assert_eq!(decision.admitted, vec![candidate("on-550", 2)]);
    assert_eq!(decision.waiting[0].deferral.reason(), "SuspectHeld");
    assert!(
        decision.waiting[0]
            .deferral
            .message()
            .starts_with("5 of 6 failures in the last 1h are on nvidia.com/cuda.driver.major=570")
    );
}

#[test]
fn a_node_still_settling_waits_without_a_slot_and_one_settled_starts() {
    let safety = safety(5, "100%", (10, 3600));
    let mut inputs = inputs(
        &safety,
        &[],
        vec![candidate("fresh", 990), candidate("settled", 900)],
    );
    inputs.settling = [("fresh".to_owned(), at(1002)), ("settled".to_owned(), at(1000))].into();
    let decision = admit(inputs);
    assert_eq!(decision.admitted, vec![candidate("settled", 900)]);
    assert_eq!(
        decision.waiting[0].deferral,
        Deferral::Settling { until: at(1002) }
    );
    assert_eq!(decision.remaining, 5, "settling takes no slot");
}
