//! The hardware ledger: each remediation records its node's GPUs and the failed ones at admission
//! (`ledger`, `admission`); a `GpuHardwareRecord` per GPU serial and host keeps their failures past
//! `history.ttl` (`history`); hardware past a policy's `safety.repeatOffender` goes straight to the
//! last rung, and a node carrying it is flagged when it joins (`join`); what an agent says of its
//! GPUs counts only as far as `trust` allows, and `claimants` (which node lists each serial)
//! spares `trust`'s conflict check a walk of the fleet. Every module is pure; `act::hardware`
//! writes.

pub mod admission;
pub mod claimants;
pub mod history;
pub mod join;
pub mod join_validation;
pub mod ledger;
pub mod trust;

pub use admission::amend;
pub use history::{Failures, failures};
