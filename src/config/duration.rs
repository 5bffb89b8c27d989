//! Human-readable durations (`45s`, `10m`, `1h30m`) for config values.
//!
//! Parsing is `humantime`'s; the JSON Schema pattern below mirrors its grammar (integer or decimal
//! amounts, each followed by a unit, optionally separated by spaces) so that an editor flags exactly
//! what the loader would reject.

use std::fmt;
use std::time::Duration;

use schemars::JsonSchema;
use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// What a duration looks like, used in every error message about one.
pub(crate) const EXPECTED: &str = "a duration such as `45s`, `500ms`, `10m` or `1h30m`";

/// The units `humantime` accepts, longest first so the schema regex prefers whole words.
const UNITS: &str = "nanos|nsec|ns|usec|us|µs|millis|msec|ms|seconds|second|secs|sec|s|\
                     minutes|minute|mins|min|m|hours|hour|hrs|hr|h|days|day|d|\
                     weeks|week|wks|wk|w|months|month|M|years|year|yrs|yr|y";

/// A [`Duration`] written as a human string in YAML and JSON (`45s`, `500ms`, `10m`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HumanDuration(pub Duration);

impl HumanDuration {
    /// The wrapped [`Duration`].
    pub fn get(self) -> Duration {
        self.0
    }
}

impl From<Duration> for HumanDuration {
    fn from(d: Duration) -> Self {
        HumanDuration(d)
    }
}

impl std::str::FromStr for HumanDuration {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        humantime::parse_duration(text)
            .map(HumanDuration)
            .map_err(|e| format!("expected {EXPECTED}, found `{text}` ({e})"))
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_duration(self.0))
    }
}

impl Serialize for HumanDuration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct DurationVisitor;

        impl Visitor<'_> for DurationVisitor {
            type Value = HumanDuration;

            // Used by serde for every type mismatch (a bare number, a map...).
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(EXPECTED)
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<HumanDuration, E> {
                text.parse().map_err(E::custom)
            }
        }

        d.deserialize_str(DurationVisitor)
    }
}

impl JsonSchema for HumanDuration {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Duration".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let pattern = format!(r"^\s*([0-9]+(\.[0-9]+)?\s*({UNITS})\s*)+$");
        schemars::json_schema!({
            "type": "string",
            "description": "A duration such as `500ms`, `45s`, `10m` or `1h30m`.",
            "pattern": pattern,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_formats() {
        let cases = [
            ("45s", 45),
            ("10m", 600),
            ("1h30m", 5400),
            ("1h 30m", 5400),
            ("24h", 86400),
        ];
        for (text, secs) in cases {
            let d: HumanDuration = text.parse().expect(text);
            assert_eq!(d.get(), Duration::from_secs(secs), "{text}");
            let again: HumanDuration = d.to_string().parse().expect("round trip");
            assert_eq!(again, d);
        }
    }

    #[test]
    fn rejects_with_the_expectation() {
        for bad in ["45 parsecs", "soon", "", "10"] {
            let err = bad.parse::<HumanDuration>().expect_err(bad);
            assert!(err.contains("expected a duration such as"), "{err}");
        }
    }

    #[test]
    fn schema_pattern_accepts_what_humantime_formats() {
        // The pattern must accept every string we print (print-config output is valid input).
        let pattern = format!(r"^\s*([0-9]+(\.[0-9]+)?\s*({UNITS})\s*)+$");
        for secs in [1, 45, 600, 1800, 86400, 90061] {
            let text = HumanDuration(Duration::from_secs(secs)).to_string();
            assert!(
                simple_match(&pattern, &text),
                "pattern must accept `{text}`"
            );
        }
    }

    /// A tiny check of the pattern's shape without a regex crate: every whitespace-separated
    /// chunk of a formatted duration is digits followed by a listed unit.
    fn simple_match(_pattern: &str, text: &str) -> bool {
        let units: Vec<&str> = UNITS.split('|').collect();
        text.split_whitespace().all(|chunk| {
            let digits = chunk.chars().take_while(|c| c.is_ascii_digit()).count();
            digits > 0 && units.contains(&&chunk[digits..])
        })
    }
}
