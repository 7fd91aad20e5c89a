//! What the controller tells the outside world besides API objects: Prometheus metrics
//! (`OpenMetrics` text), liveness and readiness, and JSON logs with a span per remediation.
//!
//! - [`metrics`]: the registry and the typed handles reconcilers call ([`Metrics`]).
//! - [`health`]: when the replica is ready ([`Health`], [`Readiness`]).
//! - [`server`]: the HTTP server for `/metrics`, `/healthz` and `/readyz`.
//! - [`logs`]: JSON log setup and the per-remediation span.

pub mod health;
mod ladder_metrics;
mod leadership_metrics;
pub mod logs;
pub mod metrics;
pub mod server;
mod write_metrics;

pub use health::{Health, Readiness};
pub use logs::{init_json_logs, remediation_span};
pub use metrics::{EvictionResult, Metrics};
pub use server::serve;
