//! The writer's outcomes and the reconcilers' errors by kind: every write the controller sends is
//! counted by verb, resource and outcome (`ok`, or the kind of failure: `fenced`, `conflict`,
//! `not_found`, `forbidden`, `invalid`, `throttled`, `timeout`, `server`, `refused`,
//! `unreachable`, `internal`; see `write::WriteError::metric_label`), and every failed reconcile
//! by reconciler and the same kinds, so that API refusals, timeouts, fence refusals, invalid input
//! and internal errors can be told apart.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct WriteLabels {
    verb: &'static str,
    resource: String,
    outcome: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ErrorLabels {
    reconciler: String,
    kind: &'static str,
}

/// The writer's series (part of [`super::Metrics`]).
#[derive(Default)]
pub(super) struct WriteSeries {
    writes: Family<WriteLabels, Counter>,
    errors: Family<ErrorLabels, Counter>,
}

impl WriteSeries {
    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "writes",
            "Writes the controller sent (or its fence stopped), by verb, resource and outcome",
            self.writes.clone(),
        );
        registry.register(
            "reconcile_errors_by_kind",
            "Reconcile attempts that failed, by reconciler and kind of failure",
            self.errors.clone(),
        );
    }

    pub(super) fn write(&self, verb: &'static str, resource: &str, outcome: &'static str) {
        self.writes
            .get_or_create(&WriteLabels {
                verb,
                resource: resource.to_owned(),
                outcome,
            })
            .inc();
    }

    pub(super) fn error(&self, reconciler: &str, kind: &'static str) {
        self.errors
            .get_or_create(&ErrorLabels {
                reconciler: reconciler.to_owned(),
                kind,
            })
            .inc();
    }
}
