//! What decisions read of a node's status, whether a `Node` read from the server holds it or the
//! cache: its conditions ([`NodeConditions`], each a [`NodeConditionRef`]) and its `nodeInfo`
//! ([`NodeInfoRef`]); and the cache's shape of both ([`CachedCondition`], [`CachedNodeInfo`]):
//! the texts a fleet repeats (condition types, statuses, reasons and messages; kernel, kubelet, OS
//! image and runtime) shared fleet-wide through [`SharedText`], a condition's heartbeat time and
//! the `nodeInfo` fields no decision reads not kept.

use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::{
    api::core::v1::{NodeCondition, NodeSystemInfo},
    apimachinery::pkg::apis::meta::v1::Time,
};

use super::shared_text::SharedText;

/// One condition of a node, as decisions read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeConditionRef<'a> {
    /// `type`.
    pub type_: &'a str,
    /// `status`: `True`, `False` or `Unknown` as the writer sent it.
    pub status: &'a str,
    /// `reason`.
    pub reason: Option<&'a str>,
    /// `message`.
    pub message: Option<&'a str>,
    /// `lastTransitionTime`, as the writer set it.
    pub last_transition_time: Option<Timestamp>,
}

impl<'a> From<&'a NodeCondition> for NodeConditionRef<'a> {
    fn from(c: &'a NodeCondition) -> Self {
        Self {
            type_: &c.type_,
            status: &c.status,
            reason: c.reason.as_deref(),
            message: c.message.as_deref(),
            last_transition_time: c.last_transition_time.as_ref().map(|t| t.0),
        }
    }
}

impl<'a> From<&'a CachedCondition> for NodeConditionRef<'a> {
    fn from(c: &'a CachedCondition) -> Self {
        Self {
            type_: &c.type_,
            status: &c.status,
            reason: c.reason.as_deref(),
            message: c.message.as_deref(),
            last_transition_time: c.last_transition_time,
        }
    }
}

/// A node's conditions, in the order the node lists them.
#[derive(Clone, Copy, Debug)]
pub enum NodeConditions<'a> {
    /// As a `Node` holds them.
    Full(&'a [NodeCondition]),
    /// As the cache keeps them.
    Cached(&'a [CachedCondition]),
}

impl<'a> NodeConditions<'a> {
    /// Each condition.
    pub fn iter(self) -> impl Iterator<Item = NodeConditionRef<'a>> + Clone + 'a {
        let (full, cached) = match self {
            Self::Full(full) => (full, &[][..]),
            Self::Cached(cached) => (&[][..], cached),
        };
        full.iter()
            .map(NodeConditionRef::from)
            .chain(cached.iter().map(NodeConditionRef::from))
    }

    /// The condition of type `type_`, if there is one.
    #[must_use]
    pub fn get(self, type_: &str) -> Option<NodeConditionRef<'a>> {
        self.iter().find(|c| c.type_ == type_)
    }
}

impl<'a> From<&'a [NodeCondition]> for NodeConditions<'a> {
    fn from(conditions: &'a [NodeCondition]) -> Self {
        Self::Full(conditions)
    }
}

impl<'a, const N: usize> From<&'a [NodeCondition; N]> for NodeConditions<'a> {
    fn from(conditions: &'a [NodeCondition; N]) -> Self {
        Self::Full(conditions)
    }
}

/// A condition as the cache keeps it: four shared texts and a time, no text of its own where
/// other nodes say the same.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedCondition {
    type_: Arc<str>,
    status: Arc<str>,
    reason: Option<Arc<str>>,
    message: Option<Arc<str>>,
    last_transition_time: Option<Timestamp>,
}

impl CachedCondition {
    /// `condition` without its heartbeat time, its texts shared through `texts`.
    pub fn new(condition: &NodeCondition, texts: &mut SharedText) -> Self {
        Self {
            type_: texts.share(&condition.type_),
            status: texts.share(&condition.status),
            reason: condition.reason.as_deref().map(|r| texts.share(r)),
            message: condition.message.as_deref().map(|m| texts.share(m)),
            last_transition_time: condition.last_transition_time.as_ref().map(|t| t.0),
        }
    }

    /// The condition as a `Node` holds it (without a heartbeat time, as the cache keeps it).
    #[must_use]
    pub fn to_condition(&self) -> NodeCondition {
        NodeCondition {
            type_: self.type_.to_string(),
            status: self.status.to_string(),
            reason: self.reason.as_deref().map(str::to_owned),
            message: self.message.as_deref().map(str::to_owned),
            last_transition_time: self.last_transition_time.map(Time),
            last_heartbeat_time: None,
        }
    }
}

/// The `nodeInfo` fields decisions read: the system UUID identifies the host for the hardware
/// ledger, the boot ID proves a ladder's reboot, and `safety.suspect` may name the kernel, kubelet,
/// OS image or runtime (`fleet::suspects`). Empty where the kubelet sent nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeInfoRef<'a> {
    /// `systemUUID`.
    pub system_uuid: &'a str,
    /// `bootID`.
    pub boot_id: &'a str,
    /// `kernelVersion`.
    pub kernel_version: &'a str,
    /// `kubeletVersion`.
    pub kubelet_version: &'a str,
    /// `osImage`.
    pub os_image: &'a str,
    /// `containerRuntimeVersion`.
    pub container_runtime_version: &'a str,
}

impl<'a> From<&'a NodeSystemInfo> for NodeInfoRef<'a> {
    fn from(info: &'a NodeSystemInfo) -> Self {
        Self {
            system_uuid: &info.system_uuid,
            boot_id: &info.boot_id,
            kernel_version: &info.kernel_version,
            kubelet_version: &info.kubelet_version,
            os_image: &info.os_image,
            container_runtime_version: &info.container_runtime_version,
        }
    }
}

impl<'a> From<&'a CachedNodeInfo> for NodeInfoRef<'a> {
    fn from(info: &'a CachedNodeInfo) -> Self {
        Self {
            system_uuid: &info.system_uuid,
            boot_id: &info.boot_id,
            kernel_version: &info.kernel_version,
            kubelet_version: &info.kubelet_version,
            os_image: &info.os_image,
            container_runtime_version: &info.container_runtime_version,
        }
    }
}

/// The `nodeInfo` fields decisions read, as the cache keeps them: the host's own two, and the four
/// a fleet shares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedNodeInfo {
    system_uuid: Box<str>,
    boot_id: Box<str>,
    kernel_version: Arc<str>,
    kubelet_version: Arc<str>,
    os_image: Arc<str>,
    container_runtime_version: Arc<str>,
}

impl CachedNodeInfo {
    /// The fields of `info` decisions read, the shared ones through `texts`.
    pub fn new(info: &NodeSystemInfo, texts: &mut SharedText) -> Self {
        Self {
            system_uuid: info.system_uuid.as_str().into(),
            boot_id: info.boot_id.as_str().into(),
            kernel_version: texts.share(&info.kernel_version),
            kubelet_version: texts.share(&info.kubelet_version),
            os_image: texts.share(&info.os_image),
            container_runtime_version: texts.share(&info.container_runtime_version),
        }
    }

    /// The fields as a `Node` holds them (the others empty, as the cache keeps them).
    #[must_use]
    pub fn to_info(&self) -> NodeSystemInfo {
        NodeSystemInfo {
            system_uuid: self.system_uuid.to_string(),
            boot_id: self.boot_id.to_string(),
            kernel_version: self.kernel_version.to_string(),
            kubelet_version: self.kubelet_version.to_string(),
            os_image: self.os_image.to_string(),
            container_runtime_version: self.container_runtime_version.to_string(),
            ..NodeSystemInfo::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn condition(type_: &str, message: Option<&str>, at: Option<i64>) -> NodeCondition {
        NodeCondition {
            type_: type_.into(),
            status: "False".into(),
            reason: Some("KubeletHasSufficientMemory".into()),
            message: message.map(str::to_owned),
            last_transition_time: at.map(|s| Time(Timestamp::from_second(s).expect("a time"))),
            last_heartbeat_time: Some(Time(Timestamp::UNIX_EPOCH)),
        }
    }

    #[test]
    fn a_cached_condition_reads_as_the_condition_and_shares_its_texts() {
        let mut texts = SharedText::default();
        let full = [
            condition(
                "MemoryPressure",
                Some("kubelet has sufficient memory available"),
                Some(7),
            ),
            condition("DiskPressure", None, None),
        ];
        let cached: Vec<CachedCondition> = full.iter().map(|c| CachedCondition::new(c, &mut texts)).collect();
        assert!(
            NodeConditions::from(&full)
                .iter()
                .eq(NodeConditions::Cached(&cached).iter())
        );
        assert_eq!(
            NodeConditions::Cached(&cached)
                .get("DiskPressure")
                .map(|c| c.message),
            Some(None)
        );
        assert!(NodeConditions::Cached(&cached).get("Ready").is_none());
        let mut without_heartbeat = full[0].clone();
        without_heartbeat.last_heartbeat_time = None;
        assert_eq!(cached[0].to_condition(), without_heartbeat);

        let again = CachedCondition::new(&full[0], &mut texts);
        assert!(Arc::ptr_eq(
            &again.reason.expect("a reason"),
            cached[0].reason.as_ref().expect("a reason")
        ));
        assert!(
            Arc::ptr_eq(&again.status, &cached[1].status),
            "one status text for both"
        );
    }
}
