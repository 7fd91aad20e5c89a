//! The CEL range table read back from the generated policy CRD.

use kube::CustomResourceExt;

use super::*;
use crate::policy::GpuRemediationPolicy;

/// The schema of the policy field at `path` (`spec.safety.rate.limit`, `[]` for a list's items).
fn field<'a>(root: &'a Value, path: &str) -> &'a Value {
    path.split('.')
        .fold(root, |node, name| match name.strip_suffix("[]") {
            Some(list) => &node["properties"][list]["items"],
            None => &node["properties"][name],
        })
}

#[test]
fn every_range_in_the_table_is_two_rules_on_its_field_in_the_policy_crd() {
    let crd = serde_json::to_value(GpuRemediationPolicy::crd()).expect("the CRD serialises");
    let root = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    for (path, range) in &RANGES {
        let rules = field(root, path)["x-kubernetes-validations"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for (rule, message) in [
            (format!("self >= {}", range.min), range.min_message),
            (format!("self <= {}", range.max), range.max_message),
        ] {
            assert!(
                rules
                    .iter()
                    .any(|r| r["rule"] == rule.as_str() && r["message"] == message),
                "{path}: no rule {rule:?} saying {message:?} in {rules:?}"
            );
        }
    }
}
