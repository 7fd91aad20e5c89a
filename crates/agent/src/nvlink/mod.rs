//! NVLink and fabric health: on HGX and NVL72 systems a GPU can be healthy alone and useless to its
//! job. This module owns what the agent reads of a GPU's NVLink links and its fabric registration
//! ([`readings`]), the catalog's thresholds for them ([`policy`]), the memory of earlier reads that
//! turns error counters into rates ([`history`]), and the faults they mean ([`signals`]):
//! `NvlinkDown`, `NvlinkErrors` and `FabricNotReady`.

pub mod history;
pub mod policy;
pub mod readings;
pub mod signals;
