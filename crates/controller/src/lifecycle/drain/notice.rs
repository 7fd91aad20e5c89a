//! The checkpoint notice before eviction (`drain.notice`), pure: which leaving pods are given it
//! first, and which of them still wait. A pod wants the notice when it is a gang's member or asks
//! for it by annotation ([`crate::drain::Notice`]). With a notice configured, such a pod is first
//! annotated with the time its eviction comes ([`Window::until`]); its eviction then waits until
//! that time, or until the pod says it checkpointed, whichever comes first (a pod that exits
//! leaves the plan). Pods that want no notice are evicted as before, at once. The window starts
//! when the first notice went out (`status.drain.noticeSince`) and lasts `drain.notice`, so a pod
//! cannot stretch it: only shorten its own wait.

use std::collections::BTreeSet;

use jiff::Timestamp;

use crate::{
    drain::{Leaving, Plan},
    time::{plus, signed},
};

/// The notice's window: from when it went out until the evictions come.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// When the first notice went out (`None`: none has, so nothing waits).
    pub since: Option<Timestamp>,
    /// When the noticed pods are evicted at the latest.
    pub until: Timestamp,
}

impl Window {
    /// The window of a drain whose notice went out `recorded` (or, when none is recorded, now,
    /// if a notice was given: this pass's or an earlier pass's whose status was not written),
    /// lasting `notice`.
    #[must_use]
    pub fn of(recorded: Option<Timestamp>, given: bool, notice: std::time::Duration, now: Timestamp) -> Self {
        let since = recorded.or(given.then_some(now));
        Self {
            since,
            until: plus(since.unwrap_or(now), signed(notice)),
        }
    }
}

/// The pods to give the notice now: those still to be evicted that want it and have not been
/// given it (by their annotation, or by this pass: `given`). None when `notice` is zero.
#[must_use]
pub fn to_give(plan: &Plan, notice: std::time::Duration, given: &BTreeSet<String>) -> Vec<Leaving> {
    if notice.is_zero() {
        return Vec::new();
    }
    plan.to_evict()
        .filter(|pod| pod.notice.wanted && !pod.notice.given && !given.contains(&pod.uid))
        .cloned()
        .collect()
}

/// Whether `pod`'s eviction waits for its notice at `now`: it was given one (annotation, or this
/// pass: `given`), has not answered that it checkpointed, and the window is still open.
#[must_use]
pub fn waits(pod: &Leaving, window: &Window, given: &BTreeSet<String>, now: Timestamp) -> bool {
    window.since.is_some()
        && pod.notice.wanted
        && (pod.notice.given || given.contains(&pod.uid))
        && !pod.notice.acknowledged
        && now < window.until
}

/// What the notice makes of one drain pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Give these pods the notice first, their eviction coming at `evict_at`.
    Give {
        /// The pods.
        pods: Vec<Leaving>,
        /// When their eviction comes at the latest.
        evict_at: Timestamp,
    },
    /// Evict, leaving out the pods that still wait (by UID: those noticed and not answered
    /// within the window). A pod whose notice the server refused is evicted without one: the
    /// notice is a courtesy, and a drain stuck on it would keep a broken node from its repair.
    Evict {
        /// The window.
        window: Window,
        /// The pods that wait.
        waiting: BTreeSet<String>,
    },
}

/// The notice's step for `plan` under `notice`, its start as recorded (`recorded`), the pods
/// given it this pass (`noticed`) and those whose notice was refused this pass (`refused`).
#[must_use]
pub fn step(
    plan: &Plan,
    notice: std::time::Duration,
    recorded: Option<Timestamp>,
    (noticed, refused): (&BTreeSet<String>, &BTreeSet<String>),
    now: Timestamp,
) -> Step {
    let asked: BTreeSet<String> = noticed.union(refused).cloned().collect();
    let give = to_give(plan, notice, &asked);
    if !give.is_empty() {
        return Step::Give {
            pods: give,
            evict_at: Window::of(recorded, true, notice, now).until,
        };
    }
    let given = !notice.is_zero()
        && (!noticed.is_empty() || plan.leaving.iter().any(|p| p.notice.wanted && p.notice.given));
    let window = Window::of(recorded, given, notice, now);
    let waiting = plan
        .to_evict()
        .filter(|pod| waits(pod, &window, noticed, now))
        .map(|pod| pod.uid.clone())
        .collect();
    Step::Evict { window, waiting }
}

/// [`step`] for a drain pass: the notice's length from `rules`, its recorded start from
/// `status`, the pods noticed and refused from this pass's `answers`.
#[must_use]
pub fn of_pass(
    plan: &Plan,
    rules: &gpu_remediation_api::remediation::PolicySnapshot,
    status: &gpu_remediation_api::GpuRemediationStatus,
    answers: &super::super::Answers,
    now: Timestamp,
) -> Step {
    let recorded = status
        .drain
        .as_ref()
        .and_then(|d| d.notice_since.as_ref())
        .map(|t| t.0);
    let answered = (&answers.noticed, &answers.notice_refused);
    step(plan, rules.drain.notice.as_std(), recorded, answered, now)
}

/// The status message while pods wait for their notice, if any do.
#[must_use]
pub fn said(window: &Window, waiting: &BTreeSet<String>) -> Option<String> {
    (!waiting.is_empty()).then(|| {
        format!(
            "{} pods given the checkpoint notice are evicted at {} or once they write {}",
            waiting.len(),
            window.until,
            gpu_remediation_api::constants::CHECKPOINTED_ANNOTATION
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{drain::Notice, test_fixtures::at};

    fn pod(name: &str, notice: Notice) -> Leaving {
        Leaving {
            notice,
            ..crate::test_fixtures::leaving(name, "train")
        }
    }

    const WANTED: Notice = Notice {
        wanted: true,
        given: false,
        acknowledged: false,
    };

    fn plan() -> Plan {
        Plan {
            leaving: vec![
                pod("plain", Notice::default()),
                pod("member", WANTED),
                pod(
                    "told",
                    Notice {
                        given: true,
                        ..WANTED
                    },
                ),
                pod(
                    "done",
                    Notice {
                        given: true,
                        acknowledged: true,
                        ..WANTED
                    },
                ),
            ],
            staying: Vec::new(),
        }
    }

    const MINUTE: std::time::Duration = std::time::Duration::from_secs(60);

    #[test]
    fn only_pods_wanting_a_notice_and_not_given_one_get_it_and_none_without_a_notice() {
        let names = |pods: Vec<Leaving>| pods.into_iter().map(|p| p.name).collect::<Vec<_>>();
        assert_eq!(names(to_give(&plan(), MINUTE, &BTreeSet::new())), ["member"]);
        let given_now: BTreeSet<String> = ["uid-member".to_owned()].into();
        assert!(
            to_give(&plan(), MINUTE, &given_now).is_empty(),
            "never given twice"
        );
        assert!(to_give(&plan(), std::time::Duration::ZERO, &BTreeSet::new()).is_empty());
    }

    #[test]
    fn a_noticed_pod_waits_until_the_window_closes_or_it_checkpoints() {
        let window = Window::of(Some(at(0)), true, MINUTE, at(10));
        assert_eq!(window.until, at(60));
        let plan = plan();
        let waiting = |now| {
            plan.leaving
                .iter()
                .filter(|p| waits(p, &window, &["uid-member".to_owned()].into(), now))
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            waiting(at(59)),
            ["member", "told"],
            "plain never waits, done checkpointed"
        );
        assert!(
            waiting(at(60)).is_empty(),
            "the window closed: every pod is evicted"
        );
    }

    #[test]
    fn a_pass_gives_the_notice_first_then_evicts_all_but_the_waiting_and_a_refused_notice_none() {
        let none = BTreeSet::new();
        let Step::Give { pods, evict_at } = step(&plan(), MINUTE, None, (&none, &none), at(5)) else {
            panic!("the notice goes first");
        };
        assert_eq!((pods.len(), evict_at), (1, at(65)));
        let noticed: BTreeSet<String> = ["uid-member".to_owned()].into();
        let refused: BTreeSet<String> = ["uid-member".to_owned()].into();
        let Step::Evict { window, waiting } = step(&plan(), MINUTE, Some(at(5)), (&noticed, &none), at(6))
        else {
            panic!("nothing left to give");
        };
        assert_eq!(window.until, at(65));
        let names: Vec<&str> = waiting.iter().map(String::as_str).collect();
        assert_eq!(names, ["uid-member", "uid-told"]);
        // The member's notice refused: it is not given again and waits for nothing.
        let Step::Evict { waiting, .. } = step(&plan(), MINUTE, Some(at(5)), (&none, &refused), at(6)) else {
            panic!("a refused notice is not asked again");
        };
        let names: Vec<&str> = waiting.iter().map(String::as_str).collect();
        assert_eq!(names, ["uid-told"]);
        assert!(said(&window, &BTreeSet::new()).is_none());
        let zero = step(&plan(), std::time::Duration::ZERO, None, (&none, &none), at(5));
        assert_eq!(
            zero,
            Step::Evict {
                window: Window {
                    since: None,
                    until: at(5)
                },
                waiting: BTreeSet::new()
            },
            "no notice configured: nothing waits, even a pod an earlier policy noticed"
        );
    }

    #[test]
    fn the_window_starts_at_the_recorded_notice_or_now_and_a_pod_cannot_stretch_it() {
        assert_eq!(Window::of(None, true, MINUTE, at(5)).since, Some(at(5)));
        let none = Window::of(None, false, MINUTE, at(5));
        assert_eq!(none.since, None);
        assert!(
            !waits(&plan().leaving[2], &none, &BTreeSet::new(), at(6)),
            "no notice went out"
        );
        // The recorded start holds whatever time the pod's own annotation claims.
        assert_eq!(Window::of(Some(at(0)), true, MINUTE, at(30)).until, at(60));
    }
}
