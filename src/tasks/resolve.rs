//! Agents, models and tiers, checked against the live server: what `list_agents` reports and
//! how `start_task` and `continue_task` turn an agent, a model or a tier into what the prompt
//! asks for.

use schemars::JsonSchema;
use serde::Serialize;

use super::error::TaskError;
use crate::config::{Config, Tier};
use crate::opencode::{AgentInfo, Api, Listing, ModelCatalog, Server};

/// A tier and what it resolves to on one server.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct TierResolution {
    pub name: String,
    pub handles: String,
    /// The model the tier resolves to now (`provider/model`); absent = the server's default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// `false` when the tier lists models and the server offers none of them.
    pub available: bool,
}

/// What `list_agents` reports.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct AgentCatalog {
    pub server_id: String,
    pub agents: Vec<AgentInfo>,
    /// Every model the server offers, as exact `provider/model` ids.
    pub models: Vec<String>,
    /// The server's default model per provider (`provider/model`).
    pub default_models: Vec<String>,
    pub tiers: Vec<TierResolution>,
}

/// What a server offers, and what each configured tier resolves to there.
pub(super) async fn catalog(server: &Server, config: &Config) -> Result<AgentCatalog, TaskError> {
    let (agents, catalog) = tokio::join!(
        server.api.agents(&server.directory),
        server.api.models(&server.directory)
    );
    let (agents, catalog) = (agents?, catalog?);
    let tiers = config
        .tiers
        .iter()
        .map(|t| resolve_tier(t, &catalog))
        .collect();
    Ok(AgentCatalog {
        server_id: server.id.clone(),
        agents,
        default_models: catalog
            .defaults
            .iter()
            .map(|(p, m)| format!("{p}/{m}"))
            .collect(),
        models: catalog.models,
        tiers,
    })
}

/// The configured tier named `tier`, if one is named; an unknown name is refused.
pub(super) fn known_tier<'c>(
    config: &'c Config,
    tier: Option<&str>,
) -> Result<Option<&'c crate::config::Tier>, TaskError> {
    let Some(name) = tier else {
        return Ok(None);
    };
    config
        .tiers
        .iter()
        .find(|t| t.name == name)
        .map(Some)
        .ok_or_else(|| {
            TaskError::InvalidArgument(format!(
                "unknown tier `{name}`; configured tiers: {}",
                config
                    .tiers
                    .iter()
                    .map(|t| t.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })
}

/// Checks agent, model, tier and variant against the live server; returns the model and
/// variant to use. The variant is the call's, else the tier's; it must be one the chosen
/// model offers (OpenCode itself takes any word and silently runs the model without it).
///
/// The server's listings are those read within the last minute if any (see
/// `opencode::listings`); a choice they refuse is checked once more against fresh ones, so
/// only what the server offers now can fail the call.
pub(super) async fn choose(
    config: &Config,
    server: &Server,
    directory: &str,
    agent: Option<&str>,
    model: Option<&str>,
    tier: Option<&str>,
    variant: Option<&str>,
) -> Result<Choice, TaskError> {
    let tier = known_tier(config, tier)?;
    let asked = Asked {
        agent,
        model,
        tier,
        variant,
    };
    let need_agents = agent.is_some();
    let need_models =
        model.is_some() || asked.variant().is_some() || tier.is_some_and(|t| !t.models.is_empty());
    let read = |reuse: bool| listings(&server.api, directory, need_agents, need_models, reuse);
    let (agents, catalog) = read(true).await?;
    let remembered = agents.as_ref().is_some_and(|l| l.remembered)
        || catalog.as_ref().is_some_and(|l| l.remembered);
    let decided = asked.decide(
        agents.as_ref().map(|l| l.value.as_slice()),
        catalog.as_ref().map(|l| &*l.value),
    );
    match decided {
        Err(TaskError::InvalidArgument(why)) if remembered => {
            tracing::debug!(
                "the remembered listings of {directory} refuse the choice ({why}); reading \
                     them again"
            );
            let (agents, catalog) = read(false).await?;
            asked.decide(
                agents.as_ref().map(|l| l.value.as_slice()),
                catalog.as_ref().map(|l| &*l.value),
            )
        }
        decided => decided,
    }
}

/// The server's agents and models, each only if `need`ed: remembered ones if `reuse` (see
/// `opencode::listings`), else read now.
async fn listings(
    api: &Api,
    directory: &str,
    need_agents: bool,
    need_models: bool,
    reuse: bool,
) -> Result<
    (
        Option<Listing<Vec<AgentInfo>>>,
        Option<Listing<ModelCatalog>>,
    ),
    TaskError,
> {
    let (agents, catalog) = tokio::join!(
        async {
            match need_agents {
                true => api.agent_listing(directory, reuse).await.map(Some),
                false => Ok(None),
            }
        },
        async {
            match need_models {
                true => api.model_listing(directory, reuse).await.map(Some),
                false => Ok(None),
            }
        }
    );
    Ok((agents?, catalog?))
}

/// What a `start_task` or `continue_task` asked to run on.
#[derive(Clone, Copy)]
struct Asked<'a> {
    agent: Option<&'a str>,
    model: Option<&'a str>,
    tier: Option<&'a Tier>,
    /// The call's own variant.
    variant: Option<&'a str>,
}

impl Asked<'_> {
    /// The call's variant, else the tier's.
    fn variant(&self) -> Option<&str> {
        self.variant
            .or(self.tier.and_then(|t| t.variant.as_deref()))
    }

    /// The choice, judged against the server's listings (`None`: not needed for this call).
    fn decide(
        &self,
        agents: Option<&[AgentInfo]>,
        catalog: Option<&ModelCatalog>,
    ) -> Result<Choice, TaskError> {
        if let (Some(name), Some(agents)) = (self.agent, agents) {
            if !agents.iter().any(|a| a.name == name) {
                return Err(TaskError::InvalidArgument(format!(
                    "unknown agent `{name}`; this server offers: {}",
                    agents
                        .iter()
                        .map(|a| a.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
        }
        let empty = ModelCatalog::default();
        let catalog = catalog.unwrap_or(&empty);
        let chosen = if let Some(m) = self.model {
            if !catalog.contains(m) {
                return Err(TaskError::InvalidArgument(format!(
                    "unknown model `{m}`; this server offers: {}",
                    list_some(&catalog.models)
                )));
            }
            Some(m.to_string())
        } else if let Some(t) = self.tier {
            let r = resolve_tier(t, catalog);
            if !r.available {
                return Err(TaskError::InvalidArgument(format!(
                    "tier `{}` lists {} but this server offers none of them; it offers: {}",
                    t.name,
                    t.models.join(", "),
                    list_some(&catalog.models)
                )));
            }
            r.model
        } else {
            None
        };
        let variant = self.variant();
        if let Some(v) = variant {
            check_variant(v, chosen.as_deref(), catalog).map_err(|e| match self.tier {
                // The tier's own variant: say where it is set.
                Some(t) if self.variant.is_none() => TaskError::InvalidArgument(format!(
                    "tier `{}` in delegation.yaml (`variant`): {e}",
                    t.name
                )),
                _ => e,
            })?;
        }
        Ok(Choice {
            price: chosen
                .as_deref()
                .and_then(|m| catalog.prices.get(m))
                .copied(),
            model: chosen,
            variant: variant.map(str::to_string),
        })
    }
}

/// What a task runs on: the model (`None`: the server's default), its variant, and its price
/// in the catalog (for the usage report, when OpenCode reports no cost).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Choice {
    pub model: Option<String>,
    pub variant: Option<String>,
    pub price: Option<crate::opencode::Price>,
}

/// `variant` must be one `model` offers; a model without variants refuses any, and so does the
/// server's default model (it is not known which one that is).
pub fn check_variant(
    variant: &str,
    model: Option<&str>,
    catalog: &ModelCatalog,
) -> Result<(), TaskError> {
    let Some(model) = model else {
        return Err(TaskError::InvalidArgument(format!(
            "variant `{variant}` needs a model: name one with `model` (or a tier that lists \
             models); the server's default model is not known to offer it"
        )));
    };
    let offered = catalog.variants_of(model);
    if offered.iter().any(|v| v == variant) {
        return Ok(());
    }
    Err(TaskError::InvalidArgument(if offered.is_empty() {
        format!("model `{model}` has no variants, so variant `{variant}` cannot run on it")
    } else {
        format!(
            "model `{model}` has no variant `{variant}`; its variants are: {}",
            offered.join(", ")
        )
    }))
}

/// A tier's model on a server: the first listed model the server offers; a tier that lists no
/// models means the server's default.
pub fn resolve_tier(tier: &Tier, catalog: &ModelCatalog) -> TierResolution {
    let (model, available) = if tier.models.is_empty() {
        (None, true)
    } else {
        match tier.models.iter().find(|m| catalog.contains(m)) {
            Some(m) => (Some(m.clone()), true),
            None => (None, false),
        }
    };
    TierResolution {
        name: tier.name.clone(),
        handles: tier.handles.clone(),
        model,
        available,
    }
}

fn list_some(items: &[String]) -> String {
    const MAX: usize = 40;
    if items.is_empty() {
        return "(none)".into();
    }
    let mut s = items
        .iter()
        .take(MAX)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if items.len() > MAX {
        s.push_str(&format!(", ... ({} more)", items.len() - MAX));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tier(models: &[&str]) -> Tier {
        Tier {
            name: "fast".into(),
            handles: "x".into(),
            models: models.iter().map(|m| m.to_string()).collect(),
            ..Tier::default()
        }
    }

    #[test]
    fn tiers_resolve_to_the_first_offered_model() {
        let catalog = ModelCatalog {
            models: vec!["a/one".into(), "b/two".into()],
            ..ModelCatalog::default()
        };
        assert_eq!(
            resolve_tier(&tier(&["z/nope", "b/two", "a/one"]), &catalog).model,
            Some("b/two".into())
        );
        let none = resolve_tier(&tier(&["z/nope"]), &catalog);
        assert!(!none.available && none.model.is_none());
        let default = resolve_tier(&tier(&[]), &catalog);
        assert!(default.available && default.model.is_none());
    }
}
