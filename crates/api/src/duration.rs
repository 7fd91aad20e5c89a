//! `Duration`: a Go-style duration string (`90s`, `2m`, `1h30m`) as the API server's CEL
//! `duration()` reads it, so the server and this crate agree on every value.
//!
//! Written by hand rather than taken from a crate because the grammar must be exactly Go's
//! `time.ParseDuration` (which CEL uses): humantime, for one, accepts `1 hour` and rejects `1.5h`.

use std::{borrow::Cow, fmt, str::FromStr};

use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A non-negative Go-style duration such as `30s`, `2m`, `1h30m` or `1.5h`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Duration(std::time::Duration);

/// Why a duration string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseDurationError {
    /// The string was empty.
    #[error("a duration must not be empty; write it like 30s, 2m or 1h30m")]
    Empty,
    /// A number was expected.
    #[error("invalid duration {0:?}: expected a number followed by a unit (ns, us, ms, s, m, h)")]
    Malformed(String),
    /// The unit is not one of ns, us, µs, ms, s, m, h.
    #[error("invalid duration {input:?}: unknown unit {unit:?} (use ns, us, ms, s, m or h)")]
    UnknownUnit {
        /// The whole input.
        input: String,
        /// The unit found.
        unit: String,
    },
    /// Negative durations mean nothing here.
    #[error("invalid duration {0:?}: must not be negative")]
    Negative(String),
}

/// The grammar the CRD schema accepts (see `crate::schema`); CEL rules add `> 0s` where zero makes
/// no sense.
pub const DURATION_PATTERN: &str = crate::schema::DURATION_REGEX;

impl Duration {
    /// A duration of `secs` seconds.
    #[must_use]
    pub const fn from_secs(secs: u64) -> Self {
        Self(std::time::Duration::from_secs(secs))
    }

    /// A duration of `mins` minutes.
    #[must_use]
    pub const fn from_mins(mins: u64) -> Self {
        Self(std::time::Duration::from_secs(mins * 60))
    }

    /// A duration of `hours` hours.
    #[must_use]
    pub const fn from_hours(hours: u64) -> Self {
        Self(std::time::Duration::from_secs(hours * 3600))
    }

    /// The standard-library duration.
    #[must_use]
    pub const fn as_std(self) -> std::time::Duration {
        self.0
    }

    /// Whether the duration is zero.
    #[must_use]
    pub const fn is_zero(self) -> bool {
        self.0.is_zero()
    }
}

impl From<std::time::Duration> for Duration {
    fn from(d: std::time::Duration) -> Self {
        Self(d)
    }
}

impl From<Duration> for std::time::Duration {
    fn from(d: Duration) -> Self {
        d.0
    }
}

impl FromStr for Duration {
    type Err = ParseDurationError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        if input.is_empty() {
            return Err(ParseDurationError::Empty);
        }
        if input.starts_with('-') {
            return Err(ParseDurationError::Negative(input.to_owned()));
        }
        let body = input.strip_prefix('+').unwrap_or(input);
        if body == "0" {
            return Ok(Self::default());
        }
        let mut total_nanos: f64 = 0.0;
        let mut rest = body;
        while !rest.is_empty() {
            let number_len = rest
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .unwrap_or(rest.len());
            let number = &rest[..number_len];
            if number.is_empty() || number == "." || number.matches('.').count() > 1 {
                return Err(ParseDurationError::Malformed(input.to_owned()));
            }
            let value: f64 = number
                .parse()
                .map_err(|_| ParseDurationError::Malformed(input.to_owned()))?;
            rest = &rest[number_len..];
            let unit_len = rest
                .find(|c: char| c.is_ascii_digit() || c == '.')
                .unwrap_or(rest.len());
            let unit = &rest[..unit_len];
            let nanos_per_unit = match unit {
                "ns" => 1.0,
                "us" | "µs" | "μs" => 1e3,
                "ms" => 1e6,
                "s" => 1e9,
                "m" => 60e9,
                "h" => 3600e9,
                "" => return Err(ParseDurationError::Malformed(input.to_owned())),
                other => {
                    return Err(ParseDurationError::UnknownUnit {
                        input: input.to_owned(),
                        unit: other.to_owned(),
                    });
                }
            };
            total_nanos += value * nanos_per_unit;
            rest = &rest[unit_len..];
        }
        // Durations here are seconds to days; f64 holds them to well under a nanosecond per second.
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "checked non-negative above"
        )]
        let nanos = total_nanos.round() as u64;
        Ok(Self(std::time::Duration::from_nanos(nanos)))
    }
}

impl fmt::Display for Duration {
    /// Formats the way people write durations in a policy: `1h30m`, `2m`, `45s`, `1.5s`, `0s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total = self.0;
        if total.is_zero() {
            return f.write_str("0s");
        }
        let secs = total.as_secs();
        let nanos = total.subsec_nanos();
        let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
        if h > 0 {
            write!(f, "{h}h")?;
        }
        if m > 0 {
            write!(f, "{m}m")?;
        }
        if nanos > 0 {
            let frac = format!("{nanos:09}");
            write!(f, "{s}.{}s", frac.trim_end_matches('0'))?;
        } else if s > 0 {
            write!(f, "{s}s")?;
        }
        Ok(())
    }
}

impl Serialize for Duration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = Cow::<str>::deserialize(deserializer)?;
        raw.parse().map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for Duration {
    fn schema_name() -> Cow<'static, str> {
        "Duration".into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        crate::schema::duration(generator)
    }

    fn inline_schema() -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> std::time::Duration {
        s.parse::<Duration>().unwrap().as_std()
    }

    #[test]
    fn parses_what_go_parses() {
        assert_eq!(parse("30s"), std::time::Duration::from_secs(30));
        assert_eq!(parse("2m"), std::time::Duration::from_secs(120));
        assert_eq!(parse("1h30m"), std::time::Duration::from_secs(5400));
        assert_eq!(parse("1.5h"), std::time::Duration::from_secs(5400));
        assert_eq!(parse("250ms"), std::time::Duration::from_millis(250));
        assert_eq!(parse("0"), std::time::Duration::ZERO);
    }

    #[test]
    fn refuses_what_go_refuses() {
        for bad in ["", "5", "1 hour", "1d", "-5m", "m", "1..5s", "h1"] {
            assert!(bad.parse::<Duration>().is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn display_round_trips() {
        for s in ["0s", "45s", "2m", "1h30m", "24h", "1.5s", "1h0m5s"] {
            let d: Duration = s.parse().unwrap();
            assert_eq!(d.to_string().parse::<Duration>().unwrap(), d, "{s}");
        }
        assert_eq!(Duration::from_mins(90).to_string(), "1h30m");
    }
}
