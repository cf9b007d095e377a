//! Gives the `ptrain` binary a run path to the libtorch it was built against, so it
//! runs without LD_LIBRARY_PATH. LD_LIBRARY_PATH still wins (DT_RUNPATH), which is
//! how a copied binary finds another machine's torch. `ptrain plugins new` learns the
//! same directory (`PTRAIN_BUILD_LIBTORCH_LIB`).

fn main() {
    // Without these, cargo reruns this script (and recompiles the crate) whenever any
    // file of the package changes, documentation included.
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=DEP_PTRAIN_TORCH_EXT_LIBTORCH_LIB");
    if let Ok(lib) = std::env::var("DEP_PTRAIN_TORCH_EXT_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg-bins=-Wl,-rpath,{lib}");
        // For `ptrain plugins new`: where a plugin's tests find the same libtorch.
        println!("cargo:rustc-env=PTRAIN_BUILD_LIBTORCH_LIB={lib}");
    }
}
