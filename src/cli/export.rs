//! `ptrain export`: a checkpoint in another library's format.

use std::{path::PathBuf, process::ExitCode};

use clap::{Args, ValueEnum};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Format {
    /// Hugging Face transformers: config.json and model.safetensors (plus the run's
    /// tokenizer files), for `AutoModelForCausalLM.from_pretrained(OUT)`.
    Hf,
}

/// Export a gpt or llama checkpoint so that another library loads it.
///
/// `--format hf` writes OUT/config.json and OUT/model.safetensors and copies the
/// run's data.tokenizer as OUT/tokenizer.json (with the tokenizer_config.json and
/// special_tokens_map.json beside it, if any), so that
/// `transformers.AutoModelForCausalLM.from_pretrained(OUT)` loads it. A gpt becomes a
/// GPT2LMHeadModel (Conv1D layouts, head tied to the token embedding); a llama the
/// family it came from (LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM,
/// MistralForCausalLM; a tied head written once), with the init_from directory's
/// generation_config.json.
#[derive(Debug, Args)]
pub struct ExportArgs {
    /// A checkpoint directory, or a run directory (its newest valid checkpoint).
    #[arg(long, value_name = "PATH")]
    checkpoint: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value = "hf")]
    format: Format,
    /// Output directory (created; files in it are replaced).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Export without the run's tokenizer files (otherwise a tokenizer that can no
    /// longer be read is an error, exit 2).
    #[arg(long)]
    no_tokenizer: bool,
}

pub fn run(args: ExportArgs) -> anyhow::Result<ExitCode> {
    let Format::Hf = args.format;
    let done = ptrain_core::model::hf::export(&args.checkpoint, &args.out, !args.no_tokenizer)?;
    let mut files = vec!["config.json".to_string(), format!("model.safetensors ({} tensors)", done.tensors)];
    files.extend(done.tokenizer_files.iter().filter_map(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned()));
    outln!("exported step {} of {} to {}: {}", done.step, done.checkpoint.display(), done.out.display(), files.join(", "));
    outln!("load it with transformers.AutoModelForCausalLM.from_pretrained({:?})", done.out.display().to_string());
    Ok(ExitCode::SUCCESS)
}
