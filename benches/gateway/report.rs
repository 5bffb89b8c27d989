//! The report: one table of figures against their targets, one scaling table, and the same
//! figures as JSON.

use serde::Serialize;

use crate::stats::{ratio, Summary};

/// One row of the main table.
#[derive(Debug, Clone, Serialize)]
pub struct Figure {
    pub id: &'static str,
    pub title: String,
    pub unit: &'static str,
    pub gateway: Summary,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline: Option<Summary>,
    /// What the baseline is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline_label: Option<String>,
    /// gateway p50 / baseline p50.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio_p50: Option<f64>,
    pub target: String,
    /// `None` when the figure has no target (informational).
    pub met: Option<bool>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub note: String,
}

impl Figure {
    pub fn new(id: &'static str, title: impl Into<String>, unit: &'static str) -> Self {
        Self {
            id,
            title: title.into(),
            unit,
            gateway: Summary::default(),
            baseline: None,
            baseline_label: None,
            ratio_p50: None,
            target: String::new(),
            met: None,
            note: String::new(),
        }
    }

    pub fn gateway(mut self, s: Summary) -> Self {
        self.gateway = s;
        self
    }

    pub fn baseline(mut self, label: impl Into<String>, s: Summary) -> Self {
        self.ratio_p50 = Some(ratio(self.gateway.p50, s.p50));
        self.baseline = Some(s);
        self.baseline_label = Some(label.into());
        self
    }

    pub fn target(mut self, target: impl Into<String>, met: bool) -> Self {
        self.target = target.into();
        self.met = Some(met);
        self
    }

    pub fn note(mut self, note: impl Into<String>) -> Self {
        self.note = note.into();
        self
    }
}

/// One row of the scaling table.
#[derive(Debug, Clone, Serialize)]
pub struct ScaleRow {
    pub tasks: usize,
    pub reps: usize,
    pub gateway_started: Summary,
    pub direct_started: Summary,
    pub gateway_total: Summary,
    pub direct_total: Summary,
    /// gateway total p50 / direct total p50.
    pub ratio_total_p50: f64,
    /// gateway total p50 - direct total p50, ms.
    pub overhead_total_ms: f64,
    /// gateway start phase p50 - direct start phase p50, per task, ms.
    pub overhead_start_per_task_ms: f64,
    /// Gateway CPU time per task (all repetitions' CPU over all their tasks), ms.
    pub gateway_cpu_per_task_ms: f64,
}

fn num(v: f64) -> String {
    if v.is_nan() {
        "-".into()
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// A Markdown table (readable in a terminal, pasteable into the README).
pub fn figures_table(figures: &[Figure]) -> String {
    let mut rows = vec![vec![
        "figure".to_string(),
        "n".into(),
        "gateway p50".into(),
        "gateway p95".into(),
        "baseline p50".into(),
        "baseline p95".into(),
        "ratio p50".into(),
        "target".into(),
        "met".into(),
    ]];
    for f in figures {
        let b = f.baseline.as_ref();
        rows.push(vec![
            format!("{} ({})", f.title, f.unit),
            f.gateway.n.to_string(),
            num(f.gateway.p50),
            num(f.gateway.p95),
            b.map_or("-".into(), |b| num(b.p50)),
            b.map_or("-".into(), |b| num(b.p95)),
            f.ratio_p50.map_or("-".into(), |r| format!("{r:.3}×")),
            if f.target.is_empty() {
                "-".into()
            } else {
                f.target.clone()
            },
            match f.met {
                Some(true) => "yes".into(),
                Some(false) => "**no**".into(),
                None => "-".into(),
            },
        ]);
    }
    markdown(&rows)
}

pub fn scaling_table(rows: &[ScaleRow]) -> String {
    let mut out = vec![vec![
        "tasks".to_string(),
        "reps".into(),
        "direct started p50".into(),
        "gateway started p50".into(),
        "direct all done p50".into(),
        "gateway all done p50".into(),
        "gateway all done p95".into(),
        "ratio p50".into(),
        "overhead p50 (ms)".into(),
        "start overhead / task (ms)".into(),
        "gateway CPU / task (ms)".into(),
    ]];
    for r in rows {
        out.push(vec![
            r.tasks.to_string(),
            r.reps.to_string(),
            num(r.direct_started.p50),
            num(r.gateway_started.p50),
            num(r.direct_total.p50),
            num(r.gateway_total.p50),
            num(r.gateway_total.p95),
            format!("{:.3}×", r.ratio_total_p50),
            num(r.overhead_total_ms),
            num(r.overhead_start_per_task_ms),
            num(r.gateway_cpu_per_task_ms),
        ]);
    }
    markdown(&out)
}

fn markdown(rows: &[Vec<String>]) -> String {
    let cols = rows.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..cols)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let line = |r: &Vec<String>| {
        let cells: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        format!("| {} |", cells.join(" | "))
    };
    let mut out = String::new();
    for (i, r) in rows.iter().enumerate() {
        out.push_str(&line(r));
        out.push('\n');
        if i == 0 {
            let dashes: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
            out.push_str(&format!("|-{}-|\n", dashes.join("-|-")));
        }
    }
    out
}
