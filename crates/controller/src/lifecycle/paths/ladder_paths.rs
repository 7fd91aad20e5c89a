//! Named paths up the escalation ladder through the same model: each rung proven by its evidence,
//! escalations when the evidence does not come, and the hand-off at the top.

use gpu_remediation_api::{
    Phase,
    ladder::{HAND_OFF_LABEL, Rung, StepOutcome},
    policy::{Action, Mode, OnDrainTimeout, Strategy},
};
use jiff::SignedDuration;

use super::{
    Mood,
    draw::{Event, Setup},
    pass,
    world::{NAME, World},
};
use crate::cordon;

fn setup(ladder: &[Rung], known_gpu: bool) -> Setup {
    Setup {
        action: Action::Replace,
        mode: Mode::Enforce,
        strategy: Strategy::DeleteNode,
        on_timeout: OnDrainTimeout::Block,
        grace: None,
        allow_zero: false,
        pods: 0,
        snapshot: true,
        exhausted: false,
        ladder: ladder.to_vec(),
        known_gpu,
        diagnostics: false,
    }
}

/// Runs `passes` calm passes `seconds` apart.
fn run(world: &mut World, passes: usize, seconds: i64) {
    for _ in 0..passes {
        world.now += SignedDuration::from_secs(seconds);
        pass(world, Mood::Calm).expect("no invariant breaks");
    }
}

fn status(world: &World) -> gpu_remediation_api::GpuRemediationStatus {
    world
        .record
        .as_ref()
        .and_then(|r| r.status.clone())
        .expect("a status")
}

fn outcomes(world: &World) -> Vec<(Rung, Option<StepOutcome>)> {
    status(world).steps.iter().map(|s| (s.step, s.outcome)).collect()
}

const FULL: [Rung; 4] = [Rung::ResetGpu, Rung::Reboot, Rung::Replace, Rung::HandOff];

#[test]
fn a_reset_that_works_succeeds_after_the_dwell_and_releases_the_node() {
    let mut world = World::new(&setup(&FULL, true), 7);
    // Cordon, drain (no pods), hand over to ResetGpu, create its object.
    run(&mut world, 4, 10);
    assert_eq!(status(&world).phase, Phase::Verifying);
    assert_eq!(status(&world).current_step, Some(Rung::ResetGpu));
    world.happen(Event::Recovers);
    run(&mut world, 1, 10);
    assert_eq!(
        status(&world).phase,
        Phase::Verifying,
        "healthy, but not yet for the dwell"
    );
    run(&mut world, 1, 5 * 60);
    let done = status(&world);
    assert_eq!(done.phase, Phase::Succeeded, "{:?}", done.message);
    assert_eq!(outcomes(&world), [(Rung::ResetGpu, Some(StepOutcome::Succeeded))]);
    assert_eq!(done.steps[0].evidence.gpus_answering, ["GPU-3"]);
    let node = world.node.as_ref().expect("the node stands");
    assert!(!cordon::is_unschedulable(node) && !cordon::has_taint(node));
}

#[test]
fn a_reset_whose_gpu_does_not_answer_is_no_success_however_healthy_the_node() {
    let mut world = World::new(&setup(&FULL, true), 7);
    run(&mut world, 4, 10);
    world.happen(Event::GpuAnswers(false));
    world.happen(Event::Recovers);
    run(&mut world, 3, 5 * 60);
    assert_eq!(
        outcomes(&world)[0],
        (Rung::ResetGpu, Some(StepOutcome::TimedOut)),
        "{:?}",
        status(&world).message
    );
    assert_eq!(status(&world).current_step, Some(Rung::Reboot));
}

#[test]
fn a_fault_back_within_the_dwell_escalates_to_a_reboot_proven_by_a_new_boot_id() {
    let mut world = World::new(&setup(&FULL, true), 7);
    run(&mut world, 4, 10);
    world.happen(Event::Recovers);
    run(&mut world, 1, 10);
    world.happen(Event::Breaks);
    run(&mut world, 1, 10);
    assert_eq!(
        outcomes(&world),
        [
            (Rung::ResetGpu, Some(StepOutcome::Permanent)),
            (Rung::Reboot, None)
        ]
    );
    // The reboot's object is created; it reports done, but no reboot is proven until the boot ID
    // changes.
    run(&mut world, 1, 10);
    world.happen(Event::Recovers);
    run(&mut world, 2, 3 * 60);
    assert_eq!(
        status(&world).phase,
        Phase::Verifying,
        "{:?}",
        status(&world).message
    );
    assert!(
        status(&world)
            .message
            .unwrap_or_default()
            .contains("boot ID did not change"),
        "{:?}",
        status(&world).message
    );
    world.happen(Event::Reboots);
    run(&mut world, 1, 10);
    run(&mut world, 1, 5 * 60);
    let done = status(&world);
    assert_eq!(done.phase, Phase::Succeeded, "{:?}", done.message);
    let reboot = &done.steps[1];
    assert_eq!(reboot.outcome, Some(StepOutcome::Succeeded));
    assert_ne!(reboot.evidence.boot_id_before, reboot.evidence.boot_id_after);
}

#[test]
fn a_reboot_object_done_without_a_new_boot_id_times_out_and_escalates_to_replace() {
    let mut world = World::new(&setup(&[Rung::Reboot, Rung::Replace], false), 7);
    run(&mut world, 4, 10);
    assert_eq!(status(&world).current_step, Some(Rung::Reboot));
    world.happen(Event::Recovers);
    run(&mut world, 3, 5 * 60);
    assert_eq!(
        outcomes(&world)[0],
        (Rung::Reboot, Some(StepOutcome::TimedOut)),
        "{:?}",
        status(&world).message
    );
    assert_eq!(status(&world).current_step, Some(Rung::Replace));
}

#[test]
fn out_of_rungs_the_node_is_handed_off_cordoned_labelled_and_its_gpus_named() {
    let mut world = World::new(&setup(&[Rung::Reboot, Rung::HandOff], true), 7);
    run(&mut world, 4, 10);
    // The reboot never proves itself.
    run(&mut world, 4, 10 * 60);
    let ended = status(&world);
    assert_eq!(ended.phase, Phase::ManualRequired, "{:?}", ended.message);
    let message = ended.message.clone().unwrap_or_default();
    assert!(
        message.contains("GPU 3 (UUID GPU-3, serial S3, PCI 0000:3b:00.0)"),
        "{message}"
    );
    let node = world.node.as_ref().expect("the node stands");
    assert!(cordon::is_unschedulable(node) && cordon::has_taint(node));
    assert_eq!(
        node.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(HAND_OFF_LABEL))
            .map(String::as_str),
        Some("true")
    );
    // A person deletes the record: everything is given back.
    world.happen(Event::RecordDeleted);
    run(&mut world, 1, 10);
    let node = world.node.as_ref().expect("the node stands");
    assert!(!cordon::is_unschedulable(node) && !cordon::has_taint(node));
    assert!(
        node.metadata
            .labels
            .as_ref()
            .is_none_or(|l| !l.contains_key(HAND_OFF_LABEL))
    );
}

#[test]
fn after_a_gpu_scoped_reset_fails_the_reboot_drains_the_whole_node_first() {
    let mut setup = setup(&FULL, true);
    setup.pods = 2;
    let mut world = World::new(&setup, 7);
    world.budget = None;
    // Cordon, drain (the model's pods leave), hand over to ResetGpu, create its object.
    for _ in 0..8 {
        world.now += SignedDuration::from_secs(40);
        world.happen(Event::PodsFinish);
        pass(&mut world, Mood::Calm).expect("no invariant breaks");
        if status(&world).phase == Phase::Verifying {
            break;
        }
    }
    let scoped = status(&world).drain.and_then(|d| d.scope).unwrap_or_default();
    assert!(scoped.starts_with("GPU-scoped drain"), "{scoped}");
    assert_eq!(status(&world).current_step, Some(Rung::ResetGpu));
    // The reset's object reports done but the node stays broken past the step's timeout.
    run(&mut world, 1, 11 * 60);
    let escalated = status(&world);
    assert_eq!(escalated.phase, Phase::Draining, "{:?}", escalated.message);
    assert_eq!(escalated.current_step, Some(Rung::Reboot));
    assert!(
        escalated.steps.last().is_some_and(|s| s.end.is_none()),
        "the reboot waits for its drain"
    );
    // The whole-node drain ends (no pods left), and the reboot starts then.
    run(&mut world, 2, 10);
    let rebooting = status(&world);
    assert!(
        matches!(rebooting.phase, Phase::Replacing | Phase::Verifying),
        "{:?}",
        rebooting.message
    );
    assert_eq!(
        rebooting.steps.iter().map(|s| s.step).collect::<Vec<_>>(),
        [Rung::ResetGpu, Rung::Reboot],
        "the reboot's step is the one opened at the escalation"
    );
}

/// Found by the property test (2026-12-06): a record hand-set back to `Pending` after its cordon,
/// its policy gone; a person lifts the cordon and lays their own, and no pass drops our
/// `cordoned-by` meanwhile (a pending record does not look at the cordon); then the record is
/// deleted and its release must not lift the person's cordon. The note alone cannot tell the two
/// cordons apart; the field's manager on the release's fresh read does
/// (`cordon::cordon_laid_by_another`). Where a pass saw our cordon lifted, our note goes first; the
/// person's cordon is theirs and stays either way.
#[test]
fn a_cordon_a_person_laid_over_our_note_stays_theirs_seen_by_a_pass_or_not() {
    let setup = setup(&[Rung::Reboot, Rung::HandOff], false);
    let found = [
        Event::HandEdit(Phase::Pending),
        Event::HandEdit(Phase::Cordoned),
        Event::PolicyDeleted,
        Event::PolicyDeleted,
        Event::Pass,
        Event::HandEdit(Phase::Pending),
        Event::PersonUncordons,
        Event::PersonCordons,
        Event::RecordDeleted,
    ];
    super::walk(&setup, &found, 9_998_063_281_899_042_836).expect("no invariant breaks");
    // Cordoned by the record, set back to `Pending` by hand, lifted and laid again by a person,
    // the record deleted: no pass saw the cordon lifted.
    let unseen = [
        Event::Pass,
        Event::Pass,
        Event::HandEdit(Phase::Pending),
        Event::PolicyDeleted,
        Event::PersonUncordons,
        Event::PersonCordons,
        Event::RecordDeleted,
        Event::Pass,
    ];
    // Cordoned by the record, lifted by a person, seen by a pass (our note goes), cordoned by the
    // person.
    let seen = [
        Event::Pass,
        Event::Pass,
        Event::PersonUncordons,
        Event::Pass,
        Event::PersonCordons,
        Event::RecordDeleted,
        Event::Pass,
    ];
    for events in [&unseen[..], &seen[..]] {
        let mut world = World::new(&setup, 7);
        for event in events {
            world.happen(*event);
            pass(&mut world, Mood::Calm).expect("no invariant breaks");
        }
        assert!(world.person_holds, "the person's cordon counts as theirs");
        let node = world.node.as_ref().expect("the node stands");
        assert!(
            cordon::is_unschedulable(node),
            "{events:?}: the person's cordon stays"
        );
        assert_eq!(cordon::holds(node, NAME), cordon::Holds::default(), "{events:?}");
    }
}
