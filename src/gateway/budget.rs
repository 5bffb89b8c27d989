//! Results sized to what the host shows its model.
//!
//! Hosts do not pass a tool result of any size to their model: Claude Code moves a result over
//! 50,000 characters into a file and shows a 2 KB preview, Codex keeps about 12,000 characters
//! (head and tail) and drops the middle. Either way the model silently misses part of the answer.
//! So the gateway budgets the *whole* result as the host sees it (the JSON text of the result,
//! fields and escapes included), not just the answer inside it, and pages the answer to fit;
//! `next_offset` says where the next page starts. The budget per host comes from `hosts` in
//! `delegation.yaml`.
//!
//! Length is counted in the host's own unit (`hosts.<name>.count`): UTF-8 bytes by default, as
//! Codex cuts, which is never more than the other and so safe for any host; UTF-16 units for
//! Claude Code, which measures a JavaScript string's length (for non-ASCII answers its pages are
//! then up to three times larger than a byte count would allow).

use serde::Serialize;

use crate::config::LengthUnit;
use crate::tasks::{TaskResult, WaitOutcome};

/// Characters kept free below the budget, for the host's own wrapping of the result.
const MARGIN: usize = 200;

/// Characters of a message beside the answer (an error) kept on a page that has no room for it.
const MESSAGE_CHARS: usize = 300;

/// The least of the answer a page carries when that much is left (in the host's unit): below
/// it, the page sheds the fields it can spare instead.
const MIN_PAGE: usize = 2_000;

/// The length of `value`'s compact JSON text (what the host shows its model), in `unit`.
pub fn shown_len<T: Serialize>(value: &T, unit: LengthUnit) -> usize {
    serde_json::to_string(value).map_or(usize::MAX, |s| unit.of(&s))
}

/// What one character adds to a JSON string as serde_json writes it, in `unit` (escapes are
/// ASCII, one unit a character in either).
fn escaped_len(c: char, unit: LengthUnit) -> usize {
    match c {
        '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
        c if (c as u32) < 0x20 => 6,
        c => unit.of_char(c),
    }
}

/// The characters of `text` from character `start` that fit in `room` units of JSON string
/// content, and at most `max_chars` of them.
fn fitting(text: &str, start: usize, max_chars: usize, room: usize, unit: LengthUnit) -> String {
    let mut used = 0;
    text.chars()
        .skip(start)
        .take(max_chars)
        .take_while(|c| {
            used += escaped_len(*c, unit);
            used <= room
        })
        .collect()
}

/// Cuts `result` (whose `text` is the whole answer) to the page from `offset` that keeps the
/// serialized result within `budget`, and at most `max_chars` characters of text.
pub fn page_result(
    mut result: TaskResult,
    offset: u64,
    max_chars: usize,
    budget: usize,
    unit: LengthUnit,
) -> TaskResult {
    let full = std::mem::take(&mut result.text);
    let total = full.chars().count();
    let start = usize::try_from(offset).unwrap_or(usize::MAX).min(total);
    if start > 0 {
        // Said on the first page; later pages keep their room for the text, so a large value
        // cannot leave a page without text (and a pager without progress).
        result.structured = None;
        result.structured_attempts = None;
    }
    // The envelope with the longest numbers it can carry, so the page never pushes it over.
    result.offset = start as u64;
    result.truncated = true;
    result.next_offset = Some(total as u64);
    // Every page carries some of the answer when some is left: a page of file lists and no
    // text would send its reader back to the same offset for ever. What the envelope can spare
    // goes, in order, until a useful piece fits, and the page says what it left out.
    let left: usize = full
        .chars()
        .skip(start)
        .take(max_chars.min(MIN_PAGE))
        .map(|c| escaped_len(c, unit))
        .sum();
    let mut room = budget.saturating_sub(shown_len(&result, unit) + MARGIN);
    let mut omitted = Vec::new();
    // Last of all the structured value and its checks: they are read from the answer's end, so
    // a reader paging the text still gets them.
    for field in [
        "tools",
        "workspace",
        "files_changed",
        "checks",
        "structured_attempts",
        "structured",
    ] {
        if room >= left {
            break;
        }
        let had = match field {
            "tools" => result.tools.take().is_some_and(|t| !t.is_empty()),
            "workspace" => result.workspace.take().is_some(),
            "files_changed" => !std::mem::take(&mut result.files_changed).is_empty(),
            "structured_attempts" => result.structured_attempts.take().is_some(),
            "checks" => result.checks.take().is_some(),
            _ => result.structured.take().is_some(),
        };
        if had {
            omitted.push(field.to_string());
            result.omitted = Some(omitted.clone());
        }
        room = budget.saturating_sub(shown_len(&result, unit) + MARGIN);
    }
    if room < left {
        // Still no room: the messages beside the answer are cut to a line each (an error
        // message can be as long as a provider made it).
        for message in [
            result.error.as_mut().map(|e| &mut e.message),
            result.text_error.as_mut(),
            result.files_error.as_mut(),
            result.structured_error.as_mut(),
        ]
        .into_iter()
        .flatten()
        {
            if let Some((cut, _)) = message.char_indices().nth(MESSAGE_CHARS) {
                message.truncate(cut);
                message.push('…');
            }
        }
        room = budget.saturating_sub(shown_len(&result, unit) + MARGIN);
    }
    let mut text = fitting(&full, start, max_chars, room, unit);
    if text.is_empty() && start < total && max_chars > 0 {
        // Nothing more can go and still no character fits (an error message of the budget's
        // size): one character anyway, over the margin kept for the host's wrapping rather than
        // a page that sends its reader back to the same offset for ever.
        text = full.chars().skip(start).take(1).collect();
    }
    let end = start + text.chars().count();
    result.text = text;
    result.truncated = end < total;
    result.next_offset = result.truncated.then_some(end as u64);
    result
}

/// Puts each finished task's answer into its wait snapshot, sharing what the budget leaves
/// after the snapshots among the answers: short answers take what they need and the rest is
/// split evenly among the long ones, which are cut and carry `next_offset`.
///
/// `answers` pairs an index into `outcome.tasks` with that task's whole result.
pub fn fill_answers(
    outcome: &mut WaitOutcome,
    answers: Vec<(usize, TaskResult)>,
    budget: usize,
    unit: LengthUnit,
) {
    let mut answers = answers;
    for (i, r) in &answers {
        if let Some(task) = outcome.tasks.get_mut(*i) {
            if !r.text.is_empty() {
                task.text = Some(String::new());
                task.next_offset = Some(r.total_chars);
            }
            task.files_changed = (!r.files_changed.is_empty()).then(|| r.files_changed.clone());
            if r.workspace.is_some() {
                task.workspace = r.workspace.clone();
            }
            if task.error.is_none() {
                task.error = r.error.clone();
            }
        }
    }
    // A task that ended without an answer (failed, cancelled) shows its error instead.
    answers.retain(|(_, r)| !r.text.is_empty());
    let mut room = budget.saturating_sub(shown_len(outcome, unit) + MARGIN);
    // Water-filling: serve the shortest answers first, each to at most an even share of what
    // is left.
    let mut order: Vec<(usize, usize, String)> = answers
        .into_iter()
        .map(|(i, r)| {
            let need: usize = r.text.chars().map(|c| escaped_len(c, unit)).sum();
            (i, need, r.text)
        })
        .collect();
    order.sort_by_key(|(_, need, _)| *need);
    let mut left = order.len();
    for (i, _, text) in order {
        let share = room / left.max(1);
        let page = fitting(&text, 0, usize::MAX, share, unit);
        let used: usize = page.chars().map(|c| escaped_len(c, unit)).sum();
        room -= used.min(room);
        left -= 1;
        let shown = page.chars().count();
        let total = text.chars().count();
        if let Some(task) = outcome.tasks.get_mut(i) {
            task.next_offset = (shown < total).then_some(shown as u64);
            task.text = Some(page);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tasks::{TaskSnapshot, TaskStatus, WaitMode};

    fn result(text: &str) -> TaskResult {
        TaskResult {
            task_id: "tsk_a".into(),
            status: TaskStatus::Completed,
            phase: None,
            text: text.into(),
            truncated: false,
            total_chars: text.chars().count() as u64,
            next_offset: None,
            offset: 0,
            text_capped: false,
            messages_capped: false,
            files_changed: Vec::new(),
            workspace: None,
            view: None,
            error: None,
            text_error: None,
            files_error: None,
            structured: None,
            structured_error: None,
            structured_attempts: None,
            checks: None,
            escalations: Vec::new(),
            confined: None,
            unconfined: None,
            turn: None,
            model: None,
            model_requested: None,
            variant: None,
            agent: None,
            tokens: None,
            cost: None,
            compactions: None,
            compaction_tokens: None,
            finish: None,
            duration_ms: None,
            tools: None,
            omitted: None,
        }
    }

    #[test]
    fn pages_fit_the_budget_whole_and_join_to_the_answer() {
        // Quotes, newlines and characters outside the BMP take more than one unit each.
        let answer: String = (0..3000)
            .map(|i| format!("line {i} \"quoted\" 😀 é\n"))
            .collect();
        let budget = 10_000;
        let mut counts = Vec::new();
        for unit in [LengthUnit::Bytes, LengthUnit::Utf16] {
            let mut offset = 0;
            let mut joined = String::new();
            let mut pages = 0;
            loop {
                let page = page_result(result(&answer), offset, 50_000, budget, unit);
                let shown = shown_len(&page, unit);
                assert!(shown <= budget, "{unit:?}: {shown}");
                assert!(!page.text.is_empty());
                joined.push_str(&page.text);
                pages += 1;
                match page.next_offset {
                    Some(next) => {
                        assert!(shown > budget - 400, "{unit:?}: not a full page: {shown}");
                        assert!(page.truncated);
                        offset = next;
                    }
                    None => break,
                }
            }
            assert_eq!(joined, answer);
            assert!(pages > 5, "{pages}");
            counts.push(pages);
        }
        assert!(
            counts[1] < counts[0],
            "counting as the host does takes fewer pages for non-ASCII text: {counts:?}"
        );
    }

    /// A result whose other fields already fill the host's budget (a worktree task that changed
    /// many files, read by Codex) still pages through the answer: each page sheds what it can
    /// spare and says so, and the pieces join to the answer.
    #[test]
    fn every_page_makes_progress_however_large_the_rest_of_the_result() {
        let answer = "word ".repeat(4_000);
        let mut whole = result(&answer);
        whole.files_changed = (0..400)
            .map(|i| {
                serde_json::from_value(serde_json::json!({
                    "file": format!("src/module_{i}/a_rather_long_file_name_{i}.rs"),
                    "additions": i, "deletions": 1
                }))
                .expect("a file change")
            })
            .collect();
        let budget = 10_000;
        let mut offset = 0;
        let mut joined = String::new();
        for _ in 0..100 {
            let page = page_result(whole.clone(), offset, 50_000, budget, LengthUnit::Bytes);
            assert!(shown_len(&page, LengthUnit::Bytes) <= budget);
            assert!(!page.text.is_empty(), "a page without text at {offset}");
            assert_eq!(
                page.omitted.as_deref(),
                Some(&["files_changed".to_string()][..])
            );
            joined.push_str(&page.text);
            match page.next_offset {
                Some(next) => {
                    assert!(next > offset);
                    offset = next;
                }
                None => break,
            }
        }
        assert_eq!(joined, answer);
        // With room to spare nothing is left out.
        let roomy = page_result(whole, 0, 50_000, 200_000, LengthUnit::Bytes);
        assert!(roomy.omitted.is_none() && roomy.files_changed.len() == 400);
    }

    #[test]
    fn a_structured_value_is_on_the_first_page_only() {
        let mut whole = result(&"x".repeat(5_000));
        whole.structured = Some(serde_json::json!({ "big": "y".repeat(3_000) }));
        whole.structured_attempts = Some(Vec::new());
        let first = page_result(whole.clone(), 0, 50_000, 6_000, LengthUnit::Bytes);
        assert!(first.structured.is_some() && first.structured_attempts.is_some());
        let next = first.next_offset.expect("more pages");
        let second = page_result(whole, next, 50_000, 6_000, LengthUnit::Bytes);
        assert!(second.structured.is_none() && second.structured_attempts.is_none());
        // The value took room on the first page; the rest of the text follows on the next.
        assert!(first.text.len() < 3_000, "{}", first.text.len());
        assert_eq!(first.text.len() + second.text.len(), 5_000);
        assert!(second.next_offset.is_none());
    }

    #[test]
    fn a_page_is_also_bounded_by_max_chars_and_an_offset_past_the_end_is_empty() {
        let page = page_result(result("abcdef"), 2, 3, 10_000, LengthUnit::Bytes);
        assert_eq!(page.text, "cde");
        assert_eq!(page.next_offset, Some(5));
        let page = page_result(result("abcdef"), 99, 3, 10_000, LengthUnit::Bytes);
        assert_eq!(page.text, "");
        assert_eq!(page.next_offset, None);
        assert_eq!(page.offset, 6);
    }

    fn snapshot(id: &str) -> TaskSnapshot {
        TaskSnapshot {
            queue_position: None,
            phase: None,
            task_id: id.into(),
            status: TaskStatus::Completed,
            title: format!("task {id}"),
            elapsed_ms: 1,
            error: None,
            permissions: Vec::new(),
            progress: None,
            text: None,
            next_offset: None,
            files_changed: None,
            workspace: None,
            structured: None,
            structured_error: None,
            structured_attempts: None,
            checks: None,
            escalations: Vec::new(),
            confined: None,
            unconfined: None,
            server_id: None,
            session_id: None,
            directory: None,
            agent: None,
            model: None,
            model_requested: None,
            variant: None,
            turn: None,
            group_id: None,
            tokens: None,
            cost: None,
            turn_started_ms: 0,
            updated_ms: 0,
        }
    }

    #[test]
    fn answers_share_the_budget_short_ones_whole() {
        let mut outcome = WaitOutcome {
            asking: Vec::new(),
            done: true,
            timed_out: false,
            mode: WaitMode::All,
            finished: vec!["a".into(), "b".into(), "c".into()],
            unfinished: Vec::new(),
            tasks: vec![snapshot("a"), snapshot("b"), snapshot("c")],
        };
        let long = "x".repeat(30_000);
        let answers = vec![
            (0, result(&long)),
            (1, result("short answer")),
            (2, result(&long)),
        ];
        fill_answers(&mut outcome, answers, 12_000, LengthUnit::Bytes);
        let shown = shown_len(&outcome, LengthUnit::Bytes);
        assert!(shown <= 12_000, "{shown}");
        let b = &outcome.tasks[1];
        assert_eq!(b.text.as_deref(), Some("short answer"));
        assert_eq!(b.next_offset, None);
        let (a, c) = (&outcome.tasks[0], &outcome.tasks[2]);
        let a_len = a.text.as_ref().map_or(0, |t| t.len());
        let c_len = c.text.as_ref().map_or(0, |t| t.len());
        assert!(
            a_len > 4_000 && a_len.abs_diff(c_len) <= 1,
            "{a_len} {c_len}"
        );
        assert_eq!(a.next_offset, Some(a_len as u64));
    }

    /// The paging invariant, over random result shapes and budgets: while text is left, every
    /// page carries some of it and moves `next_offset` on, and the pages join to the whole text.
    /// (A large structured value, attempts or error once left pages with `text: ""` and
    /// `next_offset: 0` for ever.)
    #[test]
    fn every_page_carries_text_whatever_the_shape_and_budget() {
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n.max(1)
        };
        let alphabet = ['a', ' ', '"', '\\', '\n', 'é', '😀', '\u{1}'];
        for case in 0..150 {
            let len = next(8_000) as usize + 1;
            let text: String = (0..len)
                .map(|_| alphabet[next(alphabet.len() as u64) as usize])
                .collect();
            let mut whole = result(&text);
            if next(2) == 0 {
                whole.structured =
                    Some(serde_json::json!({ "v": "s".repeat(next(30_000) as usize) }));
            }
            if next(2) == 0 {
                whole.structured_attempts = Some(Vec::new());
            }
            if next(2) == 0 {
                whole.error = Some(crate::opencode::ErrorInfo {
                    provider_status: None,
                    retryable: None,
                    name: "APIError".into(),
                    message: "e".repeat(next(12_000) as usize),
                });
            }
            if next(2) == 0 {
                whole.files_changed = (0..next(500))
                    .map(|i| {
                        serde_json::from_value(serde_json::json!({
                            "file": format!("src/f{i}.rs"), "additions": i, "deletions": 0
                        }))
                        .expect("a file change")
                    })
                    .collect();
            }
            // From a third of Codex's budget up: below that a page is an envelope and a few
            // characters, but still never empty.
            let budget = 3_000 + next(25_000) as usize;
            let unit = if next(2) == 0 {
                LengthUnit::Bytes
            } else {
                LengthUnit::Utf16
            };
            let mut offset = 0u64;
            let mut joined = String::new();
            loop {
                let page = page_result(whole.clone(), offset, 50_000, budget, unit);
                assert!(
                    !page.text.is_empty(),
                    "case {case}: an empty page at {offset} of {len} (budget {budget})"
                );
                joined.push_str(&page.text);
                match page.next_offset {
                    Some(n) => {
                        assert!(n > offset, "case {case}: no progress at {offset}");
                        offset = n;
                    }
                    None => break,
                }
            }
            assert_eq!(joined, text, "case {case}");
        }
    }
}
