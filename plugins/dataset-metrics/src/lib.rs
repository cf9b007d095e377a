//! `dataset-metrics`: loss, accuracy and sample count per named dataset of a mix;
//! for instruction data, loss per trained token and token count per source.
//!
//! Every step (attachment `accumulate`, after the forward pass) the batch's
//! per-sample losses and hits are added on the device to a `[3, datasets]` tensor
//! keyed by dataset id: no value reaches the host. At the cadence (attachment
//! `report`, every 50 steps and at the end) the sums are all-reduced across ranks
//! in one collective, read once, emitted as window means and zeroed.
//! See docs/plugins/dataset-metrics.md.

mod accumulator;

use ptrain_plugin_api::{
    export_plugin, parse_options, Attachment, Cadence, Descriptor, Hook, HostApi, LogLevel, Needs, Outbox, Plugin, PluginError, PluginResult,
    RunInfo, StepContext, Task, TensorRef, Threading,
};
use serde::Deserialize;

use accumulator::Accumulator;
use accumulator::{CORRECT, LOSS, SAMPLES};

const NAME: &str = "dataset-metrics";

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Options {}

const ATTACHMENTS: &[Attachment] = &[
    Attachment::new("report", Hook::StepEnd, Cadence::every(50).with_end()),
    Attachment::new("accumulate", Hook::AfterForward, Cadence::every(1)).needs(Needs::LOGITS.union(Needs::LABELS).union(Needs::DATASET_IDS)),
];

/// Metric names of one dataset, built once.
struct Names {
    loss: String,
    accuracy: String,
    samples: String,
}

pub struct DatasetMetrics {
    host: HostApi,
    names: Vec<Names>,
    accuracy: bool,
    acc: Option<Accumulator>,
    /// Off for data without dataset ids, after saying so once.
    active: bool,
    rank: u32,
}

impl DatasetMetrics {
    fn stop(&mut self, why: &str) {
        if self.active {
            self.active = false;
            self.acc = None;
            // Every rank sees the same data: one of them says so, and every one
            // leaves the schedule, so the loop stops calling.
            if self.rank == 0 {
                self.host.log(LogLevel::Warn, NAME, &format!("{why}: no per-dataset metrics"));
            }
            self.host.detach(NAME, why);
        }
    }

    fn accumulate(&mut self, ctx: &StepContext<'_>) -> PluginResult {
        let t = &ctx.tensors;
        let added = t.logits.with(|logits| {
            t.labels.with(|labels| {
                t.dataset_ids.with(|ids| {
                    let acc = self.acc.as_mut().expect("active");
                    match (logits.dim(), labels.dim(), ids.dim()) {
                        (2, 1, 1) => acc.add(logits, labels, ids)?,
                        // Instruction data: per-token dataset ids.
                        (3, 2, 2) => acc.add_tokens(logits, labels, ids)?,
                        _ => return Ok(false),
                    }
                    Ok::<_, tch::TchError>(true)
                })
            })
        });
        match added.flatten().flatten() {
            Some(Ok(true)) => Ok(()),
            Some(Ok(false)) => {
                self.stop("logits are neither [batch, classes] nor [batch, positions, vocabulary] with per-token dataset ids");
                Ok(())
            }
            Some(Err(e)) => Err(e.into()),
            None => {
                self.stop("the step carries no dataset ids, or no logits (train.loss_chunk never makes the whole logits)");
                Ok(())
            }
        }
    }

    fn report(&mut self, out: &mut Outbox) -> PluginResult {
        let Some(acc) = self.acc.as_mut() else { return Ok(()) };
        if let Some(sums) = acc.sums()? {
            // Every rank reaches this at the same step: one collective per report.
            self.host.all_reduce_sum(TensorRef::of(sums)).map_err(PluginError::msg)?;
        }
        let Some(sums) = acc.take()? else { return Ok(()) };
        for (d, names) in self.names.iter().enumerate() {
            let n = sums[SAMPLES][d];
            if n <= 0.0 {
                continue;
            }
            out.scalar(names.loss.as_str(), sums[LOSS][d] / n);
            if self.accuracy {
                out.scalar(names.accuracy.as_str(), sums[CORRECT][d] / n);
            }
            out.scalar(names.samples.as_str(), n);
        }
        Ok(())
    }
}

impl Plugin for DatasetMetrics {
    const DESCRIPTOR: Descriptor =
        Descriptor::new(NAME, env!("CARGO_PKG_VERSION"), "per-dataset loss and accuracy, accumulated on the device", Threading::Inline, ATTACHMENTS);

    fn new(options: serde_json::Value, host: HostApi) -> PluginResult<Self> {
        let _: Options = parse_options(options)?;
        Ok(DatasetMetrics { host, names: Vec::new(), accuracy: false, acc: None, active: false, rank: 0 })
    }

    fn on_run_start(&mut self, run: &RunInfo<'_>) -> PluginResult {
        self.names = run
            .datasets
            .iter()
            .map(|d| Names {
                loss: format!("dataset/{d}/loss"),
                accuracy: format!("dataset/{d}/accuracy"),
                // A language model's loss is per trained token: it counts tokens.
                samples: if run.model.task == Task::Classification { format!("dataset/{d}/samples") } else { format!("dataset/{d}/tokens") },
            })
            .collect();
        // Classes, or for a language model the trained tokens predicted by arg-max.
        self.accuracy = true;
        self.rank = run.rank;
        self.active = true;
        if self.names.is_empty() {
            self.stop("the data has no named datasets ([[data.datasets]] of classification rows or instruction data)");
        } else {
            self.acc = Some(Accumulator::new(self.names.len()));
        }
        Ok(())
    }

    fn on_step(&mut self, ctx: &StepContext<'_>, out: &mut Outbox) -> PluginResult {
        if !self.active {
            return Ok(());
        }
        match ctx.hook {
            Hook::AfterForward => self.accumulate(ctx),
            Hook::StepEnd => self.report(out),
            _ => Ok(()),
        }
    }
}

export_plugin!(DatasetMetrics);

#[cfg(test)]
mod tests;
