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
        if self.key.is_empty() {
            write!(f, "{}: {}", self.origin, self.message)
        } else {
            write!(f, "{}: `{}`: {}", self.origin, self.key, self.message)
        }
    }
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
