//! Renders the `CustomResourceDefinitions`, one YAML file per kind, for `crdgen` and the drift test.

use kube::CustomResourceExt;

use crate::{GpuRemediation, GpuRemediationPolicy};

/// Each CRD as `(file name, YAML)`, in a stable order.
#[must_use]
pub fn render_all() -> Vec<(&'static str, String)> {
    vec![
        (
            "gpuremediationpolicies.yaml",
            render(&GpuRemediationPolicy::crd()),
        ),
        ("gpuremediations.yaml", render(&GpuRemediation::crd())),
    ]
}

fn render<T: serde::Serialize>(crd: &T) -> String {
    // Serialising a CRD built from our own types cannot fail.
    serde_yaml::to_string(crd).expect("CRD serialises to YAML")
}
