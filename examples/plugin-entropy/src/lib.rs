//! `entropy`: an example third-party plugin.
//!
//! Every 25 steps (and at the first) it reads the batch's logits, computes the mean
//! entropy of the model's predictive distribution on the device, and emits it as
//! `entropy/mean`. When the entropy falls below `warn_below` it warns (once): a
//! collapsing entropy often means an overconfident or degenerate model.
//!
//! It shows the whole plugin surface: a declared cadence the user can override
//! (`[plugins.entropy] every = 10`), options (`warn_below`), reading tensors the host
//! hands over only when due, emitting metrics, logging through the host, and state
//! kept in checkpoints (`save_state`/`load_state` reach every plugin; no attachment is
//! needed for them, nor for `on_run_start`/`on_run_end`: docs/plugins.md, section 4).

use ptrain_plugin_api::{
    export_plugin, parse_options, Attachment, Cadence, Descriptor, Hook, HostApi, LogLevel, Needs, Outbox, Plugin, PluginResult, StepContext,
    Threading,
};
use serde::Deserialize;
use tch::Kind;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct Options {
    /// Warn when the mean entropy (nats) falls below this.
    warn_below: f64,
}

impl Default for Options {
    fn default() -> Self {
        Options { warn_below: 0.01 }
    }
}

pub struct Entropy {
    options: Options,
    host: HostApi,
    warned: bool,
}

const ATTACHMENTS: &[Attachment] = &[
    // Only on due steps does the host hand over the logits.
    Attachment::new("measure", Hook::AfterForward, Cadence::every(25).with_first_step()).needs(Needs::LOGITS),
];

impl Plugin for Entropy {
    const DESCRIPTOR: Descriptor = Descriptor::new(
        "entropy",
        env!("CARGO_PKG_VERSION"),
        "mean prediction entropy of the batch (example plugin)",
        Threading::Inline,
        ATTACHMENTS,
    );

    fn new(options: serde_json::Value, host: HostApi) -> PluginResult<Self> {
        Ok(Entropy { options: parse_options(options)?, host, warned: false })
    }

    fn on_step(&mut self, ctx: &StepContext<'_>, out: &mut Outbox) -> PluginResult {
        // With gradient accumulation AfterForward comes once per micro-batch; one
        // sample of the step is enough here.
        if ctx.micro_batch > 0 {
            return Ok(());
        }
        let entropy = ctx.tensors.logits.with(|logits| {
            // Entropy of softmax(logits) over the last dimension, averaged over every
            // prediction; computed on the device, read once (this is a due step).
            let logp = logits.detach().to_kind(Kind::Float).log_softmax(-1, Kind::Float);
            let h = -(logp.exp() * &logp).sum_dim_intlist(-1, false, Kind::Float);
            h.mean(Kind::Float).double_value(&[])
        });
        let Some(entropy) = entropy else { return Ok(()) };
        out.scalar("entropy/mean", entropy);
        if entropy < self.options.warn_below && !self.warned {
            self.warned = true;
            self.host.log(
                LogLevel::Warn,
                "entropy",
                &format!("mean prediction entropy {entropy:.4} at step {} is below {}", ctx.step, self.options.warn_below),
            );
        }
        Ok(())
    }

    // Checkpointed, so a resumed run does not warn again.
    fn save_state(&mut self) -> PluginResult<Vec<u8>> {
        Ok(vec![self.warned as u8])
    }

    fn load_state(&mut self, state: &[u8]) -> PluginResult {
        self.warned = state.first() == Some(&1);
        Ok(())
    }
}

export_plugin!(Entropy);

#[cfg(test)]
mod tests {
    use ptrain_plugin_api::{testing, StepTensors, TensorRef};

    use super::*;

    fn measure(plugin: &mut Entropy, logits: &tch::Tensor, step: u64) -> Option<f64> {
        let tensors = StepTensors { logits: TensorRef::of(logits), ..StepTensors::NONE };
        let mut out = Outbox::new();
        plugin.on_step(&StepContext { tensors, ..testing::step(Hook::AfterForward, step) }, &mut out).unwrap();
        testing::scalar(&testing::scalars(&mut out), "entropy/mean")
    }

    #[test]
    fn uniform_predictions_have_the_entropy_of_a_fair_die_and_certain_ones_warn_once() {
        let mut plugin = Entropy::new(serde_json::json!({ "warn_below": 0.1 }), HostApi::standalone()).unwrap();
        let uniform = tch::Tensor::zeros([4, 6], (Kind::Float, tch::Device::Cpu));
        assert!((measure(&mut plugin, &uniform, 1).unwrap() - 6f64.ln()).abs() < 1e-6);
        assert!(!plugin.warned);
        let certain = tch::Tensor::from_slice(&[100f32, 0.0, 0.0]).view([1, 3]);
        assert!(measure(&mut plugin, &certain, 2).unwrap() < 1e-6);
        assert!(plugin.warned);
        assert_eq!(plugin.save_state().unwrap(), [1], "a resumed run does not warn again");
    }

    #[test]
    fn a_step_without_logits_emits_nothing() {
        let mut plugin = Entropy::new(serde_json::json!({}), HostApi::standalone()).unwrap();
        let mut out = Outbox::new();
        plugin.on_step(&testing::step(Hook::AfterForward, 1), &mut out).unwrap();
        assert!(testing::scalars(&mut out).is_empty());
    }
}
