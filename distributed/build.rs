//! Compiles the c10d shim against the libtorch headers tch uses (the venv's torch,
//! found by torch-sys). Two translation units, each a heavy compile: group.cpp
//! (TCPStore, Gloo, the operations) always, nccl.cpp only when that libtorch has
//! CUDA and the CUDA/NCCL headers it needs are present.

use std::{env, path::PathBuf};

fn main() {
    let lib = PathBuf::from(env::var("DEP_TCH_LIBTORCH_LIB").expect("torch-sys exports the libtorch lib dir"));
    let torch = lib.parent().expect("lib dir has a parent").to_path_buf();
    let include = torch.join("include");
    let nvidia = torch.parent().expect("torch is in site-packages").join("nvidia");
    let cuda_include = nvidia.join("cu13/include");
    let nccl_include = nvidia.join("nccl/include");
    let cuda_headers = ["cuda_runtime_api.h", "crt/host_defines.h", "nv/target"].iter().all(|h| cuda_include.join(h).exists());
    let nccl = lib.join("libtorch_cuda.so").exists() && cuda_headers && nccl_include.join("nccl.h").exists();
    if lib.join("libtorch_cuda.so").exists() && !nccl {
        println!(
            "cargo:warning=libtorch has CUDA but the CUDA/NCCL headers are incomplete under {}: building without NCCL (run scripts/bootstrap.sh)",
            nvidia.display()
        );
    }

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
        .define("USE_C10D_GLOO", None)
        // CUDAEvent.h's alignas(hardware_destructive_interference_size) warns on every build.
        .flag_if_supported("-Wno-interference-size")
        .file("csrc/group.cpp");
    if nccl {
        build.define("PD_NCCL", None).define("USE_C10D_NCCL", None).include(&cuda_include).include(&nccl_include).file("csrc/nccl.cpp");
        println!("cargo:rustc-link-lib=dylib=torch_cuda");
        println!("cargo:rustc-link-lib=dylib=c10_cuda");
    }
    build.compile("ptrain_dist_shim");
    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    println!("cargo:rustc-link-lib=dylib=c10");
    println!("cargo:rerun-if-changed=csrc");
}
