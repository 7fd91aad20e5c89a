//! The GPU count a DRA-only node promises. With the GPU Operator's DRA mode (no device plugin, no
//! GPU Feature Discovery) a node carries no `nvidia.com/gpu.count` label; its GPUs are published as
//! devices of the NVIDIA DRA driver (`gpu.nvidia.com`) in the node's `ResourceSlice`s. The agent
//! then expects the whole GPUs those slices list, so a GPU missing at start-up is still seen.
//!
//! [`count`] is pure: the complete newest generation of each of the node's pools, whole GPUs only
//! (a device whose `type` attribute is absent or `gpu`; MIG and other partitions are not GPUs of
//! their own), bounded by [`MAX_GPUS`]. A pool whose newest generation is not all published yet, or
//! a count past the bound, is no count (the agent says why and expects nothing, as without a label).
//! The flag and the label come first (`Agent::expected`).

use std::collections::BTreeMap;

use serde_json::Value;

/// The NVIDIA DRA driver's name, the default `--dra-driver`.
pub const DEFAULT_DRIVER: &str = "gpu.nvidia.com";

/// The most GPUs a node's slices may promise (an NVL72 tray has 4, an HGX board 8): more is a
/// slice that cannot be right.
pub const MAX_GPUS: u32 = 64;

/// The whole GPUs `driver`'s devices in `node`'s `ResourceSlice`s (as JSON objects, as listed)
/// promise: `Ok(None)` where no slice of the driver is there, an error naming the pool or the
/// bound where the slices give no trustworthy count.
pub fn count(slices: &[Value], node: &str, driver: &str) -> Result<Option<u32>, String> {
    // Per pool: its newest generation, the slices of it seen, how many it says it has, its GPUs.
    let mut pools: BTreeMap<&str, (i64, u64, u64, u32)> = BTreeMap::new();
    for slice in slices {
        let spec = &slice["spec"];
        if spec["nodeName"] != node || spec["driver"] != driver {
            continue;
        }
        let pool = spec["pool"]["name"].as_str().unwrap_or_default();
        let generation = spec["pool"]["generation"].as_i64().unwrap_or(0);
        let expected_slices = spec["pool"]["resourceSliceCount"].as_u64().unwrap_or(1);
        let gpus = spec["devices"]
            .as_array()
            .map_or(0, |devices| devices.iter().filter(|d| is_whole_gpu(d)).count());
        let gpus = u32::try_from(gpus).unwrap_or(u32::MAX);
        let entry = pools.entry(pool).or_insert((generation, 0, expected_slices, 0));
        if generation > entry.0 {
            *entry = (generation, 0, expected_slices, 0);
        }
        if generation == entry.0 {
            entry.1 += 1;
            entry.3 = entry.3.saturating_add(gpus);
        }
    }
    if pools.is_empty() {
        return Ok(None);
    }
    let mut total = 0_u32;
    for (pool, (generation, seen, expected, gpus)) in pools {
        if seen < expected {
            return Err(format!(
                "pool {pool:?} of driver {driver}: {seen} of its {expected} slices of generation {generation} \
                 published"
            ));
        }
        total = total.saturating_add(gpus);
    }
    if total > MAX_GPUS {
        return Err(format!(
            "driver {driver}'s slices list {total} GPUs on this node, more than the {MAX_GPUS} any node has"
        ));
    }
    Ok(Some(total))
}

/// A device that is a whole GPU: its `type` attribute absent or the string `gpu`.
fn is_whole_gpu(device: &Value) -> bool {
    match &device["attributes"]["type"] {
        Value::Null => true,
        kind => kind["string"] == "gpu",
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn slice(node: &str, pool: &str, generation: i64, of: u64, devices: &[Value]) -> Value {
        json!({"spec": {
            "nodeName": node, "driver": DEFAULT_DRIVER,
            "pool": {"name": pool, "generation": generation, "resourceSliceCount": of},
            "devices": devices,
        }})
    }

    fn gpu(kind: Option<&str>) -> Value {
        match kind {
            Some(kind) => json!({"name": "d", "attributes": {"type": {"string": kind}}}),
            None => json!({"name": "d", "attributes": {"uuid": {"string": "GPU-1"}}}),
        }
    }

    #[test]
    fn whole_gpus_of_the_nodes_pools_are_counted_and_partitions_are_not() {
        let slices = [
            slice(
                "n",
                "n-pool",
                1,
                1,
                &[gpu(Some("gpu")), gpu(None), gpu(Some("mig")), gpu(Some("gpu"))],
            ),
            slice("n", "n-other", 3, 1, &[gpu(Some("gpu"))]),
            slice("m", "m-pool", 1, 1, &vec![gpu(None); 8]),
        ];
        assert_eq!(count(&slices, "n", DEFAULT_DRIVER), Ok(Some(4)));
        assert_eq!(count(&slices, "m", DEFAULT_DRIVER), Ok(Some(8)));
    }

    #[test]
    fn no_slice_of_the_driver_is_no_count() {
        let slices = [slice("n", "p", 1, 1, &[gpu(None)])];
        assert_eq!(count(&slices, "n", "other.example.com"), Ok(None));
        assert_eq!(count(&[], "n", DEFAULT_DRIVER), Ok(None));
    }

    #[test]
    fn only_the_newest_generation_counts_and_only_once_all_its_slices_are_there() {
        let old = slice("n", "p", 1, 1, &vec![gpu(None); 8]);
        let new_half = slice("n", "p", 2, 2, &vec![gpu(None); 4]);
        let error = count(&[old.clone(), new_half.clone()], "n", DEFAULT_DRIVER).unwrap_err();
        assert!(error.contains("1 of its 2 slices of generation 2"), "{error}");
        let new_rest = slice("n", "p", 2, 2, &vec![gpu(None); 3]);
        assert_eq!(
            count(&[new_half, old, new_rest], "n", DEFAULT_DRIVER),
            Ok(Some(7))
        );
    }

    #[test]
    fn a_count_past_any_nodes_is_refused() {
        let slices = [slice("n", "p", 1, 1, &vec![gpu(None); 65])];
        let error = count(&slices, "n", DEFAULT_DRIVER).unwrap_err();
        assert!(error.contains("65 GPUs"), "{error}");
    }
}
