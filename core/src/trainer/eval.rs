//! Evaluation on the held-out split: `train.eval_batches` batches (0: the whole
//! held-out set once) through the run's objective, their `(sum, count)` and metric
//! sums added up on the device, reduced over ranks in one collective and read once.
//! Held-out samples are read in order and never twice in one evaluation: asking
//! for more batches than the set holds covers the set once.

use tch::{Device, Kind, Tensor};

use super::{learner::Learner, summary::EvalPoint};
use crate::{
    config::Config,
    data::{BatchKey, Split},
    dist::DataParallel,
    error::{Error, Result},
    objective::{Count, Objective},
};

/// "1 held-out sample", "20 held-out samples".
pub(super) fn held_out_samples(n: u64) -> String {
    format!("{n} held-out sample{}", if n == 1 { "" } else { "s" })
}

pub(super) struct Evaluator {
    /// Batches per evaluation (each `batch_size` samples per rank; the last may be
    /// short): 0 when nothing is held out.
    batches: u64,
    /// Held-out samples, read in order; `None`: drawn as the key says (a dataset
    /// of one's own that does not count them).
    held_out: Option<u64>,
    batch_size: u64,
    rank: u64,
    world: u64,
    device: Device,
}

impl Evaluator {
    /// `held_out`: [`crate::data::Dataset::val_len`].
    pub fn new(config: &Config, held_out: Option<u64>, rank: u32, world: u32, device: Device) -> Result<Evaluator> {
        let (b, asked) = (config.data.batch_size as u64, config.train.eval_batches);
        let global = b * world as u64;
        let batches = match held_out {
            Some(n) => {
                let whole = n.div_ceil(global);
                if asked > whole && rank == 0 {
                    tracing::info!(
                        "train.eval_batches = {asked} asks for more than the held-out set's {n} samples ({whole} batches of {global}): \
                         each evaluation covers them once"
                    );
                }
                if asked == 0 {
                    whole
                } else {
                    asked.min(whole)
                }
            }
            None if asked == 0 => {
                return Err(Error::Config(crate::error::ConfigError {
                    origin: "the configuration".into(),
                    key: "train.eval_batches".into(),
                    message: "0 (the whole held-out set once) needs a dataset that counts its held-out samples \
                              (Dataset::val_len), and this one does not: set a number of batches"
                        .into(),
                }))
            }
            None => asked,
        };
        Ok(Evaluator { batches, held_out, batch_size: b, rank: rank as u64, world: world as u64, device })
    }

    /// Whether anything is held out to evaluate on.
    pub fn enabled(&self) -> bool {
        self.batches > 0
    }

    /// Held-out samples one evaluation covers, all ranks together.
    pub fn covers(&self) -> u64 {
        let asked = self.batches * self.batch_size * self.world;
        self.held_out.map_or(asked, |n| asked.min(n))
    }

    /// The objective's loss and metrics over this rank's share of the evaluation
    /// batches and every other rank's: the sums over the count, all batches and
    /// ranks together. A batch whose objective counts micro-batch means weighs by
    /// its samples, so a short last batch counts for what it holds.
    pub fn run(&self, learner: &mut Learner, objective: &dyn Objective, dist: &dyn DataParallel, step: u64) -> Result<EvalPoint> {
        let (b, rank, world, device) = (self.batch_size, self.rank, self.world, self.device);
        let dataset = learner.dataset.clone();
        // [loss sum, count, metric sums...], in float64.
        let mut names = Vec::new();
        let mut row_of = |key: BatchKey| -> Result<Tensor> {
            let batch = dataset.batch(Split::Val, key)?.to_device(device, true);
            let (sum, count) = objective.sum_and_count(&mut learner.runner(), &batch, false)?;
            let mut row = vec![sum.loss.f_to_kind(Kind::Double)?, Tensor::from(count.value()).f_to_device(device)?];
            names.clear();
            for (name, value) in sum.metrics {
                names.push(name);
                row.push(value.f_to_kind(Kind::Double)?);
            }
            // Means over the batch count as much as its loss does here.
            for (name, value) in sum.means {
                names.push(name);
                row.push(value.f_to_kind(Kind::Double)?.f_mul_scalar(count.value())?);
            }
            let row = Tensor::f_stack(&row, 0)?;
            match count {
                Count::MicroBatch if key.count < b => Ok(row.f_mul_scalar(key.count as f64 / b as f64)?),
                _ => Ok(row),
            }
        };
        let sums = tch::no_grad(|| -> Result<Tensor> {
            let mut acc: Option<Tensor> = None;
            for i in 0..self.batches {
                let first = i * world * b + rank * b;
                let count = self.held_out.map_or(b, |n| n.saturating_sub(first).min(b));
                let row = match count {
                    // Every rank runs one forward per evaluation batch: a sharded
                    // model's forward gathers its blocks with the other ranks, and a
                    // rank that skipped one would leave them waiting (a hang until
                    // dist.timeout_s). A rank past the end of the held-out set
                    // forwards a stand-in row and counts nothing of it.
                    0 => row_of(BatchKey { step: i, micro: 0, first_sample: 0, count: 1, stream: 0 })?.f_zeros_like()?,
                    _ => row_of(BatchKey { step: i, micro: 0, first_sample: rank * b, count, stream: first })?,
                };
                acc = Some(match acc {
                    Some(acc) => acc.f_add(&row)?,
                    None => row,
                });
            }
            acc.ok_or_else(|| Error::Other("an evaluation of no batch".into()))
        })?;
        let mut sums = sums;
        dist.all_reduce_sum(&mut sums).map_err(Error::Dist)?;
        // A failed read is an error, never an eval loss of 0.
        let values = Vec::<f64>::try_from(sums.f_to_device(Device::Cpu)?)?;
        if values.len() != 2 + names.len() {
            return Err(Error::Other(format!("evaluation read {} values, not {}", values.len(), 2 + names.len())));
        }
        let count = values[1].max(1e-12);
        let metrics: Vec<(&'static str, f64)> = names.iter().zip(&values[2..]).map(|(name, sum)| (*name, sum / count)).collect();
        let accuracy = metrics.iter().find(|(name, _)| *name == "accuracy").map(|(_, a)| *a);
        Ok(EvalPoint { step, loss: values[0] / count, accuracy, samples: self.covers(), metrics })
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
        let point = Evaluator::new(&config, learner.dataset.val_len(), 0, 1, Device::Cpu)
            .unwrap()
            .run(&mut learner, &Classification, &SingleRank, 7)
            .unwrap();
        let (mut loss, mut right) = (0.0, 0.0);
        for i in 0..3 {
            let batch = learner.dataset.batch(Split::Val, BatchKey { step: i, micro: 0, first_sample: 0, count: 8, stream: i * 8 }).unwrap();
            let logits = learner.runner().forward(&batch, false).unwrap();
            loss += cross_entropy(&logits, &batch.targets, Reduction::Mean).unwrap().double_value(&[]) / 3.0;
            right += logits.argmax(-1, false).eq_tensor(&batch.targets).sum(Kind::Double).double_value(&[]);
        }
        assert_eq!(point.step, 7);
        assert!((point.loss - loss).abs() < 1e-9, "{} vs {loss}", point.loss);
        assert!((point.accuracy.unwrap() - right / 24.0).abs() < 1e-12, "{:?} vs {}", point.accuracy, right / 24.0);
        assert_eq!(point.metrics, [("accuracy", point.accuracy.unwrap())]);
    }

    #[test]
    fn zero_batches_is_the_whole_held_out_set_once_a_short_last_batch_weighing_what_it_holds() {
        let whole = config(&["model.kind=\"mlp\"", "data.batch_size=8", "train.eval_batches=0", "data.synthetic_len=256"]);
        let mut learner = Learner::for_tests(&whole);
        let held_out = learner.dataset.val_len().unwrap();
        assert_eq!(held_out, 26, "10% of 256 rows, rounded up");
        let evaluator = Evaluator::new(&whole, Some(held_out), 0, 1, Device::Cpu).unwrap();
        assert_eq!(evaluator.covers(), 26);
        let point = evaluator.run(&mut learner, &Classification, &SingleRank, 3).unwrap();
        let all = learner.dataset.batch(Split::Val, BatchKey { step: 0, micro: 0, first_sample: 0, count: 26, stream: 0 }).unwrap();
        let logits = learner.runner().forward(&all, false).unwrap();
        let loss = cross_entropy(&logits, &all.targets, Reduction::Mean).unwrap().double_value(&[]);
        // float32 batch means added in float64 against one float32 mean: equal to rounding.
        assert!((point.loss - loss).abs() < 1e-6, "{} vs the mean over all 26 rows {loss}", point.loss);
        assert_eq!(point.samples, 26);
        // Asking for more batches than the set holds covers it once, never wrapping.
        let more = config(&["model.kind=\"mlp\"", "data.batch_size=8", "train.eval_batches=50", "data.synthetic_len=256"]);
        let capped = Evaluator::new(&more, Some(held_out), 0, 1, Device::Cpu).unwrap();
        assert_eq!(capped.covers(), 26);
        assert_eq!(capped.run(&mut learner, &Classification, &SingleRank, 3).unwrap().loss, point.loss);
        // Two ranks: rank 1 takes rows 8..16 and 24..26, each once.
        assert_eq!(Evaluator::new(&whole, Some(held_out), 1, 2, Device::Cpu).unwrap().batches, 2);
        // Nothing held out: no evaluation.
        assert!(!Evaluator::new(&whole, Some(0), 0, 1, Device::Cpu).unwrap().enabled());
    }

    /// Evaluation batch i: two rows of 8 tokens, of whose 16 targets the first 2 + 3 i
    /// are trained, all of them the token `[255, 128, 0][i]`.
    struct Uneven;

    const TARGETS: [i64; 3] = [255, 128, 0];

    impl Dataset for Uneven {
        fn batch(&self, _split: Split, key: BatchKey) -> Result<Batch> {
            tch::manual_seed(key.step as i64);
            let inputs = Tensor::randint(256, [2, 8], (Kind::Int64, Device::Cpu));
            let trained = 2 + 3 * key.step as i64;
            let targets = Tensor::full([16], IGNORE_INDEX, (Kind::Int64, Device::Cpu));
            let _ = targets.narrow(0, 0, trained).fill_(TARGETS[key.step as usize]);
            let targets = targets.view([2, 8]);
            Ok(Batch {
                inputs,
                targets,
                dataset_ids: None,
                segments: None,
                payload: crate::data::Payload::TrainedTokens(trained),
                samples: 2,
                tokens: 16,
            })
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

    /// A language model whose logits are `bias` at every position whatever the input:
    /// a target `t` costs `logsumexp(bias) - bias[t]`, the same on every CPU.
    struct Fixed {
        bias: Tensor,
    }

    impl crate::model::Model for Fixed {
        fn forward(&mut self, input: crate::model::ModelInput) -> Result<crate::model::ModelOutput> {
            let (b, t) = input.tokens.size2()?;
            Ok(crate::model::ModelOutput::Logits(self.bias.f_view([1, 1, 256])?.f_expand([b, t, 256], false)?))
        }
        fn task(&self) -> crate::model::Task {
            crate::model::Task::LanguageModel
        }
        fn kind(&self) -> &str {
            "fixed"
        }
        fn uses_randomness(&self) -> bool {
            false
        }
    }

    #[test]
    fn instruction_data_is_the_sum_over_every_trained_token_over_their_number() {
        let config = config(&["data.batch_size=2", "train.eval_batches=3"]);
        let vs = tch::nn::VarStore::new(Device::Cpu);
        // bias[j] = j / 32: token 255 costs lse - 7.97, token 128 lse - 4, token 0 lse.
        let bias = vs.root().var_copy("bias", &(Tensor::arange(256, (Kind::Float, Device::Cpu)) / 32.0));
        let dataset: std::sync::Arc<dyn Dataset> = std::sync::Arc::new(Uneven);
        let model = Box::new(Fixed { bias: bias.shallow_clone() });
        let mut learner = Learner::new(vs, model, dataset, &config, None, crate::optim::GradMemory::Released, 1).unwrap();
        let point = Evaluator::new(&config, learner.dataset.val_len(), 0, 1, Device::Cpu)
            .unwrap()
            .run(&mut learner, &CausalLmPerToken { chunk: 0 }, &SingleRank, 1)
            .unwrap();
        let (mut sum, mut tokens, mut means) = (0.0, 0.0, 0.0);
        for i in 0..3 {
            let batch = Uneven.batch(Split::Val, BatchKey { step: i, micro: 0, first_sample: 0, count: 2, stream: i * 2 }).unwrap();
            let logits = learner.runner().forward(&batch, false).unwrap();
            sum += cross_entropy(&logits, &batch.targets, Reduction::Sum).unwrap().double_value(&[]);
            tokens += batch.payload.trained_tokens().unwrap() as f64;
            means += cross_entropy(&logits, &batch.targets, Reduction::Mean).unwrap().double_value(&[]) / 3.0;
        }
        assert!((point.loss - sum / tokens).abs() < 1e-6, "{} vs {}", point.loss, sum / tokens);
        // The same, from the costs above: (2 x token 255 + 5 x token 128 + 8 x token 0) / 15.
        let lse = Vec::<f64>::try_from(bias.to_kind(Kind::Double).logsumexp([0], false).view([1])).unwrap()[0];
        let cost = |t: i64| lse - t as f64 / 32.0;
        let expected = (2.0 * cost(255) + 5.0 * cost(128) + 8.0 * cost(0)) / 15.0;
        // float32 logits and losses: within 1e-5 of the float64 value.
        assert!((point.loss - expected).abs() < 1e-5, "{} vs {expected}", point.loss);
        // The batches' means differ (by construction: a batch's trained tokens are all one
        // target) and weigh by their tokens, so the mean of the batches' means is
        // (cost(255) + cost(128) + cost(0)) / 3, lse - 3.99 against lse - 2.40.
        assert!((means - (cost(255) + cost(128) + cost(0)) / 3.0).abs() < 1e-5, "{means}");
        assert!((point.loss - means).abs() > 1.0, "not the mean of the batches' means ({means})");
        assert!(point.accuracy.is_none() && point.metrics.is_empty());
    }
}
