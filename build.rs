//! Generates the typed OpenCode client from the pinned spec in `openapi/`.
//!
//! The spec is OpenAPI 3.1 and progenitor reads 3.0, so `openapi/normalize.rs` first rewrites it
//! (keeping only the operations in `openapi/operations.txt`); the result is handed to progenitor
//! and pretty-printed into `$OUT_DIR/opencode_client.rs`, which `src/opencode/client.rs` includes.
//! The normalised spec is written next to it for inspection.
//!
//! It also converts the built-in `delegation.yaml` to JSON (`$OUT_DIR/delegation.builtin.json`,
//! see [`builtin_config`]): in a start timeline the config load took 1.0 ms, 60 % of it (by
//! perf) parsing those 20 KB of YAML; reading the JSON instead made starts 0.6 ms faster.
//!
//! It also exports `openapi/OPENCODE_VERSION` (the `opencode-ai` release the spec came from) as
//! the compile-time env `OPENCODE_API_VERSION`, so `opencode-mcp --version` names the OpenCode the
//! client was generated from without a second copy of the number to keep in step.

#[path = "openapi/normalize.rs"]
#[allow(dead_code)]
mod normalize;

use std::path::PathBuf;

fn main() {
    if let Err(e) = run() {
        eprintln!("error: generating the OpenCode client failed: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    for input in [
        "openapi/opencode.json",
        "openapi/operations.txt",
        "openapi/normalize.rs",
        "openapi/OPENCODE_VERSION",
        "delegation.yaml",
        "delegation.schema.json",
    ] {
        println!("cargo:rerun-if-changed={input}");
    }
    link_fixed_address();
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").map_err(|e| format!("OUT_DIR: {e}"))?);
    builtin_config(&out_dir)?;
    env_schema(&out_dir)?;

    let api_version = opencode_version(
        &std::fs::read_to_string("openapi/OPENCODE_VERSION")
            .map_err(|e| format!("reading openapi/OPENCODE_VERSION: {e}"))?,
    )?;
    println!("cargo:rustc-env=OPENCODE_API_VERSION={api_version}");

    let raw = std::fs::read_to_string("openapi/opencode.json")
        .map_err(|e| format!("reading openapi/opencode.json: {e}"))?;
    let spec: serde_json::Value = serde_json::from_str(&raw)
        .map_err(|e| format!("openapi/opencode.json is not JSON: {e}"))?;
    let operations: Vec<String> = std::fs::read_to_string("openapi/operations.txt")
        .map_err(|e| format!("reading openapi/operations.txt: {e}"))?
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(String::from)
        .collect();

    let normalized = normalize::normalize(spec, &operations)
        .map_err(|e| format!("openapi/opencode.json {e}"))?;
    let collisions = normalize::identifier_collisions(&normalized);
    if !collisions.is_empty() {
        return Err(format!(
            "schema names collide once turned into Rust identifiers: {collisions:?}; \
             add a rename rule in openapi/normalize.rs"
        ));
    }
    let pretty = serde_json::to_string_pretty(&normalized).map_err(|e| e.to_string())?;
    std::fs::write(out_dir.join("opencode.normalized.json"), &pretty)
        .map_err(|e| format!("writing the normalised spec: {e}"))?;

    let openapi: openapiv3::OpenAPI = serde_json::from_value(normalized)
        .map_err(|e| format!("the normalised spec is not OpenAPI 3.0: {e}"))?;
    let mut settings = progenitor::GenerationSettings::new();
    settings.with_interface(progenitor::InterfaceStyle::Builder);
    let mut generator = progenitor::Generator::new(&settings);
    let tokens = generator
        .generate_tokens(&openapi)
        .map_err(|e| format!("progenitor: {e}"))?;
    let file: syn::File =
        syn::parse2(tokens).map_err(|e| format!("progenitor emitted invalid Rust: {e}"))?;
    let code = prettyplease::unparse(&file);
    std::fs::write(out_dir.join("opencode_client.rs"), code)
        .map_err(|e| format!("writing the generated client: {e}"))?;
    Ok(())
}

/// Writes the committed `delegation.schema.json` to `$OUT_DIR/delegation.schema.types.json` with
/// only the keywords that say where a value goes and what type it is (`type`, `properties`,
/// `additionalProperties`, `$ref`, `$defs`). The gateway types `OPENCODE_MCP_*` values by it at
/// every start that has one (`src/config/env.rs`); the descriptions it leaves out were four
/// fifths of the text, and parsing the whole schema was a sixth of the config load (perf).
fn env_schema(out_dir: &std::path::Path) -> Result<(), String> {
    let text = std::fs::read_to_string("delegation.schema.json")
        .map_err(|e| format!("reading delegation.schema.json: {e}"))?;
    let schema: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("delegation.schema.json: {e}"))?;
    let json = serde_json::to_string(&types_only(&schema, false))
        .map_err(|e| format!("delegation.schema.json: {e}"))?;
    std::fs::write(out_dir.join("delegation.schema.types.json"), json)
        .map_err(|e| format!("writing delegation.schema.types.json: {e}"))
}

/// `node` with only the typing keywords; `names`: `node` maps names to schemas (the value of
/// `properties` or `$defs`), whose keys are all kept.
fn types_only(node: &serde_json::Value, names: bool) -> serde_json::Value {
    const KEPT: [&str; 5] = [
        "type",
        "properties",
        "additionalProperties",
        "$ref",
        "$defs",
    ];
    match node {
        serde_json::Value::Object(map) => map
            .iter()
            .filter(|(key, _)| names || KEPT.contains(&key.as_str()))
            .map(|(key, value)| {
                let holds_names = !names && (key == "properties" || key == "$defs");
                (key.clone(), types_only(value, holds_names))
            })
            .collect::<serde_json::Map<_, _>>()
            .into(),
        other => other.clone(),
    }
}

/// Writes the data of `delegation.yaml` as JSON to `$OUT_DIR/delegation.builtin.json`, which the
/// gateway reads as its built-in layer. The YAML stays the one source (and is still compiled in
/// for `config-schema`'s users and the tests); this is the same data read the way the gateway
/// reads YAML (merge keys applied), so a unit test can compare the two.
fn builtin_config(out_dir: &std::path::Path) -> Result<(), String> {
    let text = std::fs::read_to_string("delegation.yaml")
        .map_err(|e| format!("reading delegation.yaml: {e}"))?;
    let mut value: yaml_serde::Value =
        yaml_serde::from_str(&text).map_err(|e| format!("delegation.yaml: {e}"))?;
    value
        .apply_merge()
        .map_err(|e| format!("delegation.yaml: {e}"))?;
    if !value.is_mapping() {
        return Err("delegation.yaml must be a mapping of settings".into());
    }
    let json = serde_json::to_string(&value)
        .map_err(|e| format!("delegation.yaml cannot be written as JSON: {e}"))?;
    std::fs::write(out_dir.join("delegation.builtin.json"), json)
        .map_err(|e| format!("writing delegation.builtin.json: {e}"))
}

/// The version in `openapi/OPENCODE_VERSION`: one line, `MAJOR.MINOR.PATCH` with an optional
/// `-pre` tail, as npm publishes `opencode-ai`. Anything else is refused, since it would end up
/// verbatim in `--version`.
fn opencode_version(text: &str) -> Result<String, String> {
    let version = text.trim();
    let (core, pre) = match version.split_once('-') {
        Some((core, pre)) => (core, Some(pre)),
        None => (version, None),
    };
    let numeric = core.split('.').count() == 3
        && core
            .split('.')
            .all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    let pre_ok = pre.is_none_or(|p| {
        !p.is_empty()
            && p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
    });
    if numeric && pre_ok {
        Ok(version.to_owned())
    } else {
        Err(format!(
            "openapi/OPENCODE_VERSION must hold one version like 1.18.33, not {version:?}"
        ))
    }
}

/// On Linux the binary is linked as a fixed-address executable (`-no-pie`), not a
/// position-independent one.
///
/// A position-independent executable carries a relocation for every pointer in its read-only
/// data (vtables, panic locations, static tables of strings: about 17,700 of them, spread over
/// the 316 KB of `.data.rel.ro`), and the dynamic loader writes each one at every start. Every
/// page it writes is a copy-on-write fault, about 2 µs each on the 2-core VM the bench runs on:
/// a start to the `initialize` reply and exit took 335 page faults, and 249 at a fixed address;
/// cold start was 0.30–0.35 ms shorter. At a fixed address the linker resolves those pointers
/// once, and the pages stay shared with the page cache. The objects are still compiled
/// position-independent, so only the final link changes, and only for the binary: the library
/// and the tests link as before. The cost is that the executable's own code and data are not
/// randomised in memory (its heap, stack and libraries still are); the gateway is a local stdio
/// process of the user's own host, and its code is Rust's.
fn link_fixed_address() {
    // A statically linked build (`-C target-feature=+crt-static`) asks for its own executable
    // kind: rustc links a static PIE, and `-no-pie` on top of `-static-pie` makes a binary that
    // crashes at start. The shipped build passes `-C relocation-model=static` instead (see
    // `npm/static-rustflags`).
    let crt_static = std::env::var("CARGO_CFG_TARGET_FEATURE")
        .is_ok_and(|f| f.split(',').any(|f| f == "crt-static"));
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") && !crt_static {
        println!("cargo:rustc-link-arg-bins=-no-pie");
    }
}
