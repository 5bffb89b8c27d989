//! [`Surface`]: everything a reload can change, as one immutable snapshot.
//!
//! The config, the tool routes built from it and the prompt list belong together: a tool listed
//! from one config and dispatched with another's limits would be a call that saw half of each.
//! So they are built together from one [`Config`] and replaced together: the gateway holds an
//! `Arc<Surface>` behind a lock taken only to clone or replace it, and every request takes one
//! snapshot at its start and uses it to the end. A reload builds a whole new surface with the
//! same functions start-up uses (`ToolTable::new`, `tools::list`, `prompts::list`), so whatever
//! those learn to build is reloaded with no change here.

use std::sync::{Arc, OnceLock};

use rmcp::model::{Prompt, Tool};

use super::prompts;
use super::tools::{self, ToolTable};
use crate::config::{Config, HostLimits};

/// One configuration and what is built from it for the host.
#[derive(Debug)]
pub struct Surface {
    pub config: Arc<Config>,
    /// Built on first use (the first call), not before `initialize` is answered.
    tools: OnceLock<Arc<ToolTable>>,
    pub prompts: Arc<Vec<Prompt>>,
}

/// What differs between two surfaces, as the connected host sees them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Changes {
    /// The tool list (names, descriptions, schemas) the host would get from `tools/list`.
    pub tools: bool,
    /// The prompt list, or what a prompt renders to.
    pub prompts: bool,
}

impl Surface {
    pub fn new(config: Arc<Config>) -> Self {
        Self {
            tools: OnceLock::new(),
            prompts: Arc::new(prompts::list(&config)),
            config,
        }
    }

    /// Where this configuration's tool calls go.
    pub fn tools(&self) -> &Arc<ToolTable> {
        self.tools
            .get_or_init(|| Arc::new(ToolTable::new(&self.config)))
    }

    /// The limits of the host that called itself `client` at `initialize`.
    pub fn host(&self, client: Option<&str>) -> HostLimits {
        self.config.host(client)
    }

    /// The tool list for a host, built for this `tools/list` (see `tools::list`): the wait
    /// tool's `timeout_ms` bound and default are what that host sits through.
    pub fn tools_for(&self, client: Option<&str>) -> Vec<Tool> {
        let limits = self.host(client);
        if limits.wait_max >= self.config.timeouts.wait_max.get() {
            return tools::list(&self.config);
        }
        let mut seen = self.config.as_ref().clone();
        seen.timeouts.wait_max = limits.wait_max.into();
        seen.timeouts.wait_default = seen.timeouts.wait_default.get().min(limits.wait_max).into();
        tools::list(&seen)
    }

    /// What a host called `client` would find changed going from `self` to `new`.
    pub fn changes(&self, new: &Surface, client: Option<&str>) -> Changes {
        Changes {
            tools: self.tools_for(client) != new.tools_for(client),
            prompts: *self.prompts != *new.prompts || self.config.prompts != new.config.prompts,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ToolConfig;

    fn surface(edit: impl FnOnce(&mut Config)) -> Surface {
        let mut config = crate::gateway::test_config();
        edit(&mut config);
        Surface::new(Arc::new(config))
    }

    #[test]
    fn an_added_tool_changes_the_tools_only() {
        let old = surface(|_| {});
        let new = surface(|c| {
            let status = c.tools["opencode_get_task_status"].clone();
            c.tools.insert("status".into(), status);
        });
        assert_eq!(
            old.changes(&new, None),
            Changes {
                tools: true,
                prompts: false
            }
        );
        assert_eq!(new.tools_for(None).len(), old.tools_for(None).len() + 1);
        assert_eq!(new.tools().names().len(), old.tools().names().len() + 1);
    }

    #[test]
    fn a_prompt_template_edit_changes_the_prompts_only() {
        let old = surface(|_| {});
        let new = surface(|c| {
            if let Some(p) = c.prompts.values_mut().next() {
                p.template.push_str("\nOne more line.");
            }
        });
        assert_eq!(
            old.changes(&new, None),
            Changes {
                tools: false,
                prompts: true
            }
        );
    }

    #[test]
    fn a_setting_no_schema_shows_changes_nothing_the_host_sees() {
        let old = surface(|_| {});
        let new = surface(|c| {
            c.timeouts.stall = std::time::Duration::from_secs(1).into();
        });
        assert_eq!(old.changes(&new, None), Changes::default());
    }

    #[test]
    fn a_hosts_wait_bound_is_a_change_for_that_host_alone() {
        let old = surface(|_| {});
        let new = surface(|c| {
            if let Some(h) = c.hosts.get_mut("codex-mcp-client") {
                h.wait_max = Some(std::time::Duration::from_secs(100).into());
            }
        });
        assert!(old.changes(&new, Some("codex-mcp-client")).tools);
        assert!(!old.changes(&new, Some("claude-code")).tools);
    }

    #[test]
    fn a_disabled_tool_is_a_change() {
        let old = surface(|_| {});
        let new = surface(|c| {
            let usage: &mut ToolConfig = c
                .tools
                .get_mut("opencode_usage")
                .expect("the built-in config has opencode_usage");
            usage.enabled = false;
        });
        assert!(old.changes(&new, None).tools);
    }
}
