//! The process's heap, kept in step with the work: a gateway runs for days, and its memory must
//! follow what it tracks now, not the most it ever tracked.
//!
//! glibc's allocator gives every thread that allocates an arena of its own (up to eight per
//! core) and keeps freed memory in them for reuse. The gateway's allocations are small and come
//! from a handful of runtime threads, so extra arenas only hold freed memory apart, and finished
//! tasks leaving memory (see `tasks::registry`) lowered the heap without lowering the RSS.
//! [`limit_arenas`] caps the arenas at two before any thread starts, and [`give_back`] returns
//! free pages at the top and inside the arenas to the system after finished tasks left memory,
//! and once a burst of work is over (no task running; see `tasks::tracker`).
//! Both do nothing where the allocator is not glibc's.
//!
//! With `opencode_mcp::memory=debug` logged, each give-back writes one line with the heap in use,
//! the free memory the allocator still holds and the process's RSS right after it: what tells a
//! growing heap (something kept) from a resident set the allocator keeps (fragmentation).

/// Caps glibc's malloc arenas at two. Call before the async runtime starts its threads.
pub fn limit_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt(3) only sets an allocator parameter (glibc serialises it with its own
    // lock); arenas made after it obey the cap.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// Returns freed heap memory to the system (after finished tasks left memory, and when the
/// gateway goes quiet after a burst). Cheap when there is little to return; called at most once
/// per eviction pass that removed something and once per quiet spell.
pub fn give_back() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim(3) only releases free memory the allocator holds; it is thread-safe.
    unsafe {
        libc::malloc_trim(0);
    }
    if tracing::enabled!(tracing::Level::DEBUG) {
        if let Some(heap) = Heap::now() {
            tracing::debug!(
                heap_in_use_kib = heap.in_use / 1024,
                heap_free_kib = heap.free / 1024,
                rss_kib = resident().map_or(0, |b| b / 1024),
                "gave freed memory back"
            );
        }
    }
}

/// What the allocator reports of its heap, in bytes, summed over its arenas.
#[derive(Debug, Clone, Copy)]
pub struct Heap {
    /// Bytes handed out and not yet freed (small chunks and large mappings alike).
    pub in_use: u64,
    /// Bytes freed and kept by the allocator for reuse.
    pub free: u64,
}

impl Heap {
    /// The allocator's figures now; `None` where the allocator is not glibc's.
    pub fn now() -> Option<Heap> {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        {
            // SAFETY: mallinfo2(3) only reads the allocator's counters, under its own locks.
            let m = unsafe { libc::mallinfo2() };
            Some(Heap {
                in_use: (m.uordblks + m.hblkhd) as u64,
                free: m.fordblks as u64,
            })
        }
        #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
        None
    }
}

/// The process's resident set in bytes (Linux: `/proc/self/statm`).
pub fn resident() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf(3) only reads a system constant.
    let page = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).ok()?;
    Some(pages * page)
}
