//! The remediation controller: detect unhealthy GPU nodes, admit them under a policy's budget,
//! cordon, drain through the Eviction API and hand them over for replacement.
//!
//! Decisions are pure modules (`detect`, `governance`, `budget`, `drain`, `cordon`, `lifecycle`);
//! `observe` keeps the caches, `read` reads what they do not hold, `write` is the one writer (every
//! mutating call, behind the leader fence: no other module holds a client that can write),
//! `fleet` plans every policy, `admit` and `remediation` carry plans out and report them in status
//! and Events, and `controller` runs the loop.
#![forbid(unsafe_code)]
pub mod leader;
pub mod replace;
pub mod telemetry;

pub mod act;
pub mod budget;
pub mod cli;
pub mod context;
pub mod controller;
pub mod cordon;
pub mod detect;
pub mod dra;
pub mod drain;
pub mod election;
pub mod first_seen;
pub mod fleet;
pub mod governance;
pub mod hardware;
pub mod lanes;
pub mod lifecycle;
pub mod node_patch;
pub mod observe;
pub mod out_of_service;
pub mod policy_status;
pub mod progress;
pub mod quarantine;
pub mod read;
pub mod record_name;
pub mod retry;
pub mod status_condition;
#[cfg(test)]
mod test_fixtures;
pub mod time;
pub mod write;

pub use context::{Context, Settings};
pub use controller::{RunControllerError, run};
