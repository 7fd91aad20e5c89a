//! One rule a policy breaks, worded as the API server words it: what `crate::validate` and the
//! ladder's checks (`crate::ladder_schema`) return.

use std::fmt;

/// One rule a policy breaks: where, and why, as the API server would say it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The field, written like the API server writes it: `spec.triggers[0].status`.
    pub field: String,
    /// What is wrong, for a person.
    pub message: String,
}

impl Violation {
    pub(crate) fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.field, self.message)
        }
    }
}
