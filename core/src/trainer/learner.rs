//! The learner: the model, the data it trains on and what updates it. It is the one
//! place the trainer calls the model ([`Learner::runner`]), under the run's precision.

use std::sync::Arc;

use tch::{nn, Tensor};

use crate::{
    config::Config,
    data::Dataset,
    error::{Error, Result},
    model::Model,
    objective::Runner,
    optim::{self, GradMemory, LearningRate, LrSchedule, Optimizer, ParamSharding, ShardSpec},
};

pub(super) struct Learner {
    pub _vs: nn::VarStore,
    pub model: Box<dyn Model>,
    /// Trainable parameters, sorted by name.
    pub params: Vec<(String, Tensor)>,
    /// Replicated or sharded across the ranks.
    pub optimizer: Box<dyn Optimizer>,
    /// The rate the next update uses, on the device (set before each step's core).
    pub lr: LearningRate,
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
        let lr = LearningRate::new(vs.device())?;
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
            lr,
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

impl Learner {
    /// The model as the objective calls it: under the run's precision.
    pub fn runner(&mut self) -> Runner<'_> {
        Runner { model: self.model.as_mut(), autocast: self.autocast }
    }
}

#[cfg(test)]
mod tests {
    use tch::Kind;

    use super::*;
    use crate::{
        config::{ConfigBuilder, Precision},
        data::{BatchKey, Split},
        objective::Forward,
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
            let logits = learner.runner().forward(&batch, false).unwrap();
            assert_eq!((logits.size(), logits.kind()), (vec![2, 8, 256], kind), "{precision}: the logits");
            let (hidden, weight) = learner.runner().forward_hidden(&batch, false).unwrap().expect("gpt hands out its hidden states");
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
