//! Whether a pass may decide from the node cache's labels (`observe::labels`): where a policy reads
//! a label key the cache did not keep, the node watch is asked to list afresh, each policy reading
//! such a key is told so in an Event, and the pass plans nothing until the list has completed (a
//! `DoesNotExist` or `NotIn` selector would match every node whose label was left out, and two
//! policies' claims on a node cannot be weighed without both their keys).

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
    let missing = match ctx.caches.node_labels.cover(&wanted) {
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
