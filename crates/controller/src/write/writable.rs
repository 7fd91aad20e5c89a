//! What the writer needs to know about each kind it writes: which overlay keeps our writes of it
//! (so the next pass sees them before the watch does) and which CRD schema bounds what we write.
//! A kind without an overlay or a schema of ours says so by not overriding the defaults.

use std::sync::OnceLock;

use gpu_remediation_api::{GpuHardwareRecord, GpuRemediation, GpuRemediationPolicy};
use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{Node, Pod},
};
use kube::{CustomResourceExt, Resource, api::DynamicObject};
use serde::{Serialize, de::DeserializeOwned};
use serde_json::Value;

use crate::observe::{cached_node::CachedNode, overlay::Overlays};
use crate::read::Placement;

/// A kind the writer can write.
pub trait Writable:
    Resource<Scope: Placement> + Clone + std::fmt::Debug + Serialize + DeserializeOwned + Send + Sync + 'static
{
    /// Lays `written` over this kind's cache, if the passes read it from one (see
    /// `observe::overlay`).
    fn record_in(_overlays: &Overlays, _written: &Self) {}

    /// Whether a status write carries our claim in the status itself (`status.claim`): our CRDs
    /// do (the API server drops metadata sent to a custom resource's status before admission);
    /// other kinds have no such field. An untyped object is one of our policies whose stored form
    /// does not decode (`observe::undecodable`), the only status the writer applies untyped.
    const CLAIM_IN_STATUS: bool = false;

    /// The `openAPIV3Schema` of this kind's CRD, if it is ours: what we write is cut to its bounds.
    #[must_use]
    fn schema() -> Option<&'static Value> {
        None
    }
}

/// Computes the schema of each CRD of ours now, so that no write pays for it: the first record a
/// fault creates did (10 ms at 50,000 nodes, release build, in a fault's own latency; measured
/// 2026-12-06).
pub fn warm_schemas() {
    let _ = (
        GpuRemediation::schema(),
        GpuRemediationPolicy::schema(),
        GpuHardwareRecord::schema(),
    );
}

/// The schema of CRD `K`, computed once.
fn crd_schema<K: CustomResourceExt>(cell: &'static OnceLock<Value>) -> &'static Value {
    cell.get_or_init(|| {
        let crd = K::crd();
        crd.spec.versions[0]
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .and_then(|schema| serde_json::to_value(schema).ok())
            .unwrap_or(Value::Null)
    })
}

impl Writable for GpuRemediation {
    const CLAIM_IN_STATUS: bool = true;

    fn record_in(overlays: &Overlays, written: &Self) {
        overlays.remediations.record(written.clone());
    }

    fn schema() -> Option<&'static Value> {
        static SCHEMA: OnceLock<Value> = OnceLock::new();
        Some(crd_schema::<Self>(&SCHEMA))
    }
}

impl Writable for GpuRemediationPolicy {
    const CLAIM_IN_STATUS: bool = true;

    fn schema() -> Option<&'static Value> {
        static SCHEMA: OnceLock<Value> = OnceLock::new();
        Some(crd_schema::<Self>(&SCHEMA))
    }
}

impl Writable for GpuHardwareRecord {
    fn record_in(overlays: &Overlays, written: &Self) {
        overlays.hardware_records.record(written.clone());
    }

    fn schema() -> Option<&'static Value> {
        static SCHEMA: OnceLock<Value> = OnceLock::new();
        Some(crd_schema::<Self>(&SCHEMA))
    }
}

impl Writable for Node {
    fn record_in(overlays: &Overlays, written: &Self) {
        overlays.nodes.record(CachedNode::from(written.clone()));
    }
}

impl Writable for Pod {}
impl Writable for Lease {}
impl Writable for DynamicObject {
    const CLAIM_IN_STATUS: bool = true;
}
impl Writable for crate::dra::wire::DeviceTaintRule {}
