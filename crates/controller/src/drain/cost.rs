//! What a drain costs in GPU time: the GPUs a pod asks for, the GPU-seconds its eviction adds to
//! its drain's cost (`status.drain.gpuSeconds`), and the cost summed over a policy's records
//! (`status.drainGpuSeconds`). Pure; the drain's decision adds, the policy's status sums.
//!
//! The clock starts at the fault ([`fault_began`]): a gang whose member's GPU fell off the bus
//! stalls from then on, so the detection, the trigger's `for` and the drain all count. The fault's
//! time is the node's word (its condition's `lastTransitionTime`), so it is bounded: never after
//! the record's admission (the server's clock), never more than [`LOOKBACK`] before it.

use std::sync::Arc;

use gpu_remediation_api::GpuRemediation;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;

/// The GPUs `pod` asks for: `nvidia.com/gpu` in each container's limits (or its requests: for an
/// extended resource they are equal), summed over its containers, or the largest init
/// container's if that is more (the scheduler's rule for a pod's effective request). A value that
/// is not a whole number counts as none. GPUs from DRA claims are not counted.
#[must_use]
pub fn gpus_requested(pod: &Pod) -> u32 {
    let Some(spec) = pod.spec.as_ref() else { return 0 };
    let gpus = gpu_remediation_api::pod_gpus::of_container;
    let running = spec.containers.iter().map(gpus).fold(0, u32::saturating_add);
    let init = spec.init_containers.iter().flatten().map(gpus).max().unwrap_or(0);
    running.max(init)
}

/// The furthest before its record's admission a fault's start is taken to be.
pub const LOOKBACK: jiff::SignedDuration = jiff::SignedDuration::from_mins(15);

/// When `remediation`'s fault began, for its cost: its trigger's `since`, bounded to the
/// [`LOOKBACK`] before the record's admission (`creationTimestamp`; `now` for a record not yet
/// stored) and the admission itself; the admission where the trigger has no time.
#[must_use]
pub fn fault_began(remediation: &GpuRemediation, now: Timestamp) -> Timestamp {
    let admitted = remediation
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(now, |t| t.0);
    let earliest = admitted.checked_sub(LOOKBACK).unwrap_or(admitted);
    remediation
        .spec
        .trigger
        .since
        .as_ref()
        .map_or(admitted, |since| since.0.clamp(earliest, admitted))
}

/// The GPU-seconds an eviction of a pod asking for `gpus` GPUs, accepted at `now`, adds to its
/// drain's cost: the GPUs times the time since the fault began, rounded to the nearest second
/// (never negative).
#[must_use]
pub fn of_eviction(gpus: u32, fault_began: Timestamp, now: Timestamp) -> u64 {
    let held = now.duration_since(fault_began).as_millis().max(0);
    let gpu_millis = i128::from(gpus).saturating_mul(held);
    u64::try_from((gpu_millis + 500) / 1000).unwrap_or(u64::MAX)
}

/// The GPU-seconds `policy`'s drains cost, summed over its remediations on record.
#[must_use]
pub fn on_record(policy: &str, remediations: &[Arc<GpuRemediation>]) -> u64 {
    remediations
        .iter()
        .filter(|r| r.spec.policy_name == policy)
        .filter_map(|r| r.status.as_ref()?.drain.as_ref().map(|d| d.gpu_seconds))
        .fold(0, u64::saturating_add)
}

#[cfg(test)]
mod tests {
    use gpu_remediation_api::{GpuRemediationStatus, constants::GPU_RESOURCE, remediation::DrainStatus};
    use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    use super::*;
    use crate::test_fixtures::at;

    fn container(limit: Option<&str>, request: Option<&str>) -> Container {
        let list = |v: Option<&str>| v.map(|v| [(GPU_RESOURCE.to_owned(), Quantity(v.to_owned()))].into());
        Container {
            resources: Some(ResourceRequirements {
                limits: list(limit),
                requests: list(request),
                ..ResourceRequirements::default()
            }),
            ..Container::default()
        }
    }

    fn pod(containers: Vec<Container>, init: Vec<Container>) -> Pod {
        Pod {
            spec: Some(PodSpec {
                containers,
                init_containers: Some(init),
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    #[test]
    fn a_pods_gpus_are_its_containers_summed_or_its_largest_init_container() {
        let two_and_six = vec![container(Some("2"), None), container(None, Some("6"))];
        assert_eq!(gpus_requested(&pod(two_and_six.clone(), Vec::new())), 8);
        assert_eq!(
            gpus_requested(&pod(two_and_six, vec![container(Some("9"), None)])),
            9
        );
        assert_eq!(gpus_requested(&pod(vec![container(None, None)], Vec::new())), 0);
        // Not a whole number of GPUs: none counted, not a guess.
        assert_eq!(
            gpus_requested(&pod(vec![container(Some("500m"), None)], Vec::new())),
            0
        );
        assert_eq!(gpus_requested(&Pod::default()), 0);
    }

    #[test]
    fn an_eviction_costs_its_gpus_times_the_time_since_the_fault_and_never_less_than_nothing() {
        assert_eq!(of_eviction(8, at(10), at(40)), 240);
        assert_eq!(of_eviction(0, at(10), at(40)), 0);
        // Under a second is not nothing: 8 GPUs for 0.4 s are 3 GPU-seconds (3.2, rounded).
        let later = at(10)
            .checked_add(jiff::SignedDuration::from_millis(400))
            .unwrap();
        assert_eq!(of_eviction(8, at(10), later), 3);
        // A clock behind the fault costs nothing rather than wrapping.
        assert_eq!(of_eviction(8, at(40), at(10)), 0);
    }

    #[test]
    fn the_faults_start_is_the_nodes_word_bounded_by_the_admission_and_the_lookback() {
        let record = |since: Option<Timestamp>| {
            let mut r = crate::test_fixtures::remediation(
                "r",
                "n",
                "p",
                since,
                gpu_remediation_api::policy::Action::Reboot,
            );
            r.metadata.creation_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at(3600)));
            r
        };
        assert_eq!(fault_began(&record(Some(at(3590))), at(4000)), at(3590));
        // From the future (a node's clock ahead): the admission.
        assert_eq!(fault_began(&record(Some(at(9999))), at(4000)), at(3600));
        // Back-dated past the lookback: 15 minutes before the admission.
        assert_eq!(fault_began(&record(Some(at(0))), at(4000)), at(3600 - 900));
        assert_eq!(fault_began(&record(None), at(4000)), at(3600));
        // Not stored yet: `now` stands for the admission.
        let mut unstored = record(Some(at(3590)));
        unstored.metadata.creation_timestamp = None;
        assert_eq!(fault_began(&unstored, at(3595)), at(3590));
    }

    #[test]
    fn a_policys_cost_sums_its_own_records_only() {
        let record = |policy: &str, seconds: u64| {
            let mut r = crate::test_fixtures::remediation(
                "r",
                "n",
                policy,
                Some(at(0)),
                gpu_remediation_api::policy::Action::Reboot,
            );
            r.status = Some(GpuRemediationStatus {
                drain: Some(DrainStatus {
                    gpu_seconds: seconds,
                    ..DrainStatus::default()
                }),
                ..GpuRemediationStatus::default()
            });
            Arc::new(r)
        };
        let records = [record("a", 100), record("b", 7), record("a", 20)];
        assert_eq!(on_record("a", &records), 120);
        assert_eq!(on_record("c", &records), 0);
    }
}
