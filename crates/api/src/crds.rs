//! Renders the `CustomResourceDefinitions`, one YAML file per kind, for `crdgen` and the drift test.

use kube::CustomResourceExt;

use crate::{hardware::GpuHardwareRecord, policy::GpuRemediationPolicy, remediation::GpuRemediation};

/// Each CRD as `(file name, YAML)`, in a stable order.
#[must_use]
pub fn render_all() -> Vec<(&'static str, String)> {
    vec![
        (
            "gpuremediationpolicies.yaml",
            render(&GpuRemediationPolicy::crd()),
        ),
        ("gpuremediations.yaml", render(&GpuRemediation::crd())),
        (
            "gpuremediation-hardwarerecords.yaml",
            render(&GpuHardwareRecord::crd()),
        ),
    ]
}

fn render<T: serde::Serialize>(crd: &T) -> String {
    // Serialising a CRD built from our own types cannot fail.
    serde_yaml::to_string(crd).expect("CRD serialises to YAML")
}

#[cfg(test)]
mod tests {
    use std::{fs, path::Path};

    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

    use super::*;

    fn columns(crd: &CustomResourceDefinition) -> Vec<(String, String)> {
        crd.spec.versions[0]
            .additional_printer_columns
            .iter()
            .flatten()
            .map(|c| (c.name.clone(), c.json_path.clone()))
            .collect()
    }

    #[test]
    fn the_crds_directory_holds_exactly_what_crdgen_renders() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../crds");
        for (file, rendered) in render_all() {
            let on_disk = fs::read_to_string(dir.join(file))
                .unwrap_or_else(|err| panic!("crds/{file} cannot be read ({err}); run `make crds`"));
            assert!(
                on_disk == rendered,
                "crds/{file} differs from the Rust types; run `make crds` and commit the result"
            );
        }
    }

    #[test]
    fn a_remediation_prints_node_policy_phase_reason_action_step_and_age() {
        let crd = GpuRemediation::crd();
        let names: Vec<_> = columns(&crd).into_iter().map(|(name, _)| name).collect();
        assert_eq!(
            names,
            ["NODE", "POLICY", "PHASE", "REASON", "ACTION", "STEP", "AGE"]
        );
        assert_eq!(
            crd.spec.names.short_names.as_deref(),
            Some(&["gpur".to_owned()][..])
        );
        assert_eq!(
            crd.spec.names.categories.as_deref(),
            Some(&["gpu".to_owned()][..])
        );
        assert_eq!(crd.spec.scope, "Cluster");
    }

    #[test]
    fn a_policy_prints_selected_yielded_unhealthy_in_flight_mode_and_age_and_wide_its_device_taints() {
        let crd = GpuRemediationPolicy::crd();
        let names: Vec<_> = columns(&crd).into_iter().map(|(name, _)| name).collect();
        assert_eq!(
            names,
            [
                "SELECTED",
                "YIELDED",
                "UNHEALTHY",
                "IN-FLIGHT",
                "MODE",
                "AGE",
                "DEVICE-TAINTS"
            ]
        );
        let wide: Vec<_> = crd.spec.versions[0]
            .additional_printer_columns
            .iter()
            .flatten()
            .filter(|c| c.priority == Some(1))
            .map(|c| c.json_path.clone())
            .collect();
        assert_eq!(
            wide,
            [".status.deviceTaints"],
            "shown by `kubectl get -o wide` only"
        );
        assert_eq!(
            crd.spec.names.short_names.as_deref(),
            Some(&["gpupolicy".to_owned()][..])
        );
        assert_eq!(
            crd.spec.names.categories.as_deref(),
            Some(&["gpu".to_owned()][..])
        );
        assert_eq!(crd.spec.scope, "Cluster");
    }

    #[test]
    fn every_printer_column_points_at_a_field_the_schema_has() {
        for crd in [GpuRemediation::crd(), GpuRemediationPolicy::crd()] {
            let schema = serde_json::to_value(
                crd.spec.versions[0]
                    .schema
                    .as_ref()
                    .and_then(|s| s.open_api_v3_schema.as_ref())
                    .unwrap(),
            )
            .unwrap();
            for (name, path) in columns(&crd) {
                if path == ".metadata.creationTimestamp" {
                    continue;
                }
                let found = path
                    .trim_start_matches('.')
                    .split('.')
                    .try_fold(&schema, |node, key| {
                        node.get("properties").and_then(|p| p.get(key))
                    });
                assert!(
                    found.is_some(),
                    "{}: column {name} reads {path}, which the schema lacks",
                    crd.spec.names.kind
                );
            }
        }
    }

    #[test]
    fn both_kinds_have_a_status_subresource() {
        for crd in [GpuRemediation::crd(), GpuRemediationPolicy::crd()] {
            let subresources = crd.spec.versions[0].subresources.as_ref();
            assert!(
                subresources.and_then(|s| s.status.as_ref()).is_some(),
                "{}",
                crd.spec.names.kind
            );
        }
    }
}
