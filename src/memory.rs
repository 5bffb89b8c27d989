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
}
