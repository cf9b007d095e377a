//! The learner: the model, the data it trains on and what updates it. It is the one
//! place the trainer calls the model ([`Forward`]), under the run's precision.

use std::sync::Arc;

use tch::{nn, Tensor};

use crate::{
    config::Config,
    data::{Batch, Dataset},
    error::{Error, Result},
    model::{Model, ModelInput, ModelOutput, Returns},
    objective::Forward,
    optim::{self, GradMemory, LrSchedule, Optimizer, ParamSharding, ShardSpec},
};

pub(super) struct Learner {
    pub _vs: nn::VarStore,
    pub model: Box<dyn Model>,
    /// Trainable parameters, sorted by name.
    pub params: Vec<(String, Tensor)>,
    /// Replicated or sharded across the ranks.
    pub optimizer: Box<dyn Optimizer>,
    /// The learning rate at each step (not the run's hook schedule, `Run::schedule`).
    pub lr_schedule: LrSchedule,
    pub dataset: Arc<dyn Dataset>,
    /// `precision = "bf16"`: the forward pass runs in autocast to bfloat16 on this
    /// device type (`Some(true)` CUDA, `Some(false)` the CPU).
    pub autocast: Option<bool>,
    /// Reseed torch's generator from (seed, step) each step (the model draws random
    /// numbers), so a resumed run draws what the uninterrupted one drew.
    pub reseed: bool,
    /// This rank's peak memory once the model was loaded (built, `model.init_from`
    /// read, cut into shards with parameter sharding), before the optimizer's buffers.
    pub load_peak_memory: u64,
}

impl Learner {
    /// The learner of `model`, whose parameters live in `vs`: its trainable ones,
    /// and the configured optimizer over them (sharded with `shard`; `parameters`
    /// also wraps the model's blocks in its gathers).
    pub fn new(
        vs: nn::VarStore,
        mut model: Box<dyn Model>,
        dataset: Arc<dyn Dataset>,
        config: &Config,
        shard: Option<(ShardSpec, Option<ParamSharding>)>,
        grads: GradMemory,
        total_steps: u64,
    ) -> Result<Learner> {
        let mut params: Vec<(String, Tensor)> = vs.variables().into_iter().filter(|(_, t)| t.requires_grad()).collect();
        params.sort_by(|a, b| a.0.cmp(&b.0));
        if params.is_empty() {
            return Err(Error::Other("the model has no trainable parameters".into()));
        }
        let (spec, mut with) = shard.map_or((None, None), |(spec, with)| (Some(spec), with));
        if let (Some(spec), Some(with)) = (&spec, &mut with) {
            if with.cut.is_none() {
                // A factory's model, built whole: its frozen variables are cut too.
                let mut frozen: Vec<(String, Tensor)> = vs.variables().into_iter().filter(|(_, t)| !t.requires_grad()).collect();
                frozen.sort_by(|a, b| a.0.cmp(&b.0));
                with.cut = Some(optim::cut_whole(&params, &frozen, spec.rank, spec.world, with.collectives.as_ref())?);
            }
        }
        // The model is in place (cut, with parameter sharding): the optimizer's buffers come next.
        let load_peak_memory = crate::device::peak_memory(vs.device());
        let optimizer = optim::build(&config.optim, &params, spec, with, grads)?;
        if let Some((wrap, named)) = optimizer.block_wrap() {
            let depth = model.wrap_blocks(wrap)?;
            if depth != Some(named) {
                // A library model (`Trainer::with_model`) that does not run its blocks
                // through `Model::wrap_blocks`: refused before training, as a usage error.
                return Err(Error::Config(crate::error::ConfigError {
                    origin: "[dist]".into(),
                    key: "dist.shard".into(),
                    message: format!(
                        "dist.shard = \"parameters\" gathers a model block by block: model {:?} runs {} of the {named} blocks its parameters' names number \
                         through Model::wrap_blocks (use \"gradients\", or implement wrap_blocks)",
                        model.kind(),
                        depth.map_or("none".to_string(), |d| d.to_string())
                    ),
                }));
            }
        }
        Ok(Learner {
            lr_schedule: LrSchedule::new(&config.optim, total_steps),
            // Whether the model draws random numbers is the model's to say.
            reseed: model.uses_randomness(),
            load_peak_memory,
            // bf16 autocasts the forward pass on the CPU as on CUDA (libtorch supports both).
            autocast: (config.train.precision == crate::config::Precision::Bf16).then_some(vs.device().is_cuda()),
            _vs: vs,
            model,
            params,
            optimizer,
            dataset,
        })
    }

    /// The configured model on the CPU with its data, for the components' tests.
    #[cfg(test)]
    pub fn for_tests(config: &Config) -> Learner {
        let dataset = crate::data::from_config(config).unwrap();
        let vs = nn::VarStore::new(tch::Device::Cpu);
        let model = crate::model::build(config, &vs, dataset.as_ref()).unwrap();
        Learner::new(vs, model, dataset, config, None, GradMemory::Released, config.train.steps).unwrap()
    }
}

/// The model, run under autocast when the run is in bf16 (the objective computes
/// its loss in float32: see [`crate::objective::cross_entropy`]).
impl Forward for Learner {
    /// A language model's hidden states and output projection (see
    /// [`Returns::Hidden`]), under autocast like [`Forward::forward`]; `None` when
    /// the model has no such split (the loss is then computed from the logits).
    fn forward_hidden(&mut self, batch: &Batch, train: bool) -> Result<Option<(Tensor, crate::model::Head)>> {
        if !self.model.supports().hidden {
            return Ok(None);
        }
        match self.output(batch, train, Returns::Hidden)? {
            // Under bf16 autocast the whole logits' head runs in bf16 (autocast casts the
            // final norm's float32 output); the chunked loss takes its GEMM dtype from the
            // states, so they go to it in bf16: in float32 those GEMMs made a Qwen2-0.5B
            // step on an H200 take twice as long as with the whole logits.
            ModelOutput::Hidden { states, head } if self.autocast.is_some() => Ok(Some((states.f_to_kind(tch::Kind::BFloat16)?, head))),
            ModelOutput::Hidden { states, head } => Ok(Some((states, head))),
            ModelOutput::Logits(_) => Err(Error::Other(format!("model {:?} returned logits when asked for hidden states", self.model.kind()))),
        }
    }

    /// The logits of a batch (its packed rows included).
    fn forward(&mut self, batch: &Batch, train: bool) -> Result<Tensor> {
        self.output(batch, train, Returns::Logits)?.logits()
    }
}

impl Learner {
    /// The model's forward over a batch (its packed rows included), under autocast
    /// when the run is in bf16.
    pub fn output(&mut self, batch: &Batch, train: bool, returns: Returns) -> Result<ModelOutput> {
        let model = &mut self.model;
        if batch.segments.is_some() && !model.supports().segments {
            return Err(Error::Other(format!("model.kind {:?} cannot train on packed sequences (data.packing = true)", model.kind())));
        }
        let mut run = || model.forward(ModelInput::new(&batch.inputs, train).segments(batch.segments.as_ref()).returns(returns));
        match self.autocast {
            None => run(),
            Some(cuda) => ptrain_torch_ext::autocast_bf16(cuda, run).map_err(|e| Error::Other(format!("autocast: {e}")))?,
        }
    }
}

#[cfg(test)]
mod tests {
    use tch::Kind;

    use super::*;
    use crate::{
        config::{ConfigBuilder, Precision},
        data::{BatchKey, Split},
    };

    fn tiny_gpt(precision: &str) -> Config {
        let sets = ["model.kind=\"gpt\"", "model.n_layer=1", "model.n_head=2", "model.n_embd=16", "model.block_size=8", "data.batch_size=2"];
        let mut builder = ConfigBuilder::default();
        for set in sets.iter().map(|s| s.to_string()).chain([format!("train.precision=\"{precision}\"")]) {
            builder = builder.set(&set).unwrap();
        }
        builder.build().unwrap()
    }

    #[test]
    fn the_learner_runs_its_model_in_the_runs_precision() {
        for (precision, kind) in [("fp32", Kind::Float), ("bf16", Kind::BFloat16)] {
            let config = tiny_gpt(precision);
            assert_eq!(config.train.precision == Precision::Bf16, kind == Kind::BFloat16);
            let mut learner = Learner::for_tests(&config);
            let batch = learner.dataset.batch(Split::Train, BatchKey { step: 1, micro: 0, first_sample: 0, count: 2, stream: 0 }).unwrap();
            let logits = learner.forward(&batch, false).unwrap();
            assert_eq!((logits.size(), logits.kind()), (vec![2, 8, 256], kind), "{precision}: the logits");
            let (hidden, weight) = learner.forward_hidden(&batch, false).unwrap().expect("gpt hands out its hidden states");
            // (The final layer norm runs in float32 under autocast, as PyTorch's.)
            assert_eq!(hidden.size(), [2, 8, 16], "{precision}: the hidden states");
            assert_eq!(weight.size(), [256, 16]);
        }
    }

    #[test]
    fn a_model_without_trainable_parameters_is_refused() {
        let config = tiny_gpt("fp32");
        let dataset = crate::data::from_config(&config).unwrap();
        let mut vs = nn::VarStore::new(tch::Device::Cpu);
        let model = crate::model::build(&config, &vs, dataset.as_ref()).unwrap();
        vs.freeze();
        let err = Learner::new(vs, model, dataset, &config, None, GradMemory::Released, 1).err().expect("refused");
        assert!(err.to_string().contains("no trainable parameters"), "{err}");
    }
}
