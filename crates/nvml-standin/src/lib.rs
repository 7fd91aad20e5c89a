//! `libnvml_standin.so`: a stand-in for `libnvidia-ml.so`, so the agent's real NVML probe (and
//! nvml-wrapper underneath it) runs in tests on a machine without a GPU. Load it with
//! `gpu-health-agent --probe nvml --nvml-library target/debug/libnvml_standin.so` and name the
//! scenario in `GPU_STANDIN_SCENARIO`: the same JSON file the agent's `file` probe reads,
//! re-read whenever it changes.
//!
//! - [`scenario`]: the file's format and how it becomes NVML answers; [`nvlink`]: its NVLink and
//!   fabric fields; [`mig`]: its MIG devices.
//! - `state`: the answers, without raw pointers (init count, handles, event sets, XID delivery).
//! - `ffi`: the exported C functions; the only `unsafe` in the workspace outside its dependencies.
//!
//! This library is for tests only: nothing in it talks to a GPU.

mod ffi;
pub mod mig;
pub mod nvlink;
pub mod scenario;
mod state;

pub use state::SCENARIO_ENV;
