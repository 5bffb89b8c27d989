//! Runs the unit tests of the spec normalisation rules in `openapi/normalize.rs` (the module is
//! shared with `build.rs`, which cannot host tests itself), and checks the pinned spec normalises.

#[path = "../openapi/normalize.rs"]
#[allow(dead_code)]
mod normalize;

#[test]
fn pinned_spec_normalises_without_collisions() {
    let raw = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/openapi/opencode.json"
    ))
    .expect("openapi/opencode.json is committed");
    let spec: serde_json::Value = serde_json::from_str(&raw).expect("spec is JSON");
    let ops: Vec<String> = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/openapi/operations.txt"
    ))
    .expect("operations list")
    .lines()
    .map(str::trim)
    .filter(|l| !l.is_empty() && !l.starts_with('#'))
    .map(String::from)
    .collect();
    let out = normalize::normalize(spec, &ops).expect("normalises");
    assert_eq!(out["openapi"], "3.0.3");
    assert!(normalize::identifier_collisions(&out).is_empty());
    let kept = out["paths"]
        .as_object()
        .expect("paths")
        .values()
        .flat_map(|item| item.as_object().into_iter().flat_map(|m| m.values()))
        .filter(|op| op.get("operationId").is_some())
        .count();
    assert_eq!(kept, ops.len(), "every listed operation is generated");
}
