//! `ptrain generate`: sampling from a trained model with a key/value cache.

use std::{io::Write, path::PathBuf, process::ExitCode};

use anyhow::Context;
use clap::Args;
use ptrain_core::{
    config::DeviceChoice,
    data::chat_template::Message,
    model::{
        generate::{generate, Sampling},
        pretrained::Pretrained,
    },
};

/// Continue a prompt with a trained language model (a kind with a key/value cache), one token at a time.
///
/// The model comes from a ptrain checkpoint or run directory (its newest valid
/// checkpoint), an exported directory (`ptrain export --format hf`), a peft adapter
/// directory (`ptrain export --format peft`, or peft's `save_pretrained`: the base model
/// its adapter_config.json names, or --base) or any Hugging Face directory
/// `model.init_from` accepts. The prompt is tokenized with the model's
/// tokenizer (a byte-level model takes bytes) and run once; each new token then costs
/// one single-position forward through the key/value cache. Generation stops at the
/// end-of-sequence token (`generation_config.json`, `config.json`, the tokenizer's
/// `eos_token`, or the run's data.eos_token) or after --max-new-tokens. The text goes
/// to standard output, tokens/s to standard error.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// A checkpoint, a run directory, a Hugging Face model directory or a peft adapter
    /// directory.
    #[arg(long, value_name = "PATH")]
    checkpoint: PathBuf,
    /// The base model of a LoRA checkpoint or peft adapter directory, when it is no
    /// longer where the run (or adapter_config.json) recorded it. For a LoRA
    /// checkpoint its weights must hash to what the run recorded.
    #[arg(long, value_name = "DIR")]
    base: Option<PathBuf>,
    /// The text to continue.
    #[arg(long, value_name = "TEXT", required_unless_present_any = ["prompt_file", "prompt_ids"])]
    prompt: Option<String>,
    /// A file holding the text to continue.
    #[arg(long, value_name = "FILE", conflicts_with = "prompt")]
    prompt_file: Option<PathBuf>,
    /// Token ids to continue, comma-separated (no tokenizer needed).
    #[arg(long, value_name = "IDS", value_delimiter = ',', conflicts_with_all = ["prompt", "prompt_file", "chat"])]
    prompt_ids: Vec<i64>,
    /// Wrap the prompt as a user message in the model's chat template, with the
    /// assistant's turn opened.
    #[arg(long)]
    chat: bool,
    /// With --chat: a system message before the user's (the template's default
    /// system prompt otherwise, if it has one).
    #[arg(long, value_name = "TEXT", requires = "chat")]
    system: Option<String>,
    #[arg(long, value_name = "N", default_value_t = 128)]
    max_new_tokens: usize,
    /// 0 = greedy (the most likely token each time).
    #[arg(long, value_name = "T", default_value_t = 1.0)]
    temperature: f64,
    /// Sample among the K most likely tokens (0 = all).
    #[arg(long, value_name = "K", default_value_t = 0)]
    top_k: i64,
    /// Sample among the most likely tokens whose probability adds up to P (1 = all).
    #[arg(long, value_name = "P", default_value_t = 1.0)]
    top_p: f64,
    #[arg(long, value_name = "S", default_value_t = 0)]
    seed: u64,
    #[arg(long, value_enum, default_value = "auto")]
    device: DeviceChoice,
    /// Print one JSON object (prompt and new ids, text, timings) instead of the text.
    #[arg(long)]
    json: bool,
}

fn usage(message: String) -> anyhow::Error {
    ptrain_core::Error::Config(ptrain_core::error::ConfigError { origin: "command line".into(), key: String::new(), message }).into()
}

pub fn run(args: GenerateArgs) -> anyhow::Result<ExitCode> {
    let in_range = (0.0..f64::INFINITY).contains(&args.temperature) && args.top_p > 0.0 && args.top_p <= 1.0 && args.top_k >= 0;
    if !in_range {
        return Err(usage(format!(
            "--temperature {} (>= 0), --top-p {} (in (0, 1]) and --top-k {} (>= 0) must be in range",
            args.temperature, args.top_p, args.top_k
        )));
    }
    if args.max_new_tokens == 0 {
        return Err(usage("--max-new-tokens must be at least 1".into()));
    }
    let device = ptrain_core::device::select(args.device, 0)?;
    let mut pretrained = Pretrained::open_with_base(&args.checkpoint, args.base.as_deref(), device)?;
    let prompt_ids = if !args.prompt_ids.is_empty() {
        args.prompt_ids.clone()
    } else {
        let mut text = match (&args.prompt, &args.prompt_file) {
            (Some(text), _) => text.clone(),
            (None, Some(file)) => std::fs::read_to_string(file)
                .map_err(|e| ptrain_core::Error::Io { path: file.clone(), source: e })
                .context("reading --prompt-file")?,
            (None, None) => unreachable!("clap requires a prompt"),
        };
        if args.chat {
            let template = pretrained.chat_template()?;
            let system = args.system.iter().map(|s| Message { role: "system".into(), content: s.clone() });
            let messages: Vec<Message> = system.chain([Message { role: "user".into(), content: text }]).collect();
            text = template.render_messages(&messages, true)?;
        }
        pretrained.encode(&text)?
    };
    let vocab = pretrained.config.model.vocab_size;
    if let Some(bad) = prompt_ids.iter().find(|&&id| id < 0 || id >= vocab) {
        return Err(usage(format!("prompt token id {bad} is outside the model's vocabulary of {vocab}")));
    }
    let sampling =
        Sampling { max_new_tokens: args.max_new_tokens, temperature: args.temperature, top_k: args.top_k, top_p: args.top_p, seed: args.seed };
    let eos = pretrained.eos.clone();
    let done = generate(pretrained.model.as_mut(), &prompt_ids, &eos, &sampling, device)?;
    let text = pretrained.decode(&done.ids);
    let mut out = std::io::stdout().lock();
    let printed = if args.json {
        let json = serde_json::json!({
            "prompt_ids": prompt_ids, "ids": done.ids, "text": text, "stopped_at_eos": done.stopped_at_eos,
            "prefill_s": done.prefill_s, "decode_s": done.decode_s, "tokens_per_s": done.tokens_per_s(),
        });
        writeln!(out, "{json}")
    } else {
        writeln!(out, "{text}")
    };
    // A closed pipe (`| head`) is not an error of generation.
    if let Err(e) = printed.and_then(|_| out.flush()) {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            return Err(e.into());
        }
    }
    let why = if done.stopped_at_eos { "end of sequence" } else { "--max-new-tokens" };
    eprintln!(
        "{} new tokens ({why}) in {:.3} s: {:.1} tokens/s after a prefill of {} tokens in {:.3} s",
        done.ids.len(),
        done.prefill_s + done.decode_s,
        done.tokens_per_s(),
        done.prompt_tokens,
        done.prefill_s
    );
    Ok(ExitCode::SUCCESS)
}
