//! Configuration errors: every problem names where the value came from (file, environment
//! variable, or the built-in default), the key path, and what was expected.

use std::fmt;
use std::path::PathBuf;

/// The layer a setting came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// The `delegation.yaml` compiled into the binary.
    BuiltIn,
    /// A YAML file on disk (user, repository or `--config`).
    File(PathBuf),
    /// An `OPENCODE_MCP_*` environment variable, by its full name.
    Env(String),
    /// No single layer could be named (should not happen; kept so an error is never lost).
    Unknown,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::BuiltIn => f.write_str(super::load::BUILT_IN_NAME),
            Origin::File(path) => write!(f, "file {}", path.display()),
            Origin::Env(name) => write!(f, "environment variable {name}"),
            Origin::Unknown => f.write_str("the merged configuration"),
        }
    }
}

/// One thing wrong with the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The layer that supplied the offending value.
    pub origin: Origin,
    /// Dotted key path such as `tools.opencode_start_task.action`; empty for a problem with a
    /// whole layer (a YAML syntax error, an unusable variable name).
    pub key: String,
    /// What is wrong, including what was expected.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = if self.key.is_empty() {
            format!("{}: {}", self.origin, self.message)
        } else {
            format!("{}: `{}`: {}", self.origin, self.key, self.message)
        };
        f.write_str(&printable(&text))
    }
}

/// `text` with every control character written as an escape (`\n`, `\u{1b}`): what a
/// repository wrote (a key, a value, a directory name) reaches terminals and host logs through
/// messages, and must neither start a line of its own (a withheld value with a newline became
/// a real `state_dir:` line in `print-config`) nor drive the terminal (ANSI and OSC escapes).
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    printable_keeping(text, &[])
}

/// [`printable`] for text of several lines: newlines (and tabs) stay, every other control
/// character is escaped.
pub fn printable_lines(text: &str) -> std::borrow::Cow<'_, str> {
    printable_keeping(text, &['\n', '\t'])
}

fn printable_keeping<'a>(text: &'a str, keep: &[char]) -> std::borrow::Cow<'a, str> {
    let unsafe_char = |c: char| c.is_control() && !keep.contains(&c) || is_bidi_control(c);
    if !text.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if unsafe_char(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Characters that reorder what a terminal shows (the "Trojan Source" ones).
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200e}' | '\u{200f}')
}

/// Why the configuration could not be loaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The file named by `--config` or `OPENCODE_MCP_CONFIG` is missing or not a file.
    #[error(
        "config file {} (named by --config or OPENCODE_MCP_CONFIG) does not exist or is not a file",
        path.display()
    )]
    MissingFile {
        /// The path as resolved against the working directory.
        path: PathBuf,
    },
    /// The layers were read but the result is invalid. Every problem found is listed.
    #[error("{}", ProblemList(problems))]
    Invalid {
        /// All problems found, in a stable order.
        problems: Vec<Problem>,
    },
}

impl ConfigError {
    /// The individual problems (empty for [`ConfigError::MissingFile`]).
    pub fn problems(&self) -> &[Problem] {
        match self {
            ConfigError::MissingFile { .. } => &[],
            ConfigError::Invalid { problems } => problems,
        }
    }
}

struct ProblemList<'a>(&'a [Problem]);

impl fmt::Display for ProblemList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            [one] => write!(f, "invalid configuration: {one}"),
            many => {
                write!(f, "invalid configuration ({} problems):", many.len())?;
                for problem in many {
                    write!(f, "\n  - {problem}")?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_written_as_escapes() {
        assert_eq!(printable("plain `x`"), "plain `x`");
        assert_eq!(printable("a\nstate_dir: /x"), "a\\nstate_dir: /x");
        assert_eq!(printable("\u{1b}[31mred\u{7}"), "\\u{1b}[31mred\\u{7}");
        assert_eq!(printable("\u{202e}evil"), "\\u{202e}evil");
        assert_eq!(
            printable_lines("one\ntwo\u{1b}]0;x\u{7}"),
            "one\ntwo\\u{1b}]0;x\\u{7}"
        );
        let p = Problem {
            origin: Origin::File("/repo/delegation.yaml".into()),
            key: "tools.\u{1b}[2J".into(),
            message: "unknown key".into(),
        };
        assert!(!p.to_string().contains('\u{1b}'), "{p}");
    }

    #[test]
    fn display_names_origin_key_and_message() {
        let p = Problem {
            origin: Origin::Env("OPENCODE_MCP_TIMEOUTS__TASK".into()),
            key: "timeouts.task".into(),
            message: "expected a duration".into(),
        };
        assert_eq!(
            p.to_string(),
            "environment variable OPENCODE_MCP_TIMEOUTS__TASK: `timeouts.task`: expected a duration"
        );
        let one = ConfigError::Invalid {
            problems: vec![p.clone()],
        };
        assert!(one
            .to_string()
            .starts_with("invalid configuration: environment"));
        let two = ConfigError::Invalid {
            problems: vec![p.clone(), p],
        };
        assert!(two.to_string().contains("(2 problems):\n  - environment"));
    }
}
