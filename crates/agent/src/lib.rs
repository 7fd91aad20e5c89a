//! The GPU health agent: probes the GPUs of one node (through NVML, or a JSON file in the sandbox),
//! decides whether they are healthy, and publishes the `GpuHealthy` node condition.
//!
//! Readings flow one way: a [`probe`] produces a [`readings::Snapshot`], [`assess`] turns it into
//! signals using the [`catalog`], [`health`] latches fatal ones and counts warnings, and
//! [`publish`] writes the condition and Events to the API server.
#![forbid(unsafe_code)]

pub mod assess;
pub mod catalog;
pub mod health;
pub mod readings;
