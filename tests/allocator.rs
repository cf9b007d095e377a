//! The binary's allocator: libtorch's CPU tensors are allocated by the tcmalloc that
//! build.rs links in (BENCHMARKS.md: the same step at a lower peak RSS than glibc's heap,
//! without glibc's page faults when it returns memory), not by glibc.

mod common;

use common::*;

/// With `MALLOCSTATS=1`, gperftools' tcmalloc prints its statistics at exit ("MALLOC: =
/// N (... MiB) Actual memory used"); glibc knows no such variable and prints nothing.
/// Returns that figure and the model's parameter count.
fn tcmalloc_memory(width: u32) -> (u64, u64) {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = run_expect(
        ptrain().args(tiny_gpt(2)).args(["--set", &format!("model.n_embd={width}")]).arg("--run-dir").arg(dir.path()).env("MALLOCSTATS", "1"),
        0,
    );
    let err = stderr(&out);
    let line = err
        .lines()
        .find(|l| l.contains("Actual memory used"))
        .unwrap_or_else(|| panic!("no tcmalloc statistics: the binary allocates with another malloc\n{err}"));
    let bytes = line.trim_start_matches("MALLOC:").trim_start_matches([' ', '=']).split_whitespace().next().and_then(|n| n.parse().ok());
    (bytes.unwrap_or_else(|| panic!("unreadable statistics line: {line}")), summary(dir.path())["parameters"].as_u64().unwrap())
}

/// The memory tcmalloc took from the system grows with the model by at least its
/// float32 weights and AdamW's two moments: the tensors are tcmalloc's (Rust's own
/// allocations go to mimalloc, so this figure holds libtorch's).
#[test]
fn libtorchs_tensors_are_allocated_by_tcmalloc() {
    let (small, small_params) = tcmalloc_memory(64);
    let (large, large_params) = tcmalloc_memory(512);
    let tensors = 3 * 4 * (large_params - small_params);
    assert!(large >= small + tensors, "tcmalloc's memory grew by {} bytes for {tensors} bytes of weights and moments", large.saturating_sub(small));
}
