//! The device plugin's GPU assignment as the agent publishes it on its own node, in the
//! `gpuremediation.dev/gpu-pods` annotation: which pod holds which GPU, read from the kubelet's
//! pod-resources API (`v1.PodResourcesLister/List`), and when it was read. The controller reads it
//! to drain, for a GPU reset, only the device-plugin pods holding the failed GPU. Pure: the
//! annotation's shape, its bound, and its spelling.
//!
//! ```json
//! {"readAt":"2026-11-30T22:00:00Z","pods":[
//!   {"namespace":"train","name":"worker-3","gpus":["GPU-5c1e..."]},
//!   {"namespace":"infer","name":"small-0","gpus":["GPU-2b7e...","MIG-9a7f..."]}]}
//! ```
//!
//! The kubelet's pod-resources API names pods by namespace and name only (no UID), and the agent
//! reads no pods from the API server: a pod created after `readAt` is not covered by the
//! assignment (its name may be a new pod's). A MIG device is listed by its own UUID and its parent
//! GPU's (the agent's own read of the GPUs ties them; the kubelet does not say). Devices the agent
//! cannot tie to a GPU UUID are listed as `unmapped`, so a reader knows the mapping is incomplete
//! rather than guessing.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::{Deserialize, Serialize};

/// The annotation's name.
pub use crate::constants::GPU_PODS_ANNOTATION;

/// The longest annotation the agent writes (and its admission policy accepts), in bytes: 8 GPUs
/// each shared by a few pods fit many times over. Pods past it are left out and counted in
/// `omitted`.
pub const GPU_PODS_MAX_BYTES: usize = 16_384;
/// How old an assignment may be and still be trusted: the agent re-stamps it at every resync (5
/// minutes by default) and whenever it changes, so an older one means the agent stopped reading.
pub const GPU_PODS_MAX_AGE_SECONDS: i64 = 900;

/// How far the node's clock (which stamps `readAt`) may be behind the API server's (which stamps a
/// pod's creation): a reader counts a pod created this close before a read as created after it.
pub const GPU_PODS_CLOCK_SLACK_SECONDS: i64 = 5;
/// How long after the assignment changed the agent stamps it once more, so a pod seen within
/// [`GPU_PODS_CLOCK_SLACK_SECONDS`] of its creation is covered seconds later, not only at the next
/// resync. Longer than the slack.
pub const GPU_PODS_SETTLE_SECONDS: i64 = 2 * GPU_PODS_CLOCK_SLACK_SECONDS;

/// The assignment: every pod on the node holding a device of an `nvidia.com/...` resource.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuPods {
    /// When the agent read the kubelet's pod resources (the node's clock).
    pub read_at: Time,
    /// The pods, sorted by namespace and name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pods: Vec<PodDevices>,
    /// Pods left out to keep the annotation within [`GPU_PODS_MAX_BYTES`].
    #[serde(default, skip_serializing_if = "crate::is_default")]
    pub omitted: u32,
}

/// One pod's devices.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodDevices {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The UUIDs of the GPUs it holds, sorted: a whole GPU's, or a MIG device's (`MIG-...`) and its
    /// parent GPU's, so a fault on the whole GPU reaches it and a fault on another MIG device of that
    /// GPU does not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<String>,
    /// Devices not tied to a GPU UUID, as `<resource>=<device ID>`, sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unmapped: Vec<String>,
}

impl GpuPods {
    /// The annotation's text: pods past [`GPU_PODS_MAX_BYTES`] are dropped from the end and
    /// counted in `omitted`.
    #[must_use]
    pub fn to_annotation(&self) -> String {
        let mut bounded = self.clone();
        loop {
            let text = serde_json::to_string(&bounded).unwrap_or_default();
            if text.len() <= GPU_PODS_MAX_BYTES || bounded.pods.is_empty() {
                return text;
            }
            bounded.pods.pop();
            bounded.omitted = bounded.omitted.saturating_add(1);
        }
    }

    /// Reads the annotation's text.
    pub fn parse(text: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(text)
    }

    /// The same pods (and omissions), ignoring when they were read.
    #[must_use]
    pub fn same_pods(&self, other: &Self) -> bool {
        self.pods == other.pods && self.omitted == other.omitted
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::jiff::Timestamp;

    use super::*;

    fn pod(i: usize) -> PodDevices {
        PodDevices {
            namespace: "train".into(),
            name: format!("worker-{i:04}"),
            gpus: vec![format!("GPU-{i:08}-aaaa-bbbb-cccc-dddddddddddd")],
            unmapped: Vec::new(),
        }
    }

    #[test]
    fn an_assignment_reads_back_as_written() {
        let pods = GpuPods {
            read_at: Time(Timestamp::from_second(1_800_000_000).unwrap()),
            pods: vec![pod(1), pod(2)],
            omitted: 0,
        };
        let text = pods.to_annotation();
        assert!(
            text.starts_with(r#"{"readAt":"2027-01-15T08:00:00Z","pods":[{"namespace":"train""#),
            "{text}"
        );
        assert_eq!(GpuPods::parse(&text).unwrap(), pods);
    }

    #[test]
    fn pods_past_the_bound_are_left_out_and_counted() {
        let pods = GpuPods {
            read_at: Time(Timestamp::from_second(1_800_000_000).unwrap()),
            pods: (0..1000).map(pod).collect(),
            omitted: 0,
        };
        let text = pods.to_annotation();
        assert!(text.len() <= GPU_PODS_MAX_BYTES);
        let read = GpuPods::parse(&text).unwrap();
        assert!(read.omitted > 0);
        assert_eq!(read.pods.len() + read.omitted as usize, 1000);
        assert_eq!(read.pods[0], pod(0), "the first pods are kept");
    }

    #[test]
    fn two_readings_of_the_same_pods_at_different_times_are_the_same_pods() {
        let at = |s| Time(Timestamp::from_second(s).unwrap());
        let a = GpuPods {
            read_at: at(1_800_000_000),
            pods: vec![pod(1)],
            omitted: 0,
        };
        let mut b = a.clone();
        b.read_at = at(1_800_000_600);
        assert!(a.same_pods(&b));
        b.pods.push(pod(2));
        assert!(!a.same_pods(&b));
    }
}
