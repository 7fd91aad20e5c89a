//! The catalog's NVLink and fabric section (`nvlink:` in `config/xid-catalog.yaml`): what counts
//! as too many link errors, how long a fabric may take to register, and the recommended actions.
//! An override file's section replaces the fields it names, one at a time, as its XID entries do.

use std::time::Duration;

use serde::Deserialize;

use super::Severity;
use crate::readings::nvlink::Counter;

/// The longest window the history keeps samples for.
pub const MAX_WINDOW: Duration = Duration::from_secs(3600);

/// The thresholds and actions in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkPolicy {
    /// NVIDIA's recommended action for a link down.
    pub link_down_action: String,
    /// How error counters rising too fast are treated.
    pub errors_severity: Severity,
    /// NVIDIA's recommended action for them.
    pub errors_action: String,
    /// The window a counter's growth is measured over.
    pub window: Duration,
    /// Growth of each counter within `window` that is still tolerated; more is a fault.
    pub max_increase: CounterLimits,
    /// How long after the agent first saw a GPU its fabric may stay unregistered.
    pub fabric_grace: Duration,
    /// NVIDIA's recommended action for a fabric that did not register.
    pub fabric_action: String,
}

/// One limit per counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CounterLimits {
    /// CRC flit errors.
    pub crc_flit: u64,
    /// CRC data errors.
    pub crc_data: u64,
    /// Replays.
    pub replay: u64,
    /// Recoveries.
    pub recovery: u64,
}

impl CounterLimits {
    /// The limit of `counter`.
    #[must_use]
    pub fn get(&self, counter: Counter) -> u64 {
        match counter {
            Counter::CrcFlit => self.crc_flit,
            Counter::CrcData => self.crc_data,
            Counter::Replay => self.replay,
            Counter::Recovery => self.recovery,
        }
    }
}

impl Default for LinkPolicy {
    /// Used only when a catalog has no `nvlink:` section; the shipped catalog states its own.
    fn default() -> Self {
        Self {
            link_down_action: "WORKFLOW_NVLINK_ERR".to_owned(),
            errors_severity: Severity::Fatal,
            errors_action: "WORKFLOW_NVLINK_ERR".to_owned(),
            window: Duration::from_secs(300),
            max_increase: CounterLimits {
                crc_flit: 100,
                crc_data: 100,
                replay: 100,
                recovery: 5,
            },
            fabric_grace: Duration::from_secs(600),
            fabric_action: "RESTART_BM".to_owned(),
        }
    }
}

/// The section as a file states it: each field optional, so an override names only what it
/// changes.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LinkPolicyFile {
    #[serde(default)]
    link_down_action: Option<String>,
    #[serde(default)]
    errors_severity: Option<Severity>,
    #[serde(default)]
    errors_action: Option<String>,
    #[serde(default)]
    window_seconds: Option<u64>,
    #[serde(default)]
    max_increase: Option<CounterLimitsFile>,
    #[serde(default)]
    fabric_grace_seconds: Option<u64>,
    #[serde(default)]
    fabric_action: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct CounterLimitsFile {
    #[serde(default)]
    crc_flit: Option<u64>,
    #[serde(default)]
    crc_data: Option<u64>,
    #[serde(default)]
    replay: Option<u64>,
    #[serde(default)]
    recovery: Option<u64>,
}

impl LinkPolicy {
    /// Applies a file's section over this policy; a window of zero or past [`MAX_WINDOW`] is
    /// refused, since a rate needs a window the history can hold.
    pub fn merge(&mut self, file: LinkPolicyFile) -> Result<(), String> {
        if let Some(seconds) = file.window_seconds {
            let window = Duration::from_secs(seconds);
            if window.is_zero() || window > MAX_WINDOW {
                return Err(format!(
                    "nvlink.windowSeconds {seconds} is outside 1..={}",
                    MAX_WINDOW.as_secs()
                ));
            }
            self.window = window;
        }
        let replace = |slot: &mut String, value: Option<String>| {
            if let Some(value) = value {
                *slot = value;
            }
        };
        replace(&mut self.link_down_action, file.link_down_action);
        replace(&mut self.errors_action, file.errors_action);
        replace(&mut self.fabric_action, file.fabric_action);
        if let Some(severity) = file.errors_severity {
            self.errors_severity = severity;
        }
        if let Some(seconds) = file.fabric_grace_seconds {
            self.fabric_grace = Duration::from_secs(seconds);
        }
        if let Some(limits) = file.max_increase {
            let limit = |slot: &mut u64, value: Option<u64>| {
                if let Some(value) = value {
                    *slot = value;
                }
            };
            limit(&mut self.max_increase.crc_flit, limits.crc_flit);
            limit(&mut self.max_increase.crc_data, limits.crc_data);
            limit(&mut self.max_increase.replay, limits.replay);
            limit(&mut self.max_increase.recovery, limits.recovery);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(yaml: &str) -> LinkPolicyFile {
        serde_yaml::from_str(yaml).unwrap()
    }

    #[test]
    fn an_override_replaces_only_the_fields_it_names() {
        let mut policy = LinkPolicy::default();
        policy
            .merge(file("maxIncrease: {replay: 7}\nfabricGraceSeconds: 3\n"))
            .unwrap();
        assert_eq!(policy.max_increase.replay, 7);
        assert_eq!(policy.max_increase.crc_flit, 100, "the others stay");
        assert_eq!(policy.fabric_grace, Duration::from_secs(3));
        assert_eq!(policy.window, Duration::from_secs(300));
    }

    #[test]
    fn a_window_the_history_cannot_hold_is_refused() {
        let mut policy = LinkPolicy::default();
        assert!(policy.merge(file("windowSeconds: 0")).is_err());
        assert!(policy.merge(file("windowSeconds: 7200")).is_err());
        assert!(
            serde_yaml::from_str::<LinkPolicyFile>("windowSecond: 5").is_err(),
            "typo refused"
        );
    }
}
