//! How many GPUs a container asks for through the device plugin (`nvidia.com/gpu`): the one
//! reading the controller (a drain's GPU-seconds) and the sandbox's device plugin share.

use k8s_openapi::api::core::v1::Container;

use crate::constants::GPU_RESOURCE;

/// The `nvidia.com/gpu` `container` asks for: its limit, else its request (for an extended
/// resource they are equal). A value that is not a whole number counts as none.
#[must_use]
pub fn of_container(container: &Container) -> u32 {
    let resources = container.resources.as_ref();
    resources
        .and_then(|r| r.limits.as_ref())
        .and_then(|l| l.get(GPU_RESOURCE))
        .or_else(|| {
            resources
                .and_then(|r| r.requests.as_ref())
                .and_then(|r| r.get(GPU_RESOURCE))
        })
        .and_then(|q| q.0.parse::<u32>().ok())
        .unwrap_or(0)
}
