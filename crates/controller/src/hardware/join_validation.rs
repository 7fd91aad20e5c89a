//! New nodes validated before they take work (issue 40), pure: a node that registers with the
//! startup taint (kubelet `--register-with-taints`, Karpenter `startupTaints`, a Cluster API node
//! template) takes no pod until that taint is gone, so a controller that has not seen it yet
//! cannot race a workload onto it. For each such node this module decides the next step: start
//! the policy's validation Job (bounded: at most `limit` at once, like quarantine's), wait for it
//! (until its deadline), lift the taint when it passed, or hold the node (taint kept, reason said)
//! when it failed, was lost or timed out. [`lift`] is the node edit the writer makes: only the
//! startup taint goes, every other actor's taint stays.
//!
//! ```text
//! tainted ─► no Job ─► room? ─► Start ─► Running ─► Complete ─────────────► Lift (taint removed)
//!                   └► full ─► Queued (said)     └► Failed / deleted ─────► Hold (taint kept, said)
//!                                                └► past the timeout ─────► Hold (TimedOut)
//! ```
//!
//! Not wired yet, so no policy reaches it: still to come are the policy field
//! (`validation.newNodes`: the taint's key and the limit), the Job rendered for a node without a
//! remediation, the start recorded on the node (so a lost Job reads as lost), the writer's calls
//! from `act::hardware` beside `join`'s, the outcome's Event and status, and its e2e test.

use gpu_remediation_api::validation::ValidationOutcome;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Node;
use serde_json::Value;

use crate::replace::{Reported, template::report};

/// A node's validation Job as last read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobSeen {
    /// No Job for the node yet.
    None,
    /// The Job runs; it was created at this time.
    Running {
        /// The Job's creation time (the server's).
        since: Timestamp,
    },
    /// The Job reported `Complete`.
    Complete,
    /// The Job reported `Failed`.
    Failed,
    /// A Job was started for the node (recorded) but is gone before it reported.
    Lost,
}

/// What a node's validation Job says: `status` is the Job's status as read (`None` when no Job
/// was found), `created` its creation time, `started` whether a start was recorded for the node
/// (a Job recorded but gone before it reported is lost, never started twice).
#[must_use]
pub fn seen(found: Option<(Option<&Value>, Timestamp)>, started: bool) -> JobSeen {
    match found {
        None if started => JobSeen::Lost,
        None => JobSeen::None,
        Some((status, created)) => match report(status) {
            Reported::Done(_) => JobSeen::Complete,
            Reported::Failed(_) => JobSeen::Failed,
            Reported::Nothing | Reported::InProgress => JobSeen::Running { since: created },
        },
    }
}

/// One node carrying the startup taint, as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// The node.
    pub node: String,
    /// When the node registered (its creation time): the order nodes are validated in.
    pub joined: Timestamp,
    /// Its validation Job.
    pub job: JobSeen,
}

/// What to do about one candidate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Create the validation Job.
    Start {
        /// The node.
        node: String,
    },
    /// The Job runs: look again at the latest at `deadline`.
    Wait {
        /// The node.
        node: String,
        /// When the Job's time is up.
        deadline: Timestamp,
    },
    /// The Job passed: lift the startup taint.
    Lift {
        /// The node.
        node: String,
    },
    /// The Job failed, was lost or timed out: the taint stays; the policy's trigger and
    /// remediation take over from here.
    Hold {
        /// The node.
        node: String,
        /// How the validation ended.
        outcome: ValidationOutcome,
        /// Why, for a person (Event and status).
        message: String,
    },
    /// No room: `limit` validations already run. Said in status, never silently waiting.
    Queued {
        /// The node.
        node: String,
        /// Why, for a person.
        message: String,
    },
}

/// The steps for the candidates now: `limit` validations may run at once, each for `timeout`.
/// Oldest nodes first, so that a stream of new nodes cannot starve an early one.
#[must_use]
pub fn steps(
    candidates: &[Candidate],
    limit: u32,
    timeout: std::time::Duration,
    now: Timestamp,
) -> Vec<Step> {
    let timeout = SignedDuration::try_from(timeout).unwrap_or(SignedDuration::MAX);
    let mut ordered: Vec<&Candidate> = candidates.iter().collect();
    ordered.sort_by(|a, b| a.joined.cmp(&b.joined).then_with(|| a.node.cmp(&b.node)));
    // Running Jobs hold room before any new one is started.
    let mut running = u32::try_from(
        ordered
            .iter()
            .filter(|c| matches!(c.job, JobSeen::Running { .. }))
            .count(),
    )
    .unwrap_or(u32::MAX);
    let mut out = Vec::with_capacity(ordered.len());
    for candidate in ordered {
        let node = candidate.node.clone();
        out.push(match candidate.job {
            JobSeen::Running { since } => {
                let deadline = since.checked_add(timeout).unwrap_or(Timestamp::MAX);
                if now >= deadline {
                    Step::Hold {
                        node,
                        outcome: ValidationOutcome::TimedOut,
                        message: format!(
                            "validation of the new node did not finish within {}s: the startup taint stays",
                            timeout.as_secs()
                        ),
                    }
                } else {
                    Step::Wait { node, deadline }
                }
            }
            JobSeen::Complete => Step::Lift { node },
            JobSeen::Failed => Step::Hold {
                node,
                outcome: ValidationOutcome::Failed,
                message: "validation of the new node failed: the startup taint stays".to_owned(),
            },
            JobSeen::Lost => Step::Hold {
                node,
                outcome: ValidationOutcome::Failed,
                message:
                    "the new node's validation Job was deleted before it reported: the startup taint stays"
                        .to_owned(),
            },
            JobSeen::None if running < limit => {
                running += 1;
                Step::Start { node }
            }
            JobSeen::None => Step::Queued {
                node,
                message: format!("waiting: {running} validation(s) of new nodes already run (limit {limit})"),
            },
        });
    }
    out
}

/// Whether the node carries the startup taint `key`.
#[must_use]
pub fn has_taint(node: &Node, key: &str) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == key))
}

/// Lifts the startup taint `key`, keeping every other taint; whether anything changed. The
/// writer applies it as a read-modify-replace of the node (its `resourceVersion`).
pub fn lift(node: &mut Node, key: &str) -> bool {
    let Some(taints) = node.spec.as_mut().and_then(|s| s.taints.as_mut()) else {
        return false;
    };
    let before = taints.len();
    taints.retain(|t| t.key != key);
    taints.len() != before
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{NodeSpec, Taint};

    use super::*;

    const KEY: &str = "gpuremediation.dev/unvalidated";
    const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn candidate(node: &str, joined: i64, job: JobSeen) -> Candidate {
        Candidate {
            node: node.to_owned(),
            joined: at(joined),
            job,
        }
    }

    fn names(steps: &[Step], start: bool) -> Vec<String> {
        steps
            .iter()
            .filter_map(|s| match s {
                Step::Start { node } if start => Some(node.clone()),
                Step::Queued { node, .. } if !start => Some(node.clone()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn at_most_limit_validations_run_at_once_oldest_nodes_first() {
        let candidates = [
            candidate("late", 30, JobSeen::None),
            candidate("early", 10, JobSeen::None),
            candidate("busy", 0, JobSeen::Running { since: at(5) }),
            candidate("middle", 20, JobSeen::None),
        ];
        let steps = steps(&candidates, 3, TIMEOUT, at(60));
        assert_eq!(names(&steps, true), ["early", "middle"]);
        assert_eq!(names(&steps, false), ["late"]);
        let Some(Step::Queued { message, .. }) = steps.iter().find(|s| matches!(s, Step::Queued { .. }))
        else {
            panic!("{steps:?}");
        };
        assert!(
            message.contains("3 validation(s)") && message.contains("limit 3"),
            "{message}"
        );
    }

    #[test]
    fn a_limit_of_zero_starts_nothing_and_says_so() {
        let steps = steps(&[candidate("n", 0, JobSeen::None)], 0, TIMEOUT, at(1));
        assert!(
            matches!(&steps[..], [Step::Queued { node, .. }] if node == "n"),
            "{steps:?}"
        );
    }

    #[test]
    fn a_passed_job_lifts_the_taint_and_frees_its_room() {
        let candidates = [
            candidate("done", 0, JobSeen::Complete),
            candidate("next", 1, JobSeen::None),
        ];
        let steps = steps(&candidates, 1, TIMEOUT, at(60));
        assert_eq!(
            steps,
            [
                Step::Lift { node: "done".into() },
                Step::Start { node: "next".into() }
            ]
        );
    }

    #[test]
    fn a_running_job_waits_until_its_deadline_then_times_out() {
        let running = [candidate("n", 0, JobSeen::Running { since: at(100) })];
        assert_eq!(
            steps(&running, 1, TIMEOUT, at(699)),
            [Step::Wait {
                node: "n".into(),
                deadline: at(700)
            }]
        );
        let late = steps(&running, 1, TIMEOUT, at(700));
        assert!(
            matches!(&late[..], [Step::Hold { outcome: ValidationOutcome::TimedOut, message, .. }] if message.contains("600s")),
            "{late:?}"
        );
    }

    #[test]
    fn a_failed_or_lost_job_holds_the_node_and_takes_no_room() {
        let candidates = [
            candidate("broken", 0, JobSeen::Failed),
            candidate("gone", 1, JobSeen::Lost),
            candidate("next", 2, JobSeen::None),
        ];
        let steps = steps(&candidates, 1, TIMEOUT, at(60));
        assert!(
            matches!(&steps[0], Step::Hold { node, outcome: ValidationOutcome::Failed, .. } if node == "broken")
        );
        assert!(
            matches!(&steps[1], Step::Hold { node, outcome: ValidationOutcome::Failed, message } if node == "gone" && message.contains("deleted"))
        );
        assert_eq!(steps[2], Step::Start { node: "next".into() });
    }

    #[test]
    fn a_jobs_status_reads_as_running_complete_failed_or_lost() {
        let created = at(3);
        let complete = serde_json::json!({"conditions": [{"type": "Complete", "status": "True"}]});
        let failed = serde_json::json!({"conditions": [{"type": "Failed", "status": "True", "message": "BackoffLimitExceeded"}]});
        let active = serde_json::json!({"active": 1});
        assert_eq!(seen(Some((Some(&complete), created)), true), JobSeen::Complete);
        assert_eq!(seen(Some((Some(&failed), created)), true), JobSeen::Failed);
        assert_eq!(
            seen(Some((Some(&active), created)), true),
            JobSeen::Running { since: created }
        );
        assert_eq!(
            seen(Some((None, created)), false),
            JobSeen::Running { since: created }
        );
        assert_eq!(seen(None, true), JobSeen::Lost);
        assert_eq!(seen(None, false), JobSeen::None);
    }

    fn taint(key: &str) -> Taint {
        Taint {
            key: key.to_owned(),
            effect: "NoSchedule".to_owned(),
            ..Taint::default()
        }
    }

    #[test]
    fn lifting_removes_only_the_startup_taint() {
        let mut node = Node {
            spec: Some(NodeSpec {
                taints: Some(vec![
                    taint("other.example/keep"),
                    taint(KEY),
                    taint("karpenter.sh/disrupted"),
                ]),
                ..NodeSpec::default()
            }),
            ..Node::default()
        };
        assert!(has_taint(&node, KEY));
        assert!(lift(&mut node, KEY));
        assert!(!has_taint(&node, KEY));
        let kept: Vec<_> = node
            .spec
            .unwrap()
            .taints
            .unwrap()
            .into_iter()
            .map(|t| t.key)
            .collect();
        assert_eq!(kept, ["other.example/keep", "karpenter.sh/disrupted"]);
        let mut bare = Node::default();
        assert!(!lift(&mut bare, KEY));
        assert!(!has_taint(&bare, KEY));
    }
}
