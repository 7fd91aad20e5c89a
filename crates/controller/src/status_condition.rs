//! One condition of our objects' status (a policy's, a remediation's), built so that its
//! `lastTransitionTime` moves only when its status does. Pure.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// A condition, keeping the previous transition time when its status did not change.
#[must_use]
pub fn condition(
    previous: &[Condition],
    type_: &str,
    status: bool,
    reason: String,
    message: String,
    generation: Option<i64>,
    now: Timestamp,
) -> Condition {
    let status = if status { "True" } else { "False" }.to_owned();
    let last_transition_time = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map_or(Time(now), |c| c.last_transition_time.clone());
    Condition {
        type_: type_.to_owned(),
        status,
        reason,
        message,
        last_transition_time,
        observed_generation: generation,
    }
}
