//! A policy's status as this replica last wrote it, and the counts-only changes it holds back: the
//! writer's memory of its own policy status writes, so that the plan of a pass that runs before the
//! watch shows a write compares against that write (and does not announce or write it again), and a
//! change of counts alone waits (see [`crate::policy_status::verdict`]).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
};

use gpu_remediation_api::{GpuRemediationPolicy, policy::GpuRemediationPolicyStatus};
use jiff::Timestamp;
use kube::ResourceExt as _;

use super::{WriteStatusError, Writer};
use crate::policy_status::{self, Verdict};

/// What the writer remembers of its policy status writes (shared by its clones).
#[derive(Clone, Debug, Default)]
pub struct PolicyStatusMemory {
    inner: Arc<Mutex<Memory>>,
}

#[derive(Debug, Default)]
struct Memory {
    /// Each policy's status as last written, with the version it was written over.
    written: HashMap<String, WrittenStatus>,
    /// Since when each policy's planned status has differed from the server's in counts only.
    counts_held: HashMap<String, Timestamp>,
}

/// A policy status this replica wrote, and the policy's version it was written over.
#[derive(Clone, Debug)]
struct WrittenStatus {
    /// The policy's `resourceVersion` the write was made over (what the cache held).
    over: Option<String>,
    /// The status written.
    status: GpuRemediationPolicyStatus,
}

impl PolicyStatusMemory {
    fn lock(&self) -> std::sync::MutexGuard<'_, Memory> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Writer {
    /// Writes the policy's planned status unless the server has it (`policy` as this replica last
    /// wrote it, see [`Writer::policy_as_written`]), or it changes counts only and is held:
    /// returns until when.
    pub async fn write_policy_status_unless_held(
        &self,
        policy: &GpuRemediationPolicy,
        planned: &GpuRemediationPolicyStatus,
    ) -> Result<Option<Timestamp>, WriteStatusError> {
        let name = policy.name_any();
        let now = Timestamp::now();
        let since = self.policy_status.lock().counts_held.get(&name).copied();
        match policy_status::verdict(policy.status.as_ref(), planned, since, now) {
            Verdict::Unchanged => {
                self.policy_status.lock().counts_held.remove(&name);
                Ok(None)
            }
            Verdict::HoldUntil(due) => {
                self.policy_status
                    .lock()
                    .counts_held
                    .insert(name, since.unwrap_or(now));
                Ok(Some(due))
            }
            Verdict::Write => {
                self.write_policy_status(policy, planned).await?;
                let mut memory = self.policy_status.lock();
                memory.counts_held.remove(&name);
                let written = WrittenStatus {
                    over: policy.resource_version(),
                    status: planned.clone(),
                };
                memory.written.insert(name, written);
                Ok(None)
            }
        }
    }

    /// `cached` as the server has it: with the status this replica last wrote over that very
    /// version, if the watch has not shown the write yet. The plan compares its decisions (the
    /// circuit, the held domains, the waiting nodes) with the policy's status to announce each
    /// change once; planned from the cached status alone, a pass that ran before the watch caught
    /// up announced them again.
    #[must_use]
    pub fn policy_as_written(&self, cached: &Arc<GpuRemediationPolicy>) -> Arc<GpuRemediationPolicy> {
        let memory = self.policy_status.lock();
        overlaid(cached, memory.written.get(&cached.name_any()))
    }
}

fn overlaid(
    cached: &Arc<GpuRemediationPolicy>,
    written: Option<&WrittenStatus>,
) -> Arc<GpuRemediationPolicy> {
    match written {
        Some(w) if w.over == cached.resource_version() && cached.status.as_ref() != Some(&w.status) => {
            let mut policy = GpuRemediationPolicy::clone(cached);
            policy.status = Some(w.status.clone());
            Arc::new(policy)
        }
        _ => Arc::clone(cached),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(version: &str, in_flight: u32) -> GpuRemediationPolicy {
        let mut policy: GpuRemediationPolicy = serde_json::from_value(serde_json::json!({
            "apiVersion": "gpuremediation.dev/v1alpha1",
            "kind": "GpuRemediationPolicy",
            "metadata": {"name": "p", "resourceVersion": version},
            "spec": {
                "nodeSelector": {},
                "triggers": [{"conditionType": "GpuHealthy", "status": "False", "for": "1s"}],
            },
        }))
        .expect("a valid policy");
        policy.status = Some(status(in_flight));
        policy
    }

    fn status(in_flight: u32) -> GpuRemediationPolicyStatus {
        GpuRemediationPolicyStatus {
            in_flight,
            ..GpuRemediationPolicyStatus::default()
        }
    }

    #[test]
    fn a_pass_before_the_watch_shows_the_last_status_write_plans_and_writes_from_that_write() {
        let cached = Arc::new(policy("7", 0));
        let server = |written: Option<&WrittenStatus>| overlaid(&cached, written).status.clone();
        assert_eq!(server(None), Some(status(0)), "the server has what the cache has");
        let written = WrittenStatus {
            over: Some("7".into()),
            status: status(1),
        };
        assert_eq!(
            server(Some(&written)),
            Some(status(1)),
            "written over this very version: the watch has not shown it yet (not written again)"
        );
        assert_ne!(
            server(Some(&written)),
            Some(status(2)),
            "a different status is written"
        );
        // The watch has delivered a later version: that is what the server has.
        let later = Arc::new(policy("9", 0));
        assert_eq!(
            overlaid(&later, Some(&written)).status,
            Some(status(0)),
            "someone wrote the policy since: theirs is compared"
        );
    }
}
