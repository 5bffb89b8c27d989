//! The user's documentation stays true: every YAML example in the README and `docs/` is a
//! configuration `check-config` accepts, every link between the pages reaches a file and a
//! heading that exist, and the README stays a short read (its length, and sentences a newcomer
//! reads in one go).

use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_opencode-mcp");

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The README, CONTRIBUTING and every page of `docs/`, with their text.
fn pages() -> Vec<(PathBuf, String)> {
    let mut paths = vec![root().join("README.md"), root().join("CONTRIBUTING.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    paths.extend(docs);
    paths
        .into_iter()
        .map(|p| {
            let text =
                std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p, text)
        })
        .collect()
}

/// The fenced blocks of `text` whose info string is one of `kinds`, with the line each starts on.
fn fenced(text: &str, kinds: &[&str]) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut open: Option<(usize, bool, String)> = None;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        match &mut open {
            None if trimmed.starts_with("```") => {
                let info = trimmed.trim_start_matches('`').trim();
                open = Some((i + 1, kinds.contains(&info), String::new()));
            }
            None => {}
            Some((start, keep, body)) => {
                if trimmed.starts_with("```") {
                    if *keep {
                        out.push((*start, std::mem::take(body)));
                    }
                    open = None;
                } else {
                    body.push_str(line);
                    body.push('\n');
                }
            }
        }
    }
    out
}

/// Text outside fenced blocks.
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut inside = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            inside = !inside;
            out.push('\n');
            continue;
        }
        if !inside {
            out.push_str(line);
        }
        out.push('\n');
    }
    out
}

#[test]
fn every_yaml_example_passes_check_config() {
    let scratch = tempfile::tempdir().expect("temp dir");
    // No file of the user's or of a repository takes part: only the example, over the built-in.
    let home = scratch.path().join("home");
    let cwd = scratch.path().join("cwd");
    std::fs::create_dir_all(&home).expect("home");
    std::fs::create_dir_all(&cwd).expect("cwd");
    let mut checked = 0;
    for (page, text) in pages() {
        for (line, yaml) in fenced(&text, &["yaml", "yml"]) {
            let file = scratch.path().join(format!("example-{checked}.yaml"));
            std::fs::write(&file, &yaml).expect("the example");
            let out = Command::new(BIN)
                .arg("check-config")
                .arg("--config")
                .arg(&file)
                .current_dir(&cwd)
                .env("HOME", &home)
                .env("XDG_CONFIG_HOME", home.join(".config"))
                .env("XDG_STATE_HOME", home.join(".state"))
                .env_remove("OPENCODE_MCP_CONFIG")
                .output()
                .expect("run check-config");
            assert!(
                out.status.success(),
                "{}:{line}: the example fails check-config:\n{yaml}\n{}{}",
                page.display(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            checked += 1;
        }
    }
    assert!(checked >= 3, "only {checked} YAML examples found");
}

/// GitHub's anchor of a heading: lower case, punctuation but `-` and `_` dropped, spaces as `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(text: &str) -> Vec<String> {
    prose(text)
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| anchor(l.trim_start_matches('#')))
        .collect()
}

#[test]
fn every_link_between_the_pages_reaches_a_file_and_a_heading() {
    let mut links = 0;
    for (page, text) in pages() {
        let dir = page.parent().unwrap_or(Path::new("."));
        let body = prose(&text);
        for (i, _) in body.match_indices("](") {
            let rest = &body[i + 2..];
            let Some(end) = rest.find(')') else { continue };
            let target = &rest[..end];
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, fragment) = match target.split_once('#') {
                Some((f, a)) => (f, Some(a)),
                None => (target, None),
            };
            let path = if file.is_empty() {
                page.clone()
            } else {
                dir.join(file)
            };
            assert!(
                path.exists(),
                "{}: the link `{target}` names {}, which does not exist",
                page.display(),
                path.display()
            );
            if let Some(fragment) = fragment {
                let linked = std::fs::read_to_string(&path).unwrap_or_default();
                let known = anchors(&linked);
                assert!(
                    known.iter().any(|a| a == fragment),
                    "{}: the link `{target}` names no heading of {}; its headings: {known:?}",
                    page.display(),
                    path.display()
                );
            }
            links += 1;
        }
    }
    assert!(links >= 10, "only {links} links found");
}

/// The sentences of `text`'s prose (paragraphs and list items outside code, tables and
/// headings) that run past `max` words.
fn long_sentences(text: &str, max: usize) -> Vec<String> {
    let mut paragraphs = Vec::new();
    let mut current = String::new();
    for line in prose(text).lines() {
        let t = line.trim();
        let item = t.starts_with("- ")
            || t.split_once(". ")
                .is_some_and(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
        if t.is_empty() || t.starts_with('|') || t.starts_with('#') || item {
            if !current.is_empty() {
                paragraphs.push(std::mem::take(&mut current));
            }
            if !item {
                continue;
            }
        }
        current.push_str(t);
        current.push(' ');
    }
    paragraphs.push(current);
    let mut long = Vec::new();
    for p in &paragraphs {
        for sentence in p.split(". ") {
            let words = sentence.split_whitespace().count();
            if words > max {
                long.push(format!("({words} words) {sentence}"));
            }
        }
    }
    long
}

/// The README is the newcomer's page: about 250 lines. It and the user's pages of `docs/` read
/// in sentences of at most 40 words (the design notes and the generated reference aside).
#[test]
fn the_users_pages_are_a_short_read() {
    let text = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let lines = text.lines().count();
    assert!(
        lines <= 260,
        "the README has {lines} lines; keep it to about 250 (details go to docs/)"
    );
    let mut long = Vec::new();
    for (page, text) in pages() {
        let name = page
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if [
            "design.md",
            "opencode-behaviour.md",
            "configuration-reference.md",
            "CONTRIBUTING.md",
        ]
        .contains(&name)
        {
            continue;
        }
        long.extend(
            long_sentences(&text, 40)
                .into_iter()
                .map(|s| format!("{name}: {s}")),
        );
    }
    assert!(
        long.is_empty(),
        "sentences past 40 words:\n{}",
        long.join("\n")
    );
}

/// `docs/configuration-reference.md` is what the code generates now (every key, its default, what
/// it does and whether a repository may set it). `UPDATE_DOCS=1` rewrites it.
#[test]
fn the_configuration_reference_is_current() {
    let path = root().join("docs/configuration-reference.md");
    let now = opencode_mcp::config::reference::markdown();
    if std::env::var_os("UPDATE_DOCS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &now).expect("write the reference");
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == now,
        "{} is out of date: run `UPDATE_DOCS=1 cargo test --test docs` and commit it",
        path.display()
    );
}
