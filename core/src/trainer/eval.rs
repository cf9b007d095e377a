//! Evaluation on the held-out split: `train.eval_batches` batches through the
//! run's objective, their `(sum, count)` and metric sums added up on the device,
//! reduced over ranks in one collective and read once.

use tch::{Device, Kind, Tensor};

use super::{learner::Learner, summary::EvalPoint};
use crate::{
    config::Config,
    data::{BatchKey, Split},
    dist::DataParallel,
    error::{Error, Result},
    objective::Objective,
};

pub(super) struct Evaluator {
    batches: u64,
    batch_size: u64,
    rank: u64,
    world: u64,
    device: Device,
}

impl Evaluator {
    pub fn new(config: &Config, rank: u32, world: u32, device: Device) -> Evaluator {
        let batches = config.train.eval_batches.max(1);
        Evaluator { batches, batch_size: config.data.batch_size as u64, rank: rank as u64, world: world as u64, device }
    }

    /// The objective's loss and metrics over this rank's share of the evaluation
    /// batches and every other rank's: the sums over the count, all batches and
    /// ranks together.
    pub fn run(&self, learner: &mut Learner, objective: &dyn Objective, dist: &dyn DataParallel, step: u64) -> Result<EvalPoint> {
        let (b, rank, world, device) = (self.batch_size, self.rank, self.world, self.device);
        let dataset = learner.dataset.clone();
        // [loss sum, count, metric sums...], in float64.
        let mut names = Vec::new();
        let sums = tch::no_grad(|| -> Result<Option<Tensor>> {
            let mut acc: Option<Tensor> = None;
            for i in 0..self.batches {
                let key = BatchKey { step: i, micro: 0, first_sample: rank * b, count: b, stream: i * world * b + rank * b };
                let batch = dataset.batch(Split::Val, key)?.to_device(device, true);
                let (sum, count) = objective.sum_and_count(learner, &batch, false)?;
                let mut row = vec![sum.loss.f_to_kind(Kind::Double)?, Tensor::from(count.value()).f_to_device(device)?];
                names.clear();
                for (name, value) in sum.metrics {
                    names.push(name);
                    row.push(value.f_to_kind(Kind::Double)?);
                }
                let row = Tensor::f_stack(&row, 0)?;
                acc = Some(match acc {
                    Some(acc) => acc.f_add(&row)?,
                    None => row,
                });
            }
            Ok(acc)
        })?;
        let mut sums = sums.ok_or_else(|| Error::Other("evaluation ran no batch".into()))?;
        dist.all_reduce_sum(&mut sums).map_err(Error::Dist)?;
        // A failed read is an error, never an eval loss of 0.
        let values = Vec::<f64>::try_from(sums.f_to_device(Device::Cpu)?)?;
        if values.len() != 2 + names.len() {
            return Err(Error::Other(format!("evaluation read {} values, not {}", values.len(), 2 + names.len())));
        }
        let count = values[1].max(1.0);
        let metrics: Vec<(&'static str, f64)> = names.iter().zip(&values[2..]).map(|(name, sum)| (*name, sum / count)).collect();
        let accuracy = metrics.iter().find(|(name, _)| *name == "accuracy").map(|(_, a)| *a);
        Ok(EvalPoint { step, loss: values[0] / count, accuracy, metrics })
    }
}

#[cfg(test)]
mod tests {
    use tch::Reduction;

    use super::*;
    use crate::{
        config::ConfigBuilder,
        data::{Batch, Dataset, IGNORE_INDEX},
        dist::SingleRank,
        objective::{cross_entropy, CausalLmPerToken, Classification, Forward},
    };

    fn config(sets: &[&str]) -> Config {
        sets.iter().fold(ConfigBuilder::default(), |b, s| b.set(s).unwrap()).build().unwrap()
    }

    #[test]
    fn classification_is_the_mean_of_its_batch_means_and_their_accuracy() {
        let config = config(&["model.kind=\"mlp\"", "data.batch_size=8", "train.eval_batches=3", "data.synthetic_len=256"]);
        let mut learner = Learner::for_tests(&config);
        let point = Evaluator::new(&config, 0, 1, Device::Cpu).run(&mut learner, &Classification, &SingleRank, 7).unwrap();
        let (mut loss, mut right) = (0.0, 0.0);
        for i in 0..3 {
            let batch = learner.dataset.batch(Split::Val, BatchKey { step: i, micro: 0, first_sample: 0, count: 8, stream: i * 8 }).unwrap();
            let logits = learner.forward(&batch, false).unwrap();
            loss += cross_entropy(&logits, &batch.targets, Reduction::Mean).unwrap().double_value(&[]) / 3.0;
            right += logits.argmax(-1, false).eq_tensor(&batch.targets).sum(Kind::Double).double_value(&[]);
        }
        assert_eq!(point.step, 7);
        assert!((point.loss - loss).abs() < 1e-9, "{} vs {loss}", point.loss);
        assert!((point.accuracy.unwrap() - right / 24.0).abs() < 1e-12, "{:?} vs {}", point.accuracy, right / 24.0);
        assert_eq!(point.metrics, [("accuracy", point.accuracy.unwrap())]);
    }

    /// Language-model rows of 8 tokens; evaluation batch i trains 2 + 3 i of its 16 targets.
    struct Uneven;

    impl Dataset for Uneven {
        fn batch(&self, _split: Split, key: BatchKey) -> Result<Batch> {
            tch::manual_seed(key.step as i64);
            let inputs = Tensor::randint(256, [2, 8], (Kind::Int64, Device::Cpu));
            let targets = Tensor::randint(256, [16], (Kind::Int64, Device::Cpu));
            let trained = 2 + 3 * key.step as i64;
            let _ = targets.narrow(0, trained, 16 - trained).fill_(IGNORE_INDEX);
            let targets = targets.view([2, 8]);
            Ok(Batch { inputs, targets, dataset_ids: None, segments: None, trained_tokens: Some(trained), reference: None, samples: 2, tokens: 16 })
        }
        fn dataset_names(&self) -> Vec<String> {
            Vec::new()
        }
        fn train_len(&self) -> u64 {
            2
        }
        fn seq_len(&self) -> i64 {
            8
        }
    }

    #[test]
    fn instruction_data_is_the_sum_over_every_trained_token_over_their_number() {
        let config =
            config(&["model.n_layer=1", "model.n_head=2", "model.n_embd=16", "model.block_size=8", "data.batch_size=2", "train.eval_batches=3"]);
        let vs = tch::nn::VarStore::new(Device::Cpu);
        let dataset: std::sync::Arc<dyn Dataset> = std::sync::Arc::new(Uneven);
        let model = crate::model::build(&config, &vs, dataset.as_ref()).unwrap();
        let mut learner = Learner::new(vs, model, dataset, &config, None, 1).unwrap();
        let point = Evaluator::new(&config, 0, 1, Device::Cpu).run(&mut learner, &CausalLmPerToken { chunk: 0 }, &SingleRank, 1).unwrap();
        let (mut sum, mut tokens, mut means) = (0.0, 0.0, 0.0);
        for i in 0..3 {
            let batch = Uneven.batch(Split::Val, BatchKey { step: i, micro: 0, first_sample: 0, count: 2, stream: i * 2 }).unwrap();
            let logits = learner.forward(&batch, false).unwrap();
            sum += cross_entropy(&logits, &batch.targets, Reduction::Sum).unwrap().double_value(&[]);
            tokens += batch.trained_tokens.unwrap() as f64;
            means += cross_entropy(&logits, &batch.targets, Reduction::Mean).unwrap().double_value(&[]) / 3.0;
        }
        assert!((point.loss - sum / tokens).abs() < 1e-6, "{} vs {}", point.loss, sum / tokens);
        assert!((point.loss - means).abs() > 1e-4, "not the mean of the batches' means ({means})");
        assert!(point.accuracy.is_none() && point.metrics.is_empty());
    }
}
