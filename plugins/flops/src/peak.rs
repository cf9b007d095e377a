//! The device's peak FLOP/s, the denominator of MFU: a table of datasheet figures
//! for known GPUs, otherwise a short matmul benchmark on the device.

use std::time::{Duration, Instant};

use tch::{Device, Kind, Tensor};

/// Dense (no sparsity) datasheet peaks in TFLOP/s: a GPU matches when its CUDA
/// name contains every token (case-insensitive, whole words); first match wins.
/// `fp32` is the plain FP32 rate: libtorch leaves TF32 off for matmuls by default.
const TABLE: &[(&[&str], &str, f64, f64)] = &[
    // (tokens, label, bf16, fp32)
    (&["H100", "PCIe"], "H100 PCIe", 756.0, 51.2),
    (&["H100", "NVL"], "H100 NVL", 835.0, 60.0),
    (&["H200", "NVL"], "H200 NVL", 835.0, 60.0),
    (&["GH200"], "GH200", 989.0, 67.0),
    (&["H200"], "H200", 989.0, 67.0),
    (&["H100"], "H100 SXM", 989.0, 67.0),
    (&["A100"], "A100", 312.0, 19.5),
    (&["L40S"], "L40S", 362.0, 91.6),
    (&["L4"], "L4", 121.0, 30.3),
    (&["A10"], "A10", 125.0, 31.2),
];

/// A peak in FLOP/s and where it came from, for logs and the summary.
#[derive(Debug, Clone, PartialEq)]
pub struct Peak {
    pub flops: f64,
    pub source: String,
}

fn tokens(name: &str) -> Vec<String> {
    name.split(|c: char| c.is_whitespace() || c == '-' || c == '_').filter(|t| !t.is_empty()).map(str::to_ascii_uppercase).collect()
}

/// The datasheet peak of a CUDA device by name, for bf16 autocast or fp32.
pub fn from_table(device_name: &str, bf16: bool) -> Option<Peak> {
    let have = tokens(device_name);
    let (_, label, bf16_peak, fp32_peak) = TABLE.iter().find(|(need, ..)| need.iter().all(|n| have.iter().any(|h| h == &n.to_ascii_uppercase())))?;
    let (tflops, precision) = if bf16 { (*bf16_peak, "bf16") } else { (*fp32_peak, "fp32") };
    Some(Peak { flops: tflops * 1e12, source: format!("datasheet: {label} dense {precision}") })
}

/// The best matmul rate reached on `device`: square matrices big enough to keep
/// the device busy (256 is as fast per FLOP as larger sizes on a CPU core), timed
/// in batches of a millisecond or more so that synchronising does not show.
/// Stops after `budget`, or sooner once five batches in a row have not beaten the
/// best by 1%: some 10-20 ms on a CPU. At least one batch runs.
pub fn measure(device: Device, kind: Kind, budget: Duration) -> Result<Peak, tch::TchError> {
    let n: i64 = if device.is_cuda() { 4096 } else { 256 };
    let a = Tensor::f_randn([n, n], (kind, device))?;
    let b = Tensor::f_randn([n, n], (kind, device))?;
    let c = Tensor::f_empty([n, n], (kind, device))?;
    let sync = || {
        if let Device::Cuda(i) = device {
            tch::Cuda::synchronize(i as i64);
        }
    };
    let flops_per_mm = 2.0 * (n as f64).powi(3);
    // Warm-up: thread pools, cuBLAS handles, clocks.
    let _ = a.f_mm_out(&c, &b)?;
    sync();
    let (mut batch, mut best, mut stale, started) = (1u32, 0.0f64, 0u32, Instant::now());
    loop {
        let t = Instant::now();
        for _ in 0..batch {
            let _ = a.f_mm_out(&c, &b)?;
        }
        sync();
        let secs = t.elapsed().as_secs_f64();
        let rate = flops_per_mm * batch as f64 / secs.max(1e-12);
        stale = if rate > best * 1.01 { 0 } else { stale + 1 };
        best = best.max(rate);
        if secs < 0.001 {
            batch *= 2;
            stale = 0;
        }
        if started.elapsed() >= budget || stale >= 5 {
            break;
        }
    }
    let label = if device.is_cuda() { "cuda" } else { "cpu" };
    let ms = started.elapsed().as_secs_f64() * 1e3;
    Ok(Peak { flops: best, source: format!("measured: {label} {n}x{n} {kind:?} matmul, best of {ms:.0} ms") })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_gpus_match_their_datasheet_rows() {
        let peak = |name: &str, bf16| from_table(name, bf16).map(|p| p.flops / 1e12);
        assert_eq!(peak("NVIDIA H100 80GB HBM3", true), Some(989.0));
        assert_eq!(peak("NVIDIA H200", true), Some(989.0));
        assert_eq!(peak("NVIDIA A100-SXM4-80GB", true), Some(312.0));
        assert_eq!(peak("NVIDIA A100 80GB PCIe", false), Some(19.5));
        assert_eq!(peak("NVIDIA H100 PCIe", true), Some(756.0), "the PCIe card is slower than the SXM one");
        assert_eq!(peak("NVIDIA L40S", true), Some(362.0), "L40S is not read as L4");
        assert_eq!(peak("NVIDIA GeForce RTX 4090", true), None);
        assert_eq!(peak("NVIDIA A10G", true), None, "A10G is not the A10");
    }

    #[test]
    fn fp32_is_rated_below_bf16() {
        let bf16 = from_table("NVIDIA H100 80GB HBM3", true).unwrap();
        let fp32 = from_table("NVIDIA H100 80GB HBM3", false).unwrap();
        assert!(fp32.flops < bf16.flops / 10.0);
        assert!(fp32.source.contains("fp32"), "{}", fp32.source);
    }

    #[test]
    fn the_cpu_benchmark_reports_a_positive_rate() {
        let peak = measure(Device::Cpu, Kind::Float, Duration::from_millis(20)).unwrap();
        assert!(peak.flops.is_finite() && peak.flops > 0.0, "{peak:?}");
        assert!(peak.source.starts_with("measured: cpu"), "{}", peak.source);
    }
}
