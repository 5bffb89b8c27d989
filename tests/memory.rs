//! The heap figures the gateway reports follow what it holds. In a test binary of its own: the
//! counters are the whole process's, and beside the library's other unit tests, running on
//! other threads, a test freeing a large block meanwhile made the figures move the wrong way
//! (a CI run measured 201 MB in use before a 64 MiB allocation and 68 MB with it).

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[test]
fn heap_counts_what_is_held() {
    use opencode_mcp::memory::{resident, Heap};
    let before = Heap::now().expect("glibc reports its heap");
    let block = vec![7u8; 64 << 20];
    let held = Heap::now().expect("glibc reports its heap");
    assert!(
        held.in_use >= before.in_use + (63 << 20),
        "{before:?} -> {held:?}"
    );
    drop(block);
    let after = Heap::now().expect("glibc reports its heap");
    assert!(
        after.in_use + (63 << 20) <= held.in_use,
        "{held:?} -> {after:?}"
    );
    assert!(resident().is_some_and(|r| r > 0));
}
