//! `bare-tch`: the benchmark's training loop with no framework around it.
//!
//! It trains what `ptrain run` trains from the same configuration (same model and
//! data definitions from `ptrain_core`, same batches, same seed), but with none of
//! ptrain's machinery: no trainer, no hook scheduler or step gate, no plugin host,
//! no loader threads (batches are made inline on the training thread), no
//! non-finite guard, no phase clocks. What it keeps is the work any careful loop
//! does and that ptrain does too, so that the two can be timed against each other:
//!
//! * the warmup + cosine learning rate (the formula, inline);
//! * global-norm gradient clipping on the device when `optim.grad_clip > 0`;
//! * the loss read on the host every `run.log_every` steps and at the last step;
//! * evaluation every `train.eval_every` steps and at the last step, the same
//!   `train.eval_batches` held-out batches.
//!
//! Two optimizers:
//!
//! * `--optimizer fused` (default): libtorch's fused AdamW through
//!   `ptrain-torch-ext`, with the parameters grouped and ordered as ptrain groups
//!   them (decayed matrices first, then the rest, each sorted by name). The math is
//!   then identical to ptrain's, and on the CPU so are the losses, bit for bit.
//! * `--optimizer tch`: tch's own `nn::AdamW` and `backward_step_clip_norm`, the
//!   typical hand-written tch loop (per-parameter C++ AdamW, weight decay on every
//!   parameter, clipping that reads the norm on the host). Losses differ slightly.
//!
//! `--nonfinite-guard` adds ptrain's on-device non-finite loss guard (written out
//! here), so that its cost can be told apart from the rest of the framework's.
//!
//! The wall time is measured as ptrain measures `summary.json`'s `wall_s`: from
//! just before the first step (after the data, model and optimizer are built) to
//! the end of the last step's evaluation. It is written as JSON with `--out`.
//!
//! ```text
//! bare-tch [--config FILE] [--set section.key=value]... [--steps N] [--seed N]
//!          [--optimizer fused|tch] [--nonfinite-guard] [--out FILE] [--quiet]
//! ```

use std::{f64::consts::PI, path::PathBuf, process::ExitCode, time::Instant};

use ptrain_core::{
    config::{Config, LrScheduleKind, OptimName, Precision},
    data::{BatchKey, Dataset, Split},
    device, model,
    model::{Model, ModelInput, Task},
    objective::cross_entropy,
    ConfigBuilder,
};
use ptrain_torch_ext::{self as ext, TensorList};
use tch::{nn, nn::OptimizerConfig, Device, Kind, Reduction, Tensor};

type Error = Box<dyn std::error::Error>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OptimizerKind {
    Fused,
    Tch,
}

struct Args {
    config: Option<PathBuf>,
    sets: Vec<String>,
    optimizer: OptimizerKind,
    guard: bool,
    out: Option<PathBuf>,
    quiet: bool,
}

const USAGE: &str = "usage: bare-tch [--config FILE] [--set section.key=value]... [--steps N] [--seed N] [--optimizer fused|tch] [--nonfinite-guard] [--out FILE] [--quiet]";

fn parse_args() -> Result<Args, Error> {
    let mut args = Args { config: None, sets: Vec::new(), optimizer: OptimizerKind::Fused, guard: false, out: None, quiet: false };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value\n{USAGE}"));
        match flag.as_str() {
            "--config" => args.config = Some(value()?.into()),
            "--set" => args.sets.push(value()?),
            // The same shorthands as `ptrain run`, as assignments applied last.
            "--steps" => args.sets.push(format!("train.steps={}", value()?)),
            "--seed" => args.sets.push(format!("run.seed={}", value()?)),
            "--device" => args.sets.push(format!("run.device=\"{}\"", value()?)),
            "--optimizer" => {
                args.optimizer = match value()?.as_str() {
                    "fused" => OptimizerKind::Fused,
                    "tch" => OptimizerKind::Tch,
                    other => return Err(format!("unknown optimizer `{other}` (fused | tch)").into()),
                }
            }
            "--nonfinite-guard" => args.guard = true,
            "--out" => args.out = Some(value()?.into()),
            "--quiet" => args.quiet = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument `{other}`\n{USAGE}").into()),
        }
    }
    Ok(args)
}

/// ptrain's cosine or constant schedule (the benchmark's; core/src/optim/lr_schedule.rs), written out with the same
/// floating-point operations in the same order so the learning rates are equal.
fn lr_at(config: &Config, step: u64) -> f64 {
    let o = &config.optim;
    let (peak, min, warmup, total) = (o.lr, o.floor(), o.warmup(config.train.steps), config.train.steps);
    if step <= warmup {
        return peak * step as f64 / (warmup + 1) as f64;
    }
    if o.schedule != LrScheduleKind::Cosine || total <= warmup {
        return peak;
    }
    let progress = ((step - warmup) as f64 / (total - warmup) as f64).min(1.0);
    min + 0.5 * (1.0 + (PI * progress).cos()) * (peak - min)
}

/// One weight-decay group of the fused optimizer.
struct Group {
    weight_decay: f64,
    params: TensorList,
    grads: TensorList,
    exp_avgs: TensorList,
    exp_avg_sqs: TensorList,
    steps: TensorList,
}

/// Fused AdamW over handles built once. The groups and their order are ptrain's:
/// the global gradient norm sums over the parameters in this order, so a different
/// order would change its last bits and, through clipping, every loss after.
struct FusedAdamW {
    groups: Vec<Group>,
    all_grads: TensorList,
    step: Tensor,
    beta1: f64,
    beta2: f64,
    eps: f64,
    clip: f64,
}

impl FusedAdamW {
    fn new(config: &Config, params: &[(String, Tensor)]) -> FusedAdamW {
        let device = params[0].1.device();
        // Give every parameter a defined zero gradient, so the gradient handles the
        // kernels take stay valid for the whole run (backward accumulates in place).
        let touch = params.iter().map(|(_, p)| p.sum(Kind::Float) * 0.0).fold(Tensor::zeros([], (Kind::Float, device)), |a, b| a + b);
        touch.backward();
        let step = Tensor::zeros([], (Kind::Float, device));
        let mut groups = Vec::new();
        for decay in [true, false] {
            let members: Vec<&Tensor> = params.iter().filter(|(_, p)| (p.dim() >= 2) == decay).map(|(_, p)| p).collect();
            if members.is_empty() {
                continue;
            }
            let list = |f: &dyn Fn(&Tensor) -> Tensor| TensorList::new(members.iter().map(|p| f(p)).collect());
            groups.push(Group {
                weight_decay: if decay { config.optim.weight_decay } else { 0.0 },
                params: list(&|p| p.shallow_clone()),
                grads: list(&|p| p.grad()),
                exp_avgs: list(&|p| p.zeros_like().set_requires_grad(false)),
                exp_avg_sqs: list(&|p| p.zeros_like().set_requires_grad(false)),
                steps: TensorList::repeat(&step, members.len()),
            });
        }
        let all_grads = TensorList::new(groups.iter().flat_map(|g| g.grads.tensors().iter().map(Tensor::shallow_clone)).collect());
        let o = &config.optim;
        FusedAdamW { groups, all_grads, step, beta1: o.beta1, beta2: o.beta2, eps: o.eps, clip: o.grad_clip }
    }

    fn zero_grad(&self) -> Result<(), Error> {
        Ok(ext::zero_all(&self.all_grads)?)
    }

    /// Clips (when configured) and updates; `found_inf` set to 1 skips the update.
    fn step(&mut self, lr: f64, found_inf: Option<&Tensor>) -> Result<(), Error> {
        if self.clip > 0.0 {
            // The norm stays on the device: nothing reads it.
            let _norm = ext::clip_grad_norm(&self.all_grads, self.clip)?;
        }
        let _ = self.step.g_add_scalar_(1.0);
        for g in &self.groups {
            let hp = ext::AdamW { lr: ext::Lr::Value(lr), beta1: self.beta1, beta2: self.beta2, weight_decay: g.weight_decay, eps: self.eps };
            ext::fused_adamw(&g.params, &g.grads, &g.exp_avgs, &g.exp_avg_sqs, &g.steps, hp, found_inf)?;
        }
        if let Some(skipped) = found_inf {
            let _ = self.step.g_sub_(skipped);
        }
        Ok(())
    }
}

/// `--nonfinite-guard`: ptrain's non-finite loss guard, written out, to measure
/// what it costs apart from the rest of the framework. One device flag per step
/// in a ring (set by libtorch's AMP non-finite check, one kernel), handed to the
/// fused kernel to skip the
/// update; the ring is read on the host every `train.nonfinite_check_every`
/// steps and at the last step.
struct Guard {
    ring: Tensor,
    slots: Vec<Tensor>,
    one: Tensor,
    skipped: u64,
}

impl Guard {
    fn new(every: u64, device: Device) -> Guard {
        let ring = Tensor::zeros([every.max(1) as i64], (Kind::Float, device));
        let slots = (0..every.max(1) as i64).map(|i| ring.select(0, i)).collect();
        Guard { ring, slots, one: Tensor::ones([], (Kind::Float, device)), skipped: 0 }
    }

    fn flag(&self, step: u64, loss: &Tensor) -> &Tensor {
        let slot = &self.slots[(step % self.slots.len() as u64) as usize];
        let (mut loss, mut flag) = (loss.shallow_clone(), slot.shallow_clone());
        loss.internal_amp_non_finite_check_and_unscale(&mut flag, &self.one);
        slot
    }

    fn check(&mut self) {
        let flags: Vec<f32> = Vec::try_from(self.ring.to_device(Device::Cpu)).unwrap_or_default();
        let _ = self.ring.zero_();
        self.skipped += flags.iter().filter(|&&f| f > 0.5).count() as u64;
    }
}

enum Optim {
    Fused(FusedAdamW),
    Tch(nn::Optimizer, f64),
}

/// What one evaluation found.
struct Eval {
    step: u64,
    loss: f64,
    accuracy: Option<f64>,
}

struct Loop {
    config: Config,
    device: Device,
    autocast: bool,
    dataset: std::sync::Arc<dyn Dataset>,
    model: Box<dyn Model>,
    task: Task,
    quiet: bool,
}

impl Loop {
    fn forward(&mut self, inputs: &Tensor, train: bool) -> Tensor {
        if self.autocast {
            let model = &mut self.model;
            ext::autocast_bf16(self.device.is_cuda(), || model.forward(ModelInput::new(inputs, train))?.logits()).expect("autocast").expect("forward")
        } else {
            self.model.forward(ModelInput::new(inputs, train)).and_then(|o| o.logits()).expect("forward")
        }
    }

    /// The held-out loss (and accuracy) over `train.eval_batches` batches, with
    /// ptrain's keys and accumulation order, read once at the end.
    fn evaluate(&mut self, step: u64) -> Eval {
        let b = self.config.data.batch_size as u64;
        let batches = self.config.train.eval_batches.max(1);
        let sums = tch::no_grad(|| {
            let mut acc = Tensor::zeros([3], (Kind::Double, self.device));
            for i in 0..batches {
                let key = BatchKey { step: i, micro: 0, first_sample: 0, count: b, stream: i * b };
                let batch = self.dataset.batch(Split::Val, key).expect("batch").to_device(self.device, false);
                let logits = self.forward(&batch.inputs, false);
                let loss = cross_entropy(&logits, &batch.targets, Reduction::Mean).expect("loss").to_kind(Kind::Double);
                let right = match self.task {
                    Task::Classification => logits.argmax(-1, false).eq_tensor(&batch.targets).sum(Kind::Double),
                    Task::LanguageModel => Tensor::zeros([], (Kind::Double, self.device)),
                };
                acc += Tensor::stack(&[loss, right, Tensor::from(batch.targets.size()[0] as f64).to_device(self.device)], 0);
            }
            acc
        });
        let v = Vec::<f64>::try_from(sums.to_device(Device::Cpu)).unwrap_or_else(|_| vec![f64::NAN; 3]);
        let loss = v[0] / batches as f64;
        let accuracy = (self.task == Task::Classification).then(|| v[1] / v[2].max(1.0));
        if !self.quiet {
            eprintln!("eval at step {step}: loss {loss:.4}");
        }
        Eval { step, loss, accuracy }
    }
}

fn run(args: Args) -> Result<serde_json::Value, Error> {
    let mut builder = ConfigBuilder::default();
    if let Some(path) = &args.config {
        builder = builder.file(path)?;
    }
    for set in &args.sets {
        builder = builder.set(set)?;
    }
    let config = builder.build()?;
    if config.optim.name != OptimName::Adamw {
        return Err("bare-tch implements AdamW only (optim.name = \"adamw\")".into());
    }
    // Set-up in ptrain's order, so that the seeded generator draws the same
    // initial weights.
    if config.run.threads > 0 {
        tch::set_num_threads(config.run.threads as i32);
    }
    tch::manual_seed(config.run.seed as i64);
    let device = device::select(config.run.device, 0)?;
    let autocast = config.train.precision == Precision::Bf16;
    let dataset = ptrain_core::data::from_config(&config)?;
    let vs = nn::VarStore::new(device);
    let model = model::from_config(&config, &vs.root(), dataset.as_ref())?;
    let task = model.task();
    let mut params: Vec<(String, Tensor)> = vs.variables().into_iter().filter(|(_, t)| t.requires_grad()).collect();
    params.sort_by(|a, b| a.0.cmp(&b.0));
    let o = &config.optim;
    let mut optim = match args.optimizer {
        OptimizerKind::Fused => Optim::Fused(FusedAdamW::new(&config, &params)),
        OptimizerKind::Tch => {
            let adamw = nn::AdamW { beta1: o.beta1, beta2: o.beta2, wd: o.weight_decay, eps: o.eps, amsgrad: false };
            Optim::Tch(adamw.build(&vs, o.lr)?, o.grad_clip)
        }
    };

    let total = config.train.steps;
    let accum = config.optim.accum_steps.max(1);
    let b = config.data.batch_size as u64;
    let log_every = config.run.log_every;
    let eval_every = config.train.eval_every;
    // Dropout draws from torch's generator; ptrain reseeds it from (seed, step).
    let reseed = config.model.dropout > 0.0;
    let mut lp = Loop { config: config.clone(), device, autocast, dataset, model, task, quiet: args.quiet };
    let mut first_loss: Option<Tensor> = None;
    let mut last_loss: Option<Tensor> = None;
    let mut evals = Vec::new();
    let check_every = config.train.nonfinite_check_every.max(1);
    let mut guard = args.guard.then(|| Guard::new(check_every, device));
    if guard.is_some() && args.optimizer != OptimizerKind::Fused {
        return Err("--nonfinite-guard needs --optimizer fused".into());
    }

    let started = Instant::now();
    for step in 1..=total {
        if reseed {
            tch::manual_seed(config.run.seed.wrapping_add(step.wrapping_mul(0x9E37_79B9)) as i64);
        }
        let lr = lr_at(&config, step);
        if let Optim::Fused(opt) = &optim {
            opt.zero_grad()?;
        }
        let mut step_loss: Option<Tensor> = None;
        for micro in 0..accum {
            let batch = lp
                .dataset
                .batch(Split::Train, BatchKey { step, micro, first_sample: 0, count: b, stream: 0 })
                .expect("batch")
                .to_device(device, false);
            let logits = lp.forward(&batch.inputs, true);
            let loss = cross_entropy(&logits, &batch.targets, Reduction::Mean).expect("loss");
            // Out of place, as ptrain: the mean over the micro-batches.
            let loss = if accum > 1 { loss / accum as f64 } else { loss };
            match &mut optim {
                // The typical loop: zero, backward, clip, step in one call.
                Optim::Tch(opt, clip) if accum == 1 => {
                    opt.set_lr(lr);
                    if *clip > 0.0 {
                        opt.backward_step_clip_norm(&loss, *clip);
                    } else {
                        opt.backward_step(&loss);
                    }
                }
                Optim::Tch(opt, _) if micro == 0 => {
                    opt.zero_grad();
                    loss.backward();
                }
                _ => loss.backward(),
            }
            let detached = loss.detach();
            step_loss = Some(match step_loss {
                None => detached,
                Some(sum) => sum + detached,
            });
        }
        match &mut optim {
            Optim::Fused(opt) => {
                let found_inf = guard.as_ref().map(|g| g.flag(step, step_loss.as_ref().expect("a micro-batch")));
                opt.step(lr, found_inf)?
            }
            Optim::Tch(opt, clip) if accum > 1 => {
                opt.set_lr(lr);
                if *clip > 0.0 {
                    opt.clip_grad_norm(*clip);
                }
                opt.step();
            }
            Optim::Tch(..) => {}
        }
        let step_loss = step_loss.expect("at least one micro-batch");
        if first_loss.is_none() {
            first_loss = Some(step_loss.shallow_clone());
        }
        if let Some(g) = guard.as_mut() {
            if step % check_every == 0 || step == total {
                g.check();
            }
        }
        if eval_every > 0 && step % eval_every == 0 || step == total {
            evals.push(lp.evaluate(step));
        }
        // The loss reaches the host only here, at ptrain's progress cadence.
        if log_every > 0 && (step % log_every == 0 || step == total) {
            let loss = step_loss.double_value(&[]);
            if !args.quiet {
                eprintln!("step {step}/{total}  loss {loss:.4}  lr {lr:.2e}");
            }
        }
        last_loss = Some(step_loss);
    }
    let wall_s = started.elapsed().as_secs_f64();

    let read = |t: &Option<Tensor>| t.as_ref().map(|t| t.to_kind(Kind::Double).double_value(&[]));
    let last_eval = evals.last();
    Ok(serde_json::json!({
        "contender": match args.optimizer {
            OptimizerKind::Fused if args.guard => "bare-tch (fused AdamW, non-finite guard)",
            OptimizerKind::Fused => "bare-tch (fused AdamW)",
            OptimizerKind::Tch => "bare-tch (tch nn::AdamW)",
        },
        "optimizer": match args.optimizer {
            OptimizerKind::Fused => "fused",
            OptimizerKind::Tch => "tch",
        },
        "steps": total,
        "wall_s": wall_s,
        "steps_per_s": total as f64 / wall_s.max(1e-9),
        "first_loss": read(&first_loss),
        "final_loss": read(&last_loss),
        "final_eval_loss": last_eval.map(|e| e.loss),
        "final_eval_accuracy": last_eval.and_then(|e| e.accuracy),
        "eval_steps": evals.iter().map(|e| e.step).collect::<Vec<_>>(),
        "nonfinite_guard": args.guard,
        "nonfinite_steps": guard.as_ref().map(|g| g.skipped),
        "threads": tch::get_num_threads(),
        "device": device::label(device),
        "model": lp.model.kind(),
        "parameters": params.iter().map(|(_, p)| p.numel() as u64).sum::<u64>(),
    }))
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("bare-tch: {e}");
            return ExitCode::from(2);
        }
    };
    let out = args.out.clone();
    match run(args) {
        Ok(summary) => {
            println!(
                "bare-tch: {} steps in {:.3}s ({:.2} steps/s); loss {} -> {}, eval {}",
                summary["steps"],
                summary["wall_s"].as_f64().unwrap_or(f64::NAN),
                summary["steps_per_s"].as_f64().unwrap_or(f64::NAN),
                summary["first_loss"],
                summary["final_loss"],
                summary["final_eval_loss"]
            );
            if let Some(path) = out {
                if let Err(e) = std::fs::write(&path, serde_json::to_string_pretty(&summary).expect("json") + "\n") {
                    eprintln!("bare-tch: cannot write {}: {e}", path.display());
                    return ExitCode::FAILURE;
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("bare-tch: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bit-exact comparison with ptrain rests on the inline schedule giving
    /// ptrain's learning rates exactly.
    #[test]
    fn the_inline_schedule_is_ptrains() {
        for (warmup, steps, cosine) in [(20, 450, true), (0, 100, true), (30, 30, true), (10, 200, false)] {
            let mut config = Config::default();
            config.optim.warmup_steps = warmup;
            config.optim.schedule = if cosine { LrScheduleKind::Cosine } else { LrScheduleKind::Constant };
            config.train.steps = steps;
            let ptrain = ptrain_core::optim::LrSchedule::new(&config.optim, steps);
            for step in 1..=steps {
                assert_eq!(lr_at(&config, step).to_bits(), ptrain.lr(step).to_bits(), "step {step}");
            }
        }
    }
}
