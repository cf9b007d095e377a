//! LoRA adapters outside a run: a `peft` adapter directory read back (the form
//! `ptrain export --format peft` and `PeftModel.save_pretrained` write), and a LoRA
//! checkpoint's base found somewhere else than where it was trained (`--base DIR`),
//! accepted only when its weights hash to what the checkpoint recorded, the check a
//! resumed run makes too ([`same_base`]).

use std::path::{Path, PathBuf};

use serde_json::Value;
use tch::{nn, Tensor};

use super::hf::{ADAPTER_CONFIG, ADAPTER_WEIGHTS, CONFIG_JSON};
use crate::{
    config::LoraConfig,
    error::{Error, Result},
};

/// The `[lora]` and `model.init_from` settings of a `peft` adapter directory, as
/// `--set` assignments: the base from `base` or `adapter_config.json`'s
/// `base_model_name_or_path`.
pub fn peft_settings(dir: &Path, base: Option<&Path>) -> Result<(Vec<String>, PathBuf)> {
    let (lora, base) = peft_lora(dir, base)?;
    let quoted: Vec<String> = lora.targets.iter().map(|t| format!("{t:?}")).collect();
    let sets = vec![
        format!("model.init_from={:?}", base.display().to_string()),
        format!("lora.rank={}", lora.rank),
        format!("lora.alpha={:?}", lora.alpha),
        format!("lora.targets=[{}]", quoted.join(", ")),
    ];
    Ok((sets, base))
}

/// The adapters' shape (rank, alpha, targets) of a `peft` adapter directory, and its
/// base: `base`, or `adapter_config.json`'s `base_model_name_or_path`, which must be a
/// directory with `config.json`.
pub fn peft_lora(dir: &Path, base: Option<&Path>) -> Result<(LoraConfig, PathBuf)> {
    let path = dir.join(ADAPTER_CONFIG);
    let bad = |message: String| Error::Checkpoint { path: path.clone(), message };
    let text = std::fs::read_to_string(&path).map_err(|e| Error::Io { path: path.clone(), source: e })?;
    let json: Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let peft_type = json.get("peft_type").and_then(Value::as_str).unwrap_or("");
    if peft_type != "LORA" {
        return Err(bad(format!("peft_type {peft_type:?}: only LoRA adapters (\"LORA\") are read")));
    }
    for key in ["use_dora", "use_rslora"] {
        if json.get(key).and_then(Value::as_bool) == Some(true) {
            return Err(bad(format!("{key} = true: ptrain's LoRA is plain LoRA (alpha / r scaling, no DoRA)")));
        }
    }
    let base = match base {
        Some(b) => b.to_owned(),
        None => PathBuf::from(json.get("base_model_name_or_path").and_then(Value::as_str).unwrap_or_default()),
    };
    if !base.join(CONFIG_JSON).is_file() {
        return Err(bad(format!(
            "its base model `{}` (base_model_name_or_path) is not a directory with config.json here: pass --base DIR",
            base.display()
        )));
    }
    let rank = json.get("r").and_then(Value::as_i64).ok_or_else(|| bad("no integer `r` (the adapters' rank)".into()))?;
    let alpha = json.get("lora_alpha").and_then(Value::as_f64).ok_or_else(|| bad("no number `lora_alpha`".into()))?;
    // peft writes target_modules as a list, or as one regular expression string.
    let mut targets: Vec<String> = match json.get("target_modules") {
        Some(Value::Array(names)) => names.iter().filter_map(Value::as_str).map(str::to_owned).collect(),
        Some(Value::String(one)) if one.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') => vec![one.clone()],
        None | Some(Value::Null) if json.get("target_parameters").is_some_and(Value::is_array) => Vec::new(),
        other => return Err(bad(format!("target_modules {other:?}: a list of module names is needed"))),
    };
    targets.extend(target_parameters(&json).map_err(bad)?);
    Ok((LoraConfig { rank, alpha, targets, ..LoraConfig::default() }, base))
}

/// `adapter_config.json`'s `target_parameters` (a mixture's router and stacked
/// experts) as `lora.targets` names them (the families' `lora_parameters`).
fn target_parameters(json: &Value) -> std::result::Result<Vec<String>, String> {
    let Some(Value::Array(names)) = json.get("target_parameters") else { return Ok(Vec::new()) };
    let known = || super::family::FAMILIES.iter().flat_map(|f| f.lora_parameters.iter());
    let mut targets = Vec::with_capacity(names.len());
    for name in names {
        let name = name.as_str().unwrap_or_default();
        match known().find(|p| p.1 == name || name.ends_with(&format!(".{}", p.1))) {
            Some((ours, _)) => targets.push(ours.to_string()),
            None => {
                let all: Vec<&str> = known().map(|p| p.1).collect();
                return Err(format!("target_parameters holds {name:?}: ptrain adapts the parameters {}", all.join(", ")));
            }
        }
    }
    Ok(targets)
}

/// Copies a `peft` directory's `adapter_model.safetensors` into the adapters of `vs`
/// (peft's names are ptrain's with `base_model.model.` before them). Every adapter
/// must be there, and nothing else.
pub fn load_peft_weights(vs: &nn::VarStore, dir: &Path) -> Result<()> {
    let path = dir.join(ADAPTER_WEIGHTS);
    let bad = |message: String| Error::Checkpoint { path: path.clone(), message };
    let saved = Tensor::read_safetensors(&path).map_err(|e| bad(e.to_string()))?;
    let mut vars = vs.variables();
    let wanted = vars.iter().filter(|(_, v)| v.requires_grad()).count();
    if saved.len() != wanted {
        return Err(bad(format!("{} tensors, and the model with these adapters has {wanted}", saved.len())));
    }
    // peft's names of ours: a mixture's stacked experts' adapters are nested in peft.
    let both = super::lora::experts::adapts_both(vars.keys().map(String::as_str));
    let ours_of: std::collections::HashMap<String, String> =
        vars.keys().filter(|n| n.contains(super::lora::ADAPTER)).map(|n| (super::lora::experts::to_peft(n, both), n.clone())).collect();
    tch::no_grad(|| -> Result<()> {
        for (name, t) in saved {
            let peft = name.strip_prefix("base_model.model.").unwrap_or(&name);
            let ours = ours_of.get(peft).map_or(peft, String::as_str);
            let var = vars.get_mut(ours).filter(|v| v.requires_grad()).ok_or_else(|| bad(format!("`{name}` is no adapter of this model")))?;
            if t.size() != var.size() {
                return Err(bad(format!("`{name}` has shape {:?}, the model {:?}", t.size(), var.size())));
            }
            var.f_copy_(&t.f_to_kind(var.kind())?)?;
        }
        Ok(())
    })
}

/// Refuses base weights other than those a LoRA checkpoint's adapters were trained
/// on: `vs`'s base hashed as the run hashed it ([`same_base`]).
pub fn check_base(vs: &nn::VarStore, checkpoint: &Path, base: &Path) -> Result<()> {
    let state_path = checkpoint.join(ptrain_checkpoint::STATE_FILE);
    let text = std::fs::read_to_string(&state_path).map_err(|e| Error::Io { path: state_path.clone(), source: e })?;
    let state: Value = serde_json::from_str(&text).map_err(|e| Error::Checkpoint { path: checkpoint.to_owned(), message: e.to_string() })?;
    same_base(checkpoint, &state, base, Some(&super::lora::base_digest(vs)?))
}

/// Where a LoRA checkpoint records its base: the digest, or (written before the
/// digest) one SHA-256 over the whole base, which cannot be compared with a digest.
enum RecordedBase<'a> {
    None,
    Digest(&'a str),
    Earlier,
}

/// A LoRA checkpoint's adapters fit only the base they were trained on: `live`
/// (the base model `base`'s weights digested, `None` without LoRA) against the
/// checkpoint `state`'s `lora_base_digest` (none for a full fine-tuning one).
pub fn same_base(checkpoint: &Path, state: &Value, base: &Path, live: Option<&str>) -> Result<()> {
    let bad = |message: String| Error::Checkpoint { path: checkpoint.to_owned(), message };
    let recorded = match (state.get("lora_base_digest").and_then(Value::as_str), state.get("lora_base_sha256")) {
        (Some(digest), _) => RecordedBase::Digest(digest),
        (None, Some(_)) => RecordedBase::Earlier,
        (None, None) => RecordedBase::None,
    };
    match (recorded, live) {
        (RecordedBase::None, None) => Ok(()),
        (RecordedBase::Digest(recorded), Some(live)) if recorded == live => Ok(()),
        (RecordedBase::Earlier, Some(_)) => {
            tracing::warn!(
                "{}: its LoRA base was hashed as ptrain did before it took a digest per tensor (lora_base_sha256): \
                 the base model {} is not checked against it; make sure it is the one the adapters were trained on",
                checkpoint.display(),
                base.display()
            );
            Ok(())
        }
        (RecordedBase::Digest(recorded), Some(live)) => Err(bad(format!(
            "the base model {}: its weights (digest {live}) are not the base these adapters were trained on (digest {recorded}); \
             give the base model they were trained on",
            base.display()
        ))),
        (RecordedBase::Digest(_) | RecordedBase::Earlier, None) => {
            Err(bad("it holds LoRA adapters only: resume with its [lora] table and base model".into()))
        }
        (RecordedBase::None, Some(_)) => {
            Err(bad("it records no LoRA base (a full fine-tuning checkpoint): [lora] and --base are for LoRA checkpoints".into()))
        }
    }
}
