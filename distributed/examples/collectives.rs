//! A one-rank collective smoke test: forms a world-size-1 process group (NCCL on
//! `cuda`, Gloo on `cpu`) on a store of its own, runs an all-reduce, a broadcast,
//! a reduce-scatter and an all-gather of flat buffers, reads each result on the
//! host and checks it. `ptrain run` with one rank never creates a process group,
//! so this is how the kit (gpu/validate.sh) checks that NCCL initialises and works
//! on a GPU before any multi-rank run.
//!
//!   cargo run --release -p ptrain-dist --example collectives -- [cpu|cuda] [elements=1048576]
//!
//! Prints one line per operation (`ok`/`FAILED`, seconds) and exits 0 when all
//! passed, 1 when one failed, 2 on bad arguments or when NCCL is not built in.

use std::{net::TcpListener, process::ExitCode, time::Duration, time::Instant};

use ptrain_dist::{nccl_compiled, Backend, Group, GroupSpec};
use tch::{Device, Kind, Tensor};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cuda = match args.first().map(String::as_str) {
        None | Some("cpu") => false,
        Some("cuda") => true,
        Some(other) => {
            eprintln!("error: device `{other}`: expected cpu or cuda");
            return ExitCode::from(2);
        }
    };
    let Ok(elements) = args.get(1).map_or(Ok(1 << 20), |n| n.parse::<i64>()) else {
        eprintln!("error: elements must be a positive integer");
        return ExitCode::from(2);
    };
    ptrain_core::device::load_cuda_runtime();
    if cuda && !nccl_compiled() {
        eprintln!("error: this build has no NCCL (libtorch had no CUDA, or its CUDA/NCCL headers were missing at build time)");
        return ExitCode::from(2);
    }
    if cuda && !tch::Cuda::is_available() {
        eprintln!("error: CUDA is not available (no GPU visible, or the driver does not match libtorch's CUDA)");
        return ExitCode::from(2);
    }
    let device = if cuda { Device::Cuda(0) } else { Device::Cpu };
    let port = match TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()) {
        Ok(addr) => addr.port(),
        Err(e) => {
            eprintln!("error: no free port on 127.0.0.1: {e}");
            return ExitCode::from(1);
        }
    };
    let mut spec = GroupSpec::local_gloo(port, 0, 1, Duration::from_secs(60));
    if cuda {
        spec.backend = Backend::Nccl;
        spec.device = device;
    }
    let started = Instant::now();
    let group = match Group::connect(spec) {
        Ok(g) => g,
        Err(e) => {
            println!("{:<19} FAILED: {e}", format!("init {}", if cuda { "nccl" } else { "gloo" }));
            return ExitCode::from(1);
        }
    };
    let init = format!("init {}", group.spec().backend.name());
    println!("{init:<19} ok {:.3} s ({device:?}, world size 1, {elements} floats)", started.elapsed().as_secs_f64());
    let mut failed = false;
    for (name, op) in OPS {
        let started = Instant::now();
        let outcome = op(&group, elements, device);
        let secs = started.elapsed().as_secs_f64();
        match outcome {
            Ok(()) => println!("{name:<19} ok {secs:.3} s"),
            Err(e) => {
                failed = true;
                println!("{name:<19} FAILED: {e}");
            }
        }
    }
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

type Op = fn(&Group, i64, Device) -> Result<(), String>;

const OPS: [(&str, Op); 4] = [("all-reduce", all_reduce), ("broadcast", broadcast), ("reduce-scatter", reduce_scatter), ("all-gather", all_gather)];

/// 0, 1, 2, ... as floats on `device`.
fn ramp(n: i64, device: Device) -> Tensor {
    Tensor::arange(n, (Kind::Float, device))
}

/// Compares on the host: the read also waits for the collective on the GPU.
fn expect_equal(got: &Tensor, want: &Tensor) -> Result<(), String> {
    let diff = (got - want).abs().max().to_device(Device::Cpu).double_value(&[]);
    if diff == 0.0 {
        Ok(())
    } else {
        Err(format!("result differs from the expected values by up to {diff}"))
    }
}

fn all_reduce(g: &Group, n: i64, device: Device) -> Result<(), String> {
    let t = ramp(n, device);
    g.start_all_reduce(&t)?.wait()?;
    expect_equal(&t, &ramp(n, device))
}

fn broadcast(g: &Group, n: i64, device: Device) -> Result<(), String> {
    let t = ramp(n, device);
    g.start_broadcast(&t, 0)?.wait()?;
    expect_equal(&t, &ramp(n, device))
}

fn reduce_scatter(g: &Group, n: i64, device: Device) -> Result<(), String> {
    let (input, out) = (ramp(n, device), Tensor::zeros([n], (Kind::Float, device)));
    g.start_reduce_scatter_flat(&out, &input)?.wait()?;
    expect_equal(&out, &input)
}

fn all_gather(g: &Group, n: i64, device: Device) -> Result<(), String> {
    let (input, out) = (ramp(n, device), Tensor::zeros([n], (Kind::Float, device)));
    g.start_all_gather_flat(&out, &input)?.wait()?;
    expect_equal(&out, &input)
}
