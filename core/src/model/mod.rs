//! Models. The public [`Model`] trait lets library users bring their own; the
//! families registered in [`family`] (`gpt`, `llama`, `mlp`, `torchscript`) are built
//! from the configuration. The language models are one [`Decoder`] each, driving
//! their family's blocks.

pub(crate) mod adapters;
mod attention;
pub mod base_digest;
mod checkpointing;
pub mod decoder;
mod entry;
pub mod family;
mod gemma;
pub mod generate;
mod gpt;
pub mod hf;
pub mod init_source;
mod kv_cache;
pub mod layout;
mod llama;
pub mod lora;
mod mlp;
mod moe;
pub mod pretrained;
pub mod probe;
mod rope;
mod torchscript;

use tch::{nn, Tensor};

pub use attention::{Attend, Scores, Segments};
pub use decoder::Decoder;
pub use entry::{AuxLoss, Head, ModelInput, ModelOutput, Returns, Supports};
pub use gpt::Gpt;
pub use kv_cache::KvCache;
pub use llama::Llama;
pub use mlp::Mlp;
pub use ptrain_plugin_api::{LayerKind, Task};
pub use torchscript::TorchScript;

use crate::{
    config::Config,
    data::Dataset,
    error::{Error, Result},
};

/// One layer, described well enough to count its FLOPs exactly (see the `flops` plugin).
#[derive(Debug, Clone, PartialEq)]
pub struct Layer {
    pub name: String,
    pub kind: LayerKind,
    pub in_features: u64,
    pub out_features: u64,
    /// Applications per sample: sequence positions for token-wise layers.
    pub positions: u64,
    pub heads: u64,
    pub head_dim: u64,
    pub seq_len: u64,
    /// False for a first layer applied to data: its input needs no gradient.
    pub input_grad: bool,
}

impl Layer {
    pub fn linear(name: impl Into<String>, in_features: i64, out_features: i64, positions: i64, input_grad: bool) -> Layer {
        Layer {
            name: name.into(),
            kind: LayerKind::Linear,
            in_features: in_features as u64,
            out_features: out_features as u64,
            positions: positions as u64,
            heads: 0,
            head_dim: 0,
            seq_len: 0,
            input_grad,
        }
    }
}

/// A trainable model whose parameters live in the trainer's `VarStore`.
///
/// Implement it for your own model and hand it to [`crate::Trainer::with_model`]
/// (see `examples/custom-model`).
pub trait Model: Send {
    /// One forward pass. A model that reads only `input.tokens` and `input.train` and
    /// returns [`ModelOutput::Logits`] (`[B, C]` for classification, `[B, T, V]` for
    /// language models) is complete; [`Model::supports`] and [`Model::new_cache`] say
    /// which of the other inputs it honours.
    /// An error (use tch's `f_` functions, which return libtorch's errors instead
    /// of panicking) ends the run as failed: its summary is written, its sinks
    /// drained, and the newest checkpoint is left as it was.
    fn forward(&mut self, input: ModelInput) -> Result<ModelOutput>;

    fn task(&self) -> Task;

    /// A short name for logs and summaries.
    fn kind(&self) -> &str;

    /// The layers at sequence length `seq_len`, for exact FLOP counting. Models
    /// that cannot describe themselves return nothing (FLOPs are then measured
    /// with libtorch's profiler).
    fn layers(&self, _seq_len: i64) -> Vec<Layer> {
        Vec::new()
    }

    /// Whether `forward` draws random numbers when training (dropout, noise,
    /// sampling). The trainer then reseeds torch's generator from (seed, step)
    /// before each step, so a resumed run draws exactly what the uninterrupted one
    /// drew. The default, `true`, is always correct; a model that never draws may
    /// return `false` and save one reseed per step.
    fn uses_randomness(&self) -> bool {
        true
    }

    /// What `forward` honours beyond tokens and the train flag: segments (packed
    /// rows, `data.packing`) and hidden states (`train.loss_chunk`). Default: neither.
    fn supports(&self) -> Supports {
        Supports::default()
    }

    /// A key/value cache for incremental decoding of at most `capacity` positions
    /// (`ptrain generate`), which `forward` then honours in [`ModelInput::cache`];
    /// `None` for models that cannot decode incrementally.
    fn new_cache(&self, _capacity: i64) -> Option<KvCache> {
        None
    }

    /// The weight matrices of the model's repeated blocks (not its embeddings, norms
    /// or head): LoRA's frozen ones are stored in bf16 under `train.precision =
    /// "bf16"` ([`lora::store_base_bf16`]). Default: none.
    fn block_matrices(&self) -> Vec<Tensor> {
        Vec::new()
    }

    /// The auxiliary loss of its last forward without a cache, taken (a second call
    /// gives `None`): training adds it to the objective's ([`AuxLoss`]). Default: none.
    fn take_aux_loss(&mut self) -> Option<AuxLoss> {
        None
    }

    /// Runs every repeated block through `wrap` (parameter sharding's gathers), keeping
    /// the activation checkpointing planned; the number of blocks, or `None` for a
    /// model without such blocks. Their parameters are named with the block's index
    /// as the first number in the name (`transformer.h.3.ln_1.weight`).
    fn wrap_blocks(&mut self, _wrap: std::sync::Arc<dyn decoder::BlockWrap>) -> Result<Option<usize>> {
        Ok(None)
    }
}

/// Builds the configured model with its parameters in `vs` ([`from_config`]); with
/// `[lora]`, every parameter but the adapters is frozen (see [`lora`]).
pub fn build(config: &Config, vs: &nn::VarStore, dataset: &dyn Dataset) -> Result<Box<dyn Model>> {
    let model = from_config(config, &vs.root(), dataset)?;
    if let Some(lora) = config.lora() {
        lora::freeze_base(vs);
        // Adapters trained before (`model.init_adapters = "continue"`) start this run's.
        if !lora.init_from.is_empty() {
            adapters::load_peft_weights(vs, std::path::Path::new(&lora.init_from))?;
        }
    }
    Ok(model)
}

/// Builds the configured model with its parameters under `vs` (its family's
/// [`family::Build`], `model.init_from`'s weights loaded); with `[lora]`, with
/// adapters beside the linear layers it targets (not frozen: see [`build`]).
pub fn from_config(config: &Config, vs: &nn::Path, dataset: &dyn Dataset) -> Result<Box<dyn Model>> {
    let model = match family::of(config.model.kind).build {
        family::Build::Decoder(build) => build(vs, config, lora::Targets::new(config.lora(), config.model.kind), &mut |_| {})?,
        family::Build::Other(build) => return build(config, vs, dataset),
    };
    if !config.model.init_from.is_empty() {
        hf::load_weights(vs, &config.model)?;
    }
    Ok(model)
}

/// The configured decoder (with its adapters, not frozen: see [`build`]), calling
/// `after_block(i)` as soon as block `i`'s variables exist, `model.init_from`'s
/// weights left to the caller: parameter sharding cuts each block before the next
/// one takes memory, and reads only its own slices of the weights.
pub fn decoder_in_blocks(config: &Config, vs: &nn::Path, after_block: &mut dyn FnMut(usize)) -> Result<Box<dyn Model>> {
    match family::of(config.model.kind).build {
        family::Build::Decoder(build) => build(vs, config, lora::Targets::new(config.lora(), config.model.kind), after_block),
        family::Build::Other(_) => Err(Error::Other(format!("model.kind {:?} is not built block by block", config.model.kind))),
    }
}
