//! What the numbers ran on, and the `/proc` readings the figures use (RSS, CPU time).

use std::path::Path;

use serde::Serialize;

/// The machine, as printed at the top of the report and stored in the JSON.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub nproc: usize,
    pub cpu_model: String,
    pub mem_total_mb: u64,
    pub kernel: String,
    /// `/proc/loadavg` when the run started: other work on a shared machine shows here.
    pub loadavg_at_start: String,
    pub loadavg_at_end: String,
}

impl Machine {
    pub fn read() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| {
                l.strip_prefix("model name")
                    .and_then(|r| r.split_once(':'))
                    .map(|(_, v)| v.trim().to_string())
            })
            .unwrap_or_else(|| "unknown".into());
        let mem_total_mb = meminfo_kb("MemTotal").unwrap_or(0) / 1024;
        Self {
            nproc: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            cpu_model,
            mem_total_mb,
            kernel: read_trim("/proc/sys/kernel/osrelease"),
            loadavg_at_start: loadavg(),
            loadavg_at_end: String::new(),
        }
    }
}

fn read_trim(path: impl AsRef<Path>) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The first three fields of `/proc/loadavg`.
pub fn loadavg() -> String {
    read_trim("/proc/loadavg")
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn meminfo_kb(key: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    status_kb(&text, key)
}

/// A `Key:   123 kB` value of `/proc/*/status` or `/proc/meminfo`.
fn status_kb(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(key)?.strip_prefix(':')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// Resident set size of `pid` in MiB (`VmRSS`), and its peak (`VmHWM`).
pub fn rss_mb(pid: u32) -> Option<(f64, f64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss = status_kb(&text, "VmRSS")?;
    let hwm = status_kb(&text, "VmHWM").unwrap_or(rss);
    Some((rss as f64 / 1024.0, hwm as f64 / 1024.0))
}

/// `pid`'s resident memory split into (anonymous, file-backed) MiB: file pages are the binary's
/// own code and data mapped in (shared with the page cache), anonymous ones its heap and stacks,
/// so the two say whether a figure moved because of allocations or because more code ran.
pub fn rss_split_mb(pid: u32) -> Option<(f64, f64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let anon = status_kb(&text, "RssAnon")?;
    let file = status_kb(&text, "RssFile")?;
    Some((anon as f64 / 1024.0, file as f64 / 1024.0))
}

/// User plus system CPU time `pid` has used so far, in seconds.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces and parentheses: fields start after the last ") ".
    let (_, rest) = stat.rsplit_once(") ")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state); utime and stime are fields 14 and 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) as f64 / clock_ticks())
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf reads a constant of the running system; no memory is touched.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as f64
    } else {
        100.0
    }
}

/// `git describe --always --dirty` of the crate, if git is at hand.
pub fn git_describe() -> String {
    std::process::Command::new("git")
        .args(["describe", "--always", "--dirty", "--abbrev=12"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}
