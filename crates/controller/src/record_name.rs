//! The name of an unhealthy episode's `GpuRemediation` record: one node, one policy, one episode
//! (the trigger's `lastTransitionTime`), one name, so a repeated create finds the record it made.

use jiff::Timestamp;

/// `<node>-<6 hex digits>`: the same node, policy and episode always give the same name, so a
/// repeated create (a retried pass, a new leader) finds the existing record instead of a second.
#[must_use]
pub fn remediation_name(node: &str, policy: &str, since: Timestamp) -> String {
    // FNV-1a: small, stable across builds and platforms (std's hasher is not).
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in node
        .bytes()
        .chain([0])
        .chain(policy.bytes())
        .chain([0])
        .chain(since.as_second().to_be_bytes())
    {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    let suffix = format!("{:06x}", hash & 0xff_ffff);
    // Keep the whole name a valid object name (at most 253 characters).
    let prefix: String = node.chars().take(253 - 7).collect();
    format!("{prefix}-{suffix}")
}
