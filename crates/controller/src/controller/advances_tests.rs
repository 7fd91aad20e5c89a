use gpu_remediation_api::remediation::{Blocker, DrainStatus};

use super::*;

/// Whether the change concerns the remediation as written (nothing held).
fn concerned(changed: &Changed, remediation: &GpuRemediation) -> bool {
    concerns(changed, remediation, remediation.status.as_ref())
}

fn remediation(mode: &str, refused_by: &[&str]) -> GpuRemediation {
    let mut remediation: GpuRemediation = serde_json::from_value(serde_json::json!({
        "apiVersion": "gpuremediation.dev/v1alpha1",
        "kind": "GpuRemediation",
        "metadata": {"name": "n1-abc"},
        "spec": {
            "nodeName": "n1",
            "policyName": "p",
            "action": "None",
            "mode": mode,
            "trigger": {"conditionType": "GpuHealthy", "status": "False", "reason": "XID79"},
        },
    }))
    .expect("a valid remediation");
    let mut status = remediation.status.take().unwrap_or_default();
    status.drain = Some(DrainStatus {
        blockers: refused_by
            .iter()
            .map(|pdb| Blocker {
                pod: "work/web-0".to_owned(),
                pdb: Some((*pdb).to_owned()),
                code: 429,
                message: String::new(),
                since: None,
            })
            .collect(),
        ..DrainStatus::default()
    });
    remediation.status = Some(status);
    remediation
}

fn budgets(changed: &[&str]) -> Changed {
    Changed {
        anything: false,
        nodes: std::collections::BTreeSet::new(),
        nodes_listed: false,
        resync: false,
        budgets: changed.iter().map(|b| (*b).to_owned()).collect(),
    }
}

fn nodes(changed: &[&str]) -> Changed {
    Changed {
        anything: false,
        nodes: changed.iter().map(|n| (*n).to_owned()).collect(),
        nodes_listed: false,
        resync: false,
        budgets: std::collections::BTreeSet::new(),
    }
}

#[test]
fn a_node_change_concerns_only_the_remediation_of_that_node() {
    let draining = remediation("Enforce", &["work/web"]);
    let node = draining.spec.node_name.clone();
    assert!(concerned(&nodes(&[node.as_str()]), &draining));
    assert!(
        !concerned(&nodes(&["gpu-elsewhere-1", "gpu-elsewhere-2"]), &draining),
        "other nodes reporting their status do not make this drain list its pods"
    );
}

#[test]
fn a_budget_change_concerns_only_the_remediations_it_refuses() {
    let refused = remediation("Enforce", &["work/web"]);
    let elsewhere = remediation("Enforce", &["other/db"]);
    let unrefused = remediation("Enforce", &[]);
    let change = budgets(&["work/web"]);
    assert!(concerned(&change, &refused));
    assert!(!concerned(&change, &elsewhere));
    assert!(!concerned(&change, &unrefused));
}

#[test]
fn a_pod_under_several_budgets_is_concerned_by_each() {
    let refused = remediation("Enforce", &["work/a,work/b"]);
    assert!(concerned(&budgets(&["work/b"]), &refused));
}

#[test]
fn any_budget_change_concerns_a_dry_run_and_any_other_change_concerns_all() {
    assert!(concerned(&budgets(&["x/y"]), &remediation("DryRun", &[])));
    assert!(!concerned(&budgets(&[]), &remediation("DryRun", &[])));
    assert!(concerned(&Changed::everything(), &remediation("Enforce", &[])));
}
