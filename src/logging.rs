//! What the gateway's stderr carries: the `tracing` filter and its `OPENCODE_MCP_LOG` override.
//!
//! By default stderr holds what a user acts on: our own info lines (serving, servers started and
//! stopped, settings not applied) and any dependency's warnings and errors. rmcp logs every MCP
//! message it handles at INFO, which would bury those lines in a host's log panel, so it is held
//! to warnings unless debug output is asked for.
//!
//! `OPENCODE_MCP_LOG` takes a bare level, which means *this crate* at that level (`debug` must
//! not turn on every dependency's debug output, which for hyper and reqwest is per packet), or a
//! full `tracing` filter directive string, which is used as written.

use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;

/// The environment variable that overrides the filter.
pub const LOG_VAR: &str = "OPENCODE_MCP_LOG";

/// The filter when `OPENCODE_MCP_LOG` is unset or empty.
pub const DEFAULT_FILTER: &str = "warn,opencode_mcp=info,rmcp=warn";

/// The filter directives for a value of `OPENCODE_MCP_LOG` (`None`: unset).
///
/// A bare level (any case) is mapped to directives for this crate; anything else is returned
/// as is, to be parsed by [`EnvFilter`].
pub fn directives(value: Option<&str>) -> String {
    let Some(value) = value.map(str::trim).filter(|v| !v.is_empty()) else {
        return DEFAULT_FILTER.to_owned();
    };
    match value.to_ascii_lowercase().as_str() {
        "off" => "off".to_owned(),
        "error" => "error".to_owned(),
        "warn" => "warn".to_owned(),
        "info" => DEFAULT_FILTER.to_owned(),
        // rmcp::service logs each request and response at debug: a line per MCP message,
        // what a debugging user wants next to ours.
        "debug" => "warn,opencode_mcp=debug,rmcp=info,rmcp::service=debug".to_owned(),
        "trace" => "warn,opencode_mcp=trace,rmcp=debug".to_owned(),
        _ => value.to_owned(),
    }
}

/// The filter for a value of `OPENCODE_MCP_LOG`, or why the value is not a filter.
pub fn filter(value: Option<&str>) -> Result<EnvFilter, String> {
    let directives = directives(value);
    EnvFilter::builder()
        .parse(&directives)
        .map_err(|e| format!("{LOG_VAR}={directives:?} is not a log filter: {e}"))
}

/// Installs the stderr subscriber. A malformed `OPENCODE_MCP_LOG` is reported on stderr and the
/// default filter used: losing logs is better than refusing to serve over a typo.
pub fn init() {
    let value = std::env::var(LOG_VAR).ok();
    let filter = filter(value.as_deref()).unwrap_or_else(|e| {
        eprintln!("opencode-mcp: {e}; using {DEFAULT_FILTER:?} (a level such as `debug`, or directives such as `opencode_mcp=debug,rmcp=info`)");
        EnvFilter::new(DEFAULT_FILTER)
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .finish()
        .with(QuietUnservedMethods)
        .init();
}

/// Keeps rmcp's warning about a request of a method the gateway does not serve off stderr.
///
/// rmcp logs every error response at WARN (`response error`), and hosts keep the server's
/// stderr as their MCP log, where a warning reads as a fault. A host probing a method the
/// gateway does not offer (`resources/list`, a newer protocol's method) gets the protocol's
/// answer, -32601 method not found, and that is all: not a warning. Every other error response
/// is still logged.
struct QuietUnservedMethods;

impl<S: tracing::Subscriber> Layer<S> for QuietUnservedMethods {
    fn event_enabled(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) -> bool {
        let meta = event.metadata();
        if *meta.level() != tracing::Level::WARN || !meta.target().starts_with("rmcp::service") {
            return true;
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        !is_method_not_found(&fields.message, &fields.error)
    }
}

/// Whether an rmcp log line with this message and `error` field is a -32601 answer.
fn is_method_not_found(message: &str, error: &str) -> bool {
    message == "response error" && error.contains("ErrorCode(-32601)")
}

/// The two fields of rmcp's `response error` line.
#[derive(Default)]
struct Fields {
    message: String,
    error: String,
}

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => self.message = format!("{value:?}"),
            "error" => self.error = format!("{value:?}"),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_or_empty_is_the_quiet_default() {
        assert_eq!(directives(None), DEFAULT_FILTER);
        assert_eq!(directives(Some("  ")), DEFAULT_FILTER);
        assert_eq!(directives(Some("info")), DEFAULT_FILTER);
    }

    #[test]
    fn a_bare_level_is_this_crate_at_that_level() {
        assert_eq!(
            directives(Some("debug")),
            "warn,opencode_mcp=debug,rmcp=info,rmcp::service=debug"
        );
        assert_eq!(
            directives(Some("DEBUG")),
            "warn,opencode_mcp=debug,rmcp=info,rmcp::service=debug"
        );
        assert_eq!(directives(Some("warn")), "warn");
        for level in ["off", "error", "warn", "info", "debug", "trace"] {
            assert!(filter(Some(level)).is_ok(), "{level}");
        }
    }

    #[test]
    fn directive_strings_pass_through() {
        assert_eq!(
            directives(Some("opencode_mcp=trace,hyper=debug")),
            "opencode_mcp=trace,hyper=debug"
        );
        assert!(filter(Some("opencode_mcp=trace,hyper=debug")).is_ok());
    }

    #[test]
    fn only_a_method_not_found_answer_is_kept_quiet() {
        let not_found = format!(
            "{:?}",
            rmcp::ErrorData::method_not_found::<rmcp::model::ListResourcesRequestMethod>()
        );
        assert!(
            is_method_not_found("response error", &not_found),
            "{not_found}"
        );
        let invalid = format!("{:?}", rmcp::ErrorData::invalid_params("bad", None));
        assert!(
            !is_method_not_found("response error", &invalid),
            "{invalid}"
        );
        assert!(!is_method_not_found("Error sending response", &not_found));
    }

    #[test]
    fn a_malformed_value_says_what_it_is() {
        let err = filter(Some("opencode_mcp=loud")).expect_err("not a level");
        assert!(err.contains("OPENCODE_MCP_LOG"), "{err}");
        assert!(err.contains("opencode_mcp=loud"), "{err}");
    }
}
