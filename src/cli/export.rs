//! `ptrain export`: a checkpoint in another library's format.

use std::{path::PathBuf, process::ExitCode};

use clap::{Args, ValueEnum};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Format {
    /// Hugging Face transformers: config.json and model.safetensors (plus the run's
    /// tokenizer files), for `AutoModelForCausalLM.from_pretrained(OUT)`.
    Hf,
    /// peft: a LoRA run's adapters, adapter_config.json and adapter_model.safetensors,
    /// for `peft.PeftModel.from_pretrained(base, OUT)`.
    Peft,
}

/// Export a language model's checkpoint (a kind with a Hugging Face counterpart) so that another library loads it.
///
/// `--format hf` writes OUT/config.json and OUT/model.safetensors and copies the
/// run's data.tokenizer as OUT/tokenizer.json (with the tokenizer_config.json and
/// special_tokens_map.json beside it, if any), so that
/// `transformers.AutoModelForCausalLM.from_pretrained(OUT)` loads it. A gpt becomes a
/// GPT2LMHeadModel (Conv1D layouts, head tied to the token embedding); a llama the
/// family it came from (LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM,
/// MistralForCausalLM; a tied head written once), with the init_from directory's
/// generation_config.json.
///
/// A LoRA run ([lora]) checkpoints only its adapters: `--format peft` writes
/// OUT/adapter_config.json and OUT/adapter_model.safetensors, which
/// `peft.PeftModel.from_pretrained(base, OUT)` loads over the base model
/// (model.init_from); `--format hf --merge` writes the full model with the adapters
/// merged into the base weights instead.
#[derive(Debug, Args)]
pub struct ExportArgs {
    /// A checkpoint directory, or a run directory (its newest valid checkpoint); with
    /// --run-dir, `best` (the best by the checkpoint plugin's metric,
    /// plugins.checkpoint.metric: eval/loss by default), `latest`, or a step.
    #[arg(long, value_name = "PATH|best|latest|STEP")]
    checkpoint: PathBuf,
    /// The run directory --checkpoint best|latest|STEP picks from.
    #[arg(long, value_name = "DIR")]
    run_dir: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value = "hf")]
    format: Format,
    /// Output directory (created; files in it are replaced).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Export without the run's tokenizer files (hf and peft export them by default;
    /// a tokenizer that can no longer be read is then an error, exit 2).
    #[arg(long)]
    no_tokenizer: bool,
    /// --format hf of a LoRA run: merge the adapters into the base weights.
    #[arg(long)]
    merge: bool,
    /// A LoRA run's base model, moved from where model.init_from recorded it: its
    /// weights must digest to what the run recorded (state.json lora_base_digest).
    #[arg(long, value_name = "DIR")]
    base: Option<PathBuf>,
}

pub fn run(args: ExportArgs) -> anyhow::Result<ExitCode> {
    let checkpoint = pick(&args.checkpoint, args.run_dir.as_deref())?;
    if let Format::Peft = args.format {
        if args.merge {
            let message = "--merge writes a full model: use it with --format hf".to_string();
            return Err(ptrain_core::ConfigError { origin: "--merge".into(), key: String::new(), message }.into());
        }
        let done = ptrain_core::model::hf::export_peft(&checkpoint, &args.out, !args.no_tokenizer, args.base.as_deref())?;
        let mut files = vec![
            ptrain_core::model::hf::ADAPTER_CONFIG.to_string(),
            format!("{} ({} tensors)", ptrain_core::model::hf::ADAPTER_WEIGHTS, done.tensors),
        ];
        files.extend(done.tokenizer_files.iter().filter_map(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned()));
        outln!("exported the LoRA adapters of step {} of {} to {}: {}", done.step, done.checkpoint.display(), done.out.display(), files.join(", "));
        outln!("load them with peft.PeftModel.from_pretrained(base_model, {:?})", done.out.display().to_string());
        return Ok(ExitCode::SUCCESS);
    }
    let done = ptrain_core::model::hf::export(&checkpoint, &args.out, !args.no_tokenizer, args.merge, args.base.as_deref())?;
    let mut files = vec!["config.json".to_string(), format!("model.safetensors ({} tensors)", done.tensors)];
    files.extend(done.tokenizer_files.iter().filter_map(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned()));
    outln!("exported step {} of {} to {}: {}", done.step, done.checkpoint.display(), done.out.display(), files.join(", "));
    outln!("load it with transformers.AutoModelForCausalLM.from_pretrained({:?})", done.out.display().to_string());
    Ok(ExitCode::SUCCESS)
}

/// The checkpoint `--checkpoint` names: a path, or with `--run-dir` `best`,
/// `latest` or a step of that run.
fn pick(checkpoint: &std::path::Path, run_dir: Option<&std::path::Path>) -> Result<PathBuf, ptrain_core::Error> {
    use ptrain_core::checkpoint as ckpt;
    let name = checkpoint.to_str().unwrap_or_default();
    let by_name = matches!(name, "best" | "latest") || name.parse::<u64>().is_ok();
    let Some(run) = run_dir.filter(|_| by_name) else {
        if by_name && !checkpoint.exists() {
            let message = format!("--checkpoint {name} picks from a run: add --run-dir DIR");
            return Err(ptrain_core::ConfigError { origin: "--checkpoint".into(), key: String::new(), message }.into());
        }
        return Ok(checkpoint.to_owned());
    };
    let dir = ckpt::checkpoints_in(run);
    let chosen = match name {
        "latest" => return Ok(run.to_owned()),
        "best" => ckpt::read_best(&dir).map(|n| dir.join(n)).ok_or_else(|| ptrain_core::Error::Checkpoint {
            path: dir.clone(),
            message: "no best checkpoint recorded: the checkpoint plugin scores a checkpoint by its metric (plugins.checkpoint.metric, \
                      eval/loss by default) measured at the checkpoint's own step; give --checkpoint latest or a step"
                .into(),
        })?,
        step => dir.join(ckpt::dir_name(step.parse().unwrap_or_default())),
    };
    if !chosen.is_dir() {
        return Err(ptrain_core::Error::MissingFile { what: "checkpoint", path: chosen });
    }
    Ok(chosen)
}
