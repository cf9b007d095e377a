//! Compiles the C++ shim against the same libtorch headers tch uses (the venv's
//! torch, found by torch-sys). CUDA parts are compiled when that libtorch has CUDA.

use std::{env, path::PathBuf};

fn main() {
    let lib = PathBuf::from(env::var("DEP_TCH_LIBTORCH_LIB").expect("torch-sys exports the libtorch lib dir"));
    let torch = lib.parent().expect("lib dir has a parent").to_path_buf();
    let include = torch.join("include");
    let site = torch.parent().expect("torch is in site-packages").to_path_buf();
    let cuda_include = site.join("nvidia/cu13/include");
    let has_cuda =
        lib.join("libtorch_cuda.so").exists() && cuda_include.join("cuda_runtime_api.h").exists() && cuda_include.join("crt/host_defines.h").exists();

    let mut build = cc::Build::new();
    build
        .cpp(true)
        .pic(true)
        .warnings(false)
        .std("c++17")
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        .define("GLOG_USE_GLOG_EXPORT", None)
        .files(["csrc/optim.cpp", "csrc/grads.cpp", "csrc/foreach.cpp", "csrc/profiler.cpp", "csrc/trace.cpp", "csrc/cuda.cpp", "csrc/autocast.cpp", "csrc/pin.cpp"]);
    if has_cuda {
        build.define("PTX_CUDA", None).include(&cuda_include);
        println!("cargo:rustc-link-lib=dylib=c10_cuda");
        println!("cargo:rustc-link-lib=dylib=torch_cuda");
        println!("cargo:rustc-cfg=ptx_cuda");
    }
    build.compile("ptrain_torch_ext");
    println!("cargo:rustc-check-cfg=cfg(ptx_cuda)");
    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:libtorch_lib={}", lib.display());
    println!("cargo:include={}", include.display());
    println!("cargo:rerun-if-changed=csrc");
}
