//! Layering (figment), extraction and error attribution.
//!
//! Layers, lowest first: the built-in `delegation.yaml`, `<user_dir>/delegation.yaml`,
//! `<cwd>/delegation.yaml`, the `--config` file, then `OPENCODE_MCP_*` variables. figment merges
//! maps key by key (so `tools` and `prompts` can be tuned one entry, even one field, at a time) and
//! replaces everything else whole: a layer that sets `tiers`, or a prompt's `arguments`, replaces
//! the list rather than appending to it.
//!
//! Errors are reported all at once where serde allows: every layer's syntax errors, then (since
//! serde stops at the first error inside a struct) each top-level section and each tool and
//! prompt entry is extracted on its own, then the validation rules run over the merged result.
//! Each problem is attributed to the layer that supplied the offending value, using the figment
//! tag of that value (`Figment::find_metadata`).

use std::path::{Path, PathBuf};

use figment::error::Kind;
use figment::providers::{Format, Json, Serialized};
use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider};
use serde::de::DeserializeOwned;

use super::env;
use super::error::{ConfigError, Origin, Problem};
use super::template;
use super::trust;
use super::types::{
    Config, HostConfig, IsolationConfig, Limits, OpenCodeConfig, PromptConfig, ReportConfig, Tier,
    Timeouts, ToolConfig,
};
use super::validate::{self, Issue};
use super::yaml::Yaml;
use super::{Frozen, Sources, DEFAULT_JSON};

/// How the compiled-in default is named in errors.
pub const BUILT_IN_NAME: &str = "built-in delegation.yaml";

/// The file name looked for in the user and working directories.
pub const FILE_NAME: &str = "delegation.yaml";

/// The top-level keys of [`Config`] (checked against the JSON Schema in a test).
pub(crate) const CONFIG_KEYS: &[&str] = &[
    "$schema",
    "instructions",
    "opencode",
    "timeouts",
    "limits",
    "tiers",
    "tools",
    "state_dir",
    "prompts",
    "hosts",
    "isolation",
    "report",
    "reload",
    "workers",
    "checks",
    "sandbox",
    "dashboard",
];

/// A YAML layer with the name errors should use for it.
struct Layer {
    metadata: Metadata,
    /// The text (parsed on demand), or why the file could not be read. Empty for the built-in
    /// layer, whose data come from [`DEFAULT_JSON`].
    text: Result<String, String>,
}

impl Layer {
    fn built_in() -> Self {
        Layer {
            metadata: Metadata::named(BUILT_IN_NAME),
            text: Ok(String::new()),
        }
    }

    /// A layer file, read once through [`read_layer`]; one that cannot be read is a layer whose
    /// data is the error saying why (named with the file, like a syntax error).
    fn file(path: &Path, inside: Option<&Path>) -> Self {
        Self::text(path, read_layer(path, inside))
    }

    /// A layer file whose text was read earlier (the repository's, frozen at start).
    fn text(path: &Path, text: Result<String, String>) -> Self {
        Layer {
            metadata: Metadata::from("file", figment::Source::File(path.to_path_buf())),
            text,
        }
    }

    fn error(&self, why: String) -> figment::Error {
        let mut error = figment::Error::from(why);
        error.metadata = Some(self.metadata.clone());
        error
    }
}

impl Provider for Layer {
    fn metadata(&self) -> Metadata {
        self.metadata.clone()
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        if self.metadata.name == BUILT_IN_NAME {
            // Parsed once per process: a start merges the built-in layer and also reads it on
            // its own (to drop empty sections of the other layers). From the JSON `build.rs`
            // made of it: parsing the YAML was the largest piece of a cold start's own work.
            static PARSED: std::sync::OnceLock<Result<Map<Profile, Dict>, String>> =
                std::sync::OnceLock::new();
            return PARSED
                .get_or_init(|| Json::string(DEFAULT_JSON).data().map_err(|e| e.to_string()))
                .clone()
                .map_err(|why| self.error(why));
        }
        let text = self.text.as_ref().map_err(|why| self.error(why.clone()))?;
        // Only a text the parser refuses is looked at again: one that is not a mapping is
        // named by its kind rather than in the parser's words, which quote it whole.
        Yaml::string(text)
            .data()
            .map_err(|e| match top_level_mapping(text) {
                Err(why) => self.error(why),
                Ok(()) => e,
            })
    }
}

/// A layer is a mapping of settings (or empty). Anything else is refused by its kind: the YAML
/// parser's own message quotes a top-level string whole, and a file that is one long string may
/// be a secret the repository's file points at. A syntax error is left to the parser, whose
/// messages give a line and column, not contents.
fn top_level_mapping(text: &str) -> Result<(), String> {
    match yaml_serde::from_str::<yaml_serde::Value>(text) {
        Ok(yaml_serde::Value::Mapping(_) | yaml_serde::Value::Null) | Err(_) => Ok(()),
        Ok(other) => {
            let kind = match other {
                yaml_serde::Value::Bool(_) => "a boolean",
                yaml_serde::Value::Number(_) => "a number",
                yaml_serde::Value::String(_) => "a string",
                yaml_serde::Value::Sequence(_) => "a list",
                _ => "another kind of value",
            };
            Err(format!(
                "expected a mapping of settings (`key: value` lines), found {kind}"
            ))
        }
    }
}

/// The most a layer file may hold. Real ones are a few kilobytes; the bound is for a file that
/// is not one (a repository's `delegation.yaml` pointing at `/dev/zero` took the gateway to
/// 2 GiB within seconds).
pub const MAX_LAYER_BYTES: u64 = 1 << 20;

/// Reads a layer file as text: a regular file (a symlink to one is followed), of at most
/// [`MAX_LAYER_BYTES`], and, with `inside`, one that resolves to a path inside that directory
/// (the repository's file may not point at the user's secrets). Devices, FIFOs and directories
/// are refused without reading (`/dev/stdin` would swallow the host's first message).
pub fn read_layer(path: &Path, inside: Option<&Path>) -> Result<String, String> {
    use std::io::Read;
    if let Some(dir) = inside {
        let real = std::fs::canonicalize(path).map_err(|e| format!("cannot be read: {e}"))?;
        let dir = std::fs::canonicalize(dir).map_err(|e| format!("cannot be read: {e}"))?;
        if !real.starts_with(&dir) {
            return Err(format!(
                "points outside its directory {}: a repository's delegation.yaml must be a file \
                 of the repository",
                dir.display()
            ));
        }
    }
    let file = open_nonblocking(path).map_err(|e| format!("cannot be read: {e}"))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot be read: {e}"))?;
    if !meta.is_file() {
        return Err("is not a regular file".to_string());
    }
    let mut bytes = Vec::new();
    file.take(MAX_LAYER_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot be read: {e}"))?;
    if bytes.len() as u64 > MAX_LAYER_BYTES {
        return Err(format!(
            "is larger than {} KiB: not a delegation.yaml",
            MAX_LAYER_BYTES / 1024
        ));
    }
    String::from_utf8(bytes).map_err(|_| "is not UTF-8 text".to_string())
}

/// Opens `path` for reading without waiting on it: a FIFO (or a terminal) would block the open
/// itself until another process opened its other end, which kept the gateway from answering
/// `initialize`. The kind is checked on the open file, so nothing can swap it in between; a
/// regular file reads as usual whatever the flag.
fn open_nonblocking(path: &Path) -> std::io::Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY);
    }
    options.open(path)
}

/// A layer's data after the repository-controlled keys were taken out (see [`trust`]).
struct Filtered {
    metadata: Metadata,
    data: Map<Profile, Dict>,
}

impl Provider for Filtered {
    fn metadata(&self) -> Metadata {
        self.metadata.clone()
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        Ok(self.data.clone())
    }
}

/// A section whose keys are all commented out (`timeouts:` followed by comments) reads as null;
/// merged as is it would replace the built-in section and fail as "found unit". It means "nothing
/// to change here", so it is dropped, at any depth where the built-in value is a mapping. A null
/// leaf (`url: ~`) still means "unset".
fn drop_empty_sections(dict: &mut Dict, defaults: &Dict) {
    dict.retain(|key, value| {
        let default = defaults.get(key).and_then(Value::as_dict);
        match (value, default) {
            (Value::Empty(..), Some(_)) => false,
            (Value::Dict(_, inner), Some(defaults)) => {
                drop_empty_sections(inner, defaults);
                true
            }
            _ => true,
        }
    });
}

/// The same file, however it was named.
pub fn same_file(a: &Path, b: &Path) -> bool {
    a == b
        || matches!(
            (std::fs::canonicalize(a), std::fs::canonicalize(b)),
            (Ok(x), Ok(y)) if x == y
        )
}

/// Loads the layered configuration with the given environment instead of the process's (see
/// [`super::load`], which passes `std::env::vars_os()`). Only `OPENCODE_MCP_*` variables are
/// looked at.
pub fn load_with_env(
    sources: &Sources,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<Config, ConfigError> {
    load_checked(sources, env, |_| Vec::new())
}

/// [`load_with_env`], with the rules only the surface can check (`surface`: the gateway's
/// [`preset_issues`](crate::gateway::preset_issues), which needs the actions' argument schemas)
/// reported with the file's own problems, attributed the same way. `config` stays below the
/// gateway: it is handed the check, it does not reach up for it.
pub fn load_checked(
    sources: &Sources,
    env: impl IntoIterator<Item = (String, String)>,
    surface: SurfaceCheck,
) -> Result<Config, ConfigError> {
    let mut layers = vec![Origin::BuiltIn];
    let mut figment = Figment::new().merge(Layer::built_in());

    let explicit = match &sources.explicit {
        Some(path) => {
            let path = sources.cwd.join(path);
            if !path.is_file() {
                return Err(ConfigError::MissingFile { path });
            }
            Some(path)
        }
        None => None,
    };
    let user_file = sources.user_dir.as_ref().map(|d| d.join(FILE_NAME));
    // The repository's file, unless the user named it (--config) or it is their own file; as
    // frozen when serving began, if it was.
    let frozen = sources.frozen_repository.as_deref();
    let repo_file = sources.repository_file().filter(|p| match frozen {
        Some(f) => *f != Frozen::Absent,
        None => p.is_file(),
    });
    let user_file = user_file.filter(|p| p.is_file());
    // What the file layers' empty sections are checked against; most starts have no file.
    let built_in = std::cell::LazyCell::new(|| {
        Layer::built_in()
            .data()
            .ok()
            .and_then(|mut d| d.remove(&Profile::Default))
            .unwrap_or_default()
    });
    let mut withheld: Vec<(PathBuf, String, String)> = Vec::new();
    for path in user_file.iter().chain(&repo_file).chain(&explicit) {
        layers.push(Origin::File(path.clone()));
        let is_repo = Some(path) == repo_file.as_ref();
        let layer = match frozen {
            Some(Frozen::Text(text)) if is_repo => Layer::text(path, text.clone()),
            _ => Layer::file(path, is_repo.then_some(sources.cwd.as_path())),
        };
        let mut data = match layer.data() {
            Ok(data) => data,
            // Unreadable: merged as is, so its syntax error is reported like any other.
            Err(_) => {
                figment = figment.merge(layer);
                continue;
            }
        };
        // Only the repository's layer is filtered, against what the layers below set.
        let in_force = |key: &str| figment.find_value(key).ok();
        // The tiers the user set (the built-in ones name no model and no cap: a repository
        // may fill those in).
        let user_tiers = if is_repo
            && figment
                .find_metadata("tiers")
                .is_some_and(|m| m.name != BUILT_IN_NAME)
        {
            figment
                .extract_inner::<Vec<super::Tier>>("tiers")
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        let below = trust::Below {
            value: &in_force,
            tiers: &user_tiers,
        };
        for dict in data.values_mut() {
            drop_empty_sections(dict, &built_in);
            if is_repo {
                withheld.extend(
                    trust::filter(dict, &below)
                        .into_iter()
                        .map(|(key, value)| (path.clone(), key, value)),
                );
            }
        }
        figment = figment.merge(Filtered {
            metadata: layer.metadata(),
            data,
        });
    }

    let (vars, mut problems) = env::collect(env, super::env_schema);
    for var in vars {
        layers.push(Origin::Env(var.name().to_string()));
        figment = figment.merge(var);
    }

    match extract(&figment) {
        Ok(mut config) => {
            config.derived = yield_defaults(&mut config, &figment);
            config.withheld = withheld
                .into_iter()
                .map(|(file, key, value)| trust::Withheld {
                    in_force: in_force(&figment, &key),
                    file,
                    key,
                    value,
                })
                .collect();
            let repo_set_tiers = repo_file.as_ref().filter(|repo| {
                figment
                    .find_metadata("tiers")
                    .and_then(|m| m.source.as_ref())
                    .is_some_and(|s| *s == figment::Source::File(repo.to_path_buf()))
            });
            if let Some(repo) = repo_set_tiers {
                drop_dangling_escalations(&mut config, repo);
            }
            let mut issues = validate::validate(&config);
            issues.extend(surface(&config));
            problems.extend(issues.into_iter().map(|i| attribute(&figment, &layers, i)));
            if problems.is_empty() {
                // Once, here: every consumer (tool table, prompts, instructions, print-config)
                // then sees the names of the tools that actually exist.
                template::render_tool_names(&mut config);
                Ok(config)
            } else {
                Err(ConfigError::Invalid { problems })
            }
        }
        Err(more) => {
            let failed: Vec<String> = more.iter().map(|p| p.key.clone()).collect();
            problems.extend(more);
            if let Some(config) = best_effort(&figment, &failed) {
                let about_failed = |key: &str| {
                    failed
                        .iter()
                        .any(|f| !f.is_empty() && (key == f || key.starts_with(&format!("{f}."))))
                };
                let mut issues = validate::validate(&config);
                issues.extend(surface(&config));
                problems.extend(
                    issues
                        .into_iter()
                        .filter(|i| {
                            !about_failed(&i.key) && !i.related.iter().any(|r| about_failed(r))
                        })
                        .map(|i| attribute(&figment, &layers, i)),
                );
            }
            Err(ConfigError::Invalid { problems })
        }
    }
}

/// Rules about a configuration that the surface checks (see [`load_checked`]).
pub type SurfaceCheck = fn(&Config) -> Vec<Issue>;

/// Deserializes the merged layers, collecting as many problems as serde lets us see.
/// A repository's `tiers` replace the list, and a tier of the user's keeps the user's
/// `escalate_to`: one that names a tier the repository left out is not applied (a warning says
/// so) rather than keep the gateway from starting.
fn drop_dangling_escalations(config: &mut Config, repo: &Path) {
    let names: Vec<String> = config.tiers.iter().map(|t| t.name.clone()).collect();
    let mut dropped = Vec::new();
    for tier in &mut config.tiers {
        if let Some(to) = tier.escalate_to.take_if(|to| !names.contains(to)) {
            dropped.push(trust::Withheld {
                file: repo.to_path_buf(),
                key: format!("tiers.{}.escalate_to", tier.name),
                value: to,
                in_force: "none: the repository's tiers leave that tier out".into(),
            });
        }
    }
    config.withheld.extend(dropped);
}

fn extract(figment: &Figment) -> Result<Config, Vec<Problem>> {
    // Each look at the whole of a figment merges its layers into a new tree: on success once.
    let first = match figment.extract::<Config>() {
        Ok(config) => return Ok(config),
        Err(e) => e,
    };
    // Fails only when some layer could not be read or parsed; then every such layer is listed.
    let root = figment.find_value("").map_err(problems_from)?;
    let mut problems = Vec::new();
    if let Some(dict) = root.as_dict() {
        for (key, value) in dict {
            let errors = match key.as_str() {
                "$schema" | "instructions" => check::<String>(figment, key),
                "state_dir" => check::<Option<String>>(figment, key),
                "reload" => check::<bool>(figment, key),
                "opencode" => check_fields::<OpenCodeConfig>(figment, key, value),
                "timeouts" => check_fields::<Timeouts>(figment, key, value),
                "limits" => check_fields::<Limits>(figment, key, value),
                "tiers" => check::<Vec<Tier>>(figment, key),
                "tools" => check_entries::<ToolConfig>(figment, key, value),
                "prompts" => check_entries::<PromptConfig>(figment, key, value),
                "hosts" => check_entries::<HostConfig>(figment, key, value),
                "isolation" => check_fields::<IsolationConfig>(figment, key, value),
                "report" => check_fields::<ReportConfig>(figment, key, value),
                "workers" => check_entries::<super::types::WorkerConfig>(figment, key, value),
                "checks" => check_fields::<super::types::ChecksConfig>(figment, key, value),
                "sandbox" => check_fields::<super::types::SandboxConfig>(figment, key, value),
                "dashboard" => check_fields::<super::types::DashboardConfig>(figment, key, value),
                _ => vec![unknown_top_level_key(figment, key)],
            };
            problems.extend(errors.into_iter().flat_map(problems_from));
        }
    }
    if problems.is_empty() {
        // Some failure the sections do not show (a missing top-level key): report it as is.
        problems = problems_from(first);
    }
    Err(problems)
}

/// Extracts the section at `path` alone, returning its first error with a correct key path.
fn check<T: DeserializeOwned>(figment: &Figment, path: &str) -> Vec<figment::Error> {
    match figment.extract_inner::<T>(path) {
        Ok(_) => Vec::new(),
        Err(mut e) => {
            // `extract_inner` appends `path` after the inner path; put it in front.
            let prefix: Vec<String> = path.split('.').map(str::to_string).collect();
            if e.path.ends_with(&prefix) {
                let inner = e.path.len() - prefix.len();
                e.path.truncate(inner);
            }
            e.path.splice(0..0, prefix);
            vec![e]
        }
    }
}

/// Checks a settings block whole and, when that fails, each of its keys on its own over the
/// built-in block, so that every broken key is reported rather than serde's first. Each problem
/// is blamed on the layer that set that key.
fn check_fields<T: DeserializeOwned>(
    figment: &Figment,
    path: &str,
    value: &Value,
) -> Vec<figment::Error> {
    let whole = check::<T>(figment, path);
    let Some(fields) = value.as_dict().filter(|_| !whole.is_empty()) else {
        return whole;
    };
    let mut errors = Vec::new();
    for (field, v) in fields {
        let key = format!("{path}.{field}");
        let probe = Figment::new()
            .merge(Layer::built_in())
            .merge(Serialized::default(&key, v));
        for mut e in check::<T>(&probe, path) {
            e.metadata = figment.find_metadata(&key).cloned();
            errors.push(e);
        }
    }
    if errors.is_empty() {
        whole
    } else {
        errors
    }
}

/// The configuration with every key that failed to deserialize put back to its built-in value,
/// so the validation rules can still look at the rest (`check-config` reports every problem at
/// once). `None` when even that does not deserialize.
fn best_effort(figment: &Figment, failed: &[String]) -> Option<Config> {
    let mut root = figment.find_value("").ok()?.into_dict()?;
    for key in failed {
        trust::take(&mut root, key);
    }
    Figment::new()
        .merge(Layer::built_in())
        .merge(Serialized::defaults(root))
        .extract()
        .ok()
}

/// Checks each entry of a map section on its own, so two broken tools are both reported.
fn check_entries<T: DeserializeOwned>(
    figment: &Figment,
    path: &str,
    value: &Value,
) -> Vec<figment::Error> {
    match value.as_dict() {
        Some(entries) if entries.keys().all(|k| !k.contains('.') && !k.is_empty()) => entries
            .keys()
            .flat_map(|name| check::<T>(figment, &format!("{path}.{name}")))
            .collect(),
        _ => check::<std::collections::BTreeMap<String, T>>(figment, path),
    }
}

fn unknown_top_level_key(figment: &Figment, key: &str) -> figment::Error {
    let mut e = figment::Error::from(Kind::UnknownField(key.to_string(), CONFIG_KEYS));
    e.path = vec![key.to_string()];
    e.metadata = figment.find_metadata(key).cloned();
    e
}

/// Turns a figment error (a chain) into problems.
fn problems_from(error: figment::Error) -> Vec<Problem> {
    error
        .into_iter()
        .map(|e| {
            let origin = e.metadata.as_ref().map_or(Origin::Unknown, origin_of);
            let mut key = e.path.join(".");
            let message = describe(&e.kind, &mut key);
            Problem {
                origin,
                key,
                message,
            }
        })
        .collect()
}

fn origin_of(metadata: &Metadata) -> Origin {
    if let Some(figment::Source::File(path)) = &metadata.source {
        return Origin::File(path.clone());
    }
    if metadata.name == BUILT_IN_NAME {
        return Origin::BuiltIn;
    }
    env::origin_of_name(&metadata.name).unwrap_or(Origin::Unknown)
}

/// Says what was expected, in the words of the file (keys, not Rust types).
fn describe(kind: &Kind, key: &mut String) -> String {
    match kind {
        Kind::Message(message) => message.clone(),
        // What was found is named by its kind, never its value: a value may be a secret (a
        // repository's file pointing at a key file parses as one long string).
        Kind::InvalidType(found, expected) | Kind::InvalidValue(found, expected) => {
            format!("expected {}, found {}", plain(expected), kind_of(found))
        }
        Kind::InvalidLength(len, expected) => {
            format!("expected {}, found {len} elements", plain(expected))
        }
        Kind::UnknownVariant(found, expected) => format!(
            "unknown value `{found}`; expected one of: {}",
            expected.join(", ")
        ),
        Kind::UnknownField(found, expected) => format!(
            "unknown key `{found}`; valid keys here: {}",
            expected.join(", ")
        ),
        Kind::MissingField(field) => {
            if !key.is_empty() {
                key.push('.');
            }
            key.push_str(field);
            format!(
                "missing required key `{field}`: expected it to be set (an entry added by a layer \
                 must give all its required keys)"
            )
        }
        other => other.to_string(),
    }
}

/// What kind of value `found` is, in the words of a YAML file.
fn kind_of(found: &figment::error::Actual) -> &'static str {
    use figment::error::Actual;
    match found {
        Actual::Bool(_) => "a boolean",
        Actual::Unsigned(_) | Actual::Signed(_) => "an integer",
        Actual::Float(_) => "a number",
        Actual::Char(_) | Actual::Str(_) => "a string",
        Actual::Bytes(_) => "bytes",
        Actual::Unit | Actual::Option => "nothing (`~`)",
        Actual::Seq => "a list",
        Actual::Map => "a mapping",
        _ => "another kind of value",
    }
}

/// serde's expectation strings, reworded where they name Rust types.
fn plain(expected: &str) -> String {
    match expected {
        "u8" => format!("an integer from 0 to {}", u8::MAX),
        "u16" => format!("an integer from 0 to {}", u16::MAX),
        "u32" => format!("an integer from 0 to {}", u32::MAX),
        "u64" => format!("an integer from 0 to {}", u64::MAX),
        "a boolean" => "`true` or `false`".to_string(),
        other => match other.strip_prefix("struct ") {
            Some(name) => format!("a mapping of {} settings", section_name(name)),
            None => other.to_string(),
        },
    }
}

/// The value in force at `key` and the layer it comes from, for messages. A tier's field
/// (`tiers.<name>.<field>`) is looked up by the tier's name (the list has no keys).
fn in_force(figment: &Figment, key: &str) -> String {
    if let Some((name, field)) = key
        .strip_prefix("tiers.")
        .and_then(|rest| rest.split_once('.'))
    {
        let tiers = figment
            .extract_inner::<Vec<super::Tier>>("tiers")
            .unwrap_or_default();
        let value = tiers
            .iter()
            .find(|t| t.name == name)
            .and_then(|t| serde_json::to_value(t).ok())
            .and_then(|t| t.get(field).cloned());
        return match value {
            Some(v) => format!("{v} from your configuration"),
            None => "unset".to_string(),
        };
    }
    match figment.find_value(key) {
        Ok(value) if !matches!(value, Value::Empty(..)) => {
            format!(
                "{} from {}",
                trust::show(&value),
                origin_of_key(figment, key)
            )
        }
        _ => match key.split('.').collect::<Vec<_>>().as_slice() {
            // A host no layer names gets `hosts.default`'s entry.
            ["hosts", name, field] if *name != "default" => {
                format!(
                    "unset, so {}",
                    in_force(figment, &format!("hosts.default.{field}"))
                )
            }
            _ => "unset".to_string(),
        },
    }
}

/// What a file calls the section a Rust type stands for.
fn section_name(rust: &str) -> &str {
    match rust {
        "Config" => "delegation.yaml",
        "OpenCodeConfig" => "`opencode`",
        "Timeouts" => "`timeouts`",
        "Limits" => "`limits`",
        "Tier" => "tier",
        "ToolConfig" => "tool",
        "PromptConfig" => "prompt",
        "PromptArgument" => "prompt argument",
        other => other,
    }
}

/// Names the layer to blame for a validation issue: of the keys involved, the one whose value
/// came from the latest layer (the one the user most likely just changed).
fn attribute(figment: &Figment, layers: &[Origin], issue: Issue) -> Problem {
    let Issue {
        key,
        related,
        message,
    } = issue;
    let rank = |origin: &Origin| layers.iter().position(|l| l == origin);
    let (key, origin) = std::iter::once(key)
        .chain(related)
        .map(|k| {
            let origin = origin_of_key(figment, &k);
            (k, origin)
        })
        .enumerate()
        // Latest layer wins; among equals, the first key (the one the rule is about).
        .max_by_key(|(i, (_, origin))| (rank(origin), std::cmp::Reverse(*i)))
        .map(|(_, pair)| pair)
        .unwrap_or((String::new(), Origin::Unknown));
    Problem {
        origin,
        key,
        message,
    }
}

/// Built-in defaults give way to what the user set: where a rule relates two settings and one
/// of them is the built-in default, that one is derived from the other (`timeouts.task: 6s`
/// alone makes the 5m `stall` 3s, rather than refusing to start over a value the user never
/// wrote). Only values the user set themselves can contradict each other, and those are still
/// refused by validation. Returns a line per derived value, for `print-config` and the log.
fn yield_defaults(config: &mut Config, figment: &Figment) -> Vec<String> {
    let default = |key: &str| origin_of_key(figment, key) == Origin::BuiltIn;
    let mut derived = Vec::new();
    let mut note = |key: &str, value: &dyn std::fmt::Display, because: &str| {
        derived.push(format!(
            "{key} = {value} (the built-in default yields to {because})"
        ));
    };
    let t = &mut config.timeouts;
    // stall < task
    if t.stall >= t.task {
        if default("timeouts.stall") && !default("timeouts.task") {
            t.stall = (t.task.get() / 2).into();
            note(
                "timeouts.stall",
                &t.stall,
                &format!("timeouts.task {}", t.task),
            );
        } else if default("timeouts.task") && !default("timeouts.stall") {
            t.task = (t.stall.get() * 2).into();
            note(
                "timeouts.task",
                &t.task,
                &format!("timeouts.stall {}", t.stall),
            );
        }
    }
    // wait_default <= wait_max
    if t.wait_default > t.wait_max {
        if default("timeouts.wait_default") && !default("timeouts.wait_max") {
            t.wait_default = t.wait_max;
            note(
                "timeouts.wait_default",
                &t.wait_default,
                &format!("timeouts.wait_max {}", t.wait_max),
            );
        } else if default("timeouts.wait_max") && !default("timeouts.wait_default") {
            t.wait_max = t.wait_default;
            note(
                "timeouts.wait_max",
                &t.wait_max,
                &format!("timeouts.wait_default {}", t.wait_default),
            );
        }
    }
    // progress_interval < wait_default
    if t.progress_interval >= t.wait_default
        && default("timeouts.progress_interval")
        && !default("timeouts.wait_default")
    {
        t.progress_interval = (t.wait_default.get() / 2).into();
        note(
            "timeouts.progress_interval",
            &t.progress_interval,
            &format!("timeouts.wait_default {}", t.wait_default),
        );
    }
    // hosts.<name>.wait_max <= timeouts.wait_max
    let wait_max = t.wait_max;
    for (name, host) in &mut config.hosts {
        let key = format!("hosts.{name}.wait_max");
        if host.wait_max.is_some_and(|w| w > wait_max) && default(&key) {
            host.wait_max = Some(wait_max);
            note(&key, &wait_max, &format!("timeouts.wait_max {wait_max}"));
        }
    }
    derived
}

/// The layer that supplied the value at `key`, or at its nearest ancestor that figment can find
/// (list elements such as `tiers.0.name` are attributed to the whole list).
fn origin_of_key(figment: &Figment, key: &str) -> Origin {
    let mut path = key;
    loop {
        if let Some(metadata) = figment.find_metadata(path) {
            return origin_of(metadata);
        }
        match path.rfind('.') {
            Some(dot) => path = &path[..dot],
            None => return Origin::Unknown,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A layer is read once: what the loader filtered is what is merged, even when the data is
    /// asked for again (figment does so for a layer whose first read failed) after the file
    /// changed on disk. It used to be read anew, unfiltered, from the path.
    #[test]
    fn a_layer_is_read_once() {
        let dir = std::env::temp_dir().join(format!("ocm-layer-{}", crate::ids::task_id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("delegation.yaml");
        std::fs::write(&path, "timeouts:\n  task: 7m\n").expect("write");
        let layer = Layer::file(&path, Some(&dir));
        std::fs::write(&path, "opencode:\n  command: ./evil.sh\n").expect("rewrite");
        let data = layer.data().expect("parses");
        let text = format!("{data:?}");
        assert!(text.contains("7m") && !text.contains("evil"), "{text}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn config_keys_match_the_schema() {
        let schema = super::super::json_schema();
        let props = schema
            .get("properties")
            .and_then(|p| p.as_object())
            .expect("schema has properties");
        let mut from_schema: Vec<&str> = props.keys().map(String::as_str).collect();
        let mut ours = CONFIG_KEYS.to_vec();
        from_schema.sort_unstable();
        ours.sort_unstable();
        assert_eq!(from_schema, ours);
    }

    /// The built-in layer is read from the JSON `build.rs` made of `delegation.yaml`: it must be
    /// the very data the YAML gives when read as any other layer is.
    #[test]
    fn built_in_json_is_the_yaml() {
        let from_yaml = Yaml::string(crate::config::DEFAULT_YAML)
            .data()
            .expect("the YAML parses");
        let from_json = Layer::built_in().data().expect("the JSON parses");
        assert_eq!(from_json, from_yaml);
        let keys = from_json
            .get(&Profile::Default)
            .map(|d| d.len())
            .unwrap_or(0);
        assert!(keys >= 5, "only {keys} top-level settings");
    }

    #[test]
    fn built_in_layer_parses() {
        let figment = Figment::new().merge(Layer::built_in());
        let config: Config = figment.extract().expect("built-in extracts");
        assert!(validate::validate(&config).is_empty());
    }
}
