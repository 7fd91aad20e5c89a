//! The Events the lifecycle asks to publish about a remediation ([`Note`]), cut to what the API
//! server takes.

use gpu_remediation_api::{GpuRemediationStatus, Phase, text::truncate};
use kube::runtime::events::EventType;

/// The longest Event note; the API server refuses longer ones.
pub const NOTE_MAX: usize = 1000;

/// An Event to publish about the remediation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// Its reason (`PhaseChanged`, `DrainTimeout`, ...).
    pub reason: String,
    /// Normal or Warning.
    pub warning: bool,
    /// What a person reads.
    pub text: String,
}

impl Note {
    /// The Event for a change from `before` to the status's phase (or a step within a phase).
    #[must_use]
    pub fn phase(before: Phase, status: &GpuRemediationStatus, reason: &str, type_: EventType) -> Self {
        let message = status.message.clone().unwrap_or_default();
        Self::new(reason, type_, &format!("{before} → {}: {message}", status.phase))
    }

    /// An Event with this reason and text (cut to what the server takes).
    #[must_use]
    pub fn new(reason: &str, type_: EventType, text: &str) -> Self {
        Self {
            reason: reason.to_owned(),
            warning: type_ == EventType::Warning,
            text: truncate(text, NOTE_MAX),
        }
    }

    /// Its type.
    #[must_use]
    pub fn event_type(&self) -> EventType {
        if self.warning {
            EventType::Warning
        } else {
            EventType::Normal
        }
    }

    /// The Event to publish, for the controller's `action` (`Remediate`, `Admit`).
    #[must_use]
    pub fn event(&self, action: &str) -> kube::runtime::events::Event {
        kube::runtime::events::Event {
            type_: self.event_type(),
            reason: self.reason.clone(),
            note: Some(self.text.clone()),
            action: action.to_owned(),
            secondary: None,
        }
    }
}
