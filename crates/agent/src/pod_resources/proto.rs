//! The messages of the kubelet's pod-resources API v1 (`package v1`, service
//! `PodResourcesLister`) that `List` needs, with the field numbers of upstream's `api.proto`
//! (`k8s.io/kubelet/pkg/apis/podresources/v1`). Fields the agent does not read (`cpu_ids`,
//! `memory`, `dynamic_resources`, `topology`) are left out: protobuf decoding skips them.

/// The gRPC path of `List`.
pub const LIST_PATH: &str = "/v1.PodResourcesLister/List";

/// `ListPodResourcesRequest`: empty.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct ListPodResourcesRequest {}

/// `ListPodResourcesResponse`.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct ListPodResourcesResponse {
    /// The node's pods.
    #[prost(message, repeated, tag = "1")]
    pub pod_resources: Vec<PodResources>,
}

/// `PodResources`: one pod (named, no UID).
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct PodResources {
    /// Its name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Its namespace.
    #[prost(string, tag = "2")]
    pub namespace: String,
    /// Its containers.
    #[prost(message, repeated, tag = "3")]
    pub containers: Vec<ContainerResources>,
}

/// `ContainerResources`: one container.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct ContainerResources {
    /// Its name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// The device-plugin devices allocated to it.
    #[prost(message, repeated, tag = "2")]
    pub devices: Vec<ContainerDevices>,
}

/// `ContainerDevices`: the devices of one resource.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct ContainerDevices {
    /// The extended resource (`nvidia.com/gpu`).
    #[prost(string, tag = "1")]
    pub resource_name: String,
    /// The device IDs as the plugin reported them (GPU UUIDs for NVIDIA's plugin).
    #[prost(string, repeated, tag = "2")]
    pub device_ids: Vec<String>,
}

#[cfg(test)]
mod tests {
    use prost::Message as _;

    use super::*;

    #[test]
    fn a_list_response_with_fields_the_agent_does_not_read_still_decodes() {
        // pod_resources { name "p" namespace "n" containers { name "c" devices { resource_name
        // "nvidia.com/gpu" device_ids "GPU-1" topology {...} } cpu_ids 4 } }, encoded by hand.
        let devices = [
            &[0x0a, 0x0e][..],
            b"nvidia.com/gpu",
            &[0x12, 0x05],
            b"GPU-1",
            &[0x1a, 0x04, 0x0a, 0x02, 0x08, 0x01], // topology { nodes { ID 1 } }
        ]
        .concat();
        let container = [
            &[0x0a, 0x01][..],
            b"c",
            &[0x12, u8::try_from(devices.len()).unwrap()],
            &devices,
            &[0x18, 0x04], // cpu_ids 4
        ]
        .concat();
        let pod = [
            &[0x0a, 0x01][..],
            b"p",
            &[0x12, 0x01],
            b"n",
            &[0x1a, u8::try_from(container.len()).unwrap()],
            &container,
        ]
        .concat();
        let response = [&[0x0a, u8::try_from(pod.len()).unwrap()][..], &pod].concat();
        let decoded = ListPodResourcesResponse::decode(response.as_slice()).unwrap();
        assert_eq!(
            decoded.pod_resources[0].containers[0].devices[0],
            ContainerDevices {
                resource_name: "nvidia.com/gpu".into(),
                device_ids: vec!["GPU-1".into()],
            }
        );
        assert_eq!(
            decoded.encode_to_vec().len() + 2 + 6,
            response.len(),
            "only the unread fields are dropped"
        );
    }
}
