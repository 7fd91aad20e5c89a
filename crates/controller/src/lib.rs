//! The remediation controller: detect unhealthy GPU nodes, admit them under a policy's budget,
//! cordon, drain through the Eviction API and hand them over for replacement.
//!
//! Decisions are pure modules (`detect`, `governance`, `budget`, `drain`, `cordon`, `lifecycle`);
//! `observe` keeps the caches, `kubeops` makes every mutating call (each behind the leader fence),
//! `fleet` plans every policy, `admit` and `remediation` carry plans out and report them in status
//! and Events, and `controller` runs the loop.
#![forbid(unsafe_code)]
pub mod leader;
pub mod replace;
pub mod telemetry;

pub mod admit;
pub mod budget;
pub mod claim;
pub mod cli;
pub mod context;
pub mod controller;
pub mod cordon;
pub mod detect;
pub mod dra;
pub mod drain;
pub mod fleet;
pub mod governance;
pub mod hardware;
pub mod kubeops;
pub mod ladder_acts;
pub mod lanes;
pub mod lifecycle;
pub mod node_patch;
pub mod observe;
pub mod policy_status;
pub mod progress;
pub mod quarantine;
pub mod remediation;
pub mod time;

pub use context::{Context, Settings};
pub use controller::{RunControllerError, run};
