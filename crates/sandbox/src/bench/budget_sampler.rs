//! The PDB violation sampler both drain peers and every fault scenario are judged by: it watches
//! the pods and `PodDisruptionBudgets` of a namespace and, after every pod event, counts each
//! budget's healthy pods (Ready and not terminating, as the disruption controller counts them)
//! against the floor the budget promises. A count below the floor at any instant is a violation.
//!
//! The floor of each budget is fixed when the sampler starts (from `minAvailable`, or the
//! disruption controller's `expectedPods - maxUnavailable`): drains and faults do not change how
//! many replicas a workload wants, so a floor that moved with them would hide a violation.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt, api::ListParams};

/// Failure to start the sampler.
#[derive(Debug, thiserror::Error)]
pub enum StartBudgetSamplerError {
    /// The budgets could not be listed.
    #[error("listing the PDBs of {namespace}: {source}")]
    ListBudgets {
        /// The namespace.
        namespace: String,
        /// The API error.
        source: kube::Error,
    },
    /// A budget's floor cannot be known.
    #[error("PDB {namespace}/{name}: {reason}")]
    Floor {
        /// The namespace.
        namespace: String,
        /// The budget.
        name: String,
        /// Why.
        reason: String,
    },
    /// The pod watch never delivered its first complete list.
    #[error("the pod watch of {namespace} did not list within {waited:?}")]
    NotListed {
        /// The namespace.
        namespace: String,
        /// How long it waited.
        waited: Duration,
    },
}

/// One budget as the sampler holds it: which pods it counts and the fewest it allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Floor {
    /// The budget's name.
    pub pdb: String,
    /// Its `matchLabels`.
    pub match_labels: BTreeMap<String, String>,
    /// The fewest healthy pods it promises.
    pub min_healthy: usize,
}

/// A moment when a budget had fewer healthy pods than it promises.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Violation {
    /// The budget.
    pub pdb: String,
    /// Healthy pods at that moment.
    pub healthy: usize,
    /// What it promises.
    pub min_healthy: usize,
    /// When the sampler saw it.
    pub at: String,
}

/// What the sampler saw.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct BudgetReport {
    /// Pod events evaluated.
    pub samples: u64,
    /// Every moment a budget was below its floor (the first per budget and episode).
    pub violations: Vec<Violation>,
    /// Per budget, the smallest `healthy - floor` seen.
    pub least_margin: BTreeMap<String, i64>,
}

/// The floor of `pdb`, from `minAvailable` (an integer) or from the disruption controller's
/// `expectedPods` minus `maxUnavailable` (an integer). Percentages are resolved the way the
/// disruption controller does: `minAvailable` rounds up, `maxUnavailable` rounds up too.
pub fn floor_of(pdb: &PodDisruptionBudget) -> Result<Floor, String> {
    let spec = pdb.spec.as_ref().ok_or("no spec")?;
    let selector = spec.selector.as_ref().ok_or("no selector")?;
    if selector.match_expressions.as_ref().is_some_and(|e| !e.is_empty()) {
        return Err("matchExpressions are not supported by the sampler".to_owned());
    }
    let match_labels = selector.match_labels.clone().unwrap_or_default();
    let status = pdb.status.as_ref();
    let observed = status.and_then(|s| s.observed_generation);
    let expected = || -> Result<usize, String> {
        if observed.is_none() || observed != pdb.metadata.generation {
            return Err("not yet observed by the disruption controller".to_owned());
        }
        Ok(usize::try_from(status.map_or(0, |s| s.expected_pods)).unwrap_or(0))
    };
    let resolve = |value: &IntOrString, round_up: bool| -> Result<usize, String> {
        match value {
            IntOrString::Int(n) => Ok(usize::try_from(*n).unwrap_or(0)),
            IntOrString::String(s) => {
                let percent: usize = s
                    .trim_end_matches('%')
                    .parse()
                    .map_err(|_| format!("not a percentage: {s}"))?;
                let expected = expected()?;
                let scaled = expected * percent;
                Ok(if round_up {
                    scaled.div_ceil(100)
                } else {
                    scaled / 100
                })
            }
        }
    };
    let min_healthy = match (&spec.min_available, &spec.max_unavailable) {
        (Some(min), _) => resolve(min, true)?,
        (None, Some(max)) => expected()?.saturating_sub(resolve(max, true)?),
        (None, None) => return Err("neither minAvailable nor maxUnavailable".to_owned()),
    };
    Ok(Floor {
        pdb: pdb.name_any(),
        match_labels,
        min_healthy,
    })
}

/// The healthy pods each floor counts, given each pod's labels and health.
#[must_use]
pub fn healthy_counts(floors: &[Floor], pods: &[(&BTreeMap<String, String>, bool)]) -> Vec<usize> {
    floors
        .iter()
        .map(|floor| {
            pods.iter()
                .filter(|(labels, healthy)| {
                    *healthy && floor.match_labels.iter().all(|(k, v)| labels.get(k) == Some(v))
                })
                .count()
        })
        .collect()
}

#[derive(Default)]
struct State {
    listed: bool,
    pods: BTreeMap<String, (BTreeMap<String, String>, bool)>,
    below: BTreeMap<String, bool>,
    report: BudgetReport,
}

impl State {
    fn evaluate(&mut self, floors: &[Floor]) {
        self.report.samples += 1;
        let pods: Vec<_> = self.pods.values().map(|(l, h)| (l, *h)).collect();
        let counts = healthy_counts(floors, &pods);
        for (floor, healthy) in floors.iter().zip(counts) {
            let margin = i64::try_from(healthy).unwrap_or(i64::MAX)
                - i64::try_from(floor.min_healthy).unwrap_or(i64::MAX);
            let least = self
                .report
                .least_margin
                .entry(floor.pdb.clone())
                .or_insert(margin);
            *least = (*least).min(margin);
            let was_below = self.below.insert(floor.pdb.clone(), margin < 0).unwrap_or(false);
            if margin < 0 && !was_below {
                self.report.violations.push(Violation {
                    pdb: floor.pdb.clone(),
                    healthy,
                    min_healthy: floor.min_healthy,
                    at: Timestamp::now().to_string(),
                });
            }
        }
    }
}

/// A running sampler. Stop it with [`BudgetSampler::finish`].
pub struct BudgetSampler {
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl BudgetSampler {
    /// Reads the floors of every PDB in `namespace` (each must be observed by the disruption
    /// controller) and starts watching its pods; returns once the first list is complete.
    pub async fn start(client: &Client, namespace: &str) -> Result<Self, StartBudgetSamplerError> {
        let budgets = Api::<PodDisruptionBudget>::namespaced(client.clone(), namespace)
            .list(&ListParams::default())
            .await
            .map_err(|source| StartBudgetSamplerError::ListBudgets {
                namespace: namespace.to_owned(),
                source,
            })?;
        let floors = budgets
            .items
            .iter()
            .map(|pdb| {
                floor_of(pdb).map_err(|reason| StartBudgetSamplerError::Floor {
                    namespace: namespace.to_owned(),
                    name: pdb.name_any(),
                    reason,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let task = tokio::spawn(async move {
            let mut events = std::pin::pin!(watcher(pods, watcher::Config::default()).default_backoff());
            while let Some(event) = events.next().await {
                // A watch error is retried by the backoff; the pods it missed arrive in the
                // re-list, which is evaluated like any other event.
                let Ok(event) = event else { continue };
                let mut state = shared.lock().unwrap_or_else(PoisonError::into_inner);
                match event {
                    watcher::Event::Init => {
                        state.listed = false;
                        state.pods.clear();
                    }
                    watcher::Event::InitApply(pod) | watcher::Event::Apply(pod) => {
                        let healthy = crate::workload::is_ready(&pod);
                        state.pods.insert(pod.name_any(), (pod.labels().clone(), healthy));
                    }
                    watcher::Event::Delete(pod) => {
                        state.pods.remove(&pod.name_any());
                    }
                    watcher::Event::InitDone => state.listed = true,
                }
                if state.listed {
                    state.evaluate(&floors);
                }
            }
        });
        let sampler = Self { state, task };
        let waited = Duration::from_secs(60);
        let deadline = tokio::time::Instant::now() + waited;
        while !sampler.listed() {
            if tokio::time::Instant::now() > deadline {
                return Err(StartBudgetSamplerError::NotListed {
                    namespace: namespace.to_owned(),
                    waited,
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(sampler)
    }

    fn listed(&self) -> bool {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).listed
    }

    /// What it saw so far.
    #[must_use]
    pub fn report(&self) -> BudgetReport {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .report
            .clone()
    }

    /// Stops watching and returns what it saw.
    #[must_use]
    pub fn finish(self) -> BudgetReport {
        self.task.abort();
        self.report()
    }
}

impl Drop for BudgetSampler {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pdb(spec: &serde_json::Value, expected_pods: i32) -> PodDisruptionBudget {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "ns", "generation": 1},
            "spec": spec,
            "status": {"observedGeneration": 1, "expectedPods": expected_pods,
                       "currentHealthy": expected_pods, "desiredHealthy": 0, "disruptionsAllowed": 0},
        }))
        .unwrap()
    }

    fn selector() -> serde_json::Value {
        serde_json::json!({"matchLabels": {"app": "web"}})
    }

    #[test]
    fn max_unavailable_one_of_five_promises_four_healthy() {
        let floor = floor_of(&pdb(
            &serde_json::json!({"selector": selector(), "maxUnavailable": 1}),
            5,
        ))
        .unwrap();
        assert_eq!(floor.min_healthy, 4);
    }

    #[test]
    fn percentages_round_up_like_the_disruption_controller() {
        let min = floor_of(&pdb(
            &serde_json::json!({"selector": selector(), "minAvailable": "50%"}),
            5,
        ))
        .unwrap();
        assert_eq!(min.min_healthy, 3);
        let max = floor_of(&pdb(
            &serde_json::json!({"selector": selector(), "maxUnavailable": "10%"}),
            7,
        ))
        .unwrap();
        assert_eq!(max.min_healthy, 6);
    }

    #[test]
    fn a_budget_the_disruption_controller_has_not_observed_has_no_floor_yet() {
        let mut unobserved = pdb(
            &serde_json::json!({"selector": selector(), "maxUnavailable": 1}),
            5,
        );
        unobserved.status.as_mut().unwrap().observed_generation = None;
        assert!(floor_of(&unobserved).is_err());
    }

    #[test]
    fn only_ready_pods_matching_every_label_count_as_healthy() {
        let floors = vec![Floor {
            pdb: "web".into(),
            match_labels: [("app".to_owned(), "web".to_owned())].into(),
            min_healthy: 2,
        }];
        let web: BTreeMap<String, String> = [("app".to_owned(), "web".to_owned())].into();
        let other: BTreeMap<String, String> = [("app".to_owned(), "db".to_owned())].into();
        let pods = [(&web, true), (&web, false), (&other, true), (&web, true)];
        assert_eq!(healthy_counts(&floors, &pods), vec![2]);
    }

    #[test]
    fn falling_below_the_floor_is_recorded_once_per_episode() {
        let floors = vec![Floor {
            pdb: "web".into(),
            match_labels: [("app".to_owned(), "web".to_owned())].into(),
            min_healthy: 2,
        }];
        let web: BTreeMap<String, String> = [("app".to_owned(), "web".to_owned())].into();
        let mut state = State::default();
        state.pods.insert("a".into(), (web.clone(), true));
        state.pods.insert("b".into(), (web.clone(), true));
        state.evaluate(&floors);
        state.pods.insert("b".into(), (web.clone(), false));
        state.evaluate(&floors);
        state.evaluate(&floors);
        state.pods.insert("b".into(), (web.clone(), true));
        state.evaluate(&floors);
        state.pods.insert("a".into(), (web, false));
        state.evaluate(&floors);
        assert_eq!(state.report.violations.len(), 2);
        assert_eq!(state.report.least_margin["web"], -1);
    }
}
