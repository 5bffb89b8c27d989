//! Preset tools: a `tools:` entry that fixes some of its action's arguments and, for actions
//! that take a `prompt`, replaces the free-form prompt with declared arguments and a template.
//!
//! ```yaml
//! write_tests:
//!   action: start_task
//!   tier: fast                 # fixed: gone from the tool's schema, always sent
//!   description: Write unit tests for one module and run them.
//!   arguments:
//!     - {name: module, description: Path of the module to test, required: true}
//!     - {name: notes, description: Cases that matter}
//!   prompt: |-
//!     Write unit tests for {{ module }}.{% if notes %} {{ notes }}{% endif %}
//! ```
//!
//! Why it exists: the orchestrator otherwise spends premium tokens writing the same long prompt
//! and picking the same tier every day. A preset moves both into the repository's file, and the
//! host sends only what varies.
//!
//! A preset is not a new action. At call time [`Preset::arguments_for_action`] turns the host's
//! arguments into the action's own (declared arguments rendered into `prompt`, fixed values
//! added) and the call then goes through the action's normal parser and checks, so a preset can
//! never do what its action cannot. The action's other arguments stay available to the host
//! (a `directory`, a `title`, an `idempotency_key`), except the fixed ones.
//!
//! Templates are MiniJinja (Jinja2 syntax), so an optional argument can be left out cleanly with
//! `{% if notes %}...{% endif %}`; a missing optional argument renders as nothing. Everything that
//! can be checked before a call is checked when the configuration loads ([`issues`]): fixed keys
//! the action does not take, fixed values its schema refuses (a tier that does not exist),
//! template syntax, and placeholders that name no declared argument. `{{tool:<action>}}` is not
//! available here: this text goes to the agent, not to the host.

use std::collections::BTreeSet;

use minijinja::Environment;
use rmcp::model::JsonObject;
use serde_json::Value;

use super::error::ToolError;
use super::tools;
use crate::config::{Config, Issue, PromptArgument, ToolConfig};

/// The argument a template is rendered into.
const PROMPT: &str = "prompt";

/// The arguments a preset's schema does not require even when its action's does: `server_id`
/// means the gateway's own server when left out, which is what a preset wants.
const DEFAULTED: &[&str] = &["server_id"];

/// Arguments an action refuses together: fixing one hides the other too, since the host could
/// only pass it to be refused (a preset on tier `fast` takes no `model`).
const EXCLUSIVE: &[(&str, &str)] = &[("tier", "model"), ("tiers", "models")];

/// The parts of a tool entry that change its action's arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct Preset {
    arguments: Vec<PromptArgument>,
    template: Option<String>,
    fixed: JsonObject,
    /// The argument names of the tool's own schema, for an error that lists what the host may
    /// pass (the action's parser would list the arguments the preset hides too). Empty: unchecked.
    accepts: Vec<String>,
}

impl Preset {
    /// The preset of a tool entry, or `None` for a plain tool (a name for an action).
    pub fn of(tool: &ToolConfig) -> Option<Self> {
        tool.is_preset().then(|| Self {
            arguments: tool.arguments.clone(),
            template: tool.prompt.clone(),
            fixed: tool
                .fixed
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            accepts: Vec::new(),
        })
    }

    /// The preset with the argument names its tool's schema lists (see `input_schema`).
    pub fn accepting(mut self, names: Vec<String>) -> Self {
        self.accepts = names;
        self
    }

    /// The tool's input schema, from its action's: fixed arguments removed (with those they
    /// exclude), and with a template the declared arguments in place of `prompt` (first among
    /// the required ones).
    pub fn input_schema(&self, action_schema: &JsonObject) -> JsonObject {
        let mut schema = action_schema.clone();
        let mut hidden: BTreeSet<&str> = self.fixed.keys().map(String::as_str).collect();
        if self.template.is_some() {
            hidden.insert(PROMPT);
        }
        for (a, b) in EXCLUSIVE {
            if self.fixed.contains_key(*a) {
                hidden.insert(b);
            }
            if self.fixed.contains_key(*b) {
                hidden.insert(a);
            }
        }
        let mut properties = JsonObject::new();
        for arg in &self.arguments {
            let mut property = JsonObject::new();
            property.insert("type".into(), "string".into());
            property.insert("description".into(), arg.description.clone().into());
            if arg.required {
                property.insert("minLength".into(), 1.into());
            }
            properties.insert(arg.name.clone(), Value::Object(property));
        }
        if let Some(Value::Object(own)) = schema.get("properties") {
            for (name, property) in own {
                if !hidden.contains(name.as_str()) {
                    properties.insert(name.clone(), property.clone());
                }
            }
        }
        let mut required: Vec<Value> = self
            .arguments
            .iter()
            .filter(|a| a.required)
            .map(|a| Value::String(a.name.clone()))
            .collect();
        if let Some(Value::Array(own)) = schema.get("required") {
            required.extend(
                own.iter()
                    .filter(|name| {
                        name.as_str()
                            .is_some_and(|n| !hidden.contains(n) && !DEFAULTED.contains(&n))
                    })
                    .cloned(),
            );
        }
        schema.insert("properties".into(), Value::Object(properties));
        if required.is_empty() {
            schema.remove("required");
        } else {
            schema.insert("required".into(), Value::Array(required));
        }
        schema
    }

    /// Turns the host's arguments for tool `tool` into its action's: the declared arguments are
    /// taken out and rendered into `prompt`, and the fixed values added. Passing a fixed
    /// argument is refused rather than silently overridden in either direction.
    pub fn arguments_for_action(
        &self,
        tool: &str,
        mut args: JsonObject,
    ) -> Result<JsonObject, ToolError> {
        for (name, value) in &self.fixed {
            if args.get(name).is_some_and(|v| !v.is_null()) {
                return Err(ToolError::invalid_argument(format!(
                    "`{name}` is fixed to {value} by the tool `{tool}`; leave it out"
                )));
            }
        }
        // Before the unknown-argument check: `prompt` is the one a host passes out of habit,
        // and this says what to do instead.
        if self.template.is_some()
            && args.contains_key(PROMPT)
            && !self.arguments.iter().any(|a| a.name == PROMPT)
        {
            return Err(ToolError::invalid_argument(format!(
                "the tool `{tool}` writes the prompt from its template; pass its arguments \
                 ({}) instead of `prompt`",
                self.argument_names()
            )));
        }
        if !self.accepts.is_empty() {
            if let Some(unknown) = args
                .keys()
                .find(|k| !self.accepts.contains(k) && !self.fixed.contains_key(*k))
            {
                return Err(ToolError::invalid_argument(format!(
                    "unknown argument `{unknown}` of the tool `{tool}`; it takes: {}",
                    self.accepts.join(", ")
                )));
            }
        }
        if let Some(template) = &self.template {
            let mut values = std::collections::BTreeMap::new();
            for arg in &self.arguments {
                match args.remove(&arg.name) {
                    None | Some(Value::Null) => {}
                    Some(Value::String(text)) => {
                        if !text.trim().is_empty() {
                            values.insert(arg.name.clone(), text);
                        }
                    }
                    Some(other) => {
                        return Err(ToolError::invalid_argument(format!(
                            "`{}` must be a string, found {other}",
                            arg.name
                        )))
                    }
                }
                if arg.required && !values.contains_key(&arg.name) {
                    return Err(ToolError::invalid_argument(format!(
                        "missing required argument `{}` of the tool `{tool}`: {}",
                        arg.name, arg.description
                    )));
                }
            }
            let prompt = render(template, &values).map_err(|e| {
                ToolError::invalid_argument(format!(
                    "cannot render the prompt template of the tool `{tool}`: {e}"
                ))
            })?;
            args.insert(PROMPT.into(), Value::String(prompt));
        }
        for (name, value) in &self.fixed {
            args.insert(name.clone(), value.clone());
        }
        Ok(args)
    }

    fn argument_names(&self) -> String {
        let names: Vec<&str> = self.arguments.iter().map(|a| a.name.as_str()).collect();
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        }
    }
}

/// What one rendering may spend: MiniJinja charges each instruction, loop step and allocated
/// byte against it. A prompt is a few kilobytes of arguments put in place; a template from a
/// repository that loops `range(100000)` inside another, or writes `"x" * 100000000`, runs out
/// within milliseconds and is an error, not a gateway at full CPU with gigabytes allocated.
const FUEL: u64 = 5_000_000;

/// The most text one rendering may write: far above any prompt a host sends (start_task's own
/// `limits.max_prompt_bytes` checks the result), and the end of a template that writes without
/// bound.
const MAX_OUTPUT: usize = 8 << 20;

/// A writer that refuses to grow past [`MAX_OUTPUT`], ending the rendering with an error.
struct Capped(Vec<u8>);

impl std::io::Write for Capped {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.0.len() + buf.len() > MAX_OUTPUT {
            return Err(std::io::Error::other(format!(
                "the rendered prompt is longer than {} MiB",
                MAX_OUTPUT >> 20
            )));
        }
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The template environment: plain text out (no HTML escaping, which MiniJinja only turns on
/// for `.html`-like template names), undefined values render as nothing, and [`FUEL`] per
/// rendering.
fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_fuel(Some(FUEL));
    env
}

/// Renders `template` with the given argument values. Bounded by [`FUEL`], and on a runtime
/// worker it first hands that worker's other tasks to the rest of the runtime, so a long
/// rendering never stalls them.
pub fn render(
    template: &str,
    values: &std::collections::BTreeMap<String, String>,
) -> Result<String, minijinja::Error> {
    let work = || {
        let env = environment();
        let mut out = Capped(Vec::new());
        env.template_from_str(template)?
            .render_captured_to(minijinja::Value::from(values.clone()), &mut out)?;
        String::from_utf8(out.0).map_err(|_| {
            minijinja::Error::new(
                minijinja::ErrorKind::InvalidOperation,
                "the rendered prompt is not UTF-8",
            )
        })
    };
    match tokio::runtime::Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(work)
        }
        _ => work(),
    }
}

/// Every problem with the enabled preset entries of `config`, keyed like the file. Disabled ones
/// are not checked: their fixed values may name tiers a repository has replaced (the built-in
/// `review` preset names `standard` and `strong`), which must not stop the gateway; enabling one
/// checks it.
pub fn issues(config: &Config) -> Vec<Issue> {
    let mut issues = Vec::new();
    for (name, tool) in config.enabled_tools() {
        let Some(preset) = Preset::of(tool) else {
            continue;
        };
        let schema = tools::action_input_schema(tool.action, config);
        check(name, tool, &preset, &schema, &mut issues);
    }
    issues
}

fn issue(key: String, message: String) -> Issue {
    Issue {
        key,
        related: Vec::new(),
        message,
    }
}

fn check(
    name: &str,
    tool: &ToolConfig,
    preset: &Preset,
    schema: &JsonObject,
    issues: &mut Vec<Issue>,
) {
    let action = tool.action.as_str();
    let empty = JsonObject::new();
    let properties = schema
        .get("properties")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let takes: Vec<&str> = properties.keys().map(String::as_str).collect();
    for (key, value) in &preset.fixed {
        let Some(property) = properties.get(key) else {
            issues.push(issue(
                format!("tools.{name}.{key}"),
                format!(
                    "expected a tool setting (action, description, enabled, title, arguments, \
                     prompt) or an argument of action {action} to fix ({}), found `{key}`",
                    takes.join(", ")
                ),
            ));
            continue;
        };
        if key == PROMPT {
            issues.push(issue(
                format!("tools.{name}.{key}"),
                "a fixed prompt is written as the `prompt` template".to_string(),
            ));
            continue;
        }
        if let Err(problem) = fits(property, value) {
            issues.push(issue(
                format!("tools.{name}.{key}"),
                format!("{value} is not a valid `{key}` for action {action}: {problem}"),
            ));
        } else if key == "output_schema" {
            // Its schema says only "an object"; the rest is what a call checks, and a host
            // could not fix a schema it cannot see.
            if let Err(problem) = crate::tasks::checks::structured::check_schema(value) {
                issues.push(issue(format!("tools.{name}.{key}"), problem.to_string()));
            }
        }
    }
    match &preset.template {
        None if !preset.arguments.is_empty() => issues.push(issue(
            format!("tools.{name}.arguments"),
            "expected a `prompt` template to use the declared arguments in, found none".into(),
        )),
        None => {}
        Some(_) if !properties.contains_key(PROMPT) => issues.push(issue(
            format!("tools.{name}.prompt"),
            format!(
                "action {action} takes no prompt, so a tool bound to it cannot have a template"
            ),
        )),
        Some(template) => check_template(name, preset, template, properties, issues),
    }
}

/// The declared arguments and the template that uses them.
fn check_template(
    name: &str,
    preset: &Preset,
    template: &str,
    properties: &JsonObject,
    issues: &mut Vec<Issue>,
) {
    let mut declared = BTreeSet::new();
    for (i, arg) in preset.arguments.iter().enumerate() {
        let key = format!("tools.{name}.arguments.{i}.name");
        if !is_identifier(&arg.name) {
            issues.push(issue(
                key,
                format!(
                    "expected an argument name of letters, digits and `_` (not starting with a \
                     digit), found `{}`",
                    arg.name
                ),
            ));
        } else if !declared.insert(arg.name.as_str()) {
            issues.push(issue(
                key,
                format!("argument `{}` is declared twice", arg.name),
            ));
        } else if properties.contains_key(&arg.name) && arg.name != PROMPT {
            issues.push(issue(
                key,
                format!(
                    "`{}` is already an argument of the action; name the declared argument \
                     otherwise (or fix the action's own with `{}: <value>`)",
                    arg.name, arg.name
                ),
            ));
        }
    }
    let env = environment();
    let compiled = match env.template_from_str(template) {
        Ok(compiled) => compiled,
        Err(e) => {
            issues.push(issue(
                format!("tools.{name}.prompt"),
                format!("expected a MiniJinja template, found a syntax error: {e}"),
            ));
            return;
        }
    };
    let globals: BTreeSet<&str> = env.globals().map(|(name, _)| name).collect();
    let mut unknown: Vec<String> = compiled
        .undeclared_variables(false)
        .into_iter()
        .filter(|v| !declared.contains(v.as_str()) && !globals.contains(v.as_str()))
        .collect();
    unknown.sort();
    for variable in unknown {
        issues.push(issue(
            format!("tools.{name}.prompt"),
            format!(
                "unknown placeholder `{variable}`; expected one of the declared arguments ({})",
                preset.argument_names()
            ),
        ));
    }
}

/// A name a template can use as a variable: `module`, `max_lines`; not `my-arg` (a subtraction
/// in a template) or `2nd`.
fn is_identifier(name: &str) -> bool {
    name.chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Whether `value` fits a property schema of the action (types, enums such as the tier names,
/// bounds). The action's schemas are ours, inlined and reference-free, so compiling one cannot
/// fail or fetch anything; if it ever did, the call-time parser still checks the value.
fn fits(property: &Value, value: &Value) -> Result<(), String> {
    let Ok(validator) = jsonschema::validator_for(property) else {
        return Ok(());
    };
    let errors: Vec<String> = validator
        .iter_errors(value)
        .map(|e| e.to_string())
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Action, Config};
    use serde_json::json;

    fn tool(yaml: serde_json::Value) -> ToolConfig {
        serde_json::from_value(yaml).expect("a tool entry")
    }

    /// A template that would loop ten billion times or allocate 100 MB runs out of fuel and is
    /// an error; a prompt of real size renders.
    #[test]
    fn a_hostile_template_runs_out_of_fuel() {
        let values = std::collections::BTreeMap::from([("task".to_string(), "y".repeat(50_000))]);
        for hostile in [
            "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
            "{{ 'x' * 100000000 }}",
            "{% for i in range(100000) %}{{ task }}{% endfor %}",
        ] {
            let started = std::time::Instant::now();
            let rendered = render(hostile, &values);
            assert!(rendered.is_err(), "{hostile} rendered");
            assert!(
                started.elapsed() < std::time::Duration::from_secs(10),
                "{hostile} took {:?}",
                started.elapsed()
            );
        }
        let fine = render(
            "Do this: {{ task }}\n{% if notes %}{{ notes }}{% endif %}",
            &values,
        )
        .expect("a prompt of real size renders");
        assert_eq!(fine.len(), "Do this: ".len() + 50_000 + 1);
    }

    fn write_tests() -> ToolConfig {
        tool(json!({
            "action": "start_task",
            "description": "Write unit tests.",
            "tier": "fast",
            "arguments": [
                {"name": "module", "description": "The module", "required": true},
                {"name": "notes", "description": "Cases that matter"}
            ],
            "prompt": "Write unit tests for {{ module }}.{% if notes %} {{ notes }}{% endif %}"
        }))
    }

    fn config_with(name: &str, entry: ToolConfig) -> Config {
        let mut config = crate::gateway::test_config();
        config.tools.insert(name.into(), entry);
        config
    }

    #[test]
    fn unknown_keys_of_an_entry_are_fixed_arguments() {
        let entry = write_tests();
        assert_eq!(entry.fixed.get("tier"), Some(&json!("fast")));
        assert!(entry.is_preset());
        let plain = tool(json!({"action": "start_task", "description": "d"}));
        assert!(!plain.is_preset());
        assert_eq!(Preset::of(&plain), None);
    }

    #[test]
    fn schema_has_declared_arguments_and_loses_fixed_ones() {
        let config = config_with("write_tests", write_tests());
        let base = tools::action_input_schema(Action::StartTask, &config);
        let preset = Preset::of(&write_tests()).expect("a preset");
        let schema = Value::Object(preset.input_schema(&base));
        let props = schema["properties"].as_object().expect("properties");
        assert_eq!(props["module"]["type"], "string");
        assert!(props.contains_key("notes"));
        assert!(!props.contains_key("prompt"));
        assert!(!props.contains_key("tier"));
        assert!(!props.contains_key("model"), "excluded by the fixed tier");
        assert!(props.contains_key("agent") && props.contains_key("directory"));
        assert_eq!(schema["required"], json!(["module"]));
    }

    #[test]
    fn arguments_render_into_the_prompt_and_fixed_values_are_sent() {
        let preset = Preset::of(&write_tests()).expect("a preset");
        let args = json!({"module": "src/a.rs", "title": "tests"});
        let out = preset
            .arguments_for_action("write_tests", args.as_object().cloned().unwrap_or_default())
            .expect("renders");
        assert_eq!(out["prompt"], "Write unit tests for src/a.rs.");
        assert_eq!(out["tier"], "fast");
        assert_eq!(out["title"], "tests");
        assert!(!out.contains_key("module"));

        let args = json!({"module": "src/a.rs", "notes": "Cover the empty input."});
        let out = preset
            .arguments_for_action("write_tests", args.as_object().cloned().unwrap_or_default())
            .expect("renders");
        assert_eq!(
            out["prompt"],
            "Write unit tests for src/a.rs. Cover the empty input."
        );
    }

    #[test]
    fn call_errors_name_the_argument() {
        let preset = Preset::of(&write_tests()).expect("a preset");
        let call = |args: Value| {
            preset
                .arguments_for_action("write_tests", args.as_object().cloned().unwrap_or_default())
                .expect_err("refused")
                .message
        };
        assert!(call(json!({})).contains("missing required argument `module`"));
        assert!(call(json!({"module": "  "})).contains("`module`"));
        assert!(call(json!({"module": 3})).contains("must be a string"));
        assert!(call(json!({"module": "m", "tier": "strong"})).contains("fixed to \"fast\""));
        assert!(call(json!({"module": "m", "prompt": "x"})).contains("instead of `prompt`"));
        let strict = preset
            .clone()
            .accepting(vec!["module".into(), "notes".into()]);
        let unknown = strict
            .arguments_for_action(
                "write_tests",
                json!({"module": "m", "modle": "x"})
                    .as_object()
                    .cloned()
                    .unwrap_or_default(),
            )
            .expect_err("refused")
            .message;
        assert_eq!(
            unknown,
            "unknown argument `modle` of the tool `write_tests`; it takes: module, notes"
        );
    }

    #[test]
    fn load_errors_name_the_key() {
        let keys = |entry: Value| {
            let config = config_with("p", tool(entry));
            issues(&config)
                .into_iter()
                .map(|i| format!("{}: {}", i.key, i.message))
                .collect::<Vec<_>>()
        };
        let base = |extra: Value| {
            let mut entry = json!({"action": "start_task", "description": "d"});
            for (k, v) in extra.as_object().cloned().unwrap_or_default() {
                entry[k] = v;
            }
            entry
        };
        assert!(keys(base(json!({"tier": "fast"}))).is_empty());
        let found = keys(base(json!({"descripton": "typo"})));
        assert!(found[0].starts_with("tools.p.descripton: "), "{found:?}");
        assert!(
            found[0].contains("tier"),
            "lists the action's arguments: {found:?}"
        );
        let found = keys(base(json!({"tier": "nope"})));
        assert!(
            found[0].starts_with("tools.p.tier: \"nope\" is not a valid"),
            "{found:?}"
        );
        let found = keys(base(json!({"isolation": 3})));
        assert!(found[0].starts_with("tools.p.isolation: "), "{found:?}");
        let found = keys(base(json!({"prompt": "{{ modul }}",
            "arguments": [{"name": "module", "description": "m"}]})));
        assert!(
            found[0].contains("unknown placeholder `modul`"),
            "{found:?}"
        );
        assert!(found[0].contains("(module)"), "{found:?}");
        let found = keys(base(json!({"prompt": "{% if x %}"})));
        assert!(
            found[0].starts_with("tools.p.prompt: expected a MiniJinja template"),
            "{found:?}"
        );
        let found = keys(base(
            json!({"arguments": [{"name": "a", "description": "a"}]}),
        ));
        assert!(found[0].starts_with("tools.p.arguments: "), "{found:?}");
        let found = keys(base(json!({"prompt": "{{ title }}",
            "arguments": [{"name": "title", "description": "t"}]})));
        assert!(
            found[0].starts_with("tools.p.arguments.0.name: "),
            "{found:?}"
        );
        let found = keys(json!({"action": "usage", "description": "d", "prompt": "x"}));
        assert!(found[0].contains("takes no prompt"), "{found:?}");
        let found = keys(json!({"action": "wait_for_task", "description": "d", "mode": "any"}));
        assert!(found.is_empty(), "{found:?}");
        // A fixed output_schema is checked as a call would check it.
        let found = keys(base(json!({"output_schema": {"type": "object"}})));
        assert!(found.is_empty(), "{found:?}");
        let found = keys(base(json!({"output_schema": {"type": "no-such-type"}})));
        assert!(found[0].starts_with("tools.p.output_schema: "), "{found:?}");
        // Arguments are identifiers, each declared once.
        let found = keys(base(json!({"prompt": "{{ a }}", "arguments": [
            {"name": "a", "description": "a"},
            {"name": "9lives", "description": "n"},
            {"name": "a", "description": "again"}
        ]})));
        assert!(
            found
                .iter()
                .any(|f| f.starts_with("tools.p.arguments.1.name: expected an argument name")),
            "{found:?}"
        );
        assert!(
            found
                .iter()
                .any(|f| f.starts_with("tools.p.arguments.2.name: argument `a` is declared twice")),
            "{found:?}"
        );
    }
}
