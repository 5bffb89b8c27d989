//! `opencode-mcp init`: cheap tiers in one step.
//!
//! The built-in tiers name no model, so every tier runs OpenCode's default model, and
//! delegation saves nothing until the user names cheaper ones. `init` reads OpenCode's live
//! catalog (through a throwaway server, as `doctor` does), proposes the cheapest capable models
//! for each tier, shows the proposal, and writes it into the user's own `delegation.yaml` once
//! confirmed. It never writes a repository's file, and it leaves tiers the user's file already
//! sets alone unless asked (`--replace-tiers`).
//!
//! *Capable* means the model calls tools and holds a context of 32k tokens or more
//! (`ModelCatalog::capable`): an agent cannot work otherwise. The tiers are cheapest first, so
//! the capable models, ordered by price, are cut into as many bands as there are tiers, and each
//! tier is offered the two cheapest of its band. Without prices in the catalog the models are
//! proposed in name order, and the proposal says so.

use std::path::Path;

use serde::Serialize;

use crate::config::Tier;
use crate::opencode::ModelCatalog;

/// Models offered per tier.
const PER_TIER: usize = 2;

/// The capable models of a catalog, cheapest first.
#[derive(Debug, Clone, PartialEq)]
pub struct Ranked {
    /// Each model with its price (input plus output, USD per million tokens) if the catalog
    /// has one.
    pub models: Vec<(String, Option<f64>)>,
    /// Whether the catalog prices any of them (else they are in name order).
    pub priced: bool,
}

/// The capable models of `catalog`, cheapest first (in name order without prices).
pub fn ranked(catalog: &ModelCatalog) -> Ranked {
    let price = |model: &str| {
        catalog
            .prices
            .get(model)
            .map(|p| p.input + p.output)
            .filter(|total| total.is_finite() && *total >= 0.0)
    };
    let mut models: Vec<(String, Option<f64>)> = catalog
        .models
        .iter()
        .filter(|m| catalog.capable.contains(*m))
        .map(|m| (m.clone(), price(m)))
        .collect();
    let priced = models.iter().any(|(_, p)| p.is_some_and(|p| p > 0.0));
    if priced {
        models.sort_by(|a, b| {
            let (x, y) = (a.1.unwrap_or(f64::INFINITY), b.1.unwrap_or(f64::INFINITY));
            x.total_cmp(&y).then_with(|| a.0.cmp(&b.0))
        });
    } else {
        models.sort_by(|a, b| a.0.cmp(&b.0));
    }
    Ranked { models, priced }
}

/// One tier as `init` proposes it: the tier's name and what it handles, kept from the
/// configuration, and the models proposed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TierProposal {
    pub name: String,
    pub handles: String,
    pub models: Vec<String>,
}

/// The models proposed for each of `tiers` (cheapest tier first) from `ranked`.
pub fn propose(tiers: &[Tier], ranked: &Ranked) -> Vec<TierProposal> {
    let all: Vec<String> = ranked.models.iter().map(|(m, _)| m.clone()).collect();
    let n = all.len();
    let k = tiers.len().max(1);
    tiers
        .iter()
        .enumerate()
        .map(|(i, tier)| {
            let band = if ranked.priced {
                &all[i * n / k..(i + 1) * n / k]
            } else {
                &all[..]
            };
            let from = if band.is_empty() { &all[..] } else { band };
            TierProposal {
                name: tier.name.clone(),
                handles: tier.handles.clone(),
                models: from.iter().take(PER_TIER).cloned().collect(),
            }
        })
        .collect()
}

/// The proposal as the `tiers:` block of a `delegation.yaml`, with a comment saying where it
/// came from.
pub fn yaml(tiers: &[TierProposal], priced: bool) -> Result<String, String> {
    #[derive(Serialize)]
    struct File<'a> {
        tiers: &'a [TierProposal],
    }
    let body = yaml_serde::to_string(&File { tiers }).map_err(|e| e.to_string())?;
    let how = if priced {
        "the cheapest capable models OpenCode offers, by the catalog's prices"
    } else {
        "capable models OpenCode offers, in name order: its catalog lists no prices, so \
         reorder them cheapest first"
    };
    Ok(format!(
        "# Written by `opencode-mcp init`: {how} (capable: they call tools and hold 32k tokens of\n\
         # context). The first model of a tier that OpenCode offers wins. Edit freely.\n{body}"
    ))
}

/// What [`write`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// The file did not exist: it holds the tiers now.
    Created,
    /// The file set no tiers: they were added at its end.
    Added,
    /// The file's tiers were replaced (asked for).
    Replaced,
}

/// Whether the `delegation.yaml` text `text` sets `tiers` (it must parse).
pub fn sets_tiers(text: &str) -> Result<bool, String> {
    let value: yaml_serde::Value = yaml_serde::from_str(text).map_err(|e| e.to_string())?;
    Ok(match value {
        yaml_serde::Value::Mapping(map) => map.contains_key("tiers"),
        yaml_serde::Value::Null => false,
        _ => return Err("it is not a map of settings".into()),
    })
}

/// Writes `block` (a `tiers:` block, from [`yaml`]) into the user's file at `path`: creates it,
/// adds the block to a file that sets no tiers, or, with `replace`, puts it in place of the
/// file's own `tiers` (only when they start on a line of their own, `tiers:` at the left
/// margin; the rest of the file, comments included, stays as it is). A file that sets tiers is
/// left alone without `replace`.
pub fn write(path: &Path, block: &str, replace: bool) -> Result<Written, String> {
    let existing = match std::fs::read_to_string(path) {
        Ok(text) => Some(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let (text, written) = match existing {
        None => (block.to_string(), Written::Created),
        Some(text) => {
            let has = sets_tiers(&text).map_err(|e| {
                format!(
                    "cannot read {} as YAML ({e}): fix it first (`opencode-mcp check-config` \
                     names the problem)",
                    path.display()
                )
            })?;
            match (has, replace) {
                (false, _) => {
                    let sep = if text.is_empty() || text.ends_with('\n') {
                        ""
                    } else {
                        "\n"
                    };
                    (format!("{text}{sep}\n{block}"), Written::Added)
                }
                (true, false) => {
                    return Err(format!(
                        "{} sets `tiers` already: they are left as they are (pass \
                         --replace-tiers to replace them with this proposal)",
                        path.display()
                    ))
                }
                (true, true) => (replaced(&text, block, path)?, Written::Replaced),
            }
        }
    };
    // What is written must still be a configuration whose tiers read back.
    if !sets_tiers(&text).unwrap_or(false) {
        return Err(format!("the result for {} would not parse", path.display()));
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let tmp = path.with_extension(format!("yaml.init-{}", std::process::id()));
    std::fs::write(&tmp, text.as_bytes())
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            format!("cannot write {}: {e}", path.display())
        })?;
    Ok(written)
}

/// `text` with its top-level `tiers` block (from the `tiers:` line to the next top-level key)
/// replaced by `block`.
fn replaced(text: &str, block: &str, path: &Path) -> Result<String, String> {
    let lines: Vec<&str> = text.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.starts_with("tiers:"))
        .ok_or_else(|| {
            format!(
                "cannot find where `tiers` starts in {} (a line `tiers:` at the left margin): \
                 replace them by hand",
                path.display()
            )
        })?;
    // The block goes on while lines are indented, list items at the margin, comments or blank.
    let end = lines[start + 1..]
        .iter()
        .position(|l| {
            let first = l.chars().next();
            first.is_some_and(|c| !c.is_whitespace() && c != '-' && c != '#')
        })
        .map_or(lines.len(), |i| start + 1 + i);
    let mut out = String::new();
    for l in &lines[..start] {
        out.push_str(l);
        out.push('\n');
    }
    out.push_str(block);
    if !block.ends_with('\n') {
        out.push('\n');
    }
    for l in &lines[end..] {
        out.push_str(l);
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::opencode::Price;

    fn catalog() -> ModelCatalog {
        let price = |input, output| Price {
            input,
            output,
            ..Default::default()
        };
        let models = ["p/dear", "p/cheap", "p/mid", "p/tiny", "p/blind"];
        ModelCatalog {
            models: models.iter().map(|m| m.to_string()).collect(),
            prices: [
                ("p/dear", price(15.0, 75.0)),
                ("p/cheap", price(0.1, 0.4)),
                ("p/mid", price(1.0, 4.0)),
                ("p/tiny", price(0.01, 0.01)),
                ("p/blind", price(0.0, 0.0)),
            ]
            .into_iter()
            .map(|(m, p)| (m.to_string(), p))
            .collect(),
            // p/tiny's context is too small and p/blind calls no tools: neither is capable.
            capable: ["p/dear", "p/cheap", "p/mid"]
                .iter()
                .map(|m| m.to_string())
                .collect(),
            ..ModelCatalog::default()
        }
    }

    fn tiers() -> Vec<Tier> {
        ["fast", "standard", "strong"]
            .iter()
            .map(|n| Tier {
                name: n.to_string(),
                handles: format!("{n} work"),
                ..Default::default()
            })
            .collect()
    }

    #[test]
    fn capable_models_are_proposed_cheapest_tier_first() {
        let ranked = ranked(&catalog());
        assert!(ranked.priced);
        let names: Vec<&str> = ranked.models.iter().map(|(m, _)| m.as_str()).collect();
        assert_eq!(names, ["p/cheap", "p/mid", "p/dear"]);
        let proposal = propose(&tiers(), &ranked);
        let models: Vec<Vec<String>> = proposal.iter().map(|t| t.models.clone()).collect();
        assert_eq!(models, [vec!["p/cheap"], vec!["p/mid"], vec!["p/dear"]]);
        assert_eq!(proposal[1].handles, "standard work");

        // Without prices: every tier gets the capable models in name order, and it says so.
        let unpriced = ModelCatalog {
            prices: Default::default(),
            ..catalog()
        };
        let ranked = super::ranked(&unpriced);
        assert!(!ranked.priced);
        let proposal = propose(&tiers(), &ranked);
        assert_eq!(proposal[0].models, ["p/cheap", "p/dear"]);
        let text = yaml(&proposal, false).expect("yaml");
        assert!(text.contains("no prices"), "{text}");
    }

    #[test]
    fn the_users_file_is_created_added_to_or_left_alone() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("opencode-mcp/delegation.yaml");
        let block = yaml(&propose(&tiers(), &ranked(&catalog())), true).expect("yaml");

        assert_eq!(write(&path, &block, false), Ok(Written::Created));
        let written = std::fs::read_to_string(&path).expect("written");
        let back: serde_json::Value = yaml_serde::from_str(&written).expect("parses");
        assert_eq!(back["tiers"][0]["models"][0], "p/cheap");

        // Tiers set already: left alone unless asked.
        let mine = "# my settings\nlimits:\n  queue: 5\ntiers:\n- name: fast\n  handles: x\n  models: [a/b]\n  # a note\n\nsandbox:\n  network: true\n";
        std::fs::write(&path, mine).expect("mine");
        let refused = write(&path, &block, false).expect_err("left alone");
        assert!(refused.contains("--replace-tiers"), "{refused}");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), mine);

        assert_eq!(write(&path, &block, true), Ok(Written::Replaced));
        let now = std::fs::read_to_string(&path).expect("read");
        assert!(
            now.starts_with("# my settings\nlimits:\n  queue: 5\n"),
            "{now}"
        );
        assert!(now.contains("sandbox:\n  network: true\n"), "{now}");
        assert!(!now.contains("a/b"), "{now}");
        let back: serde_json::Value = yaml_serde::from_str(&now).expect("parses");
        assert_eq!(back["tiers"][2]["models"][0], "p/dear");
        assert_eq!(back["limits"]["queue"], 5);

        // A file without tiers gets them added at its end.
        std::fs::write(&path, "limits:\n  queue: 5").expect("no tiers");
        assert_eq!(write(&path, &block, false), Ok(Written::Added));
        let now = std::fs::read_to_string(&path).expect("read");
        let back: serde_json::Value = yaml_serde::from_str(&now).expect("parses");
        assert_eq!(
            (
                back["limits"]["queue"].clone(),
                back["tiers"][0]["name"].clone()
            ),
            (5.into(), "fast".into())
        );

        // A file that is not YAML is not touched.
        std::fs::write(&path, "tiers: [unclosed").expect("broken");
        let refused = write(&path, &block, true).expect_err("broken");
        assert!(refused.contains("check-config"), "{refused}");
    }
}
