//! Coverage runs only (`.ci/coverage`, built with `--cfg tarpaulin`): makes every process of this
//! binary leave either a whole profile or none.
//!
//! An instrumented process writes its counters (several MB) to `LLVM_PROFILE_FILE` at exit. A
//! gateway that a host stops with SIGTERM and then SIGKILL can be killed in the middle of that
//! write, and one truncated `.profraw` makes the coverage tool refuse the whole run. So the
//! profile is written by an exit handler of ours to a `.partial` name next to the real one and
//! renamed into place when complete: a process killed mid-write leaves a file the tool does not
//! read. The runtime's own exit handler then finds the profile already written and does nothing.
//!
//! In every other build this module is empty.

/// Registers the exit handler; call first thing in `main`.
#[cfg(tarpaulin)]
pub fn write_whole_profiles() {
    // SAFETY: atexit(3) registers a plain function; it runs on the exiting thread after `main`
    // returned or `exit` was called, before the profiling runtime's own handler (registered
    // earlier, so run later).
    unsafe {
        libc::atexit(dump);
    }
}

#[cfg(not(tarpaulin))]
pub fn write_whole_profiles() {}

/// Writes the profile now, for a process about to end without running exit handlers (the
/// supervisor ends by raising OpenCode's fatal signal on itself, see `supervisor::mirror`).
#[cfg(tarpaulin)]
pub fn write_profile_now() {
    dump();
}

#[cfg(not(tarpaulin))]
pub fn write_profile_now() {}

#[cfg(tarpaulin)]
extern "C" {
    /// LLVM's profiling runtime: where the next write goes (`%p`/`%m` patterns allowed).
    fn __llvm_profile_set_filename(name: *const libc::c_char);
    /// LLVM's profiling runtime: writes the profile and marks it written, so the exit handler
    /// of the runtime skips it.
    fn __llvm_profile_dump() -> libc::c_int;
}

#[cfg(tarpaulin)]
extern "C" fn dump() {
    use std::os::unix::ffi::OsStrExt;
    let Some(pattern) = std::env::var_os("LLVM_PROFILE_FILE") else {
        return;
    };
    let dir = std::path::Path::new(&pattern)
        .parent()
        .map(std::path::Path::to_path_buf)
        .unwrap_or_default();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let name = format!("opencode-mcp-{}-{nanos}.profraw", std::process::id());
    let done = dir.join(&name);
    let partial = dir.join(format!("{name}.partial"));
    let Ok(c_partial) = std::ffi::CString::new(partial.as_os_str().as_bytes()) else {
        return;
    };
    // SAFETY: both are the runtime's documented entry points; the name is a valid C string
    // that outlives the calls (the runtime copies it).
    let written = unsafe {
        __llvm_profile_set_filename(c_partial.as_ptr());
        __llvm_profile_dump()
    };
    if written == 0 {
        let _ = std::fs::rename(&partial, &done);
    }
}
