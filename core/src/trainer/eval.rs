//! Evaluation on the held-out split: `train.eval_batches` batches, summed on the
//! device, reduced over ranks in one collective and read once.

use ptrain_plugin_api::{Hook, Metric, PhaseTimes, Scalar, StepTensors, Task};
use tch::{Device, Kind, Tensor};

use super::{
    hooks::{step_context, At},
    run::Run,
    summary::EvalPoint,
};
use crate::{
    data::{BatchKey, Split},
    error::{Error, Result},
    host::{Event, Reach},
    model::{self, chunked_loss},
};

impl Run {
    pub(super) fn evaluate(&mut self, step: u64, lr: f64, phases: PhaseTimes) -> Result<()> {
        let (rank, world, device) = (self.env.rank as u64, self.env.world as u64, self.env.device);
        let b = self.env.config.data.batch_size as u64;
        let batches = self.env.config.train.eval_batches.max(1);
        let chunk = self.env.config.train.loss_chunk;
        let learner = &mut self.learner;
        // Instruction data: the loss summed over trained tokens, and their count.
        let mut per_token = false;
        let mut sums = tch::no_grad(|| -> Result<Tensor> {
            let mut acc = Tensor::zeros([3], (Kind::Double, device));
            for i in 0..batches {
                let key = BatchKey { step: i, micro: 0, first_sample: rank * b, count: b, stream: i * world * b + rank * b };
                let batch = learner.dataset.batch(Split::Val, key)?.to_device(device, true);
                // train.loss_chunk: the summed loss a chunk of positions at a time.
                let chunked = match chunk {
                    0 => None,
                    _ => learner.forward_hidden(&batch, false)?.map(|(h, w)| chunked_loss::summed(&h, &w, &batch.targets, chunk)).transpose()?,
                };
                let zero = || Tensor::zeros([], (Kind::Double, device));
                if let Some(trained) = batch.trained_tokens {
                    per_token = true;
                    let loss = match chunked {
                        Some(sum) => sum,
                        None => model::token_loss(&learner.forward(&batch, false)?, &batch.targets, tch::Reduction::Sum)?,
                    };
                    acc += Tensor::stack(&[loss.to_kind(Kind::Double), zero(), Tensor::from(trained as f64).to_device(device)], 0);
                    continue;
                }
                let (loss, right) = match chunked {
                    Some(sum) => (sum.to_kind(Kind::Double) / batch.targets.ne(-100).sum(Kind::Double).clamp_min(1.0), zero()),
                    None => {
                        let logits = learner.forward(&batch, false)?;
                        let loss = model::loss(learner.task, &logits, &batch.targets).to_kind(Kind::Double);
                        let right = match learner.task {
                            Task::Classification => logits.argmax(-1, false).eq_tensor(&batch.targets).sum(Kind::Double),
                            Task::LanguageModel => zero(),
                        };
                        (loss, right)
                    }
                };
                acc += Tensor::stack(&[loss, right, Tensor::from(batch.targets.size()[0] as f64).to_device(device)], 0);
            }
            Ok(acc)
        })?;
        self.dist.all_reduce_sum(&mut sums).map_err(Error::Dist)?;
        // A failed read is an error, never an eval loss of 0.
        let [loss_sum, correct, count] = <[f64; 3]>::try_from(Vec::<f64>::try_from(sums.f_to_device(Device::Cpu)?)?)
            .map_err(|v| Error::Other(format!("evaluation read {} values, not 3", v.len())))?;
        let loss = if per_token { loss_sum / count.max(1.0) } else { loss_sum / (batches * world) as f64 };
        let accuracy = (learner.task == Task::Classification).then(|| correct / count.max(1.0));
        self.tally.evals.push(EvalPoint { step, loss, accuracy });
        let accuracy_text = accuracy.map(|a| format!(", accuracy {a:.3}")).unwrap_or_default();
        self.metrics.progress.println(&format!("eval at step {step}: loss {loss:.4}{accuracy_text}"));
        let mut metrics = vec![Metric::scalar("eval/loss", loss)];
        if let Some(a) = accuracy {
            metrics.push(Metric::scalar("eval/accuracy", a));
        }
        let scalars: Vec<Scalar<'_>> = metrics.iter().filter_map(|m| Some(Scalar { name: m.name.as_rstr(), value: m.as_scalar()? })).collect();
        let at = At { hook: Hook::Eval, step, micro_batch: 0, lr, phases };
        let ctx = step_context(&self.env, &self.tally, self.learner.dataset.train_len(), at, StepTensors::NONE, &scalars);
        self.host.dispatch(Event::Step(&ctx), Reach::Due(self.schedule.due()));
        self.metrics.emitted.extend(metrics);
        Ok(())
    }
}
