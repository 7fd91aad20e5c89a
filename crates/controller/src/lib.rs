//! The remediation controller: detect unhealthy GPU nodes, admit them under a policy's budget,
//! cordon, drain through the Eviction API and replace them. (Being built: see the open issues.)
#![forbid(unsafe_code)]
pub mod leader;
