//! `ptrain logits`: one forward pass, written to a file (a debugging aid).

use std::{path::PathBuf, process::ExitCode};

use clap::{Args, ValueEnum};
use ptrain_core::{
    data::Split,
    model::probe::{self, ProbeBatch},
};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum SplitArg {
    Train,
    Val,
}

/// Write the model's logits and loss on one batch to a safetensors file.
///
/// A debugging aid to compare ptrain's model with another implementation: the model
/// is built on the CPU exactly as `ptrain run` builds it (same seed, same
/// model.init_from), optionally with a checkpoint's weights, and run in evaluation
/// mode. The batch is the one the trainer draws (`--split train --step 1`: the first
/// training micro-batch; `--split val --step 0`: the first evaluation batch), or
/// token ids from `--inputs`. OUT holds `inputs`, `targets`, `logits` and `loss`, and a mixture of experts' router
/// load-balancing loss `aux_loss` (unweighted, transformers' `aux_loss`).
#[derive(Debug, Args)]
pub struct LogitsArgs {
    /// TOML file layered over the default (with --checkpoint and no --config: the
    /// checkpoint's own config.toml); repeat to layer several, in order (a later
    /// file's keys win).
    #[arg(short, long, value_name = "FILE")]
    config: Vec<PathBuf>,
    /// Override one key.
    #[arg(short, long = "set", value_name = "SECTION.KEY=VALUE")]
    set: Vec<String>,
    /// Weights from this ptrain checkpoint (or a run directory's newest).
    #[arg(long, value_name = "PATH")]
    checkpoint: Option<PathBuf>,
    /// Which split's batch the trainer would draw.
    #[arg(long, value_enum, default_value = "val")]
    split: SplitArg,
    /// The step of that batch (train: from 1; val: evaluation batch index, from 0).
    #[arg(long, value_name = "N")]
    step: Option<u64>,
    /// A safetensors file with int64 `inputs` [B, T] (and optionally `targets`) instead.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["split", "step"])]
    inputs: Option<PathBuf>,
    /// Where to write the results.
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    /// The base model of a LoRA checkpoint, when it is no longer where the run
    /// recorded it (`--set model.init_from=DIR`).
    #[arg(long, value_name = "DIR")]
    base: Option<PathBuf>,
}

pub fn run(args: LogitsArgs) -> anyhow::Result<ExitCode> {
    let recorded = args.checkpoint.as_ref().map(|c| ptrain_core::model::hf::resolve_checkpoint(c)).transpose()?;
    let sets = super::run::with_base(&args.set, args.base.as_deref())?;
    let builder = match &recorded {
        Some(checkpoint) if args.config.is_empty() => {
            let own = ptrain_core::ConfigBuilder::default().recorded_file(&checkpoint.join("config.toml"))?;
            sets.iter().try_fold(own, |b, s| b.set(s))?
        }
        _ => ptrain_core::ConfigBuilder::layered(&args.config, &sets)?,
    };
    let run = recorded.as_deref().map(ptrain_core::config::run_dir_of);
    let mut config = builder.weights_from(run).build()?;
    if recorded.is_some() && config.lora().is_none() {
        // The checkpoint has every weight: model.init_from's are not read (it may be gone).
        // A LoRA checkpoint has the adapters only: the base is model.init_from's.
        config.model.init_from.clear();
    }
    let batch = match (&args.inputs, args.split) {
        (Some(path), _) => ProbeBatch::from_file(path)?,
        (None, SplitArg::Train) => ProbeBatch::Drawn { split: Split::Train, step: args.step.unwrap_or(1) },
        (None, SplitArg::Val) => ProbeBatch::Drawn { split: Split::Val, step: args.step.unwrap_or(0) },
    };
    let result = probe::probe(&config, recorded.as_deref(), batch)?;
    result.write(&args.out)?;
    let loss = result.loss.as_ref().map_or("-".to_string(), |l| format!("{:.6}", l.double_value(&[])));
    let aux: String = result.aux.iter().filter(|(n, _)| !n.contains('/')).map(|(n, t)| format!(", {n} {:.6}", t.double_value(&[]))).collect();
    outln!("logits {:?}, loss {loss}{aux}: {}", result.logits.size(), args.out.display());
    Ok(ExitCode::SUCCESS)
}
