//! The remediation controller: detect unhealthy GPU nodes, admit them under a policy's budget,
//! cordon, drain through the Eviction API and hand them over for replacement.
//!
//! Decisions are pure modules (`detect`, `governance`, `budget`, `drain`, `cordon`, `phase`);
//! `observe` keeps the caches, `kubeops` makes every mutating call (each behind the leader fence),
//! `fleet` and `remediation` carry decisions out, `report` writes Events.
#![forbid(unsafe_code)]
pub mod leader;

pub mod budget;
pub mod cordon;
pub mod detect;
pub mod drain;
pub mod governance;
pub mod phase;
pub mod time;
pub mod telemetry;
pub mod replace;
