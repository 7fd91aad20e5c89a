//! The demo's remediation followed until it ends: each phase printed as `kubectl get
//! gpuremediations -w` would show it (phases passed between two looks from the history), every PDB
//! sampled on the way, the figures the summary prints gathered.

use std::time::{Duration, Instant};

use gpu_remediation_api::{GpuRemediation, Phase};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::{Api, Client, ResourceExt, api::ListParams};

use super::progress;
use super::stage::{Clock, RunDemoError, WORKLOAD_NAMESPACE, step};

/// Follows the node's remediation until it ends, printing each change, sampling every PDB.
pub(super) async fn follow(
    admin: &Client,
    node: &str,
    policy: &str,
    fault_at: Instant,
    timeout: Duration,
    clock: &Clock,
) -> Result<progress::Figures, RunDemoError> {
    let remediations = Api::<GpuRemediation>::all(admin.clone());
    let budgets = Api::<PodDisruptionBudget>::namespaced(admin.clone(), WORKLOAD_NAMESPACE);
    let mut figures = progress::Figures {
        node: node.to_owned(),
        ..progress::Figures::default()
    };
    let mut shown: Option<progress::Seen> = None;
    let mut printed = std::collections::BTreeSet::new();
    println!(
        "           {:<28} {:<12} {:<16} (as `kubectl get gpuremediations -w` shows it)",
        "REMEDIATION", "NODE", "PHASE"
    );
    loop {
        if let Ok(list) = budgets.list(&ListParams::default()).await {
            figures.budgets.sample(&list.items);
        }
        let mine = remediations
            .list(&ListParams::default())
            .await
            .map_err(step("listing remediations"))?
            .items
            .into_iter()
            .find(|r| r.spec.node_name == node && r.spec.policy_name == policy);
        if let Some(remediation) = mine {
            let now = progress::seen(&remediation);
            figures.remediation = remediation.name_any();
            let elapsed = fault_at.elapsed();
            let phase = now.phase;
            figures.phase_seen.entry(phase.to_string()).or_insert(elapsed);
            // A phase passed between two looks is in the history: count it as seen now.
            for transition in remediation.status.iter().flat_map(|s| &s.phase_history) {
                figures
                    .phase_seen
                    .entry(transition.phase.to_string())
                    .or_insert(elapsed);
            }
            figures.pods_evicted = now.evicted;
            // Phases passed between two looks are shown too, from the history, in order.
            for transition in remediation.status.iter().flat_map(|s| &s.phase_history) {
                if transition.phase != phase && printed.insert(transition.phase.to_string()) {
                    let passed = progress::Seen {
                        phase: transition.phase,
                        ..now.clone()
                    };
                    let text = progress::line(clock.0.elapsed(), &figures.remediation, node, &passed, None);
                    println!("{}", text.unwrap_or_default());
                }
            }
            printed.insert(phase.to_string());
            if let Some(text) = progress::line(
                clock.0.elapsed(),
                &figures.remediation,
                node,
                &now,
                shown.as_ref(),
            ) {
                println!("{text}");
            }
            shown = Some(now);
            if phase.is_terminal() {
                return if phase == Phase::Succeeded {
                    Ok(figures)
                } else {
                    let message = remediation.status.and_then(|s| s.message).unwrap_or_default();
                    Err(RunDemoError::NotSucceeded(format!("ended {phase}: {message}")))
                };
            }
        }
        if fault_at.elapsed() > timeout {
            return Err(RunDemoError::NotSucceeded(format!(
                "still {} after {}s",
                shown.map_or_else(|| "not created".to_owned(), |s| s.phase.to_string()),
                timeout.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
