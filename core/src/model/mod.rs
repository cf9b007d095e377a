//! Models. The public [`Model`] trait lets library users bring their own; `gpt`,
//! `mlp` and `torchscript` are built from the configuration.

mod checkpointing;
pub mod generate;
mod gpt;
pub mod hf;
mod kv_cache;
mod llama;
pub mod lora;
mod mlp;
pub mod pretrained;
pub mod probe;
mod rope;
mod torchscript;

use tch::{nn, Kind, Tensor};

pub use gpt::Gpt;
pub use kv_cache::KvCache;
pub use llama::Llama;
pub use mlp::Mlp;
pub use ptrain_plugin_api::{LayerKind, Task};
pub use torchscript::TorchScript;

use crate::{
    config::{Config, ModelKind, TaskKind},
    data::{Dataset, Segments},
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
    /// Logits: `[B, C]` for classification, `[B, T, V]` for language models.
    /// An error (use tch's `f_` functions, which return libtorch's errors instead
    /// of panicking) ends the run as failed: its summary is written, its sinks
    /// drained, and the newest checkpoint is left as it was.
    fn forward(&mut self, inputs: &Tensor, train: bool) -> Result<Tensor>;

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

    /// Logits of packed sequences: `segments` gives each token's position within its
    /// row and its row, and a token attends only to the earlier tokens of its own
    /// row, so each row gets exactly the logits it gets alone (`data.packing`).
    fn forward_packed(&mut self, _inputs: &Tensor, _segments: &Segments, _train: bool) -> Result<Tensor> {
        Err(Error::Other(format!("model.kind {:?} cannot train on packed sequences (data.packing = true)", self.kind())))
    }

    /// A language model's hidden states before its output projection `[B, T, D]`
    /// (packed sequences with `segments`), and the projection's weight `[V, D]`, so
    /// the loss can be computed a chunk of positions at a time
    /// (`train.loss_chunk`). `None`: the model has no such split, and the loss is
    /// computed from [`Model::forward`]'s logits.
    fn forward_hidden(&mut self, _inputs: &Tensor, _segments: Option<&Segments>, _train: bool) -> Result<Option<(Tensor, Tensor)>> {
        Ok(None)
    }

    /// A key/value cache for incremental decoding of at most `capacity` positions
    /// (`ptrain generate`); `None` for models that cannot decode incrementally.
    fn new_cache(&self, _capacity: i64) -> Option<KvCache> {
        None
    }

    /// Logits `[B, n, V]` of `inputs` `[B, n]` placed after the positions `cache`
    /// holds, which then holds these too. Only for models whose `new_cache` gives one.
    fn forward_cached(&mut self, _inputs: &Tensor, _cache: &mut KvCache) -> Result<Tensor> {
        Err(Error::Other(format!("model.kind {:?} cannot decode incrementally", self.kind())))
    }
}

/// The attention mask of packed sequences, `[B, 1, T, T]` boolean: a query attends
/// to a key at or before it in the same row (`ids` `[B, T]`, as
/// [`Segments::ids`]). Padding is a row of its own, so no query attends to nothing.
pub fn packed_attention_mask(ids: &Tensor) -> Result<Tensor> {
    let t = ids.size().last().copied().unwrap_or(0);
    let same = ids.f_unsqueeze(2)?.f_eq_tensor(&ids.f_unsqueeze(1)?)?;
    let causal = Tensor::f_ones([t, t], (Kind::Bool, ids.device()))?.f_tril(0)?;
    Ok(same.f_logical_and(&causal)?.f_unsqueeze(1)?)
}

/// Builds the configured model with its parameters in `vs` ([`from_config`]); with
/// `[lora]`, every parameter but the adapters is frozen (see [`lora`]).
pub fn build(config: &Config, vs: &nn::VarStore, dataset: &dyn Dataset) -> Result<Box<dyn Model>> {
    let model = from_config(config, &vs.root(), dataset)?;
    if config.lora().is_some() {
        lora::freeze_base(vs);
    }
    Ok(model)
}

/// Builds the configured model with its parameters under `vs`; with `[lora]`,
/// with adapters beside the linear layers it targets (not frozen: see [`build`]).
pub fn from_config(config: &Config, vs: &nn::Path, dataset: &dyn Dataset) -> Result<Box<dyn Model>> {
    let m = &config.model;
    let targets = lora::Targets { lora: config.lora(), kind: m.kind };
    Ok(match m.kind {
        ModelKind::Gpt => {
            let mut gpt = Gpt::with_lora(vs, m, targets);
            gpt.checkpoint_blocks(&config.train)?;
            if !m.init_from.is_empty() {
                hf::load_weights(vs, m)?;
            }
            Box::new(gpt)
        }
        ModelKind::Llama => {
            let mut llama = Llama::with_lora(vs, m, targets);
            llama.checkpoint_blocks(&config.train)?;
            if !m.init_from.is_empty() {
                hf::load_weights(vs, m)?;
            }
            Box::new(llama)
        }
        ModelKind::Mlp => {
            let input_dim = if m.input_dim > 0 { m.input_dim } else { dataset.input_dim() };
            let classes = if m.num_classes > 0 { m.num_classes } else { dataset.num_classes() };
            if input_dim <= 0 || classes <= 1 {
                return Err(Error::Config(crate::error::ConfigError {
                    origin: "configuration".into(),
                    key: "model.kind".into(),
                    message: "mlp needs classification data (data.kind = \"jsonl\" or synthetic classification)".into(),
                }));
            }
            Box::new(Mlp::new(vs, input_dim, &m.hidden, classes))
        }
        ModelKind::Torchscript => {
            let task = match m.task {
                TaskKind::Classification => Task::Classification,
                TaskKind::LanguageModel => Task::LanguageModel,
            };
            Box::new(TorchScript::load(std::path::Path::new(&m.path), vs, task)?)
        }
    })
}
