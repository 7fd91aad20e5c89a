//! The labels a GPU node carries on a fleet run by NVIDIA's GPU operator with Node Feature
//! Discovery, on a cloud with Karpenter: GPU Feature Discovery's `nvidia.com/*`, the operator's
//! deploy switches, NFD's CPU flags and kernel, PCI and OS features, the cloud's and the
//! provisioner's; 123 of them, the keys theirs, the values typical. Kept in
//! `crates/sandbox/fixtures/operator-labels.json`, which the controller's
//! `observe::cache_cost_tests` reads too, so the scale bench's labelled fleet and the cache's model
//! of it carry the same labels.

use std::collections::BTreeMap;

/// The labels, by key.
///
/// # Panics
/// Never: the fixture is checked in and checked by this module's test.
#[must_use]
pub fn operator_labels() -> BTreeMap<String, String> {
    serde_json::from_str(include_str!("../../fixtures/operator-labels.json"))
        .expect("fixtures/operator-labels.json is a map of label keys to values")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fixture_holds_a_gpu_operator_nodes_hundred_odd_labels() {
        let labels = operator_labels();
        assert_eq!(labels.len(), 123);
        assert_eq!(labels["nvidia.com/gpu.present"], "true");
        assert!(labels.contains_key("feature.node.kubernetes.io/cpu-cpuid.AVX512F"));
        assert!(labels.contains_key("karpenter.sh/nodepool"));
    }
}
