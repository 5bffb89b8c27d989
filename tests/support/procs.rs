//! Reading the process table from `/proc` (Linux): who descends from whom, who is in which
//! process group, what a process's environment holds. For tests that count processes.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// One row of `/proc/<pid>/stat`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proc {
    pub pid: u32,
    pub ppid: u32,
    pub pgrp: u32,
    /// Single-letter state; `Z` is a zombie (dead, not reaped).
    pub state: char,
    pub comm: String,
}

impl Proc {
    /// Running or sleeping: not a zombie.
    pub fn is_live(&self) -> bool {
        self.state != 'Z' && self.state != 'X'
    }
}

/// `/proc/<pid>/stat`, parsed.
pub fn stat(pid: u32) -> Option<Proc> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (head, rest) = text.rsplit_once(") ")?;
    let comm = head.split_once(" (")?.1.to_string();
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    let pgrp = fields.next()?.parse().ok()?;
    Some(Proc {
        pid,
        ppid,
        pgrp,
        state,
        comm,
    })
}

/// Every process visible now.
pub fn all() -> Vec<Proc> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(stat)
        .collect()
}

/// Live processes that descend from `root` (not `root` itself).
pub fn descendants(root: u32) -> BTreeSet<u32> {
    let table = all();
    let mut found = BTreeSet::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for p in table.iter().filter(|p| p.ppid == parent && p.is_live()) {
            if found.insert(p.pid) {
                frontier.push(p.pid);
            }
        }
    }
    found
}

/// Live members of process group `pgrp`.
pub fn group(pgrp: u32) -> BTreeSet<u32> {
    all()
        .into_iter()
        .filter(|p| p.pgrp == pgrp && p.is_live())
        .map(|p| p.pid)
        .collect()
}

/// The live ones among `pids`.
pub fn live_among(pids: &BTreeSet<u32>) -> BTreeSet<u32> {
    pids.iter()
        .copied()
        .filter(|pid| stat(*pid).is_some_and(|p| p.is_live()))
        .collect()
}

/// Polls (bounded) until none of `pids` is alive; returns how long that took, or the survivors.
/// There is no event for the exit of a process that is not our child, so this polls `/proc`.
pub async fn wait_all_gone(
    pids: &BTreeSet<u32>,
    within: Duration,
) -> Result<Duration, BTreeSet<u32>> {
    let start = Instant::now();
    loop {
        let live = live_among(pids);
        if live.is_empty() {
            return Ok(start.elapsed());
        }
        if start.elapsed() > within {
            return Err(live);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `NAME` from `/proc/<pid>/environ`.
pub fn env_var(pid: u32, name: &str) -> Option<String> {
    let bytes = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let prefix = format!("{name}=");
    bytes
        .split(|b| *b == 0)
        .filter_map(|kv| std::str::from_utf8(kv).ok())
        .find_map(|kv| kv.strip_prefix(&prefix).map(String::from))
}

/// A short description of each pid (`pid comm state`), for failure messages.
pub fn describe(pids: &BTreeSet<u32>) -> String {
    pids.iter()
        .map(|pid| match stat(*pid) {
            Some(p) => format!("{} {} {} (pgrp {})", p.pid, p.comm, p.state, p.pgrp),
            None => format!("{pid} gone"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Local addresses listening on TCP `port`, from `/proc/net/tcp` and `/proc/net/tcp6`, as
/// `(family, hex address)`: e.g. `("tcp", "0100007F")` is 127.0.0.1.
pub fn listeners_on(port: u16) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for family in ["tcp", "tcp6"] {
        let Ok(text) = std::fs::read_to_string(format!("/proc/net/{family}")) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            if cols.len() < 4 || cols[3] != "0A" {
                continue; // not LISTEN
            }
            let Some((addr, port_hex)) = cols[1].rsplit_once(':') else {
                continue;
            };
            if u16::from_str_radix(port_hex, 16).ok() == Some(port) {
                out.push((family.to_string(), addr.to_string()));
            }
        }
    }
    out
}
