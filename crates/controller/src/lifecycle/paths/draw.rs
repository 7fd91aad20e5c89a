//! What the random paths draw: the policy and the record's start ([`Setup`]), and the events
//! that happen in the world between two passes ([`Event`]), with their weights.

use gpu_remediation_api::{
    Phase,
    ladder::Rung,
    policy::{Action, Mode, OnDrainTimeout, Strategy},
};
use proptest::{
    prelude::{Just, any, prop, prop_oneof},
    strategy::Strategy as _,
};

/// What happens in the world between two passes.
#[derive(Clone, Copy, Debug)]
pub(super) enum Event {
    Pass,
    Time(i64),
    Recovers,
    Breaks,
    NodeDeleted,
    NodeRecreated,
    PodsFinish,
    PersonCordons,
    PersonUncordons,
    PersonApproves,
    RecordDeleted,
    HandEdit(Phase),
    PolicyDeleted,
    /// The pods' disruption budget gains room (a replacement pod became ready elsewhere).
    BudgetFrees,
    /// The node rebooted: a new boot ID.
    Reboots,
    /// The failed GPU leaves the agent's inventory, or answers in it again.
    GpuAnswers(bool),
    /// The node's kubelet stops reporting (`Ready=Unknown`), or reports again (`Ready=True`).
    Unreachable(bool),
}

pub(super) fn event() -> impl proptest::strategy::Strategy<Value = Event> {
    let in_flight = prop_oneof![
        Just(Phase::Pending),
        Just(Phase::Cordoned),
        Just(Phase::Draining),
        Just(Phase::Blocked),
        Just(Phase::Replacing),
        Just(Phase::Verifying),
    ];
    prop_oneof![
        8 => Just(Event::Pass),
        4 => prop_oneof![Just(1_i64), Just(30), Just(400), Just(4_000), Just(200_000)].prop_map(Event::Time),
        2 => Just(Event::Recovers),
        2 => Just(Event::Breaks),
        1 => Just(Event::NodeDeleted),
        1 => Just(Event::NodeRecreated),
        3 => Just(Event::PodsFinish),
        1 => Just(Event::PersonCordons),
        1 => Just(Event::PersonUncordons),
        1 => Just(Event::PersonApproves),
        1 => Just(Event::RecordDeleted),
        1 => in_flight.prop_map(Event::HandEdit),
        1 => Just(Event::PolicyDeleted),
        2 => Just(Event::BudgetFrees),
        2 => Just(Event::Reboots),
        2 => any::<bool>().prop_map(Event::GpuAnswers),
        2 => any::<bool>().prop_map(Event::Unreachable),
    ]
}

/// The policy and the record's start, drawn per path.
#[derive(Clone, Debug)]
#[allow(
    clippy::struct_excessive_bools,
    reason = "each flag is one independent dimension the paths are drawn over"
)]
pub(super) struct Setup {
    pub(super) action: Action,
    pub(super) mode: Mode,
    pub(super) strategy: Strategy,
    pub(super) on_timeout: OnDrainTimeout,
    pub(super) grace: Option<i64>,
    pub(super) allow_zero: bool,
    pub(super) pods: usize,
    pub(super) snapshot: bool,
    pub(super) exhausted: bool,
    /// The policy's ladder (empty: none).
    pub(super) ladder: Vec<Rung>,
    /// The fault named a GPU (the ledger lists it) and the catalog recommends a reset.
    pub(super) known_gpu: bool,
    /// The policy runs diagnostics before the first destroying step.
    pub(super) diagnostics: bool,
}

pub(super) fn setup() -> impl proptest::strategy::Strategy<Value = Setup> {
    (
        prop_oneof![Just(Action::Replace), Just(Action::Reboot), Just(Action::None)],
        prop_oneof![6 => Just(Mode::Enforce), 2 => Just(Mode::Manual), 1 => Just(Mode::DryRun)],
        prop_oneof![
            Just(Strategy::DeleteNode),
            Just(Strategy::Template),
            Just(Strategy::DeleteMachine)
        ],
        prop_oneof![
            Just(OnDrainTimeout::Block),
            Just(OnDrainTimeout::ForceDelete),
            Just(OnDrainTimeout::Proceed)
        ],
        prop_oneof![Just(None), Just(Some(0_i64)), Just(Some(30))],
        any::<bool>(),
        0..4_usize,
        prop::bool::weighted(0.9),
        prop::bool::weighted(0.05),
        prop_oneof![
            3 => Just(Vec::new()),
            3 => Just(vec![Rung::ResetGpu, Rung::Reboot, Rung::Replace, Rung::HandOff]),
            1 => Just(vec![Rung::ResetGpu, Rung::Replace]),
            1 => Just(vec![Rung::Reboot, Rung::HandOff]),
        ],
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(
                action,
                mode,
                strategy,
                on_timeout,
                grace,
                allow_zero,
                pods,
                snapshot,
                exhausted,
                ladder,
                known_gpu,
                diagnostics,
            )| Setup {
                action,
                mode,
                strategy: if action == Action::Reboot {
                    Strategy::Template
                } else {
                    strategy
                },
                on_timeout,
                grace,
                allow_zero,
                pods,
                snapshot,
                exhausted,
                ladder,
                known_gpu,
                diagnostics,
            },
        )
}
