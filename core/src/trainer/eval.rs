//! Evaluation on the held-out split: `train.eval_batches` batches through the
//! run's objective, their `(sum, count)` and metric sums added up on the device,
//! reduced over ranks in one collective and read once.

use ptrain_plugin_api::{Hook, Metric, PhaseTimes, Scalar, StepTensors};
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
};

impl Run {
    pub(super) fn evaluate(&mut self, step: u64, lr: f64, phases: PhaseTimes) -> Result<()> {
        let (rank, world, device) = (self.env.rank as u64, self.env.world as u64, self.env.device);
        let b = self.env.config.data.batch_size as u64;
        let batches = self.env.config.train.eval_batches.max(1);
        let (learner, objective) = (&mut self.learner, &self.objective);
        // [loss sum, count, metric sums...], in float64.
        let mut names = Vec::new();
        let sums = tch::no_grad(|| -> Result<Option<Tensor>> {
            let mut acc: Option<Tensor> = None;
            for i in 0..batches {
                let key = BatchKey { step: i, micro: 0, first_sample: rank * b, count: b, stream: i * world * b + rank * b };
                let batch = learner.dataset.batch(Split::Val, key)?.to_device(device, true);
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
        self.dist.all_reduce_sum(&mut sums).map_err(Error::Dist)?;
        // A failed read is an error, never an eval loss of 0.
        let values = Vec::<f64>::try_from(sums.f_to_device(Device::Cpu)?)?;
        if values.len() != 2 + names.len() {
            return Err(Error::Other(format!("evaluation read {} values, not {}", values.len(), 2 + names.len())));
        }
        let count = values[1].max(1.0);
        let loss = values[0] / count;
        let metrics: Vec<(&str, f64)> = names.iter().zip(&values[2..]).map(|(name, sum)| (*name, sum / count)).collect();
        let accuracy = metrics.iter().find(|(name, _)| *name == "accuracy").map(|(_, a)| *a);
        self.tally.evals.push(EvalPoint { step, loss, accuracy });
        let metrics_text: String = metrics.iter().map(|(name, v)| format!(", {name} {v:.3}")).collect();
        self.metrics.progress.println(&format!("eval at step {step}: loss {loss:.4}{metrics_text}"));
        let mut metrics: Vec<Metric> = metrics.into_iter().map(|(name, v)| Metric::scalar(format!("eval/{name}"), v)).collect();
        metrics.insert(0, Metric::scalar("eval/loss", loss));
        let scalars: Vec<Scalar<'_>> = metrics.iter().filter_map(|m| Some(Scalar { name: m.name.as_rstr(), value: m.as_scalar()? })).collect();
        let at = At { hook: Hook::Eval, step, micro_batch: 0, lr, phases };
        let ctx = step_context(&self.env, &self.tally, self.learner.dataset.train_len(), at, StepTensors::NONE, &scalars);
        self.host.dispatch(Event::Step(&ctx), Reach::Due(self.schedule.due()));
        self.metrics.emitted.extend(metrics);
        Ok(())
    }
}
