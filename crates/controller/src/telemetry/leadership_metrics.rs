//! The series about this replica's leadership: whether it leads, whether its fence is proven, and
//! whether its passes wait for a node list (a leader that plans nothing looks healthy otherwise).
//! The server sets the first two from the fence at every scrape; every pass sets the third.

use prometheus_client::{metrics::gauge::Gauge, registry::Registry};

/// The leadership series (part of [`super::Metrics`]).
#[derive(Default)]
pub(super) struct LeadershipSeries {
    leader: Gauge,
    fence_unproven: Gauge,
    node_labels_listing: Gauge,
}

impl LeadershipSeries {
    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "leader",
            "1 while this replica holds a current claim on the leader Lease",
            self.leader.clone(),
        );
        registry.register(
            "fence_unproven",
            "1 while this replica's last probe could not prove that the API server enforces the fence \
             (it refuses to lead, or leads unfenced with --allow-unfenced)",
            self.fence_unproven.clone(),
        );
        registry.register(
            "node_labels_listing",
            "1 while this replica's passes plan nothing because a policy reads a node label its node \
             cache has not listed yet (the node watch is listing afresh)",
            self.node_labels_listing.clone(),
        );
    }

    pub(super) fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }

    pub(super) fn set_fence_unproven(&self, unproven: bool) {
        self.fence_unproven.set(i64::from(unproven));
    }

    pub(super) fn set_node_labels_listing(&self, listing: bool) {
        self.node_labels_listing.set(i64::from(listing));
    }
}
