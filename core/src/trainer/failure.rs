//! Why a run failed, as `summary.json` and the final line tell it: an error that
//! came back from the loop, or a panic caught on the training thread (or a data
//! worker's, which the loader hands over as an error). Running out of memory is
//! told apart: the message names the size libtorch tried to allocate, the peak,
//! and the settings that make a step need less.

use serde::Serialize;
use tch::Device;

use crate::{device, error::Error, panic::Panic};

/// How a run failed.
#[derive(Debug, Clone, Serialize)]
pub struct RunError {
    /// `error`, `panic` or `out_of_memory`.
    pub kind: String,
    pub message: String,
    /// Where a panic happened (`file:line:column`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// The step that was running when it failed (the last completed is `last_step`).
    pub step: u64,
}

impl RunError {
    pub(super) fn from_error(error: &Error, step: u64, device: Device) -> RunError {
        let message = without_backtrace(&error.to_string());
        match out_of_memory(&message, device) {
            Some(message) => RunError { kind: "out_of_memory".into(), message, location: None, step },
            None => RunError { kind: "error".into(), message, location: None, step },
        }
    }

    pub(super) fn from_panic(panic: Panic, step: u64, device: Device) -> RunError {
        let message = without_backtrace(&panic.message);
        match out_of_memory(&message, device) {
            Some(message) => RunError { kind: "out_of_memory".into(), message, location: panic.location, step },
            None => RunError { kind: "panic".into(), message, location: panic.location, step },
        }
    }
}

/// libtorch appends its C++ backtrace to an error ("Exception raised from ...",
/// "frame #0: ..."): useful to libtorch's developers, noise in a summary.
fn without_backtrace(message: &str) -> String {
    // Inside a panic's `Debug` of tch's error (`unwrap()` on `Torch("...")`) its lines are escaped.
    let message = ["\\nException raised from", "\\nframe #"].iter().fold(message, |m, cut| m.split(cut).next().unwrap_or(m));
    let kept: Vec<&str> = message.lines().take_while(|l| !l.starts_with("Exception raised from") && !l.starts_with("frame #")).collect();
    kept.join("\n").trim_end().to_string()
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "step {} failed: {}", self.step, self.message)?;
        if let Some(at) = &self.location {
            write!(f, " (panic at {at})")?;
        }
        Ok(())
    }
}

/// Runs a stage of set-up that allocates the model or its optimizer's state: a panic
/// in it (tch's `nn` builders unwrap libtorch's errors, out of memory among them) is
/// set-up's error (exit 1, one line), never exit 101 with libtorch's backtrace; out
/// of memory, returned or panicked, says what to make smaller.
pub(super) fn setup_stage<T>(stage: &str, device: Device, f: impl FnOnce() -> crate::error::Result<T>) -> crate::error::Result<T> {
    let advice = "Set-up needs less with a smaller model (model.n_layer, model.n_embd, model.vocab_size), LoRA \
                  (the base frozen: no gradient nor optimizer state for it), or dist.shard = \"parameters\" over several ranks";
    let failed = match crate::panic::catching(f) {
        Ok(Ok(value)) => return Ok(value),
        Ok(Err(e)) => match out_of_memory_with(&without_backtrace(&e.to_string()), device, advice) {
            Some(message) => message,
            None => return Err(e),
        },
        Err(panic) => {
            let message = without_backtrace(&panic.message);
            out_of_memory_with(&message, device, advice).unwrap_or_else(|| Panic { message, ..panic }.to_string())
        }
    };
    Err(Error::Other(format!("{stage}: {failed}")))
}

/// libtorch's allocators say "CUDA out of memory. Tried to allocate 2.00 GiB ..."
/// and "DefaultCPUAllocator: can't allocate memory: you tried to allocate N bytes".
fn out_of_memory(message: &str, device: Device) -> Option<String> {
    let advice = "A step needs less with a smaller data.batch_size (raise optim.accum_steps to keep the global batch), \
                  train.precision = \"bf16\", train.activation_checkpointing = \"full\" (gpt, llama), or a smaller model \
                  (model.n_layer, model.n_embd, model.block_size)";
    out_of_memory_with(message, device, advice)
}

/// The out-of-memory message, with `advice` on what to make smaller.
fn out_of_memory_with(message: &str, device: Device, advice: &str) -> Option<String> {
    let lower = message.to_lowercase();
    if !(lower.contains("out of memory") || lower.contains("can't allocate memory")) {
        return None;
    }
    let size = lower.find("tried to allocate ").map(|at| {
        let rest = &message[at + "tried to allocate ".len()..];
        let end = [rest.find(". "), rest.find('('), rest.find('\n')].into_iter().flatten().min().unwrap_or(rest.len());
        let text = rest[..end].trim().trim_end_matches('.');
        match text.strip_suffix(" bytes").and_then(|n| n.trim().parse::<u64>().ok()) {
            Some(bytes) => gib(bytes),
            None => text.to_string(),
        }
    });
    let peak = device::peak_memory(device);
    Some(format!(
        "out of memory on {}: tried to allocate {}, peak {} so far. {advice}. libtorch said: {}",
        device::label(device),
        size.as_deref().unwrap_or("an unknown size"),
        gib(peak),
        message.lines().next().unwrap_or_default()
    ))
}

fn gib(bytes: u64) -> String {
    format!("{:.2} GiB ({bytes} bytes)", bytes as f64 / (1u64 << 30) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libtorch_backtraces_are_cut() {
        let m = "torch: shape '[3]' is invalid for input of size 2\nException raised from infer_size_impl at InferSize.h:99:\nframe #0: c10::Error";
        assert_eq!(without_backtrace(m), "torch: shape '[3]' is invalid for input of size 2");
        // A panic's `Debug` of tch's error holds its lines escaped.
        let unwrapped = r#"called `Result::unwrap()` on an `Err` value: Torch("can't allocate memory\nframe #0: c10::Error")"#;
        assert_eq!(without_backtrace(unwrapped), "called `Result::unwrap()` on an `Err` value: Torch(\"can't allocate memory");
    }

    #[test]
    fn out_of_memory_names_the_size_the_peak_and_the_knobs() {
        let cpu = "DefaultCPUAllocator: can't allocate memory: you tried to allocate 1125899906842624 bytes. Error code 12 (Cannot allocate memory)";
        let m = out_of_memory(cpu, Device::Cpu).unwrap();
        assert!(m.contains("tried to allocate 1048576.00 GiB (1125899906842624 bytes)"), "{m}");
        for knob in ["peak", "data.batch_size", "optim.accum_steps", "train.precision"] {
            assert!(m.contains(knob), "{knob} missing from {m}");
        }
        let cuda = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.1 GiB";
        assert!(out_of_memory(cuda, Device::Cpu).unwrap().contains("tried to allocate 2.00 GiB, peak"));
        assert!(out_of_memory("shape mismatch", Device::Cpu).is_none());
    }
}
