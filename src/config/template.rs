//! Prompt templates: plain text with `{{name}}` placeholders.
//!
//! One grammar serves validation (every placeholder must name a declared argument or `tiers`) and
//! rendering, so the two cannot disagree. A placeholder is `{{`, a name of letters, digits, `_` or
//! `-`, then `}}`; spaces inside the braces are allowed (`{{ task }}`). Anything else, such as a
//! lone `{{`, is literal text.

use super::types::PromptConfig;

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
        if is_name {
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

/// The placeholder names in `template`, in order of appearance (repeats included).
pub fn placeholders(template: &str) -> Vec<&str> {
    scan(template).into_iter().map(|p| p.name).collect()
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
}
