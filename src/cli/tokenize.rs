//! `ptrain tokenize`: fill the token cache without training, or show rows as the
//! model sees them.

use std::{io::IsTerminal, process::ExitCode};

use clap::Args;
use ptrain_core::data::{
    instruct::{self, InstructData},
    preference::{self, PreferenceData},
    text::show::{self, Marks},
    token_cache::Tokenizing,
};

use super::run::RunArgs;

/// Tokenize data.path (and data.val_path, and [[data.datasets]]) with data.tokenizer
/// into the token cache.
///
/// Instruction data (`data.kind = "chat"` or `"prompt_completion"`) is encoded
/// with its trained-token masks on every core, and each source's rows, tokens and
/// trained tokens are counted, with the rows cut or left out (and why). Preference
/// pairs (`data.kind = "preference"`) likewise: each file's pairs and their prompt,
/// chosen and rejected tokens, then the pairs cut or left out and the trained
/// (completion) tokens.
///
/// What `ptrain run` does first, without training, and with the same flags: a
/// later run with the same tokenizer and data reuses the cached ids. Useful before
/// a distributed run (every rank would otherwise tokenize), and to measure
/// tokenization speed. `--show N` prints the first N rows as the model sees them.
#[derive(Debug, Args)]
pub struct TokenizeArgs {
    #[command(flatten)]
    run: RunArgs,
    /// One JSON object per file on stdout instead of a sentence.
    #[arg(long)]
    json: bool,
    /// Print the first N rows of instruction data as the model sees them: the
    /// rendered text with the trained spans marked (green on a terminal, else
    /// between `[[` and `]]`), and each row's tokens and trained tokens. Encodes
    /// only those rows. For preference pairs, each pair's prompt + chosen and
    /// prompt + rejected, the completions marked.
    #[arg(long, value_name = "N")]
    show: Option<usize>,
}

pub fn run(args: TokenizeArgs) -> anyhow::Result<ExitCode> {
    let config = args.run.config()?;
    let pairs = config.data.kind == ptrain_core::config::DataKind::Preference;
    if let Some(n) = args.show {
        if !config.data.kind.is_instruction() {
            return Err(config_error("--show reads instruction data: data.kind = \"chat\", \"prompt_completion\" or \"preference\"").into());
        }
        return if pairs { show_pairs(&config, n) } else { show(&config, n) };
    }
    if pairs {
        return preference(&config, args.json);
    }
    if config.data.kind.is_instruction() {
        return instruction(&config, args.json);
    }
    if !config.tokenizes() {
        return Err(config_error(
            "ptrain tokenize needs data.tokenizer and data.kind = \"text\", \"jsonl\", \"chat\", \"prompt_completion\" or \"preference\"",
        )
        .into());
    }
    let tokenizing = Tokenizing::new(&config)?;
    // A validation file that is the training file is encoded (and reported) once.
    let val = Some(&config.data.val_path).filter(|v| !v.is_empty() && **v != config.data.path);
    for source in std::iter::once(&config.data.path).chain(val).filter(|s| !s.is_empty()) {
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

fn config_error(message: &str) -> ptrain_core::Error {
    ptrain_core::Error::from(ptrain_core::ConfigError { origin: "configuration".into(), key: "data.kind".into(), message: message.into() })
}

/// Instruction data: every source encoded with its trained-token masks into the
/// cache; what each holds, and what was cut or left out.
fn instruction(config: &ptrain_core::Config, json: bool) -> anyhow::Result<ExitCode> {
    let data = InstructData::from_config(config, ptrain_core::data::seq_len(config))?;
    let counts = &data.counts;
    for (name, meta, file, seconds) in data.files() {
        let rows = meta.rows + meta.untrained;
        let rate = seconds.map(|s| rows as f64 / s.max(1e-9));
        if json {
            outln!(
                "{}",
                serde_json::json!({
                    "source": name, "path": meta.source, "files": meta.files, "file": file, "rows": meta.rows, "tokens": meta.tokens,
                    "trained_tokens": meta.trained_tokens, "untrained": meta.untrained, "first_untrained": meta.first_untrained,
                    "reused": seconds.is_none(), "seconds": seconds, "rows_per_s": rate,
                    "tokens_per_s": seconds.map(|s| meta.tokens as f64 / s.max(1e-9)),
                })
            );
            continue;
        }
        let how = match (seconds, rate) {
            (Some(s), Some(r)) => format!("encoded in {s:.2}s ({r:.0} rows/s, {:.0} tokens/s)", meta.tokens as f64 / s.max(1e-9)),
            _ => "reused".into(),
        };
        outln!("{name} ({}): {} rows, {} tokens, {} trained; {how} -> {}", meta.source, meta.rows, meta.tokens, meta.trained_tokens, file.display());
        if let Some(first) = &meta.first_untrained {
            outln!("  {} rows have no trained token and are left out; the first: {first}", meta.untrained);
        }
    }
    if json {
        outln!("{}", serde_json::json!({ "counts": counts }));
        return Ok(ExitCode::SUCCESS);
    }
    outln!(
        "{} rows: {} truncated, {} dropped as too long, {} dropped with no trained token",
        counts.rows,
        counts.truncated,
        counts.dropped_too_long,
        counts.dropped_untrained
    );
    if counts.sources.len() > 1 {
        for c in &counts.sources {
            outln!(
                "  {}: {} rows kept, {} tokens, {} trained; weight {} by {:?}: {:.3} copies per epoch, {:.1}% of its trained tokens",
                c.name,
                c.kept,
                c.tokens,
                c.trained_tokens,
                c.weight,
                config.data.weight_by,
                c.copies,
                100.0 * c.epoch_trained_share
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `--show N`: the first rows, marked, with their counts; rows with nothing
/// trained named with the reason.
fn show(config: &ptrain_core::Config, n: usize) -> anyhow::Result<ExitCode> {
    let marks = marks();
    let limit = ptrain_core::data::seq_len(config) as usize + 1;
    for row in instruct::show::first_rows(config, n)? {
        let e = &row.shown.encoded;
        let trained = e.trained.iter().skip(1).filter(|&&t| t).count();
        outln!("--- {} {}: {} tokens, {} trained", row.place.file.display(), row.place.at, e.ids.len(), trained);
        outln!("{}", show::marked(&row.shown, marks));
        if let Some(why) = &e.untrained {
            outln!("!!! nothing is trained in this row (it is left out): {why}");
        }
        if e.ids.len() > limit {
            outln!(
                "!!! longer than data.max_seq_len + 1 = {limit} tokens: data.overflow = {:?} cuts it there or leaves it out",
                config.data.overflow
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Preference pairs: every file encoded into the cache; what each holds, then
/// the pairs cut or left out and the trained tokens.
fn preference(config: &ptrain_core::Config, json: bool) -> anyhow::Result<ExitCode> {
    let data = PreferenceData::from_config(config, ptrain_core::data::seq_len(config))?;
    for (name, file) in data.files() {
        let m = &file.meta;
        let rate = file.encoded.map(|s| m.pairs as f64 / s.max(1e-9));
        if json {
            outln!(
                "{}",
                serde_json::json!({
                    "source": name, "path": m.source, "files": m.files, "file": file.path, "pairs": m.pairs,
                    "prompt_tokens": m.prompt_tokens, "chosen_tokens": m.chosen_tokens, "rejected_tokens": m.rejected_tokens,
                    "reused": file.encoded.is_none(), "seconds": file.encoded, "pairs_per_s": rate,
                })
            );
            continue;
        }
        let how = match (file.encoded, rate) {
            (Some(s), Some(r)) => format!("encoded in {s:.2}s ({r:.0} pairs/s)"),
            _ => "reused".into(),
        };
        outln!(
            "{name} ({}): {} pairs; prompt {} tokens, chosen {}, rejected {}; {how} -> {}",
            m.source,
            m.pairs,
            m.prompt_tokens,
            m.chosen_tokens,
            m.rejected_tokens,
            file.path.display()
        );
    }
    let c = &data.counts;
    if json {
        outln!("{}", serde_json::json!({ "counts": c }));
        return Ok(ExitCode::SUCCESS);
    }
    let limit = ptrain_core::data::seq_len(config) as usize + 1;
    outln!("{}", c.sentence(limit, config.dpo.truncation_mode.name()));
    Ok(ExitCode::SUCCESS)
}

/// `--show N` for pairs: each pair's prompt + chosen and prompt + rejected, the
/// completions marked, with their counts; what truncation does to them.
fn show_pairs(config: &ptrain_core::Config, n: usize) -> anyhow::Result<ExitCode> {
    let marks = marks();
    let limit = ptrain_core::data::seq_len(config) as usize + 1;
    let (mode, keep_start) = (config.dpo.truncation_mode.name(), config.dpo.truncation_mode == ptrain_core::config::TruncationMode::KeepStart);
    for row in preference::show::first_pairs(config, n)? {
        let ([chosen, rejected], ids) = &row.shown;
        let p = ids.prompt.len();
        outln!("--- {} {}: prompt {p} tokens, chosen {}, rejected {}", row.place.file.display(), row.place.at, ids.chosen.len(), ids.rejected.len());
        for (what, shown) in [("chosen", chosen), ("rejected", rejected)] {
            outln!("{what}:");
            outln!("{}", show::marked(shown, marks));
        }
        if keep_start && p >= limit {
            outln!("!!! the prompt alone fills data.max_seq_len + 1 = {limit} tokens: the pair is left out (dpo.truncation_mode = \"{mode}\")");
        } else if p + ids.chosen.len().max(ids.rejected.len()) > limit {
            outln!("!!! longer than data.max_seq_len + 1 = {limit} tokens: dpo.truncation_mode = \"{mode}\" cuts it there");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Colour on a terminal, else brackets (said first).
fn marks() -> Marks {
    let marks = if std::io::stdout().is_terminal() { Marks::Colour } else { Marks::Brackets };
    if marks == Marks::Brackets {
        outln!("(trained text is between [[ and ]])");
    }
    marks
}
