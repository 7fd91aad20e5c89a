//! Whether a pass may decide from the node cache's labels (`observe::labels`): where a policy reads
//! a label key the cache did not keep, the node watch is asked to list afresh, each policy reading
//! such a key is told so in an Event, and the pass plans nothing until the list has completed (a
//! `DoesNotExist` or `NotIn` selector would match every node whose label was left out, and two
//! policies' claims on a node cannot be weighed without both their keys). While it waits, the
//! `node_labels_listing` gauge reads 1.

use std::{collections::BTreeSet, sync::Arc};

use gpu_remediation_api::{GpuRemediationPolicy, constants::reasons};
use kube::runtime::events::EventType;

use crate::{
    context::Context,
    lifecycle::Note,
    observe::labels::{Coverage, keys_read_by, keys_read_by_all},
};

/// Whether the node cache keeps every label key `policies` read; if not, asks for the list that
/// will (once, when a key is new) and says so on the policies that read the missing keys.
pub async fn covered(ctx: &Context, policies: &[Arc<GpuRemediationPolicy>]) -> bool {
    let wanted = keys_read_by_all(policies.iter().map(|p| &p.spec));
    let coverage = ctx.caches.node_labels.cover(&wanted);
    ctx.metrics
        .set_node_labels_listing(!matches!(coverage, Coverage::Covered));
    let missing = match coverage {
        Coverage::Covered => return true,
        Coverage::Listing(_) => return false,
        Coverage::Relisting(missing) => missing,
    };
    tracing::warn!(
        ?missing,
        "a policy reads node labels the cache did not keep: listing every node afresh; nothing is admitted \
         or quarantined until that list completes"
    );
    for policy in policies {
        let read: BTreeSet<String> = keys_read_by(&policy.spec)
            .intersection(&missing)
            .cloned()
            .collect();
        if read.is_empty() {
            continue;
        }
        ctx.writer
            .publish(policy.as_ref(), listing(&read).event("ListNodes"))
            .await;
    }
    false
}

fn listing(keys: &BTreeSet<String>) -> Note {
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    Note::new(
        reasons::NODE_LABELS_LISTING,
        EventType::Normal,
        &format!(
            "this policy reads node label(s) {} that the controller's node cache did not keep: every node \
             is being listed afresh keeping them; until that list completes, no node is admitted or \
             quarantined under any policy",
            keys.join(", ")
        ),
    )
}

#[cfg(test)]
mod tests {
    use gpu_remediation_api::GpuRemediationPolicySpec;

    use super::*;
    use crate::observe::labels::NodeLabels;

    /// A policy selecting nodes by `key`.
    fn reading(name: &str, key: &str) -> Arc<GpuRemediationPolicy> {
        let spec: GpuRemediationPolicySpec = serde_json::from_value(serde_json::json!({
            "nodeSelector": {"matchExpressions": [{"key": key, "operator": "DoesNotExist"}]},
            "triggers": [{"conditionType": "GpuHealthy", "status": "False", "for": "30s"}],
        }))
        .unwrap();
        Arc::new(GpuRemediationPolicy::new(name, spec))
    }

    fn listing_gauge(ctx: &Context) -> Option<String> {
        ctx.metrics
            .encode()
            .lines()
            .find(|line| line.starts_with("gpu_remediator_node_labels_listing "))
            .map(str::to_owned)
    }

    #[tokio::test]
    async fn passes_wait_for_a_list_keeping_a_new_key_saying_so_once_on_the_policies_reading_it() {
        let (mut ctx, recording) = crate::write::recording::context(Vec::new(), Vec::new(), Vec::new());
        let (labels, _relist) = NodeLabels::keeping(BTreeSet::new());
        let _ = labels.start_listing();
        labels.listed();
        ctx.caches.node_labels = labels.clone();
        let policies = [
            reading("pool", "example.com/pool"),
            reading("other", "example.com/rack"),
        ];

        assert!(covered(&ctx, &policies[..0]).await, "no policy reads a label");
        assert_eq!(
            listing_gauge(&ctx).as_deref(),
            Some("gpu_remediator_node_labels_listing 0")
        );
        assert!(!covered(&ctx, &policies).await, "the list kept neither key");
        assert_eq!(
            listing_gauge(&ctx).as_deref(),
            Some("gpu_remediator_node_labels_listing 1")
        );
        // The next pass, before the list completes, waits without saying it again.
        assert!(!covered(&ctx, &policies).await);
        assert_eq!(
            recording.events_sent(2).await,
            [reasons::NODE_LABELS_LISTING, reasons::NODE_LABELS_LISTING],
            "one Event on each policy reading a missing key"
        );

        let _ = labels.start_listing();
        labels.listed();
        assert!(covered(&ctx, &policies).await, "the new list kept both keys");
        assert_eq!(
            listing_gauge(&ctx).as_deref(),
            Some("gpu_remediator_node_labels_listing 0")
        );
        assert_eq!(recording.event_reasons().len(), 2);
    }
}
