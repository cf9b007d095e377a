//! Keeps libtorch_cuda among the binary's needed libraries. Rust links with
//! `--as-needed`, and nothing in the bare loop references libtorch_cuda directly, so
//! the linker drops it and `--device cuda` finds no CUDA (seen on an H200: "CUDA is
//! not available"). ptrain itself keeps it through the shim's CUDA calls.

fn main() {
    if let Ok(lib) = std::env::var("DEP_PTRAIN_TORCH_EXT_LIBTORCH_LIB") {
        if std::path::Path::new(&lib).join("libtorch_cuda.so").exists() {
            println!("cargo:rustc-link-arg-bins=-Wl,--no-as-needed,-ltorch_cuda,--as-needed");
        }
    }
}
