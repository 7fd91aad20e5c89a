//! The drain planner: which of a node's pending evictions to send in this round, spending each
//! disruption budget's room exactly, so that a 429 happens only in a genuine race (someone else's
//! eviction, or a budget status written after the one we planned with).
//!
//! A budget's room is its status's `disruptionsAllowed`, less the evictions this controller asked
//! under it that its status does not count yet ([`Flight`], [`in_flight`]: any drain, any
//! remediation), less those planned earlier in this round. A pod whose one budget has no room is
//! held, with that budget named, and sent when a change of the budget shows room again. The
//! Eviction API's own rules are followed: a `Pending` pod, and an unready pod whose budget lets
//! unhealthy pods go, leave without spending the budget; a pod under no budget, or under several
//! (which the server refuses with 500), is sent and, if refused, asked again after the backoff.
//! Pure.

use std::collections::{BTreeMap, BTreeSet};

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;

use crate::drain::{self, Leaving, Readiness};

/// How long an eviction granted counts against its budget at most, if the watch never shows the
/// budget listing it (a relist can skip versions): the disruption controller's own horizon for
/// `disruptedPods`.
pub const FLIGHT_HORIZON: SignedDuration = SignedDuration::from_secs(120);

/// When the budget watch last saw budget `namespace/name` list `pod` among its `disruptedPods`.
pub type Listed<'a> = &'a (dyn Fn(&str, &str) -> Option<Timestamp> + Sync);

/// An eviction this controller asked (or is asking) under some budgets, and when it was planned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Flight {
    /// The pod's name (budgets list the pods they count by name).
    pub pod: String,
    /// Each budget covering the pod, as `namespace/name`.
    pub budgets: Vec<String>,
    /// When it was planned (before the server could grant it).
    pub planned_at: Timestamp,
}

impl Flight {
    /// The flight of `pod`, planned now under the budgets covering it.
    #[must_use]
    pub fn of(pod: &Leaving, budgets: &[PodDisruptionBudget], now: Timestamp) -> Self {
        Self {
            pod: pod.name.clone(),
            budgets: drain::covering_budgets(pod, budgets),
            planned_at: now,
        }
    }

    /// Whether the status of budget `key` (standing in `budgets`) may not count this eviction yet.
    /// The server's grant writes the pod into the budget's `disruptedPods`, and the disruption
    /// controller takes it out only once the pod is terminating (then it no longer counts as
    /// healthy): from the first version listing it, every later version counts it. The watch sees
    /// every version, so "listed since it was planned" is exact; a version number alone is not
    /// (a later version may hold an earlier grant and not this one).
    fn unseen_by(
        &self,
        key: &str,
        budgets: &[PodDisruptionBudget],
        listed: Listed<'_>,
        now: Timestamp,
    ) -> bool {
        find(budgets, key).is_some()
            && listed(key, &self.pod).is_none_or(|seen| seen < self.planned_at)
            && crate::time::plus(self.planned_at, FLIGHT_HORIZON) > now
    }

    /// Whether every budget it was planned under now counts it (or is gone): it can be forgotten.
    #[must_use]
    pub fn counted(&self, budgets: &[PodDisruptionBudget], listed: Listed<'_>, now: Timestamp) -> bool {
        !self
            .budgets
            .iter()
            .any(|key| self.unseen_by(key, budgets, listed, now))
    }
}

/// How many of `flights` each budget's status does not count yet, by `namespace/name`.
#[must_use]
pub fn in_flight<'a>(
    flights: impl IntoIterator<Item = &'a Flight>,
    budgets: &[PodDisruptionBudget],
    listed: Listed<'_>,
    now: Timestamp,
) -> BTreeMap<String, u32> {
    let mut counts = BTreeMap::new();
    for flight in flights {
        for key in &flight.budgets {
            if flight.unseen_by(key, budgets, listed, now) {
                *counts.entry(key.clone()).or_insert(0) += 1;
            }
        }
    }
    counts
}

/// What one round sends, and what waits for room.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Round {
    /// Evictions to ask now.
    pub send: Vec<Leaving>,
    /// Pods held until their budget (`namespace/name`) shows room.
    pub held: Vec<(Leaving, String)>,
}

/// What the planner knows besides the pods.
#[derive(Clone, Copy)]
pub struct Room<'a> {
    /// Every disruption budget, as the watch last saw it.
    pub budgets: &'a [PodDisruptionBudget],
    /// Evictions each budget's status does not count yet ([`in_flight`]).
    pub in_flight: &'a BTreeMap<String, u32>,
    /// When each pod (by UID) was last asked to leave.
    pub asked_at: &'a (dyn Fn(&str) -> Option<Timestamp> + Sync),
    /// How long a refused eviction waits before it is asked again without news of its budget.
    pub backoff: SignedDuration,
    /// Now.
    pub now: Timestamp,
}

/// Plans the round for `pending` (the pods still to be asked, in the drain's order).
#[must_use]
pub fn plan<'a>(pending: impl IntoIterator<Item = &'a Leaving>, room: &Room<'_>) -> Round {
    let mut spent: BTreeMap<String, i64> = BTreeMap::new();
    let mut round = Round::default();
    for pod in pending {
        let asked = (room.asked_at)(&pod.uid);
        let backoff_over = asked.is_none_or(|at| crate::time::plus(at, room.backoff) <= room.now);
        let covering = drain::covering_budgets(pod, room.budgets);
        let [key] = covering.as_slice() else {
            // No budget: nothing to wait for. Several: the server refuses (500) whatever their
            // room; the refusal is shown, and asked again after the backoff.
            if backoff_over {
                round.send.push(pod.clone());
            }
            continue;
        };
        let Some(budget) = find(room.budgets, key) else {
            continue;
        };
        match cost(pod, budget) {
            Cost::Unknown | Cost::Free => {
                if backoff_over {
                    round.send.push(pod.clone());
                }
            }
            Cost::One(allowed) => {
                let used = spent.entry(key.clone()).or_insert(0);
                let flying = i64::from(room.in_flight.get(key).copied().unwrap_or(0));
                if allowed - flying - *used > 0 {
                    *used += 1;
                    round.send.push(pod.clone());
                } else {
                    round.held.push((pod.clone(), key.clone()));
                }
            }
        }
    }
    round
}

/// What evicting a pod costs its one budget.
enum Cost {
    /// Its status is not current (no status yet, or older than the budget's spec): the server
    /// decides.
    Unknown,
    /// Nothing: the server lets it go without spending the budget.
    Free,
    /// One of the budget's `disruptionsAllowed` (here, as its status says).
    One(i64),
}

fn cost(pod: &Leaving, budget: &PodDisruptionBudget) -> Cost {
    let Some(status) = budget.status.as_ref() else {
        return Cost::Unknown;
    };
    let current = match (status.observed_generation, budget.metadata.generation) {
        (Some(observed), Some(generation)) => observed >= generation,
        (None, Some(_)) => false,
        (_, None) => true,
    };
    if !current {
        return Cost::Unknown;
    }
    let always = budget
        .spec
        .as_ref()
        .and_then(|s| s.unhealthy_pod_eviction_policy.as_deref())
        == Some("AlwaysAllow");
    match pod.readiness {
        Readiness::Pending => Cost::Free,
        Readiness::Unready if always || is_healthy(budget) => Cost::Free,
        Readiness::Unready | Readiness::Ready => Cost::One(i64::from(status.disruptions_allowed)),
    }
}

/// Whether the budget has the healthy pods it needs (then the default `IfHealthyBudget` lets an
/// unready pod go without spending it).
fn is_healthy(budget: &PodDisruptionBudget) -> bool {
    budget
        .status
        .as_ref()
        .is_some_and(|s| s.desired_healthy > 0 && s.current_healthy >= s.desired_healthy)
}

/// The budgets a drain step plans with, cloned from the watch's `store`: those in the namespaces
/// of `pods` (a budget covers only pods of its own namespace) and of the budgets `flights` were
/// planned under (the room they hold is weighed in the same pass). The cluster's other budgets are
/// never copied, however many there are, and a step decides again at every answer.
#[must_use]
pub fn in_reach<'a>(
    store: impl IntoIterator<Item = &'a std::sync::Arc<PodDisruptionBudget>>,
    pods: impl IntoIterator<Item = &'a Leaving>,
    flights: impl IntoIterator<Item = &'a Flight>,
) -> Vec<PodDisruptionBudget> {
    let mut namespaces: BTreeSet<&str> = pods.into_iter().map(|p| p.namespace.as_str()).collect();
    for flight in flights {
        namespaces.extend(
            flight
                .budgets
                .iter()
                .filter_map(|key| key.split_once('/').map(|(ns, _)| ns)),
        );
    }
    store
        .into_iter()
        .filter(|b| {
            b.metadata
                .namespace
                .as_deref()
                .is_some_and(|ns| namespaces.contains(ns))
        })
        .map(|b| (**b).clone())
        .collect()
}

fn find<'a>(budgets: &'a [PodDisruptionBudget], key: &str) -> Option<&'a PodDisruptionBudget> {
    budgets.iter().find(|b| find_key(b) == key)
}

fn find_key(budget: &PodDisruptionBudget) -> String {
    // `namespace/name`, as `drain::covering_budgets` names them.
    format!("{}/{}", budget.namespace().unwrap_or_default(), budget.name_any())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::policy::v1::{PodDisruptionBudgetSpec, PodDisruptionBudgetStatus},
        apimachinery::pkg::apis::meta::v1::LabelSelector,
    };
    use kube::api::ObjectMeta;

    use super::*;
    use crate::test_fixtures::at;

    fn pod(name: &str, app: &str) -> Leaving {
        crate::test_fixtures::leaving(name, app)
    }

    fn budget(name: &str, app: &str, allowed: i32) -> PodDisruptionBudget {
        PodDisruptionBudget {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("work".into()),
                resource_version: Some("1".into()),
                generation: Some(1),
                ..ObjectMeta::default()
            },
            spec: Some(PodDisruptionBudgetSpec {
                selector: Some(LabelSelector {
                    match_labels: Some([("app".to_owned(), app.to_owned())].into()),
                    ..LabelSelector::default()
                }),
                ..PodDisruptionBudgetSpec::default()
            }),
            status: Some(PodDisruptionBudgetStatus {
                disruptions_allowed: allowed,
                observed_generation: Some(1),
                current_healthy: 10,
                desired_healthy: 10 - allowed,
                expected_pods: 10,
                ..PodDisruptionBudgetStatus::default()
            }),
        }
    }

    fn never(_: &str) -> Option<Timestamp> {
        None
    }

    fn round(pods: &[Leaving], budgets: &[PodDisruptionBudget], in_flight: &BTreeMap<String, u32>) -> Round {
        round_asked(pods, budgets, in_flight, &never)
    }

    fn round_asked(
        pods: &[Leaving],
        budgets: &[PodDisruptionBudget],
        in_flight: &BTreeMap<String, u32>,
        asked_at: &(dyn Fn(&str) -> Option<Timestamp> + Sync),
    ) -> Round {
        plan(
            pods,
            &Room {
                budgets,
                in_flight,
                asked_at,
                backoff: SignedDuration::from_secs(5),
                now: at(2),
            },
        )
    }

    #[test]
    fn a_step_reads_only_the_budgets_of_its_pods_and_its_flights_namespaces() {
        let elsewhere = |ns: &str, name: &str| {
            let mut b = budget(name, "web", 1);
            b.metadata.namespace = Some(ns.into());
            std::sync::Arc::new(b)
        };
        let store = [
            std::sync::Arc::new(budget("web", "web", 1)),
            elsewhere("train", "job"),
            elsewhere("other", "db"),
        ];
        let flight = Flight {
            pod: "job-0".into(),
            budgets: vec!["train/job".into()],
            planned_at: at(0),
        };
        let read = in_reach(&store, &[pod("web-0", "web")], [&flight]);
        let keys: Vec<String> = read.iter().map(find_key).collect();
        assert_eq!(keys, ["work/web", "train/job"]);
        assert!(in_reach(&store, &[], []).is_empty());
    }

    fn names(pods: &[Leaving]) -> Vec<&str> {
        pods.iter().map(|p| p.name.as_str()).collect()
    }

    fn held(round: &Round) -> Vec<(&str, &str)> {
        round
            .held
            .iter()
            .map(|(p, b)| (p.name.as_str(), b.as_str()))
            .collect()
    }

    #[test]
    fn pods_under_no_budget_are_all_sent_at_once() {
        let pods = [pod("a", "free"), pod("b", "free")];
        let planned = round(&pods, &[budget("web", "web", 0)], &BTreeMap::new());
        assert_eq!(names(&planned.send), ["a", "b"]);
        assert!(planned.held.is_empty());
    }

    #[test]
    fn a_budget_allowing_one_gets_exactly_one_eviction_and_the_rest_wait_for_it() {
        let pods: Vec<Leaving> = (0..10).map(|i| pod(&format!("web-{i}"), "web")).collect();
        let planned = round(&pods, &[budget("web", "web", 1)], &BTreeMap::new());
        assert_eq!(names(&planned.send), ["web-0"]);
        assert_eq!(planned.held.len(), 9);
        assert!(planned.held.iter().all(|(_, b)| b == "work/web"));
    }

    #[test]
    fn four_budgets_of_one_each_send_four_evictions_for_forty_pods() {
        let apps = ["a", "b", "c", "d"];
        let pods: Vec<Leaving> = (0..40).map(|i| pod(&format!("p-{i}"), apps[i % 4])).collect();
        let budgets: Vec<PodDisruptionBudget> = apps.iter().map(|a| budget(a, a, 1)).collect();
        let planned = round(&pods, &budgets, &BTreeMap::new());
        assert_eq!(names(&planned.send), ["p-0", "p-1", "p-2", "p-3"]);
        assert_eq!(planned.held.len(), 36);
    }

    #[test]
    fn a_budget_with_no_room_sends_nothing_even_to_a_pod_never_asked() {
        let planned = round(
            &[pod("web-0", "web")],
            &[budget("web", "web", 0)],
            &BTreeMap::new(),
        );
        assert!(planned.send.is_empty());
        assert_eq!(held(&planned), [("web-0", "work/web")]);
    }

    #[test]
    fn a_pod_refused_before_is_sent_again_as_soon_as_its_budget_shows_room() {
        let asked = |_: &str| Some(at(1));
        let pods = [pod("web-0", "web")];
        let planned = round_asked(&pods, &[budget("web", "web", 1)], &BTreeMap::new(), &asked);
        assert_eq!(
            names(&planned.send),
            ["web-0"],
            "room shown: no backoff to wait out"
        );
        let planned = round_asked(&pods, &[budget("web", "web", 0)], &BTreeMap::new(), &asked);
        assert!(planned.send.is_empty(), "no room: held, whatever the backoff");
    }

    #[test]
    fn evictions_in_flight_under_a_budget_use_its_room_whoever_sent_them() {
        // Two remediations share the budget: the other's eviction, granted but not yet counted
        // in the status we see, leaves this one nothing.
        let in_flight = [("work/web".to_owned(), 1)].into();
        let planned = round(&[pod("web-0", "web")], &[budget("web", "web", 1)], &in_flight);
        assert!(planned.send.is_empty());
        let planned = round(
            &[pod("web-0", "web"), pod("web-1", "web")],
            &[budget("web", "web", 2)],
            &in_flight,
        );
        assert_eq!(names(&planned.send), ["web-0"]);
    }

    #[test]
    fn a_pod_under_several_budgets_is_sent_once_per_backoff_for_the_server_to_refuse() {
        let budgets = [budget("web", "web", 5), budget("all-web", "web", 5)];
        let planned = round(&[pod("web-0", "web")], &budgets, &BTreeMap::new());
        assert_eq!(names(&planned.send), ["web-0"]);
        let asked = |_: &str| Some(at(0));
        let planned = round_asked(&[pod("web-0", "web")], &budgets, &BTreeMap::new(), &asked);
        assert!(planned.send.is_empty(), "refused 2 s ago, backoff 5 s");
        assert!(planned.held.is_empty(), "no single budget to wait for");
    }

    #[test]
    fn an_unready_pod_goes_free_when_its_budget_lets_unhealthy_pods_go() {
        let mut sick = pod("web-0", "web");
        sick.readiness = Readiness::Unready;
        // IfHealthyBudget (the default): the budget has its healthy pods.
        let planned = round(
            &[sick.clone(), pod("web-1", "web")],
            &[budget("web", "web", 1)],
            &BTreeMap::new(),
        );
        assert_eq!(
            names(&planned.send),
            ["web-0", "web-1"],
            "the unready pod spends nothing"
        );
        // ... but not when the budget is short of healthy pods.
        let mut short = budget("web", "web", 0);
        short.status.as_mut().unwrap().current_healthy = 8;
        short.status.as_mut().unwrap().desired_healthy = 9;
        let planned = round(std::slice::from_ref(&sick), &[short.clone()], &BTreeMap::new());
        assert_eq!(held(&planned), [("web-0", "work/web")]);
        // AlwaysAllow: always.
        short.spec.as_mut().unwrap().unhealthy_pod_eviction_policy = Some("AlwaysAllow".into());
        let planned = round(&[sick], &[short], &BTreeMap::new());
        assert_eq!(names(&planned.send), ["web-0"]);
    }

    #[test]
    fn a_pending_pod_goes_whatever_its_budget_says() {
        let mut waiting = pod("web-0", "web");
        waiting.readiness = Readiness::Pending;
        let planned = round(&[waiting], &[budget("web", "web", 0)], &BTreeMap::new());
        assert_eq!(names(&planned.send), ["web-0"]);
    }

    #[test]
    fn a_budget_whose_status_lags_its_spec_is_left_to_the_server() {
        let mut stale = budget("web", "web", 0);
        stale.metadata.generation = Some(2);
        let planned = round(&[pod("web-0", "web")], &[stale], &BTreeMap::new());
        assert_eq!(names(&planned.send), ["web-0"]);
    }

    #[test]
    fn a_flight_counts_until_the_budget_watch_sees_it_listed_as_disrupted() {
        let budgets = [budget("web", "web", 2)];
        let first = Flight::of(&pod("web-0", "web"), &budgets, at(0));
        let second = Flight::of(&pod("web-1", "web"), &budgets, at(0));
        assert_eq!(first.budgets, ["work/web"]);
        let nothing = |_: &str, _: &str| None;
        assert_eq!(
            in_flight([&first, &second], &budgets, &nothing, at(1)),
            [("work/web".to_owned(), 2)].into()
        );
        // A newer version of the budget holding the first grant only: the second still counts.
        let first_listed = |_: &str, pod: &str| (pod == "web-0").then(|| at(1));
        assert_eq!(
            in_flight([&first, &second], &budgets, &first_listed, at(1)),
            [("work/web".to_owned(), 1)].into()
        );
        assert!(first.counted(&budgets, &first_listed, at(1)));
        assert!(!second.counted(&budgets, &first_listed, at(1)));
        // A listing from before this flight was planned is an earlier eviction of that name.
        let long_ago = |_: &str, _: &str| Some(at(-60));
        assert!(!first.counted(&budgets, &long_ago, at(1)));
        // A budget deleted meanwhile counts nothing; a flight past the horizon is forgotten.
        assert!(first.counted(&[], &nothing, at(1)));
        assert!(first.counted(&budgets, &nothing, at(121)));
    }
}
