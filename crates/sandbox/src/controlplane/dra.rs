//! How much of Dynamic Resource Allocation the control plane runs, and the flags that takes on each
//! supported Kubernetes minor: device taints (KEP-5055) were alpha in 1.35 (`DeviceTaintRule` in
//! `resource.k8s.io/v1alpha3`, both gates off), beta in 1.36 (`DRADeviceTaints` on by default,
//! `DRADeviceTaintRules` off, the rule in `v1beta2`, a beta API off by default) and GA in 1.37
//! (`resource.k8s.io/v1`, on by default: the modes without device taints turn it off). Pure.

/// How much of Dynamic Resource Allocation the control plane runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Dra {
    /// The API is served (GA in 1.35) but no controller makes claims from templates.
    #[default]
    Off,
    /// kube-controller-manager's resourceclaim controller too, so pods can claim devices through
    /// `ResourceClaimTemplate`s and the scheduler allocates them.
    On,
    /// [`Dra::On`] plus device taints: whatever the minor needs for `DeviceTaintRule`s to be served
    /// and honoured by the API server, scheduler and controller manager (nothing from 1.37).
    DeviceTaints,
}

impl Dra {
    /// The kube-controller-manager controllers this mode adds.
    #[must_use]
    pub fn controllers(self) -> &'static [&'static str] {
        match self {
            Self::Off => &[],
            Self::On | Self::DeviceTaints => &["resourceclaim-controller"],
        }
    }

    /// The `--feature-gates` flag every component of Kubernetes 1.`minor` gets, if any. From 1.37
    /// the modes without device taints turn the GA gate off (with its API, see
    /// [`Self::runtime_config`]): a scheduler with the gate on waits for an API that is not served.
    #[must_use]
    pub fn feature_gates(self, minor: u32) -> Option<&'static str> {
        match (self, minor) {
            (Self::DeviceTaints, ..=35) => {
                Some("--feature-gates=DRADeviceTaints=true,DRADeviceTaintRules=true")
            }
            (Self::DeviceTaints, 36) => Some("--feature-gates=DRADeviceTaintRules=true"),
            (Self::DeviceTaints, _) | (Self::Off | Self::On, ..=36) => None,
            (Self::Off | Self::On, _) => Some("--feature-gates=DRADeviceTaintRules=false"),
        }
    }

    /// The API server's `--runtime-config` on Kubernetes 1.`minor`, if any. From 1.37 the GA
    /// `DeviceTaintRule` is served by default: the other modes turn it off, so they stay what they
    /// say (DRA without device taints) on every minor.
    #[must_use]
    pub fn runtime_config(self, minor: u32) -> Option<&'static str> {
        match (self, minor) {
            (Self::DeviceTaints, ..=35) => Some("--runtime-config=resource.k8s.io/v1alpha3=true"),
            (Self::DeviceTaints, 36) => {
                Some("--runtime-config=resource.k8s.io/v1beta2/devicetaintrules=true")
            }
            (Self::DeviceTaints, _) | (Self::Off | Self::On, ..=36) => None,
            (Self::Off | Self::On, _) => Some("--runtime-config=resource.k8s.io/v1/devicetaintrules=false"),
        }
    }

    /// The `resource.k8s.io` version in which Kubernetes 1.`minor` started in this mode serves
    /// `DeviceTaintRule` (`None`: not served).
    #[must_use]
    pub fn device_taint_rules(self, minor: u32) -> Option<&'static str> {
        match (self, minor) {
            (Self::DeviceTaints, ..=35) => Some("v1alpha3"),
            (Self::DeviceTaints, 36) => Some("v1beta2"),
            (Self::DeviceTaints, _) => Some("v1"),
            (Self::Off | Self::On, _) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_taints_take_the_gates_and_api_their_minor_needs_and_nothing_once_ga() {
        let flags = |minor| {
            (
                Dra::DeviceTaints.feature_gates(minor),
                Dra::DeviceTaints.runtime_config(minor),
            )
        };
        assert_eq!(
            flags(35),
            (
                Some("--feature-gates=DRADeviceTaints=true,DRADeviceTaintRules=true"),
                Some("--runtime-config=resource.k8s.io/v1alpha3=true")
            )
        );
        assert_eq!(
            flags(36),
            (
                Some("--feature-gates=DRADeviceTaintRules=true"),
                Some("--runtime-config=resource.k8s.io/v1beta2/devicetaintrules=true")
            )
        );
        assert_eq!(flags(37), (None, None), "GA, on by default");
        assert_eq!(
            (Dra::On.feature_gates(35), Dra::On.runtime_config(36)),
            (None, None)
        );
        assert_eq!(
            (Dra::On.feature_gates(37), Dra::On.runtime_config(37)),
            (
                Some("--feature-gates=DRADeviceTaintRules=false"),
                Some("--runtime-config=resource.k8s.io/v1/devicetaintrules=false")
            ),
            "DRA without device taints stays that on 1.37"
        );
        let served: Vec<Option<&str>> = (35..=37)
            .map(|m| Dra::DeviceTaints.device_taint_rules(m))
            .collect();
        assert_eq!(served, [Some("v1alpha3"), Some("v1beta2"), Some("v1")]);
        assert_eq!(Dra::On.device_taint_rules(37), None);
    }
}
