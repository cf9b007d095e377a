//! `model.init_from` naming what another run made rather than a Hugging Face model: a
//! ptrain run (or checkpoint) directory, or a `peft` adapter directory (what `ptrain
//! export --format peft` and `PeftModel.save_pretrained` write). DPO from an SFT run is
//! the use: TRL users pass the SFT trainer's output directory. Before the configuration
//! is resolved, such a source becomes what the rest of ptrain reads, a Hugging Face
//! directory and `[lora]`:
//! - a full fine-tuning run: its newest valid checkpoint exported as a Hugging Face
//!   directory into this run's directory (`init_from/`), which `model.init_from` then names;
//! - LoRA adapters (a LoRA run, a peft directory), as `model.init_adapters` says:
//!   `merge` writes base + adapters merged there the same way (`W + alpha / r * B A`, as
//!   `ptrain export --merge` and peft's `merge_and_unload`); `continue` names the base as
//!   `model.init_from`, takes the adapters' shape into `[lora]` and starts this run's
//!   adapters from them (`lora.init_from`). A LoRA run's base is checked against the
//!   digest its checkpoint recorded.
//!
//! The directory written stays: the run records it as its `model.init_from`, so a resumed
//! run, an export and `generate` find what it started from; `source.json` there says
//! where it came from.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use serde_json::{json, Value};

use super::{adapters, hf, lora, pretrained::Pretrained};
use crate::{
    config::{Config, InitAdapters, LoraConfig, ShardMode, TOKENIZER_FILES},
    error::{ConfigError, Error, Result},
    model::family,
};

/// Where in the new run's directory the starting weights are written.
pub const INIT_DIR: &str = "init_from";
const SOURCE_FILE: &str = "source.json";

/// What `model.init_from` names, when it is not a Hugging Face model.
enum Source {
    /// A ptrain run or checkpoint directory: the checkpoint found there.
    Run(PathBuf),
    /// A `peft` adapter directory.
    Peft,
}

/// The error for `key`, named with the layer that set `model.init_from`.
fn bad(explicit: &BTreeMap<String, String>, key: &str, message: String) -> Error {
    let origin = explicit.get(key).or_else(|| explicit.get("model.init_from")).cloned().unwrap_or_else(|| "configuration".into());
    ConfigError { origin, key: key.into(), message }.into()
}

fn source_of(path: &Path) -> Option<Source> {
    if !path.is_dir() || path.join(hf::CONFIG_JSON).is_file() {
        return None;
    }
    if path.join(hf::ADAPTER_CONFIG).is_file() {
        return Some(Source::Peft);
    }
    let (found, warnings) = ptrain_checkpoint::resolve(path);
    for w in warnings {
        tracing::warn!("{w}");
    }
    found.map(Source::Run)
}

/// Turns a `model.init_from` naming a ptrain run or a peft directory into a Hugging
/// Face directory (and `[lora]`), as the module's documentation says; anything else
/// is left to [`hf::HfDir::open`]. `explicit`: the keys a layer set, and where.
pub fn materialize(config: &mut Config, explicit: &BTreeMap<String, String>) -> Result<()> {
    let spec = config.model.init_from.clone();
    if let Some(source) = (!spec.is_empty()).then(|| source_of(Path::new(&spec))).flatten() {
        let path = std::path::absolute(&spec).map_err(|e| Error::Io { path: spec.clone().into(), source: e })?;
        match source {
            Source::Run(checkpoint) => from_run(config, &path, &checkpoint, explicit)?,
            Source::Peft => from_peft(config, &path, explicit)?,
        }
    }
    let adapters_given = config.lora().is_some_and(|l| !l.init_from.is_empty());
    if adapters_given && config.dist.shard == ShardMode::Parameters {
        let message = "adapters to start from are not read under dist.shard = \"parameters\" yet: start from them merged \
                       (model.init_adapters = \"merge\"), or shard the optimizer only (dist.shard = \"gradients\")";
        return Err(bad(explicit, "lora.init_from", message.into()));
    }
    Ok(())
}

/// The unset `model.init_adapters` for a source holding adapters: say what to choose.
fn choose(explicit: &BTreeMap<String, String>, what: &str) -> Error {
    let message = format!(
        "is not set, and model.init_from names {what}: set \"merge\" (start from the adapters merged into their base: a full \
         model, which DPO's reference is then too) or \"continue\" (train the adapters on, over their base)"
    );
    bad(explicit, "model.init_adapters", message)
}

/// The new run's `init_from/`: where a run source's weights are written.
fn init_dir(config: &Config, explicit: &BTreeMap<String, String>, source: &Path) -> Result<PathBuf> {
    if config.run.run_dir.is_empty() {
        let message = format!(
            "names the ptrain run {}: its weights are written into this run's directory ({INIT_DIR}/), so name it: set \
             run.run_dir (--run-dir)",
            source.display()
        );
        return Err(bad(explicit, "model.init_from", message));
    }
    let dir = Path::new(&config.run.run_dir).join(INIT_DIR);
    std::path::absolute(&dir).map_err(|e| Error::Io { path: dir, source: e })
}

fn from_run(config: &mut Config, source: &Path, checkpoint: &Path, explicit: &BTreeMap<String, String>) -> Result<()> {
    let recorded = hf::recorded_config(checkpoint)?;
    let mode = config.model.init_adapters;
    let record = |mode: &str| json!({ "source": source, "checkpoint": std::path::absolute(checkpoint).unwrap_or_default(), "init_adapters": mode });
    let Some(trained) = recorded.lora().cloned() else {
        if mode == InitAdapters::Continue {
            let message = format!("is \"continue\", and {} trained every weight (no [lora]): leave it unset", source.display());
            return Err(bad(explicit, "model.init_adapters", message));
        }
        let out = init_dir(config, explicit, source)?;
        write_once(&out, &record("none"), |tmp| hf::export(checkpoint, tmp, true, false, None).map(drop))?;
        config.model.init_from = out.display().to_string();
        return Ok(());
    };
    if mode == InitAdapters::Unset {
        return Err(choose(explicit, &format!("the LoRA run {}", source.display())));
    }
    let base = recorded_base(&recorded, checkpoint, explicit)?;
    match mode {
        InitAdapters::Unset => unreachable!("refused above"),
        InitAdapters::Merge => {
            let out = init_dir(config, explicit, source)?;
            write_once(&out, &record("merge"), |tmp| hf::export(checkpoint, tmp, true, true, Some(&base)).map(drop))?;
            config.model.init_from = out.display().to_string();
            Ok(())
        }
        InitAdapters::Continue => {
            let out = init_dir(config, explicit, source)?;
            write_once(&out, &record("continue"), |tmp| hf::export_peft(checkpoint, tmp, false, Some(&base)).map(drop))?;
            let targets = trained.targets(family::of(recorded.model.kind).lora_modules);
            take_lora(config, LoraConfig { targets, ..trained }, &out, explicit)?;
            config.model.init_from = base.display().to_string();
            Ok(())
        }
    }
}

/// The base a LoRA run recorded (`model.init_from`), which must still be there.
fn recorded_base(recorded: &Config, checkpoint: &Path, explicit: &BTreeMap<String, String>) -> Result<PathBuf> {
    let base = PathBuf::from(&recorded.model.init_from);
    if base.join(hf::CONFIG_JSON).is_file() {
        return std::path::absolute(&base).map_err(|e| Error::Io { path: base, source: e });
    }
    let message = format!(
        "names a LoRA run whose base model `{}` (its recorded model.init_from) is not there: export its adapters with \
         `ptrain export --format peft --checkpoint {} --out DIR --base WHERE_THE_BASE_IS_NOW` and start from DIR",
        base.display(),
        checkpoint.display()
    );
    Err(bad(explicit, "model.init_from", message))
}

fn from_peft(config: &mut Config, source: &Path, explicit: &BTreeMap<String, String>) -> Result<()> {
    let (trained, base) = adapters::peft_lora(source, None)?;
    let base = std::path::absolute(&base).map_err(|e| Error::Io { path: base.clone(), source: e })?;
    match config.model.init_adapters {
        InitAdapters::Unset => Err(choose(explicit, &format!("the peft adapter directory {}", source.display()))),
        InitAdapters::Continue => {
            take_lora(config, trained, source, explicit)?;
            config.model.init_from = base.display().to_string();
            Ok(())
        }
        InitAdapters::Merge => {
            let out = init_dir(config, explicit, source)?;
            let record = json!({ "source": source, "init_adapters": "merge" });
            write_once(&out, &record, |tmp| {
                let mut model = Pretrained::open(source, tch::Device::Cpu)?;
                let lora = model.config.lora().cloned().ok_or_else(|| Error::Other("a peft directory builds LoRA".into()))?;
                let saved = lora::merged_weights(&model.vars, &lora)?;
                let spec = family::of(model.config.model.kind).hf.as_ref().ok_or_else(|| Error::Other("no Hugging Face form".into()))?;
                hf::write_hf(&model.config, spec, saved, &source.join(hf::ADAPTER_WEIGHTS), tmp, false)?;
                // The tokenizer beside the adapters (a chat SFT's, with its template), else the base's.
                let from = model.tokenizer_dir.take().unwrap_or_else(|| base.clone());
                for name in TOKENIZER_FILES.iter().filter(|n| from.join(n).is_file()) {
                    std::fs::copy(from.join(name), tmp.join(name)).map_err(|e| Error::Io { path: from.join(name), source: e })?;
                }
                Ok(())
            })?;
            config.model.init_from = out.display().to_string();
            Ok(())
        }
    }
}

/// `[lora]` as the adapters `trained` were shaped, starting from those in `adapters` (a
/// peft directory). A shape key set to another value is refused: the adapters would not fit.
fn take_lora(config: &mut Config, trained: LoraConfig, adapters: &Path, explicit: &BTreeMap<String, String>) -> Result<()> {
    let mut lora = config.lora.clone().filter(|l| l.enabled).unwrap_or_else(|| LoraConfig { dropout: trained.dropout, ..LoraConfig::default() });
    let mine = lora.targets(family::of(config.model.kind).lora_modules);
    let differs = [
        ("lora.rank", lora.rank != trained.rank, trained.rank.to_string()),
        ("lora.alpha", lora.alpha != trained.alpha, trained.alpha.to_string()),
        ("lora.targets", mine != trained.targets, format!("{:?}", trained.targets)),
    ];
    if let Some((key, _, value)) = differs.iter().find(|(key, differ, _)| *differ && explicit.contains_key(*key)) {
        let message = format!("the adapters continued from {} have {value}: leave {key} out or set it so", adapters.display());
        return Err(bad(explicit, key, message));
    }
    lora.rank = trained.rank;
    lora.alpha = trained.alpha;
    lora.targets = trained.targets;
    lora.init_from = adapters.display().to_string();
    config.lora = Some(lora);
    Ok(())
}

/// Writes `out` by `write` (into a directory beside it, renamed into place: a
/// half-written one is never read, and ranks writing at once agree), unless it holds
/// what `record` says already. One holding another source is kept if a run started
/// from it (its `config.toml` is beside it: the run resumes from what it began with),
/// else written again.
fn write_once(out: &Path, record: &Value, write: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let kept: Option<Value> = std::fs::read_to_string(out.join(SOURCE_FILE)).ok().and_then(|t| serde_json::from_str(&t).ok());
    match kept {
        Some(kept) if &kept == record => {
            tracing::info!("model.init_from: {} (written before from {})", out.display(), record["source"]);
            return Ok(());
        }
        Some(kept) if out.with_file_name("config.toml").is_file() => {
            tracing::warn!("model.init_from: keeping {}, what this run started from ({}), not {}", out.display(), kept["source"], record["source"]);
            return Ok(());
        }
        _ => {}
    }
    let tmp = out.with_file_name(format!("{INIT_DIR}.partial-{}", std::process::id()));
    let io = |path: &Path, e: std::io::Error| Error::Io { path: path.to_owned(), source: e };
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| io(&tmp, e))?;
    let written = write(&tmp).and_then(|()| {
        let text = serde_json::to_string_pretty(record).expect("JSON serializes") + "\n";
        std::fs::write(tmp.join(SOURCE_FILE), text).map_err(|e| io(&tmp, e))
    });
    if let Err(e) = written {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    if out.is_dir() && !out.join(SOURCE_FILE).is_file() {
        // Not ours to replace (a directory the user made): say so rather than delete it.
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(Error::Data { path: out.to_owned(), message: "is in the way of the starting weights: move it".into() });
    }
    let _ = std::fs::remove_dir_all(out);
    match std::fs::rename(&tmp, out) {
        Ok(()) => {}
        // Another rank renamed the same weights into place first.
        Err(_) if out.join(SOURCE_FILE).is_file() => {
            let _ = std::fs::remove_dir_all(&tmp);
        }
        Err(e) => return Err(io(out, e)),
    }
    tracing::info!("model.init_from: {} written from {}", out.display(), record["source"]);
    Ok(())
}
