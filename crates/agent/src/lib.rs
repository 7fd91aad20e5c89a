//! The GPU health agent: probes GPUs through NVML and publishes `GpuHealthy` node conditions.
//! (Being built: see the open issues.)
