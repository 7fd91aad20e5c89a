//! The model of the cluster the random paths run in: one node, its pods, the record, the
//! replacement, a person, and the clock; how the drawn events ([`super::draw`]) change it;
//! answers by the dice.

use std::collections::{BTreeMap, BTreeSet};

use gpu_remediation_api::{
    GpuRemediation, GpuRemediationSpec,
    constants::{APPROVED_ANNOTATION, GPU_INVENTORY_ANNOTATION, REMEDIATION_FINALIZER},
    hardware::{HardwareLedger, LedgerGpu},
    ladder::{LadderStep, Rung},
    policy::{Action, ConditionStatus, Drain, Release, Replacement, Strategy, Trigger},
    remediation::{PolicySnapshot, TriggerRecord},
};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::{
    api::{
        core::v1::{Node, NodeCondition, NodeSpec, NodeStatus, NodeSystemInfo},
        policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec, PodDisruptionBudgetStatus},
    },
    apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time},
};
use kube::core::Status;

use super::draw::{Event, Setup};
use crate::{
    cordon,
    drain::{Leaving, Plan},
    lifecycle::{EvictionAnswer, Words},
    replace::{Observation, Presence, ReplacementNode, Reported},
};

pub(super) const NAME: &str = "gpu-1-abc123";
pub(super) const NODE: &str = "gpu-1";

/// A pod in the model.
#[derive(Clone, Debug)]
pub(super) struct Pod {
    pub(super) uid: String,
    pub(super) terminating: bool,
    pub(super) gone_by: Option<Timestamp>,
    /// Where it stands with the checkpoint notice (a gang member or opted in: drawn).
    pub(super) notice: crate::drain::Notice,
}

/// The model of the cluster around one remediation.
pub(super) struct World {
    pub(super) now: Timestamp,
    pub(super) record: Option<GpuRemediation>,
    pub(super) rules: PolicySnapshot,
    pub(super) policy_exists: bool,
    pub(super) node: Option<Node>,
    pub(super) admitted_uid: String,
    pub(super) generation: u32,
    pub(super) pods: Vec<Pod>,
    pub(super) person_holds: bool,
    pub(super) replacement: Option<(bool, Reported)>,
    pub(super) dice: u64,
    pub(super) asked_at: BTreeMap<String, Timestamp>,
    /// The room of the one disruption budget covering every pod (`None`: no budget), and its
    /// status's version (each grant writes it).
    pub(super) budget: Option<(i32, u64)>,
    /// A person hand-edited the record's phase (it may skip the drain and what follows it).
    pub(super) hand_edited: bool,
    /// When the first checkpoint notice went out.
    pub(super) notice_since: Option<Timestamp>,
    /// The pods whose notice the server refused (evicted without one).
    pub(super) notice_refused: BTreeSet<String>,
}

pub(super) fn at(second: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + second).expect("a valid time")
}

pub(super) fn condition(broken: bool, since: Timestamp) -> NodeCondition {
    NodeCondition {
        type_: "GpuHealthy".into(),
        status: if broken { "False" } else { "True" }.into(),
        reason: Some(if broken { "XID79" } else { "GpusHealthy" }.into()),
        last_transition_time: Some(Time(since)),
        ..NodeCondition::default()
    }
}

pub(super) fn node(uid: &str, broken: bool, since: Timestamp) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(NODE.into()),
            uid: Some(uid.into()),
            annotations: Some([(GPU_INVENTORY_ANNOTATION.to_owned(), INVENTORY.to_owned())].into()),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec::default()),
        status: Some(NodeStatus {
            conditions: Some(vec![
                condition(broken, since),
                NodeCondition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    ..NodeCondition::default()
                },
            ]),
            node_info: Some(NodeSystemInfo {
                boot_id: format!("boot-{uid}-0"),
                ..NodeSystemInfo::default()
            }),
            ..NodeStatus::default()
        }),
    }
}

/// The agent's inventory of the model's node: the GPU the fault names answers.
const INVENTORY: &str = r#"[{"index":3,"uuid":"GPU-3","pciBusId":"0000:3b:00.0"}]"#;

fn ladder_step(rung: Rung) -> LadderStep {
    LadderStep {
        step: rung,
        timeout: gpu_remediation_api::Duration::from_mins(10),
        template: rung
            .has_template()
            .then(|| serde_json::json!({"apiVersion": "v1", "kind": "Thing"})),
    }
}

pub(super) fn rules(setup: &Setup) -> PolicySnapshot {
    PolicySnapshot {
        generation: Some(1),
        triggers: vec![Trigger {
            condition_type: "GpuHealthy".into(),
            status: ConditionStatus::False,
            reasons: Vec::new(),
            for_: gpu_remediation_api::Duration::from_secs(0),
            action: None,
            quarantine: None,
            start_at: None,
        }],
        drain: Drain {
            timeout: gpu_remediation_api::Duration::from_mins(30),
            on_timeout: setup.on_timeout,
            grace_period_seconds: setup.grace,
            allow_zero_grace_period: setup.allow_zero,
            unreachable_after: gpu_remediation_api::Duration::from_mins(5),
            ..Drain::default()
        },
        replacement: Replacement {
            strategy: setup.strategy,
            template: None,
            timeout: gpu_remediation_api::Duration::from_mins(20),
        },
        release: Release {
            healthy_for: gpu_remediation_api::Duration::from_mins(5),
        },
        ladder: setup.ladder.iter().copied().map(ladder_step).collect(),
        validation: None,
        diagnostics: setup.diagnostics.then(|| gpu_remediation_api::diagnostics::Diagnostics {
            job: serde_json::json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"namespace": "ops"}}),
            timeout: gpu_remediation_api::Duration::from_mins(5),
        }),
    }
}

pub(super) fn record(setup: &Setup, rules: &PolicySnapshot, created: Timestamp) -> GpuRemediation {
    let mut record = GpuRemediation::new(
        NAME,
        GpuRemediationSpec {
            node_name: NODE.into(),
            policy_name: "p".into(),
            trigger: TriggerRecord {
                condition_type: "GpuHealthy".into(),
                status: ConditionStatus::False,
                reason: "XID79".into(),
                message: if setup.known_gpu {
                    "GPU 3: XID 79; recommended action RESET_GPU".into()
                } else {
                    "GPU 3: XID 79; recommended action RESTART_BM".into()
                },
                since: Some(Time(created)),
            },
            action: setup.action,
            mode: setup.mode,
            node_uid: Some("uid-0".into()),
            previous_incident: None,
            policy_snapshot: setup.snapshot.then(|| rules.clone()),
            hardware: setup.known_gpu.then(|| HardwareLedger {
                failed: vec![LedgerGpu {
                    uuid: "GPU-3".into(),
                    serial: Some("S3".into()),
                    index: Some(3),
                    pci_bus_id: Some("0000:3b:00.0".into()),
                    reason: Some("XID79".into()),
                    first_seen: None,
                }],
                ..HardwareLedger::default()
            }),
        },
    );
    record.metadata.creation_timestamp = Some(Time(created));
    record.metadata.finalizers = Some(vec![REMEDIATION_FINALIZER.into()]);
    if setup.exhausted {
        record.metadata.annotations = Some(
            [(
                gpu_remediation_api::constants::ATTEMPTS_EXHAUSTED_ANNOTATION.to_owned(),
                "2 attempts in 24h".to_owned(),
            )]
            .into(),
        );
    }
    record
}

impl World {
    pub(super) fn new(setup: &Setup, dice: u64) -> Self {
        let now = at(0);
        let mut rules = rules(setup);
        // A checkpoint notice drawn by the dice: none, 30 s or 5 min.
        rules.drain.notice =
            gpu_remediation_api::Duration::from_secs([0, 30, 300][usize::try_from(dice % 3).unwrap_or(0)]);
        Self {
            now,
            record: Some(record(setup, &rules, now)),
            rules,
            policy_exists: true,
            node: Some(node("uid-0", true, now)),
            admitted_uid: "uid-0".into(),
            generation: 0,
            pods: (0..setup.pods)
                .map(|i| Pod {
                    uid: format!("pod-{i}"),
                    terminating: false,
                    gone_by: None,
                    notice: crate::drain::Notice {
                        wanted: (dice >> (i + 3)) & 1 == 1,
                        ..crate::drain::Notice::default()
                    },
                })
                .collect(),
            person_holds: false,
            replacement: None,
            dice: dice | 1,
            asked_at: BTreeMap::new(),
            budget: None,
            hand_edited: false,
            notice_since: None,
            notice_refused: BTreeSet::new(),
        }
        .with_budget()
    }

    /// A budget over the pods, drawn by the dice: none, or one allowing 0 to 2 disruptions.
    fn with_budget(mut self) -> Self {
        self.budget = match self.roll(4) {
            0 => None,
            _ => Some((i32::try_from(self.roll(3)).unwrap_or(0), 1)),
        };
        self
    }

    /// The budget as the watch would show it.
    pub(super) fn budgets(&self) -> Vec<PodDisruptionBudget> {
        self.budget
            .iter()
            .map(|&(allowed, version)| PodDisruptionBudget {
                metadata: ObjectMeta {
                    name: Some("web".into()),
                    namespace: Some("work".into()),
                    generation: Some(1),
                    resource_version: Some(version.to_string()),
                    ..ObjectMeta::default()
                },
                spec: Some(PodDisruptionBudgetSpec {
                    selector: Some(LabelSelector {
                        match_labels: Some([("app".to_owned(), "web".to_owned())].into()),
                        ..LabelSelector::default()
                    }),
                    ..PodDisruptionBudgetSpec::default()
                }),
                status: Some(PodDisruptionBudgetStatus {
                    disruptions_allowed: allowed,
                    observed_generation: Some(1),
                    ..PodDisruptionBudgetStatus::default()
                }),
            })
            .collect()
    }

    /// The server's grant of an eviction under the budget: one disruption spent.
    pub(super) fn spend_budget(&mut self) {
        if let Some((allowed, version)) = self.budget.as_mut() {
            *allowed -= 1;
            *version += 1;
        }
    }

    /// A pseudo-random number in `0..n` (xorshift), from the path's dice.
    pub(super) fn roll(&mut self, n: u64) -> u64 {
        self.dice ^= self.dice << 13;
        self.dice ^= self.dice >> 7;
        self.dice ^= self.dice << 17;
        self.dice % n
    }

    pub(super) fn ours(&self) -> Option<&Node> {
        self.node
            .as_ref()
            .filter(|n| n.metadata.uid.as_deref() == Some(self.admitted_uid.as_str()))
    }

    pub(super) fn happen(&mut self, event: Event) {
        match event {
            Event::Pass => {}
            Event::Time(seconds) => self.now += SignedDuration::from_secs(seconds),
            Event::Recovers | Event::Breaks => {
                let broken = matches!(event, Event::Breaks);
                let now = self.now;
                if let Some(conditions) = self
                    .node
                    .as_mut()
                    .and_then(|n| n.status.as_mut())
                    .and_then(|s| s.conditions.as_mut())
                {
                    conditions[0] = condition(broken, now);
                }
            }
            Event::NodeDeleted => {
                self.node = None;
                self.person_holds = false;
                self.pods.clear();
            }
            Event::NodeRecreated => {
                self.generation += 1;
                self.node = Some(node(
                    &format!("uid-new-{}", self.generation),
                    self.roll(2) == 0,
                    self.now,
                ));
                self.person_holds = false;
                self.pods.clear();
            }
            Event::PodsFinish => self.pods.retain(|p| !p.terminating),
            Event::PersonCordons => {
                // `kubectl cordon`: the server names its manager as the field's whenever the value
                // changes, so a cordon laid over our still-present note is told from ours on the
                // release's fresh read (`cordon::cordon_laid_by_another`).
                if let Some(node) = self.node.as_mut()
                    && let Some(spec) = node.spec.as_mut()
                    && spec.unschedulable != Some(true)
                {
                    spec.unschedulable = Some(true);
                    manages_cordon(node, "kubectl-cordon");
                    self.person_holds = true;
                }
            }
            Event::PersonUncordons => {
                if let Some(node) = self.node.as_mut()
                    && let Some(spec) = node.spec.as_mut()
                {
                    spec.unschedulable = None;
                    node.metadata.managed_fields = None;
                    self.person_holds = false;
                }
            }
            Event::PersonApproves => {
                if let Some(record) = self.record.as_mut() {
                    record
                        .metadata
                        .annotations
                        .get_or_insert_with(BTreeMap::new)
                        .insert(APPROVED_ANNOTATION.into(), "true".into());
                }
            }
            Event::RecordDeleted => {
                if let Some(record) = self.record.as_mut() {
                    record.metadata.deletion_timestamp.get_or_insert(Time(self.now));
                }
            }
            Event::HandEdit(phase) => {
                if let Some(record) = self.record.as_mut()
                    && let Some(status) = record.status.as_mut()
                    && !status.phase.is_terminal()
                {
                    status.phase = phase;
                    self.hand_edited = true;
                }
            }
            Event::PolicyDeleted => self.policy_exists = false,
            Event::Reboots => {
                self.generation += 1;
                let boot = format!("boot-{}", self.generation);
                if let Some(info) = self
                    .node
                    .as_mut()
                    .and_then(|n| n.status.as_mut())
                    .and_then(|s| s.node_info.as_mut())
                {
                    info.boot_id = boot;
                }
            }
            Event::GpuAnswers(answers) => {
                if let Some(n) = self.node.as_mut() {
                    let text = if answers { INVENTORY } else { "[]" };
                    n.metadata
                        .annotations
                        .get_or_insert_with(BTreeMap::new)
                        .insert(GPU_INVENTORY_ANNOTATION.to_owned(), text.to_owned());
                }
            }
            Event::Unreachable(unreachable) => {
                if let Some(ready) = self
                    .node
                    .as_mut()
                    .and_then(|n| n.status.as_mut())
                    .and_then(|s| s.conditions.as_mut())
                    .and_then(|c| c.iter_mut().find(|c| c.type_ == "Ready"))
                {
                    ready.status = if unreachable { "Unknown" } else { "True" }.into();
                }
            }
            Event::BudgetFrees => {
                if let Some((allowed, version)) = self.budget.as_mut() {
                    *allowed += 1;
                    *version += 1;
                }
            }
        }
    }

    pub(super) fn plan(&self) -> Plan {
        Plan {
            leaving: self
                .pods
                .iter()
                .map(|p| Leaving {
                    namespace: "work".into(),
                    name: p.uid.clone(),
                    uid: p.uid.clone(),
                    terminating: p.terminating,
                    gone_by: p.gone_by,
                    labels: [("app".to_owned(), "web".to_owned())].into(),
                    readiness: crate::drain::Readiness::Ready,
                    notice: p.notice,
                    gpus: 0,
                })
                .collect(),
            staying: Vec::new(),
        }
    }

    /// The diagnostics Job as the acting layer reads it: sometimes unread, else running (always,
    /// when nobody helps: it hangs), completed or failed, by the dice.
    pub(super) fn diagnostics_job(&mut self, mood: Mood) -> Result<Observation, Words> {
        if mood == Mood::Random && self.roll(8) == 0 {
            return Err(words("looking at the diagnostics Job", 503));
        }
        let reported = match mood {
            Mood::Stubborn => Reported::InProgress,
            Mood::Calm => Reported::Done("condition Complete=True".into()),
            Mood::Random => match self.roll(4) {
                0 => Reported::Done("condition Complete=True".into()),
                1 => Reported::Failed("condition Failed=True".into()),
                _ => Reported::InProgress,
            },
        };
        Ok(Observation {
            target: Presence::Present,
            node: Presence::Present,
            reported,
            replacement: ReplacementNode::NotExpected,
        })
    }

    pub(super) fn observation(&mut self, record: &GpuRemediation, mood: Mood) -> Result<Observation, Words> {
        if mood == Mood::Stubborn || (mood == Mood::Random && self.roll(8) == 0) {
            return Err(words("looking at the replacement", 503));
        }
        let node = match self.ours() {
            Some(_) => Presence::Present,
            None => Presence::Gone,
        };
        let (exists, reported) = self.replacement.clone().unwrap_or((false, Reported::Nothing));
        let status = record.status.clone().unwrap_or_default();
        let step_object = crate::lifecycle::ladder::looked_at(&status, &self.rules)
            .is_some_and(|(strategy, _)| strategy == Strategy::Template);
        let reported = if record.spec.action == Action::Reboot
            || self.rules.replacement.strategy == Strategy::Template
            || step_object
        {
            match if mood == Mood::Calm { 0 } else { self.roll(6) } {
                0 => Reported::Done("Succeeded".into()),
                1 => Reported::Failed("Failed".into()),
                _ => reported,
            }
        } else {
            Reported::Nothing
        };
        Ok(Observation {
            target: if exists { Presence::Present } else { Presence::Gone },
            node,
            reported,
            // A deleted Node's replacement is awaited (none joins in this world).
            replacement: if self.rules.replacement.strategy == Strategy::DeleteNode {
                ReplacementNode::Awaited
            } else {
                ReplacementNode::NotExpected
            },
        })
    }
}

/// Records `manager` as the one holding the node's `spec.unschedulable`, as the server does for the
/// writer that changed it.
pub(super) fn manages_cordon(node: &mut Node, manager: &str) {
    node.metadata.managed_fields = Some(vec![cordon::managing_the_cordon(manager)]);
}

pub(super) fn words(action: &str, code: u16) -> Words {
    Words::answered(action.into(), code, format!("the server refused ({code})"))
}

pub(super) fn refusal(code: u16) -> EvictionAnswer {
    EvictionAnswer::Refused(Box::new(Status {
        code,
        message: format!("refused with {code}"),
        ..Status::default()
    }))
}

/// How the world answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Mood {
    /// Some of everything, by the dice.
    Random,
    /// Every request granted, every replacement done.
    Calm,
    /// Every request refused, no replacement ever done.
    Stubborn,
}
