//! The hardware ledger: what each `GpuRemediation` records of its node's GPUs at admission (which
//! ones failed, by serial and UUID, and the host), and `GpuHardwareRecord`, one small
//! cluster-scoped object per GPU serial (or host) holding its recent failures, which outlives
//! `history.ttl` so a bad GPU is recognised on whatever node it reappears.
//!
//! Also the two pure spellings every reader shares: a serial (or host) as a label value, and the
//! record's object name.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{duration::Duration, policy::Action, safety::OffenderAction};

/// The most GPUs a ledger lists (a node has at most a few dozen).
pub const LEDGER_GPUS_MAX: usize = 64;
/// The most earlier failures a repeat offence names.
pub const OFFENCE_EARLIER_MAX: usize = 8;
/// The most failures one `GpuHardwareRecord` keeps: the latest ones; `failureCount` counts all.
pub const RECORD_FAILURES_MAX: usize = 16;
/// The longest serial or host identity recorded.
pub const HARDWARE_ID_MAX_LENGTH: usize = 253;

/// What a remediation recorded of its node's hardware at admission.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HardwareLedger {
    /// The node's GPUs, from the agent's `gpuremediation.dev/gpu-inventory` annotation.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub gpus: Vec<LedgerGpu>,
    /// The GPUs the fault names, from the agent's `gpuremediation.dev/failed-gpus` annotation.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub failed: Vec<LedgerGpu>,
    /// The machine under the node: its system UUID, else its provider ID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub host: Option<String>,
    /// Set when a failed GPU or the host was past the policy's `safety.repeatOffender` limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeat_offender: Option<RepeatOffence>,
    /// GPUs the node's agent named as failed that the ledger does not count as failures: not in
    /// the node's own inventory before the fault, or claimed by another live node as well.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub untrusted: Vec<UntrustedGpu>,
}

/// A GPU named as failed that counts as no failure, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UntrustedGpu {
    /// `GPU-...`, as the failed-GPUs annotation named it.
    #[schemars(length(max = 128))]
    pub uuid: String,
    /// The serial it was named with, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub serial: Option<String>,
    /// Why it does not count.
    pub why: Distrust,
    /// For `Conflict`: the other live nodes whose inventory lists the serial (at most 8).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub claimed_by: Vec<String>,
}

/// Why a GPU named as failed is not counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Distrust {
    /// The node's own inventory does not list the GPU with that serial.
    NotInInventory,
    /// The node's inventory listed the serial only at or after the fault began (or the controller
    /// never saw it listed).
    ListedAfterFault,
    /// Another live node's inventory lists the same serial: a conflict, never a failure.
    Conflict,
}

/// The largest NVML index a ledger records (far above any machine's GPU count); a node reporting
/// a larger one has its index left out, not its record refused.
pub const GPU_INDEX_MAX: u32 = 1024;

/// One GPU in a ledger.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LedgerGpu {
    /// `GPU-...`.
    #[schemars(length(max = 128))]
    pub uuid: String,
    /// The board serial, where the board reports one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub serial: Option<String>,
    /// NVML index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = GPU_INDEX_MAX))]
    pub index: Option<u32>,
    /// PCI bus id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub pci_bus_id: Option<String>,
    /// For a failed GPU: the fault's reason (`XID79`, `GpuMissing`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 316))]
    pub reason: Option<String>,
    /// When the controller first saw this serial in the node's inventory (the node's
    /// `gpuremediation.dev/gpu-first-seen` annotation, written by the controller alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_seen: Option<Time>,
}

/// Why a remediation went straight to the last rung: the hardware and its earlier failures.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RepeatOffence {
    /// What offended: `Gpu` (by serial) or `Host`.
    pub kind: HardwareKind,
    /// The serial or host identity.
    #[schemars(length(max = 253))]
    pub id: String,
    /// Earlier failures within the window.
    #[schemars(range(max = 1_000_000))]
    pub failures: u32,
    /// The policy's window.
    pub window: Duration,
    /// The last rung the policy's `safety.repeatOffender` sent the node to.
    pub action: OffenderAction,
    /// The latest earlier failures, newest first.
    #[schemars(length(max = 8))]
    pub earlier: Vec<HardwareFailure>,
}

/// What a record is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema)]
pub enum HardwareKind {
    /// One GPU board, by serial.
    Gpu,
    /// One machine, by system UUID or provider ID.
    Host,
}

impl HardwareKind {
    /// The prefix of its records' names.
    #[must_use]
    pub const fn prefix(self) -> &'static str {
        match self {
            Self::Gpu => "gpu",
            Self::Host => "host",
        }
    }
}

/// One failure of a GPU or host: the remediation that recorded it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HardwareFailure {
    /// When the fault began (the trigger's `since`).
    pub at: Time,
    /// The node it failed on.
    #[schemars(length(max = 253))]
    pub node: String,
    /// That node's UID.
    #[serde(default, rename = "nodeUID", skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub node_uid: Option<String>,
    /// The `GpuRemediation` that recorded it (deleted after `history.ttl`; this entry stays).
    #[schemars(length(max = 253))]
    pub remediation: String,
    /// The fault's reason.
    #[schemars(length(max = 316))]
    pub reason: String,
    /// The GPU's UUID (a GPU record) or the failed GPUs' serials (a host record).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub gpu: Option<String>,
    /// The host it was in, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub host: Option<String>,
    /// What the remediation was to do.
    pub action: Action,
    /// The diagnostics the remediation ran before destroying the node's state (`spec.diagnostics`
    /// of its policy): the Job, how it ended and what it said, so the evidence of this failure is
    /// found from the hardware after the node and the remediation are gone. Set once they ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diagnostics: Option<crate::diagnostics::DiagnosticsRecord>,
}

/// The failure history of one GPU (by serial) or one host, written by the controller when it
/// admits a remediation naming it, kept after the remediations themselves expire.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "gpuremediation.dev",
    version = "v1alpha1",
    kind = "GpuHardwareRecord",
    plural = "gpuhardwarerecords",
    shortname = "gpuhw",
    category = "gpu",
    doc = "A GpuHardwareRecord is the failure history of one GPU board (by serial) or one host, across every node it has been part of: the controller adds an entry for each remediation that names it, keeps the latest entries and counts all of them, and a policy's safety.repeatOffender sends hardware past its limit straight to the last rung.",
    printcolumn = r#"{"name":"KIND","type":"string","jsonPath":".spec.kind"}"#,
    printcolumn = r#"{"name":"ID","type":"string","jsonPath":".spec.id"}"#,
    printcolumn = r#"{"name":"FAILURES","type":"integer","jsonPath":".spec.failureCount"}"#,
    printcolumn = r#"{"name":"LAST-NODE","type":"string","jsonPath":".spec.failures[0].node"}"#,
    printcolumn = r#"{"name":"LAST-FAILURE","type":"date","jsonPath":".spec.failures[0].at"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::bounds::spec)]
pub struct GpuHardwareRecordSpec {
    /// `Gpu` or `Host`.
    pub kind: HardwareKind,
    /// The serial or host identity, exactly as reported.
    #[schemars(length(max = 253))]
    pub id: String,
    /// Every failure ever recorded here, including those no longer listed.
    #[schemars(range(max = 1_000_000))]
    pub failure_count: u32,
    /// The latest failures, newest first (at most 16).
    #[serde(default)]
    #[schemars(length(max = 16))]
    pub failures: Vec<HardwareFailure>,
}

/// `serial` (or a host identity) as a label value: itself when it is one (at most 63 letters,
/// digits, `-`, `_` or `.`, starting and ending with a letter or digit), else `hash-` and 16 hex
/// digits of its 64-bit FNV-1a hash. NVIDIA board serials (13 digits) are always themselves.
#[must_use]
pub fn label_value(id: &str) -> String {
    let valid = !id.is_empty()
        && id.len() <= 63
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && id.starts_with(|c: char| c.is_ascii_alphanumeric())
        && id.ends_with(|c: char| c.is_ascii_alphanumeric());
    if valid {
        id.to_owned()
    } else {
        format!("hash-{:016x}", fnv1a(id))
    }
}

/// The name of the record of `id`: `gpu-<serial>` (or `host-<id>`) when the identity is a valid
/// lower-case DNS label of at most 57 characters, else `gpu-hash-<16 hex digits>`.
#[must_use]
pub fn record_name(kind: HardwareKind, id: &str) -> String {
    let valid = !id.is_empty()
        && id.len() <= 57
        && id
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !id.starts_with('-')
        && !id.ends_with('-')
        && !id.starts_with("hash-");
    if valid {
        format!("{}-{id}", kind.prefix())
    } else {
        format!("{}-hash-{:016x}", kind.prefix(), fnv1a(id))
    }
}

/// FNV-1a, 64 bits: small and stable across builds and platforms (std's hasher is not), for
/// names derived from identities.
#[must_use]
pub fn fnv1a(text: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_board_serial_is_its_own_label_value() {
        assert_eq!(label_value("1652023012345"), "1652023012345");
    }

    #[test]
    fn an_identity_that_is_not_a_label_value_is_hashed_stably() {
        let provider = "aws:///us-east-1a/i-0123456789abcdef0";
        let value = label_value(provider);
        assert!(value.starts_with("hash-") && value.len() == 21, "{value}");
        assert_eq!(value, label_value(provider));
        assert_ne!(value, label_value("aws:///us-east-1a/i-0123456789abcdef1"));
        assert!(label_value(&"9".repeat(64)).starts_with("hash-"));
        assert!(label_value("-1").starts_with("hash-"));
    }

    #[test]
    fn a_record_is_named_after_its_serial_when_that_is_a_dns_label_and_hashed_otherwise() {
        assert_eq!(
            record_name(HardwareKind::Gpu, "1652023012345"),
            "gpu-1652023012345"
        );
        assert_eq!(
            record_name(HardwareKind::Host, "4c4c4544-0042-3510-8058-b3c04f4e3132"),
            "host-4c4c4544-0042-3510-8058-b3c04f4e3132"
        );
        let upper = record_name(HardwareKind::Gpu, "PB1234ABC");
        assert!(upper.starts_with("gpu-hash-"), "{upper}");
        assert_ne!(upper, record_name(HardwareKind::Gpu, "pb1234abc"));
        assert!(record_name(HardwareKind::Gpu, "hash-0").starts_with("gpu-hash-"));
    }
}
