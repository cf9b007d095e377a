//! `ptrain export --format peft`: a LoRA checkpoint's adapters as the directory
//! `peft.PeftModel.from_pretrained(base, OUT)` loads: `adapter_config.json` and
//! `adapter_model.safetensors`, the tensors named as `peft` saves them
//! (`base_model.model.<module>.lora_A.weight`). ptrain's parameter names are the
//! Hugging Face module paths for both kinds, so an export is a rename (a mixture's
//! stacked experts' adapters renamed as peft nests them: `lora::experts::to_peft`).

use std::path::Path;

use safetensors::tensor::TensorView;
use serde_json::json;

use super::export::{copy_tokenizer, recorded_config, resolve_checkpoint, tokenizer_readable, write_safetensors, Exported};
use crate::{
    error::{Error, Result},
    model::{
        family,
        lora::{experts, ADAPTER},
    },
};

pub const ADAPTER_CONFIG: &str = "adapter_config.json";
pub const ADAPTER_WEIGHTS: &str = "adapter_model.safetensors";

/// Writes `out/adapter_config.json` and `out/adapter_model.safetensors` from the
/// LoRA checkpoint at (or newest under) `path`, and with `with_tokenizer` the run's
/// tokenizer files beside them (as TRL's `save_model` does, so the directory is a
/// complete chat model with its base); a checkpoint of a run without `[lora]` is
/// refused ([`Error::Checkpoint`]: exit 2). `base`: the base model moved there from
/// `model.init_from` (`--base`; checked against the run's recorded hash), written as
/// `base_model_name_or_path`.
pub fn export_peft(path: &Path, out: &Path, with_tokenizer: bool, base: Option<&Path>) -> Result<Exported> {
    let checkpoint = resolve_checkpoint(path)?;
    let bad = |message: String| Error::Checkpoint { path: checkpoint.clone(), message };
    let (manifest, saved) = ptrain_checkpoint::read_model(&checkpoint).map_err(|e| bad(e.to_string()))?;
    let mut config = recorded_config(&checkpoint)?;
    let Some(lora) = config.lora().cloned() else {
        return Err(bad("--format peft exports LoRA adapters, and this run trained none ([lora]): export it with --format hf".into()));
    };
    match base {
        Some(base) => {
            // Absolute: peft and `ptrain generate` read the export from other folders.
            let base = std::path::absolute(base).map_err(|e| Error::Io { path: base.to_owned(), source: e })?;
            config.model.init_from = base.display().to_string();
            let vs = tch::nn::VarStore::new(tch::Device::Cpu);
            let _model = crate::model::build(&config, &vs, &crate::model::pretrained::NoData)?;
            crate::model::adapters::check_base(&vs, &checkpoint, &base)?;
        }
        None if !config.model.init_from.is_empty() && !Path::new(&config.model.init_from).join(super::CONFIG_JSON).is_file() => tracing::warn!(
            "the run's base model {} (model.init_from) is no longer there: {} names it as base_model_name_or_path, which peft \
             and `ptrain generate` cannot load; export with --base DIR naming where the base model is now",
            config.model.init_from,
            out.join(ADAPTER_CONFIG).display()
        ),
        None => {}
    }
    if with_tokenizer {
        tokenizer_readable(&config)?;
    }
    let mut views = Vec::with_capacity(saved.len());
    let both_experts = experts::adapts_both(saved.keys().map(String::as_str));
    for (name, t) in &saved {
        if !name.contains(ADAPTER) {
            return Err(bad(format!("tensor `{name}` is not a LoRA adapter's")));
        }
        let shape = t.shape.iter().map(|&d| d as usize).collect();
        let view = TensorView::new(ptrain_checkpoint::dtype::to_safetensors(t.dtype), shape, &t.data).map_err(|e| bad(e.to_string()))?;
        views.push((format!("base_model.model.{}", experts::to_peft(name, both_experts)), view));
    }
    std::fs::create_dir_all(out).map_err(|e| Error::Io { path: out.to_owned(), source: e })?;
    let tensors = views.len();
    write_safetensors(views, &out.join(ADAPTER_WEIGHTS))?;
    let tokenizer_files = if with_tokenizer { copy_tokenizer(&config, out)? } else { Vec::new() };

    // GPT-2's Conv1D stores weights [in, out]: peft's fan_in_fan_out says so when merging.
    let family = family::of(config.model.kind);
    // Weights peft adapts as parameters (a mixture's router and experts) are its
    // target_parameters, under peft's names for them.
    let (parameters, modules): (Vec<String>, Vec<String>) =
        lora.targets(family.lora_modules).into_iter().partition(|t| family.lora_parameters.iter().any(|p| p.0 == t));
    let parameters: Vec<&str> = family.lora_parameters.iter().filter(|p| parameters.iter().any(|t| t == p.0)).map(|p| p.1).collect();
    let adapter_config = json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": config.model.init_from,
        "inference_mode": true,
        "r": lora.rank,
        "lora_alpha": lora.alpha,
        "lora_dropout": lora.dropout,
        "target_modules": modules,
        "target_parameters": (!parameters.is_empty()).then_some(parameters),
        "fan_in_fan_out": family.hf.as_ref().is_some_and(|hf| hf.conv1d),
        "bias": "none",
        "use_rslora": false,
        "use_dora": false,
        "init_lora_weights": true,
        "modules_to_save": null,
        "layers_to_transform": null,
        "layers_pattern": null,
        "rank_pattern": {},
        "alpha_pattern": {},
    });
    let config_out = out.join(ADAPTER_CONFIG);
    let text = serde_json::to_string_pretty(&adapter_config).expect("JSON serializes") + "\n";
    std::fs::write(&config_out, text).map_err(|e| Error::Io { path: config_out, source: e })?;
    Ok(Exported { checkpoint: checkpoint.clone(), step: manifest.step, out: out.to_owned(), tensors, tokenizer_files })
}
