//! The model families, each declared once by a [`FamilySpec`] (in its own file, beside
//! its blocks) and registered here, in [`FAMILIES`]: as torchtitan's `TrainSpec`, the
//! one description every part of ptrain asks about a `model.kind`. The builder
//! ([`super::from_config`]), parameter sharding (it cuts a model built block by block),
//! LoRA (the modules it adapts), the Hugging Face loader and exporter (the `model_type`s,
//! the `config.json` mapping both ways and the parameter table), `generate` (a key/value
//! cache) and the configuration's shape checks ([`check`]) read it; the flops plugin
//! reads the layers a decoder derives from its family's [`Layout`](super::layout::Layout).
//!
//! The configuration cannot import `model` (see `crate::resolve`): what it must know of
//! a kind is `ModelKind::has_blocks`, which a test here checks against the descriptors.

use std::sync::Arc;

use serde_json::{Map, Value};
use tch::nn;

use super::{gemma, gpt, hf::arch::HfConfig, hf::names::Param, llama, lora::Targets, mlp, moe, torchscript, Model};
use crate::{
    config::{or_list, Config, ModelConfig, ModelKind},
    data::Dataset,
    error::{ConfigError, Error, Result},
};

/// Every family, registered once.
pub const FAMILIES: &[&FamilySpec] = &[&gpt::SPEC, &llama::SPEC, &gemma::SPEC, &moe::SPEC, &mlp::SPEC, &torchscript::SPEC];

/// What a family is, for everything outside it.
pub struct FamilySpec {
    /// `model.kind`.
    pub kind: ModelKind,
    pub build: Build,
    /// `generate` decodes it with a key/value cache ([`Model::new_cache`]).
    pub kv_cache: bool,
    /// The linear layers LoRA adapts by default and may target (the last part of
    /// their names); empty: LoRA does not apply.
    pub lora_modules: &'static [&'static str],
    /// Weights LoRA adapts only when `lora.targets` names them, which `peft` reaches as
    /// parameters (`LoraConfig(target_parameters=[...])`, no dropout): ptrain's target name
    /// and peft's `target_parameters` entry.
    pub lora_parameters: &'static [(&'static str, &'static str)],
    /// A configured shape it cannot build: the key and why.
    pub check: fn(&ModelConfig) -> Option<(&'static str, String)>,
    /// Its Hugging Face counterpart (`model.init_from`, `ptrain export`), if any.
    pub hf: Option<HfSpec>,
}

impl FamilySpec {
    /// A family of another kind than a decoder (`mlp`, `torchscript`): no blocks, no
    /// key/value cache, no Hugging Face counterpart, nothing LoRA adapts, every shape
    /// buildable.
    pub const fn without_blocks(kind: ModelKind, build: BuildOther) -> FamilySpec {
        FamilySpec { kind, build: Build::Other(build), kv_cache: false, lora_modules: &[], lora_parameters: &[], check: |_| None, hf: None }
    }
}

/// How a family's model is built.
pub enum Build {
    /// A decoder-only language model of repeated blocks (`super::decoder::Decoder`):
    /// activation checkpointing, parameter sharding (built block by block), the chunked
    /// loss's hidden states, packed rows and instruction data.
    Decoder(BuildDecoder),
    /// Any other model (no blocks).
    Other(BuildOther),
}

/// Builds the configured decoder under `vs` with the adapters `targets` names, calling
/// `after_block(i)` once block `i`'s variables exist; `model.init_from`'s weights are
/// left to the caller.
pub type BuildDecoder = fn(vs: &nn::Path, config: &Config, targets: Targets, after_block: &mut dyn FnMut(usize)) -> Result<Box<dyn Model>>;

/// Builds the configured model under `vs` (the data gives what the configuration leaves out).
pub type BuildOther = fn(config: &Config, vs: &nn::Path, dataset: &dyn Dataset) -> Result<Box<dyn Model>>;

/// Reads a `config.json` of one of a family's `model_type`s (the second argument);
/// what it cannot compute is an error naming the key.
pub type ReadConfig = fn(&Map<String, Value>, &str) -> std::result::Result<Arc<dyn HfConfig>, String>;

/// The `config.json` of an export of the configured model, over `base` (the `init_from`
/// one, whose keys ptrain does not model it keeps).
pub type WriteConfig = fn(&ModelConfig, Option<&Map<String, Value>>) -> std::result::Result<Map<String, Value>, String>;

/// A family's Hugging Face mapping.
pub struct HfSpec {
    /// `(model_type, architecture class)` of the checkpoints it reads and writes.
    pub model_types: &'static [(&'static str, &'static str)],
    pub read: ReadConfig,
    pub write: WriteConfig,
    /// Every parameter under its Hugging Face name, in a fixed order.
    pub params: fn(&ModelConfig) -> Vec<Param>,
    /// A file's tensor name in ptrain's terms (files of the bare model lack a prefix).
    pub canonical: fn(&str) -> String,
    /// Tensors a file may hold that are not parameters of the configured model.
    pub known_extra: fn(&ModelConfig, &str) -> bool,
    /// Parameters of the Hugging Face model the configured one lacks, exported as zeros.
    pub absent_as_zeros: fn(&ModelConfig, &str) -> bool,
    /// Its block linear weights are stored `[in, out]` (GPT-2's `Conv1D`): transposed
    /// on the way in and out, and peft's `fan_in_fan_out`.
    pub conv1d: bool,
}

impl FamilySpec {
    /// Built of repeated blocks ([`Build::Decoder`]).
    pub fn blocks(&self) -> bool {
        matches!(self.build, Build::Decoder(_))
    }
}

impl std::fmt::Debug for FamilySpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FamilySpec({:?})", self.kind)
    }
}

/// The family of `kind`.
pub fn of(kind: ModelKind) -> &'static FamilySpec {
    FAMILIES.iter().copied().find(|f| f.kind == kind).unwrap_or_else(|| panic!("model.kind {kind:?} is not registered in model::family"))
}

/// The family that reads `model_type`, with its architecture class.
pub fn by_model_type(model_type: &str) -> Option<(&'static FamilySpec, &'static str)> {
    FAMILIES.iter().find_map(|f| f.hf.as_ref()?.model_types.iter().find(|(t, _)| *t == model_type).map(|(_, class)| (*f, *class)))
}

/// Every `model_type` ptrain reads, as a message lists them, `conjunction` before the
/// last: `gpt2, llama and qwen2`.
pub fn model_types(conjunction: &str) -> String {
    let all: Vec<&str> = FAMILIES.iter().filter_map(|f| f.hf.as_ref()).flat_map(|h| h.model_types.iter().map(|(t, _)| *t)).collect();
    match all.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} {conjunction} {last}", rest.join(", ")),
        _ => all.join(""),
    }
}

/// The kinds for which `which` holds, each through `spell`, as a message lists them.
pub fn kinds(which: impl Fn(&FamilySpec) -> bool, spell: impl Fn(&str) -> String) -> String {
    or_list(FAMILIES.iter().filter(|f| which(f)).map(|f| spell(&f.kind.name())))
}

/// The configured model's checks that its family decides: its shape, and the modules
/// `[lora]` targets. Errors are named by the file or `--set` that set the key.
pub fn check(config: &Config) -> Result<()> {
    let family = of(config.model.kind);
    let bad = |key: String, message: String| -> Error {
        // `lora.targets[1]` was set as `lora.targets`.
        let set = key.split('[').next().unwrap_or_default().to_string();
        let located = config.origins.locate(ConfigError { origin: "configuration".into(), key: set, message });
        ConfigError { key, ..located }.into()
    };
    if let Some((key, message)) = (family.check)(&config.model) {
        return Err(bad(key.into(), message));
    }
    let Some(lora) = config.lora() else { return Ok(()) };
    let (kind, own) = (config.model.kind, family.lora_modules);
    if own.is_empty() {
        let kinds = kinds(|f| !f.lora_modules.is_empty(), |k| format!("\"{k}\""));
        return Err(bad("lora".into(), format!("model.kind = {kind:?} has no linear layers LoRA adapts: use {kinds}")));
    }
    let parameters: Vec<&str> = family.lora_parameters.iter().map(|p| p.0).collect();
    for (i, target) in lora.targets.iter().enumerate() {
        if parameters.contains(&target.as_str()) && lora.dropout > 0.0 {
            // peft's ParamWrapper refuses dropout: its adapter is folded into the weight.
            let message = format!("{} with lora.targets naming `{target}`: peft adapts it as a parameter, without dropout", lora.dropout);
            return Err(bad("lora.dropout".into(), message));
        }
        if own.contains(&target.as_str()) || parameters.contains(&target.as_str()) {
            continue;
        }
        let own: Vec<&str> = own.iter().chain(&parameters).copied().collect();
        let every: Vec<&str> = FAMILIES.iter().flat_map(|f| f.lora_modules.iter().copied().chain(f.lora_parameters.iter().map(|p| p.0))).collect();
        let message = match every.contains(&target.as_str()) {
            true => format!("model.kind = {kind:?} has no module `{target}`; its linear layers: {}", own.join(", ")),
            false => match ptrain_plugin_api::unknown_key::closest(target, every.iter().copied()) {
                Some(near) => format!("unknown module `{target}`: did you mean `{near}`? (model.kind = {kind:?} has {})", own.join(", ")),
                None => format!("unknown module `{target}` (model.kind = {kind:?} has {})", own.join(", ")),
            },
        };
        return Err(bad(format!("lora.targets[{i}]"), message));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_registered_once_and_declares_what_the_configuration_assumes() {
        for kind in ModelKind::ALL {
            assert_eq!(FAMILIES.iter().filter(|f| f.kind == *kind).count(), 1, "{kind:?}");
            let family = of(*kind);
            assert_eq!(family.blocks(), kind.has_blocks(), "{kind:?}: ModelKind::has_blocks and the descriptor agree");
            assert_eq!(family.kv_cache, family.blocks(), "{kind:?}: the decoders decode with a cache");
            assert_eq!(family.hf.is_some(), family.blocks(), "{kind:?}: the decoders start from Hugging Face checkpoints");
        }
        assert_eq!(FAMILIES.len(), ModelKind::ALL.len());
        let mut types: Vec<&str> = FAMILIES.iter().filter_map(|f| f.hf.as_ref()).flat_map(|h| h.model_types.iter().map(|t| t.0)).collect();
        let n = types.len();
        types.sort();
        types.dedup();
        assert_eq!(types.len(), n, "a model_type is read by one family");
    }

    #[test]
    fn lists_read_as_sentences() {
        assert_eq!(model_types("and"), "gpt2, llama, qwen2, qwen3, mistral, gemma2, gemma3_text, qwen3_moe, qwen2_moe and mixtral");
        assert_eq!(kinds(|f| f.blocks(), |k| format!("a {k}")), "a gpt, a llama, a gemma or a moe");
        assert_eq!(by_model_type("qwen3").map(|(f, class)| (f.kind, class)), Some((ModelKind::Llama, "Qwen3ForCausalLM")));
        assert!(by_model_type("gemma").is_none());
    }
}
