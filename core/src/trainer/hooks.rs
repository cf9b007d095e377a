//! What an inline plugin is handed at a hook point: the step context, built from
//! the run's state and the tensors alive at that point, and the call ([`HookCall`]).

use abi_stable::std_types::{RSlice, RStr};
use ptrain_plugin_api::{Hook, NamedTensor, Needs, PhaseTimes, Scalar, StepContext, StepTensors, TensorRef};
use tch::Tensor;

use super::{clock::unix_now, run::RunEnv, tally::Tally};
use crate::{
    host::{Event, PluginHost, Reach},
    schedule::RunSchedule,
};

/// Where in the run a hook is called.
#[derive(Clone, Copy)]
pub(super) struct At {
    pub hook: Hook,
    pub step: u64,
    pub micro_batch: u64,
    pub lr: f64,
    /// This step's phase times so far.
    pub phases: PhaseTimes,
}

/// The context of a call at `at`, without parameters and gradients.
pub(super) fn step_context<'a>(
    env: &'a RunEnv,
    tally: &Tally,
    train_len: u64,
    at: At,
    tensors: StepTensors,
    scalars: &'a [Scalar<'a>],
) -> StepContext<'a> {
    StepContext {
        hook: at.hook,
        step: at.step,
        micro_batch: at.micro_batch,
        epoch: tally.samples_seen / train_len.max(1),
        lr: at.lr,
        samples_seen: tally.samples_seen,
        tokens_seen: tally.tokens_seen,
        step_samples: tally.step_samples,
        step_tokens: tally.step_tokens,
        step_trained_tokens: tally.step_trained_tokens,
        phases: at.phases,
        phases_total: tally.phases_total,
        steps_run: at.step - env.start_step,
        elapsed_s: unix_now() - env.unix_start,
        rank: env.rank,
        world_size: env.world,
        device: env.run_data.device(),
        scalars: RSlice::from_slice(scalars),
        tensors,
        params: RSlice::EMPTY,
        grads: RSlice::EMPTY,
    }
}

/// Borrowed handles of named tensors, for a context's `params` and `grads`.
pub(super) fn named<'a>(tensors: impl Iterator<Item = (&'a String, &'a Tensor)>) -> Vec<NamedTensor<'a>> {
    tensors.map(|(n, t)| NamedTensor { name: RStr::from_str(n), tensor: TensorRef::of(t) }).collect()
}

/// Calls the inline plugins due at a hook point, with what their step context is
/// built from, borrowed from the run.
pub(super) struct HookCall<'a> {
    pub env: &'a RunEnv,
    pub tally: &'a Tally,
    /// Distinct training samples, for the context's epoch.
    pub train_len: u64,
    pub host: &'a mut PluginHost,
    pub schedule: &'a RunSchedule,
}

impl HookCall<'_> {
    /// Calls the plugins due at `at.hook`. Each gets the tensors its due attachments
    /// asked for; parameter and gradient handles (of `params`) are gathered only for
    /// the (rare) calls that asked for them.
    pub fn call(&mut self, at: At, tensors: StepTensors, params: &[(String, Tensor)]) {
        let wants_params = self.schedule.due().wants(at.hook, Needs::PARAMS.union(Needs::GRADS));
        let grads: Vec<Tensor> = if wants_params { params.iter().map(|(_, t)| t.grad()).collect() } else { Vec::new() };
        let param_refs = if wants_params { named(params.iter().map(|(n, t)| (n, t))) } else { Vec::new() };
        let grad_refs = if wants_params { named(params.iter().map(|(n, _)| n).zip(&grads)) } else { Vec::new() };
        let mut ctx = step_context(self.env, self.tally, self.train_len, at, tensors, &[]);
        ctx.params = RSlice::from_slice(&param_refs);
        ctx.grads = RSlice::from_slice(&grad_refs);
        self.host.dispatch(Event::Step(&ctx), Reach::Due(self.schedule.due()));
    }
}
