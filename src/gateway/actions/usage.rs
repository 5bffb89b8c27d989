//! `usage`: tokens, cost and the saving over `report.reference_price`, per tier and per model,
//! so the host (and the person behind it) can see what delegation is worth.

use rmcp::model::ToolAnnotations;
use schemars::JsonSchema;
use serde::Deserialize;

use super::{ActionSpec, Ctx};
use crate::config::HumanDuration;
use crate::gateway::error::ToolError;
use crate::tasks::epoch_ms;
use crate::tasks::store::usage::{self, UsageReport};

/// Arguments of `usage`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Args {
    /// A period, e.g. `24h`. Default: since the gateway started.
    #[serde(default)]
    pub since: Option<String>,
}

/// The `usage` action.
pub struct Usage;

impl ActionSpec for Usage {
    type Args = Args;
    type Output = UsageReport;
    const TITLE: &'static str = "Usage and savings";

    /// Reads the task records and changes nothing.
    fn annotations() -> ToolAnnotations {
        super::observing()
    }
}

pub(super) async fn run(args: Args, ctx: &Ctx<'_>) -> Result<UsageReport, ToolError> {
    let now = epoch_ms(std::time::SystemTime::now());
    let since = match args.since.as_deref() {
        None => ctx.tasks.started_ms,
        Some(text) => {
            let d: HumanDuration = text
                .trim()
                .parse()
                .map_err(|e: String| ToolError::invalid_argument(format!("`since`: {e}")))?;
            now.saturating_sub(u64::try_from(d.get().as_millis()).unwrap_or(u64::MAX))
        }
    };
    let records = ctx.tasks.summaries().await;
    Ok(usage::report(
        &records,
        Some(since),
        now,
        ctx.config.report.reference_price,
    ))
}
