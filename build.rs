//! Gives the `ptrain` binary a run path to the libtorch it was built against, so it
//! runs without LD_LIBRARY_PATH. LD_LIBRARY_PATH still wins (DT_RUNPATH), which is
//! how a copied binary finds another machine's torch.

fn main() {
    if let Ok(lib) = std::env::var("DEP_PTRAIN_TORCH_EXT_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg-bins=-Wl,-rpath,{lib}");
    }
}
