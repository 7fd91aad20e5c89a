//! This replica's identity on the Lease (and so in its claim, `<identity>/<leaseTransitions>`,
//! and in its Events), chosen once per process (pure: the caller passes what it read of the
//! environment and a random nonce).
//!
//! Two processes must never share an identity, or the second could take the first's claim for its
//! own: a replica that finds its own identity on the Lease takes it at once, without a new
//! `leaseTransitions`, so both would write under the same claim. The process id cannot tell them
//! apart (it is 1 in every container), nor can the pod alone: a pod's name is reused by a
//! `StatefulSet`, and its UID outlives a container restart. So the identity is the pod's name and
//! UID (from the downward API: `POD_NAME`, `POD_UID`) plus a random per-process nonce; outside a
//! pod (no UID), the given name or the host name plus the nonce.

/// An identity and where its name came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The identity written to the Lease.
    pub name: String,
    /// Whether it names a pod (its name and UID were given).
    pub in_pod: bool,
}

/// The identity of a process of pod `pod_name` (UID `pod_uid`) on host `hostname`, with `nonce`.
/// Without a UID it is not in a pod: the given name, else the host name, else `gpu-remediator`,
/// with the nonce.
#[must_use]
pub fn identity(
    pod_name: Option<&str>,
    pod_uid: Option<&str>,
    hostname: Option<&str>,
    nonce: &str,
) -> Identity {
    fn given(value: Option<&str>) -> Option<&str> {
        value.map(str::trim).filter(|value| !value.is_empty())
    }
    match (given(pod_name), given(pod_uid)) {
        (Some(name), Some(uid)) => Identity {
            name: format!("{name}_{uid}_{nonce}"),
            in_pod: true,
        },
        (name, _) => Identity {
            name: format!("{}_{nonce}", name.or(given(hostname)).unwrap_or("gpu-remediator")),
            in_pod: false,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_is_named_by_its_name_and_uid() {
        let id = identity(
            Some("gpu-remediator-7d9f"),
            Some("0b1c-uid"),
            Some("node-a"),
            "n1",
        );
        assert_eq!(id.name, "gpu-remediator-7d9f_0b1c-uid_n1");
        assert!(id.in_pod);
    }

    #[test]
    fn two_pods_of_one_name_differ_by_uid() {
        let first = identity(Some("gpu-remediator-0"), Some("uid-1"), None, "n");
        let second = identity(Some("gpu-remediator-0"), Some("uid-2"), None, "n");
        assert_ne!(first.name, second.name);
    }

    #[test]
    fn a_restarted_container_of_the_same_pod_gets_another_identity() {
        let before = identity(Some("gpu-remediator-0"), Some("uid-1"), None, "first");
        let after = identity(Some("gpu-remediator-0"), Some("uid-1"), None, "second");
        assert_ne!(before.name, after.name);
    }

    #[test]
    fn outside_a_pod_the_name_or_host_name_gets_the_nonce() {
        let named = identity(Some("dev"), None, Some("laptop"), "n");
        assert_eq!(
            named,
            Identity {
                name: "dev_n".into(),
                in_pod: false
            }
        );
        let host = identity(None, Some(""), Some("laptop"), "n");
        assert_eq!(host.name, "laptop_n");
        assert!(!host.in_pod);
        assert_eq!(identity(None, None, None, "n").name, "gpu-remediator_n");
    }
}
