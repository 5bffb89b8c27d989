//! Prompt templates: plain text with `{{name}}` placeholders, and `{{tool:<action>}}` in every
//! text the host reads.
//!
//! One grammar serves validation (every placeholder must name a declared argument or `tiers`) and
//! rendering, so the two cannot disagree. A placeholder is `{{`, a name of letters, digits, `_` or
//! `-`, then `}}`; spaces inside the braces are allowed (`{{ task }}`). Anything else, such as a
//! lone `{{`, is literal text.
//!
//! `{{tool:<action>}}` (e.g. `{{tool:start_task}}`) stands for the name of the enabled tool bound
//! to that action, so text that tells the host which tool to call follows the tool table when a
//! tool is renamed (a new entry with the same action, the old one disabled). It is rendered once,
//! when the configuration is loaded, in the instructions, tool titles and descriptions, and prompt
//! descriptions, argument descriptions and templates; if several enabled tools share the action,
//! the first by name is used. Anything that starts `{{tool:` and ends at the next `}}` counts, so
//! a misspelt action is reported rather than sent as literal text.

use std::collections::BTreeMap;

use super::types::{Action, Config, PromptConfig};

/// What starts a tool-name placeholder's inner text.
pub const TOOL_PREFIX: &str = "tool:";

/// The placeholder the gateway fills with the rendered tier list.
pub const TIERS_PLACEHOLDER: &str = "tiers";

/// One placeholder found in a template: its name and the byte range it covers (braces included).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Placeholder<'a> {
    name: &'a str,
    start: usize,
    end: usize,
}

fn scan(template: &str) -> Vec<Placeholder<'_>> {
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(open) = template[from..].find("{{").map(|i| from + i) {
        let inner_start = open + 2;
        let Some(close) = template[inner_start..].find("}}").map(|i| inner_start + i) else {
            break;
        };
        let name = template[inner_start..close].trim();
        let is_name = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        let is_tool = name.starts_with(TOOL_PREFIX) && !name.contains('{');
        if is_name || is_tool {
            found.push(Placeholder {
                name,
                start: open,
                end: close + 2,
            });
            from = close + 2;
        } else {
            // Not a placeholder: step past this `{{` only, so `{{{{x}}` still finds `{{x}}`.
            from = open + 1;
        }
    }
    found
}

/// The placeholder names in `template`, in order of appearance (repeats included), without the
/// `{{tool:...}}` ones (see [`tool_placeholders`]), which are not prompt arguments.
pub fn placeholders(template: &str) -> Vec<&str> {
    scan(template)
        .into_iter()
        .map(|p| p.name)
        .filter(|name| !name.starts_with(TOOL_PREFIX))
        .collect()
}

/// The actions named by `{{tool:<action>}}` placeholders in `text`, as written (trimmed), in
/// order of appearance. Unknown names are returned too: validation reports them.
pub fn tool_placeholders(text: &str) -> Vec<&str> {
    scan(text)
        .into_iter()
        .filter_map(|p| p.name.strip_prefix(TOOL_PREFIX))
        .map(str::trim)
        .collect()
}

/// The action called `name` in `delegation.yaml`, if there is one.
pub fn action_named(name: &str) -> Option<Action> {
    Action::ALL.into_iter().find(|a| a.as_str() == name)
}

/// For each action with an enabled tool, that tool's name: a plain tool (an alias that only names
/// the action) before a preset, since text that says "call X with `tier`" or "wait on the group
/// with X" means the action with all its arguments, which a preset may fix or change (a
/// `mode: any` wait, a preset with its own template); among equals the first by name (the tool
/// map is ordered by name), so the choice does not depend on file order.
pub fn tool_names(config: &Config) -> BTreeMap<Action, String> {
    let mut names = BTreeMap::new();
    for preset in [false, true] {
        for (name, tool) in config.enabled_tools() {
            if tool.is_preset() == preset {
                names.entry(tool.action).or_insert_with(|| name.to_string());
            }
        }
    }
    names
}

/// Replaces each `{{tool:<action>}}` in `text` with the name `names` gives that action; one it
/// does not know (an unknown action, or one without an enabled tool) is left as written, which a
/// validated config never contains.
pub fn render_tools(text: &str, names: &BTreeMap<Action, String>) -> String {
    render(text, |name| {
        let action = action_named(name.strip_prefix(TOOL_PREFIX)?.trim())?;
        names.get(&action).cloned()
    })
}

/// One piece of free text the host reads: its key path in the file, whether the host is shown it
/// (a disabled tool's description is not), and the text.
pub(crate) struct Text<'a> {
    pub key: String,
    pub shown: bool,
    pub text: &'a str,
}

/// Every text that may hold `{{tool:...}}`, in file order, keyed as in errors.
pub(crate) fn texts(config: &Config) -> Vec<Text<'_>> {
    let mut out = vec![Text {
        key: "instructions".to_string(),
        shown: true,
        text: &config.instructions,
    }];
    for (name, tool) in &config.tools {
        if let Some(title) = &tool.title {
            out.push(Text {
                key: format!("tools.{name}.title"),
                shown: tool.enabled,
                text: title,
            });
        }
        out.push(Text {
            key: format!("tools.{name}.description"),
            shown: tool.enabled,
            text: &tool.description,
        });
    }
    for (name, prompt) in &config.prompts {
        out.push(Text {
            key: format!("prompts.{name}.description"),
            shown: true,
            text: &prompt.description,
        });
        for (i, arg) in prompt.arguments.iter().enumerate() {
            out.push(Text {
                key: format!("prompts.{name}.arguments.{i}.description"),
                shown: true,
                text: &arg.description,
            });
        }
        out.push(Text {
            key: format!("prompts.{name}.template"),
            shown: true,
            text: &prompt.template,
        });
    }
    out
}

/// Renders every `{{tool:<action>}}` in the config's texts (see [`texts`]) to tool names. Run
/// once on a validated config, so every placeholder has a tool.
pub(crate) fn render_tool_names(config: &mut Config) {
    let names = tool_names(config);
    config.instructions_source = super::Provenance(config.instructions.clone());
    let fill = |text: &mut String| {
        if text.contains("{{") {
            *text = render_tools(text, &names);
        }
    };
    fill(&mut config.instructions);
    for tool in config.tools.values_mut() {
        if let Some(title) = &mut tool.title {
            fill(title);
        }
        fill(&mut tool.description);
    }
    for prompt in config.prompts.values_mut() {
        fill(&mut prompt.description);
        for arg in &mut prompt.arguments {
            fill(&mut arg.description);
        }
        fill(&mut prompt.template);
    }
}

/// A literal tool name in a text the host reads that names no enabled tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleMention {
    /// Where the text is (`instructions`, `tools.<name>.description`, ...).
    pub key: String,
    /// The `opencode_...` word found there.
    pub name: String,
}

impl std::fmt::Display for StaleMention {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "warning: `{}` mentions `{}`, which is not an enabled tool: the host would be told to \
             call a tool that is not there; write `{{{{tool:<action>}}}}` to name whichever tool \
             is bound to the action",
            self.key, self.name
        )
    }
}

/// Every literal `opencode_<name>` in the texts the host is shown (rendered, so placeholders
/// already stand for enabled tools) that is not an enabled tool. A warning for `check-config`,
/// not an error: the word may be meant as prose, and the gateway still works.
pub fn stale_mentions(config: &Config) -> Vec<StaleMention> {
    texts(config)
        .into_iter()
        .filter(|t| t.shown)
        .flat_map(|t| {
            stale_tool_mentions(t.text, config)
                .into_iter()
                .map(move |name| StaleMention {
                    key: t.key.clone(),
                    name: name.to_string(),
                })
        })
        .collect()
}

/// A literal `opencode_<name>` in `text` that is not an enabled tool: text written for the
/// default tool names that a rename or a disabled tool left behind. Only whole words count, so
/// `mcp__opencode__x` or `opencode_*` are not mentions.
fn stale_tool_mentions<'a>(text: &'a str, config: &Config) -> Vec<&'a str> {
    let is_name_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    let mut found: Vec<&str> = Vec::new();
    for (start, _) in text.match_indices("opencode_") {
        if text[..start].chars().next_back().is_some_and(is_name_char) {
            continue;
        }
        let rest = &text[start..];
        let end = rest.find(|c: char| !is_name_char(c)).unwrap_or(rest.len());
        let word = rest[..end].trim_end_matches(['-', '_']);
        if word.len() > "opencode_".len()
            && !config.tools.get(word).is_some_and(|t| t.enabled)
            && !found.contains(&word)
        {
            found.push(word);
        }
    }
    found
}

/// Replaces every placeholder for which `value` returns `Some`; others are left as written.
pub fn render(template: &str, mut value: impl FnMut(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(template.len());
    let mut last = 0;
    for p in scan(template) {
        if let Some(text) = value(p.name) {
            out.push_str(&template[last..p.start]);
            out.push_str(&text);
            last = p.end;
        }
    }
    out.push_str(&template[last..]);
    out
}

impl PromptConfig {
    /// The placeholder names used in the template.
    pub fn placeholders(&self) -> Vec<&str> {
        placeholders(&self.template)
    }

    /// Renders the template: `tiers` becomes `tiers_text`, each declared argument its value from
    /// `args` (or empty text when absent). Undeclared placeholders cannot occur in a validated
    /// config; they would be left as written.
    pub fn render(
        &self,
        args: &std::collections::BTreeMap<String, String>,
        tiers_text: &str,
    ) -> String {
        render(&self.template, |name| {
            if name == TIERS_PLACEHOLDER {
                Some(tiers_text.to_string())
            } else if self.arguments.iter().any(|a| a.name == name) {
                Some(args.get(name).cloned().unwrap_or_default())
            } else {
                None
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_placeholders() {
        assert_eq!(
            placeholders("a {{task}} b {{ tiers }} {{task}} {{bad name}} {{}} {{x"),
            vec!["task", "tiers", "task"]
        );
        assert_eq!(placeholders("{{{{x}}"), vec!["x"]);
        assert!(placeholders("no braces { here }").is_empty());
    }

    #[test]
    fn renders_known_and_keeps_unknown() {
        let out = render("do {{task}} with {{ tiers }} and {{other}}", |n| match n {
            "task" => Some("X".into()),
            "tiers" => Some("- fast".into()),
            _ => None,
        });
        assert_eq!(out, "do X with - fast and {{other}}");
    }

    #[test]
    fn prompt_render_fills_missing_optional_with_empty() {
        let prompt = PromptConfig {
            description: "d".into(),
            arguments: vec![
                super::super::PromptArgument {
                    name: "task".into(),
                    description: "t".into(),
                    required: true,
                },
                super::super::PromptArgument {
                    name: "context".into(),
                    description: "c".into(),
                    required: false,
                },
            ],
            template: "[{{task}}][{{context}}][{{tiers}}]".into(),
        };
        let mut args = std::collections::BTreeMap::new();
        args.insert("task".to_string(), "T".to_string());
        assert_eq!(prompt.render(&args, "L"), "[T][][L]");
    }

    /// The built-in config, with `yaml` merged over it as the repository's file.
    fn load_repo(yaml: &str) -> Result<Config, crate::config::ConfigError> {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        std::fs::write(dir.path().join("delegation.yaml"), yaml)
            .unwrap_or_else(|e| panic!("write: {e}"));
        let sources = crate::config::Sources {
            explicit: None,
            cwd: dir.path().to_path_buf(),
            user_dir: None,
            frozen_repository: None,
        };
        crate::config::load_with_env(&sources, Vec::new())
    }

    #[test]
    fn tool_placeholders_are_not_prompt_arguments() {
        let text = "call {{tool:start_task}}, then {{ tool: wait_for_task }} on {{task}} \
                    and {{tool:}} {{tool:bad name}}";
        assert_eq!(placeholders(text), vec!["task"]);
        assert_eq!(
            tool_placeholders(text),
            vec!["start_task", "wait_for_task", "", "bad name"]
        );
    }

    #[test]
    fn renders_the_first_enabled_plain_tool_by_name() {
        let mut config = crate::gateway::test_config();
        let start = |name: &str, enabled: bool| super::super::ToolConfig {
            action: Action::StartTask,
            description: format!("{name} starts"),
            enabled,
            title: None,
            always_load: false,
            search_hint: None,
            arguments: Vec::new(),
            prompt: None,
            fixed: Default::default(),
        };
        config
            .tools
            .insert("zz_start".into(), start("zz_start", true));
        config
            .tools
            .insert("aa_start".into(), start("aa_start", false));
        let names = tool_names(&config);
        assert_eq!(names[&Action::StartTask], "opencode_start_task");
        config
            .tools
            .get_mut("opencode_start_task")
            .unwrap_or_else(|| panic!("built-in tool"))
            .enabled = false;
        let names = tool_names(&config);
        assert_eq!(names[&Action::StartTask], "zz_start");
        assert_eq!(
            render_tools(
                "{{tool:start_task}} / {{ tool:start_task }} / {{tool:nope}} / {{task}}",
                &names
            ),
            "zz_start / zz_start / {{tool:nope}} / {{task}}"
        );
        // A preset sorted first is not the action's name while a plain tool is enabled: it may
        // fix the very arguments the text tells the host to pass.
        let mut preset = start("aa_preset", true);
        preset
            .fixed
            .insert("tier".into(), serde_json::Value::from("fast"));
        config.tools.insert("aa_preset".into(), preset);
        assert_eq!(tool_names(&config)[&Action::StartTask], "zz_start");
        config
            .tools
            .get_mut("zz_start")
            .unwrap_or_else(|| panic!("zz_start"))
            .enabled = false;
        assert_eq!(tool_names(&config)[&Action::StartTask], "aa_preset");
    }

    #[test]
    fn the_built_in_texts_use_placeholders_and_render_to_default_names() {
        assert!(crate::config::DEFAULT_YAML.contains("{{tool:start_task}}"));
        assert!(crate::config::DEFAULT_YAML.contains("{{tool:wait_for_task}}"));
        let config = crate::gateway::test_config();
        for text in texts(&config) {
            assert!(
                !text.text.contains("{{tool:"),
                "{}: {}",
                text.key,
                text.text
            );
        }
        assert!(config
            .instructions
            .contains("opencode_start_task (server_id"));
        assert!(
            stale_mentions(&config).is_empty(),
            "{:?}",
            stale_mentions(&config)
        );
    }

    #[test]
    fn a_renamed_tool_is_named_everywhere() {
        let config = load_repo(
            "tools:\n  delegate_start:\n    action: start_task\n    description: Start one.\n  \
             opencode_start_task:\n    enabled: false\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(config.instructions.contains("delegate_start (server_id"));
        for text in texts(&config).iter().filter(|t| t.shown) {
            assert!(
                !text.text.contains("opencode_start_task"),
                "{}: {}",
                text.key,
                text.text
            );
        }
        assert!(stale_mentions(&config).is_empty());
    }

    #[test]
    fn an_unknown_action_is_an_error_naming_key_and_actions() {
        let err = load_repo(
            "tools:\n  opencode_cancel_task:\n    description: Stop it; see {{tool:stat}}.\n",
        )
        .map(|_| ())
        .unwrap_err()
        .to_string();
        for needle in [
            "delegation.yaml",
            "`tools.opencode_cancel_task.description`",
            "unknown action `stat`",
            "start_task",
            "discard_task",
        ] {
            assert!(err.contains(needle), "{needle}: {err}");
        }
    }

    #[test]
    fn a_placeholder_without_an_enabled_tool_is_an_error() {
        // The built-in instructions name `{{tool:apply_task}}`.
        let err = load_repo("tools:\n  opencode_apply_task:\n    enabled: false\n")
            .map(|_| ())
            .unwrap_err()
            .to_string();
        for needle in [
            "delegation.yaml",
            "`tools.opencode_apply_task.enabled`",
            "`instructions` names `{{tool:apply_task}}`",
            "no enabled tool is bound to action apply_task",
        ] {
            assert!(err.contains(needle), "{needle}: {err}");
        }
        // A disabled tool's own description is never shown: only its action name is checked.
        load_repo(
            "tools:\n  opencode_cancel_task:\n    enabled: false\n    description: \
             use {{tool:cancel_task}}\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
    }

    #[test]
    fn instructions_limit_counts_rendered_text() {
        // 2040 characters as written; a 30-character tool name makes it longer than 2048.
        let long = "x".repeat(2040 - "{{tool:start_task}}".len());
        let yaml = format!(
            "instructions: '{{{{tool:start_task}}}}{long}'\ntools:\n  \
             a_tool_name_of_thirty_chars_xx:\n    action: start_task\n    description: d\n  \
             opencode_start_task:\n    enabled: false\n"
        );
        let err = load_repo(&yaml).map(|_| ()).unwrap_err().to_string();
        assert!(err.contains("`instructions`"), "{err}");
        assert!(err.contains("found 2051"), "{err}");
    }

    #[test]
    fn stale_mentions_are_whole_words_naming_no_enabled_tool() {
        let mut config = crate::gateway::test_config();
        config.instructions = "Use opencode_start_task, not opencode_gone or opencode_gone; \
                               opencode_* and mcp__opencode__x and opencode_mcp_x are fine? no"
            .into();
        config
            .tools
            .get_mut("opencode_cancel_task")
            .unwrap_or_else(|| panic!("built-in tool"))
            .description = "see opencode_stop_server".into();
        let found = stale_mentions(&config);
        let got: Vec<(&str, &str)> = found
            .iter()
            .map(|m| (m.key.as_str(), m.name.as_str()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("instructions", "opencode_gone"),
                ("instructions", "opencode_mcp_x")
            ]
        );
        assert!(found[0].to_string().contains("not an enabled tool"));
    }
}
