//! Which pod holds which GPU through the device plugin, from the kubelet's pod-resources API
//! (`v1.PodResourcesLister/List` over the unix socket
//! `/var/lib/kubelet/pod-resources/kubelet.sock`), published on the agent's own node as the
//! `gpuremediation.dev/gpu-pods` annotation (`gpu_remediation_api::gpu_pods`) so the controller
//! can drain, for a GPU reset, only the pods holding the failed GPU.
//!
//! - [`proto`]: the few protobuf messages of `k8s.io/kubelet/pkg/apis/podresources/v1/api.proto`
//!   the agent reads, written by hand (no `protoc` at build time);
//! - [`assignment`]: pure: the kubelet's answer and the GPU inventory → the assignment, and the
//!   annotation text to publish (unchanged text when nothing changed, so nothing is written);
//! - [`reader`]: the gRPC call, under a deadline.

pub mod assignment;
pub mod proto;
pub mod reader;
