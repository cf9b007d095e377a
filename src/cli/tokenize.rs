//! `ptrain tokenize`: fill the token cache without training.

use std::{path::PathBuf, process::ExitCode};

use clap::Args;
use ptrain_core::data::token_cache::Tokenizing;

/// Tokenize data.path (and data.val_path) with data.tokenizer into the token cache.
///
/// Instruction data (`data.kind = "chat"` or `"prompt_completion"`) is encoded
/// with its trained-token masks, and the rows cut or left out are counted.
///
/// What `ptrain run` does first, without training: a later run with the same
/// tokenizer and text reuses the cached ids. Useful before a distributed run (every
/// rank would otherwise tokenize), and to measure tokenization speed.
#[derive(Debug, Args)]
pub struct TokenizeArgs {
    /// TOML file layered over the default; repeat to layer several, in order (a later
    /// file's keys win).
    #[arg(short, long, value_name = "FILE")]
    config: Vec<PathBuf>,
    /// Override one key, e.g. `--set data.tokenizer=tok.json`.
    #[arg(short, long = "set", value_name = "SECTION.KEY=VALUE")]
    set: Vec<String>,
    /// One JSON object per file on stdout instead of a sentence.
    #[arg(long)]
    json: bool,
}

pub fn run(args: TokenizeArgs) -> anyhow::Result<ExitCode> {
    let config = ptrain_core::ConfigBuilder::layered(&args.config, &args.set)?.build()?;
    if config.data.kind.is_instruction() {
        return instruction(&config, args.json);
    }
    if !config.tokenizes() {
        return Err(ptrain_core::Error::from(ptrain_core::ConfigError {
            origin: "configuration".into(),
            key: "data.tokenizer".into(),
            message: "ptrain tokenize needs data.tokenizer and data.kind = \"text\", \"jsonl\", \"chat\" or \"prompt_completion\"".into(),
        })
        .into());
    }
    let tokenizing = Tokenizing::new(&config)?;
    let sources = [&config.data.path, &config.data.val_path];
    for source in sources.into_iter().filter(|s| !s.is_empty()) {
        let t = tokenizing.prepare(std::path::Path::new(source))?;
        let rate = t.tokens as f64 / t.seconds.max(1e-9);
        if args.json {
            let bytes = std::fs::metadata(&t.source).map(|m| m.len()).unwrap_or(0);
            let row = serde_json::json!({
                "source": t.source, "bytes": bytes, "file": t.file, "tokens": t.tokens, "dtype": format!("uint{}", t.width * 8),
                "reused": t.reused, "seconds": t.seconds, "tokens_per_s": if t.reused { None } else { Some(rate) },
            });
            outln!("{row}");
        } else if t.reused {
            outln!("{}: {} tokens, reused {}", t.source.display(), t.tokens, t.file.display());
        } else {
            outln!("{}: {} tokens in {:.2}s ({rate:.0} tokens/s) -> {}", t.source.display(), t.tokens, t.seconds, t.file.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Instruction data: every file encoded with its trained-token masks into the
/// cache, and what was cut or left out.
fn instruction(config: &ptrain_core::Config, json: bool) -> anyhow::Result<ExitCode> {
    let data = ptrain_core::data::instruct::InstructData::from_config(config, ptrain_core::data::seq_len(config))?;
    let counts = data.counts;
    for (name, file, rows) in data.files() {
        if json {
            outln!("{}", serde_json::json!({ "source": name, "file": file, "rows": rows }));
        } else {
            outln!("{name}: {rows} rows -> {}", file.display());
        }
    }
    if json {
        outln!("{}", serde_json::json!({ "counts": counts }));
    } else {
        outln!(
            "{} rows: {} truncated, {} dropped as too long, {} dropped with no trained token",
            counts.rows,
            counts.truncated,
            counts.dropped_too_long,
            counts.dropped_untrained
        );
    }
    Ok(ExitCode::SUCCESS)
}
