use tch::{Device, Kind};

use super::*;
use crate::{
    config::{Config, ConfigBuilder},
    data::{BatchKey, Dataset, Split},
    dist::SingleRank,
    objective::{self, Count},
};

fn tiny_gpt(accum: u64) -> Config {
    let sets = ["model.kind=\"gpt\"", "model.n_layer=1", "model.n_head=2", "model.n_embd=16", "model.block_size=8", "data.batch_size=2"];
    let mut builder = ConfigBuilder::default();
    for set in sets.iter().map(|s| s.to_string()).chain([format!("optim.accum_steps={accum}"), "optim.grad_clip=1.0".into()]) {
        builder = builder.set(&set).unwrap();
    }
    builder.build().unwrap()
}

/// The training batches of steps 1.. in order, `accum` a step.
struct Drawn {
    dataset: std::sync::Arc<dyn Dataset>,
    next: u64,
    accum: u64,
}

impl MicroBatches for Drawn {
    fn next(&mut self) -> Result<Batch> {
        let (step, micro) = (self.next / self.accum + 1, self.next % self.accum);
        self.next += 1;
        self.dataset.batch(Split::Train, BatchKey { step, micro, first_sample: 0, count: 2, stream: 2 * (step * self.accum + micro) })
    }
}

/// Nothing around the core (what a captured step runs with).
struct NoSeams;

impl Seams for NoSeams {}

/// Remembers which seams were called, in order, and what the losses were.
#[derive(Default)]
struct Recorded {
    calls: Vec<String>,
    losses: Vec<f64>,
}

impl Seams for Recorded {
    fn fetched(&mut self, micro: u64, _batch: &Batch) {
        self.calls.push(format!("fetched {micro}"));
    }
    fn forwarded(&mut self, _: &Learner, micro: u64, _: &Batch, logits: Option<&Tensor>, loss: &mut Tensor) -> Result<()> {
        assert!(logits.is_some_and(|l| l.size() == [2, 8, 256]), "the whole logits without a chunked loss");
        self.losses.push(loss.double_value(&[]));
        self.calls.push(format!("forwarded {micro}"));
        Ok(())
    }
    fn backwarded(&mut self, micro: u64) {
        self.calls.push(format!("backwarded {micro}"));
    }
    fn before_update(&mut self, learner: &Learner, _: &Tensor, tokens: u64) -> Result<()> {
        assert!(learner.params.iter().all(|(_, p)| p.grad().defined()), "the gradients are there before the update");
        self.calls.push(format!("before_update {tokens}"));
        Ok(())
    }
    fn updated(&mut self, _: &Learner) -> Result<()> {
        self.calls.push("updated".into());
        Ok(())
    }
}

/// `steps` steps of the core over the tiny gpt's data; their losses and the seams' record.
fn train(accum: u64, steps: u64, seams: &mut dyn Seams) -> Vec<f64> {
    let config = tiny_gpt(accum);
    tch::manual_seed(3);
    let mut learner = Learner::for_tests(&config);
    let objective = objective::from_config(&config, learner.model.task());
    let mut nonfinite = NonFinite::new(&config.train, Device::Cpu, 0, (0, 0));
    let mut batches = Drawn { dataset: learner.dataset.clone(), next: 0, accum };
    let (scale, _) = StepScale::of_step(Count::MicroBatch, accum, &SingleRank, Device::Cpu).unwrap();
    learner.lr.set(1e-2).unwrap();
    let mut losses = Vec::new();
    for step in 1..=steps {
        let core =
            StepCore { learner: &mut learner, objective: objective.as_ref(), dist: &mut SingleRank, nonfinite: &mut nonfinite, grad_clip: 1.0 };
        let input = StepInput { step, accum, scale: &scale, grad_norm: false };
        let out = core.run(input, &mut batches, seams).unwrap();
        assert!(out.grad_norm.is_some(), "clipping computes the norm");
        assert_eq!(out.tokens, 16 * accum, "{accum} micro-batches of 2 x 8 positions");
        losses.push(out.loss.to_kind(Kind::Double).double_value(&[]));
    }
    losses
}

#[test]
fn seams_that_only_observe_leave_the_steps_as_the_bare_core_computes_them() {
    let bare = train(2, 3, &mut NoSeams);
    let mut recorded = Recorded::default();
    let observed = train(2, 3, &mut recorded);
    assert_eq!(bare, observed, "bit for bit");
    assert!(bare[2] < bare[0], "it learns: {bare:?}");
    let step: Vec<&str> = recorded.calls[..8].iter().map(String::as_str).collect();
    assert_eq!(
        step,
        ["fetched 0", "forwarded 0", "backwarded 0", "fetched 1", "forwarded 1", "backwarded 1", "before_update 32", "updated"],
        "each micro-batch forward then backward, then the update"
    );
    assert_eq!(recorded.calls.len(), 24);
    // Each micro-batch's loss is scaled to the step: half of the micro-batch's mean.
    let step_losses: Vec<f64> = recorded.losses.chunks(2).map(|c| c[0] + c[1]).collect();
    for (a, b) in step_losses.iter().zip(&bare) {
        assert!((a - b).abs() < 1e-6, "the step's loss is its scaled micro-batch losses' sum: {a} vs {b}");
    }
}

/// Changes the loss before backward, as a `[debug]` fault does.
struct Poisoned;

impl Seams for Poisoned {
    fn forwarded(&mut self, _: &Learner, _: u64, _: &Batch, _: Option<&Tensor>, loss: &mut Tensor) -> Result<()> {
        *loss *= f64::NAN;
        Ok(())
    }
}

#[test]
fn a_non_finite_loss_is_flagged_and_its_update_skipped_on_the_device() {
    let config = tiny_gpt(1);
    let mut learner = Learner::for_tests(&config);
    let objective = objective::from_config(&config, learner.model.task());
    let mut nonfinite = NonFinite::new(&config.train, Device::Cpu, 0, (0, 0));
    let before: Vec<Tensor> = learner.params.iter().map(|(_, p)| p.copy()).collect();
    let mut batches = Drawn { dataset: learner.dataset.clone(), next: 0, accum: 1 };
    let (scale, _) = StepScale::of_step(Count::MicroBatch, 1, &SingleRank, Device::Cpu).unwrap();
    learner.lr.set(1e-2).unwrap();
    let core = StepCore { learner: &mut learner, objective: objective.as_ref(), dist: &mut SingleRank, nonfinite: &mut nonfinite, grad_clip: 0.0 };
    let out = core.run(StepInput { step: 1, accum: 1, scale: &scale, grad_norm: false }, &mut batches, &mut Poisoned).unwrap();
    assert!(out.loss.double_value(&[]).is_nan() && out.grad_norm.is_none());
    for ((name, p), b) in learner.params.iter().zip(&before) {
        assert!(p.equal(b), "{name} was updated despite the NaN loss");
    }
    let _ = nonfinite.check(1);
    assert_eq!((nonfinite.run, nonfinite.total), (1, 1), "the flag is read at the check");
}

#[test]
fn the_update_runs_at_the_rate_the_learners_tensor_holds() {
    let config = tiny_gpt(1);
    let mut learner = Learner::for_tests(&config);
    let objective = objective::from_config(&config, learner.model.task());
    let mut nonfinite = NonFinite::new(&config.train, Device::Cpu, 0, (0, 0));
    let mut batches = Drawn { dataset: learner.dataset.clone(), next: 0, accum: 1 };
    let (scale, _) = StepScale::of_step(Count::MicroBatch, 1, &SingleRank, Device::Cpu).unwrap();
    let mut moved = Vec::new();
    for lr in [0.0, 1e-2] {
        let before: Vec<Tensor> = learner.params.iter().map(|(_, p)| p.copy()).collect();
        learner.lr.set(lr).unwrap();
        let core =
            StepCore { learner: &mut learner, objective: objective.as_ref(), dist: &mut SingleRank, nonfinite: &mut nonfinite, grad_clip: 0.0 };
        core.run(StepInput { step: 1, accum: 1, scale: &scale, grad_norm: false }, &mut batches, &mut NoSeams).unwrap();
        moved.push(learner.params.iter().zip(&before).any(|((_, p), b)| !p.equal(b)));
    }
    assert_eq!(moved, [false, true], "a zero rate leaves every parameter, 1e-2 moves them");
}
