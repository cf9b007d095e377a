//! Compiles the C++ shim against the same libtorch headers tch uses (the venv's
//! torch, found by torch-sys). CUDA parts are compiled when that libtorch has CUDA
//! and the CUDA runtime headers are found; otherwise a warning says so, and a CUDA
//! run is refused at start (`ptrain_core::device::shim_has_cuda`).

use std::{env, path::PathBuf};

fn main() {
    let lib = PathBuf::from(env::var("DEP_TCH_LIBTORCH_LIB").expect("torch-sys exports the libtorch lib dir"));
    let torch = lib.parent().expect("lib dir has a parent").to_path_buf();
    let include = torch.join("include");
    let site = torch.parent().expect("torch is in site-packages").to_path_buf();
    let torch_has_cuda = lib.join("libtorch_cuda.so").exists();
    // The CUDA runtime headers: the pip wheel's (torch 2.11 on CUDA 13), then a
    // toolkit's ($CUDA_HOME, $CUDA_PATH, /usr/local/cuda).
    let mut candidates = vec![site.join("nvidia/cu13/include")];
    candidates.extend(["CUDA_HOME", "CUDA_PATH"].iter().filter_map(env::var_os).map(|home| PathBuf::from(home).join("include")));
    candidates.push(PathBuf::from("/usr/local/cuda/include"));
    let cuda_include = candidates.iter().find(|dir| dir.join("cuda_runtime_api.h").exists() && dir.join("crt/host_defines.h").exists()).cloned();
    if torch_has_cuda && cuda_include.is_none() {
        let looked: Vec<String> = candidates.iter().map(|d| d.display().to_string()).collect();
        println!(
            "cargo:warning=libtorch has CUDA but no CUDA runtime headers were found (looked in {}): building the shim WITHOUT CUDA, \
             so `ptrain run --device cuda` will refuse to run (set CUDA_HOME or run scripts/bootstrap.sh, then rebuild)",
            looked.join(", ")
        );
    }
    let cuda_include = cuda_include.filter(|_| torch_has_cuda);

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
        .files([
            "csrc/optim.cpp",
            "csrc/grads.cpp",
            "csrc/foreach.cpp",
            "csrc/profiler.cpp",
            "csrc/trace.cpp",
            "csrc/cuda.cpp",
            "csrc/cuda_graph.cpp",
            "csrc/autocast.cpp",
            "csrc/pin.cpp",
            "csrc/checkpoint.cpp",
            "csrc/precomputed.cpp",
            "csrc/sharding.cpp",
            "csrc/swiglu.cpp",
            "csrc/linear.cpp",
        ]);
    if let Some(cuda_include) = &cuda_include {
        build.define("PTX_CUDA", None).include(cuda_include);
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
    println!("cargo:rerun-if-env-changed=CUDA_HOME");
    println!("cargo:rerun-if-env-changed=CUDA_PATH");
}
