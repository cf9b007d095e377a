//! Gives the `ptrain` binary a run path to the libtorch it was built against, so it
//! runs without LD_LIBRARY_PATH. LD_LIBRARY_PATH still wins (DT_RUNPATH), which is
//! how a copied binary finds another machine's torch. `ptrain plugins new` learns the
//! same directory (`PTRAIN_BUILD_LIBTORCH_LIB`).
//!
//! Links gperftools' tcmalloc (the minimal one, statically) into the binaries: its
//! `malloc` then serves the whole process, libtorch's CPU tensors included. On the CPU a
//! training step frees and re-allocates the same large buffers every step; glibc either
//! keeps them in a fragmented heap (LoRA at Qwen2-0.5B's shape: 5.3 GiB peak RSS for
//! 4.0 GiB live) or, with a low mmap threshold, returns them and faults their pages back
//! in every step (26% slower). tcmalloc's page heap reuses them without either: 3.5 GiB
//! at a slightly faster step (BENCHMARKS.md). Without the archive (Debian:
//! libgoogle-perftools-dev, which scripts/bootstrap.sh installs) the build warns and
//! keeps glibc's allocator. Rust's own allocations stay with mimalloc (src/main.rs).

use std::path::PathBuf;

fn main() {
    // Without these, cargo reruns this script (and recompiles the crate) whenever any
    // file of the package changes, documentation included.
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=DEP_PTRAIN_TORCH_EXT_LIBTORCH_LIB");
    println!("cargo:rerun-if-env-changed=PTRAIN_TCMALLOC");
    if let Ok(lib) = std::env::var("DEP_PTRAIN_TORCH_EXT_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg-bins=-Wl,-rpath,{lib}");
        // For `ptrain plugins new`: where a plugin's tests find the same libtorch.
        println!("cargo:rustc-env=PTRAIN_BUILD_LIBTORCH_LIB={lib}");
    }
    match tcmalloc() {
        Some(archive) => {
            println!("cargo:rerun-if-changed={}", archive.display());
            // The whole archive, so that malloc, free, posix_memalign and the rest all
            // come from it; the executable exports them (shared libraries reference
            // them), so libtorch's calls resolve here too.
            println!("cargo:rustc-link-arg-bins=-Wl,--whole-archive");
            println!("cargo:rustc-link-arg-bins={}", archive.display());
            println!("cargo:rustc-link-arg-bins=-Wl,--no-whole-archive");
            println!("cargo:rustc-link-arg-bins=-lstdc++");
            println!("cargo:rustc-link-arg-bins=-lpthread");
        }
        None => {
            // Rerun when a library directory changes (the package installed later); a
            // missing file named here would rerun the script on every build.
            LIB_DIRS.iter().filter(|d| std::path::Path::new(d).is_dir()).for_each(|d| println!("cargo:rerun-if-changed={d}"));
            println!(
                "cargo:warning=libtcmalloc_minimal.a not found (Debian: apt install libgoogle-perftools-dev; or set PTRAIN_TCMALLOC): ptrain keeps glibc's malloc, whose freed tensors cost CPU runs memory or speed"
            )
        }
    }
}

const LIB_DIRS: [&str; 5] = ["/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib"];

/// `PTRAIN_TCMALLOC` (a path to libtcmalloc_minimal.a, or `off`), else the
/// usual library directories.
fn tcmalloc() -> Option<PathBuf> {
    match std::env::var("PTRAIN_TCMALLOC") {
        Ok(v) if v == "off" => return None,
        Ok(v) if !v.is_empty() => return Some(PathBuf::from(v)),
        _ => {}
    }
    LIB_DIRS.iter().map(|dir| PathBuf::from(dir).join("libtcmalloc_minimal.a")).find(|p| p.is_file())
}
