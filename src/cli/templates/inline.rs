//! `{{name}}`: an inline ptrain plugin (made by `ptrain plugins new {{name}}`).
//!
//! Every 20 steps, after the backward pass, it reads the gradients, computes their global
//! L2 norm and largest absolute value on the device (one read back per due step, none on the
//! others), and emits them as `{{name}}/grad_norm` and `{{name}}/grad_max_abs`: every sink
//! (jsonl, tensorboard, ...) receives them. Above `warn_above` it logs a warning.
//!
//! ```text
//! cargo build --release        # target/release/libptrain_plugin_{{lib}}.so
//! cargo test --release         # the unit test below, on plugin-api's testing fixtures
//! PTRAIN_PLUGIN_PATH=$PWD/target/release ptrain run --plugins {{name}},jsonl --set plugins.jsonl.every=20
//! ptrain run --plugins {{name}} --set plugins.{{name}}.every=5 --set plugins.{{name}}.warn_above=10.0
//! ```

use ptrain_plugin_api::{
    export_plugin, parse_options, Attachment, Cadence, Descriptor, Hook, HostApi, LogLevel, Needs,
    Outbox, Plugin, PluginResult, StepContext, Threading,
};
use serde::Deserialize;
use tch::{Kind, Tensor};

/// Options: the keys of `[plugins.{{name}}]` other than the cadence keys (`every`,
/// `first_step`, ...), which the host applies to the first attachment below.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
struct Options {
    /// Warn when the global gradient norm exceeds this.
    warn_above: Option<f64>,
}

pub struct {{Type}} {
    options: Options,
    host: HostApi,
}

const ATTACHMENTS: &[Attachment] = &[
    // The host hands over the gradients (`ctx.grads`) only on due steps, and only
    // because the attachment asks for them.
    Attachment::new("grads", Hook::AfterBackward, Cadence::every(20)).needs(Needs::GRADS),
];

impl Plugin for {{Type}} {
    const DESCRIPTOR: Descriptor = Descriptor::new(
        "{{name}}",
        env!("CARGO_PKG_VERSION"),
        "global gradient norm and largest gradient every 20 steps",
        Threading::Inline,
        ATTACHMENTS,
    );

    fn new(options: serde_json::Value, host: HostApi) -> PluginResult<Self> {
        let options: Options = parse_options(options)?;
        // A bad option is refused here: the run stops before training (exit 2) with
        // this message. `Err("...".into())` and `bail!("...")` work too.
        if let Some(limit) = options.warn_above.filter(|limit| *limit <= 0.0) {
            return Err(format!("warn_above = {limit}: must be above 0").into());
        }
        Ok({{Type}} { options, host })
    }

    fn on_step(&mut self, ctx: &StepContext<'_>, out: &mut Outbox) -> PluginResult {
        // Per-parameter norms and maxima, on the device; each handle is borrowed for
        // the duration of `with` (never keep it), the results are new tensors.
        let (mut norms, mut maxima) = (Vec::new(), Vec::new());
        for grad in ctx.grads.iter() {
            grad.tensor.with(|g| {
                // Undefined for a parameter that got no gradient this step (unused
                // in the forward pass): skip it.
                if g.defined() {
                    let g = g.detach().to_kind(Kind::Float);
                    norms.push(g.norm());
                    maxima.push(g.abs().max());
                }
            });
        }
        if norms.is_empty() {
            return Ok(());
        }
        // One host/device synchronisation for both figures, on this due step only.
        let both = Tensor::stack(
            &[
                Tensor::stack(&norms, 0).norm(),
                Tensor::stack(&maxima, 0).max(),
            ],
            0,
        )
        .to_kind(Kind::Double);
        let values = Vec::<f64>::try_from(both.to_device(tch::Device::Cpu))?;
        let (norm, max_abs) = (values[0], values[1]);
        out.scalar("{{name}}/grad_norm", norm);
        out.scalar("{{name}}/grad_max_abs", max_abs);
        if self.options.warn_above.is_some_and(|limit| norm > limit) {
            self.host.log(
                LogLevel::Warn,
                "{{name}}",
                &format!("gradient norm {norm:.3} at step {}", ctx.step),
            );
        }
        Ok(())
    }
}

export_plugin!({{Type}});

#[cfg(test)]
mod tests {
    use ptrain_plugin_api::{testing, NamedTensor, TensorRef};

    use super::*;

    #[test]
    fn emits_the_global_norm_and_the_largest_gradient_and_warns_above_the_limit() {
        let options = serde_json::json!({ "warn_above": 10.0 });
        // Records what the plugin asks of the host (logs, stop requests, ...).
        let host = testing::RecordingHost::new();
        let mut plugin = {{Type}}::new(options, host.api()).unwrap();
        // Two parameters' gradients, as the host would hand them over at a due step.
        let w = Tensor::from_slice(&[3.0f32, 0.0, -4.0]);
        let b = Tensor::from_slice(&[12.0f32]);
        let grads = [
            NamedTensor::new("layer.weight", TensorRef::of(&w)),
            NamedTensor::new("layer.bias", TensorRef::of(&b)),
        ];
        let ctx = StepContext {
            grads: grads.as_slice().into(),
            ..testing::step(Hook::AfterBackward, 20)
        };
        let mut out = Outbox::new();
        plugin.on_step(&ctx, &mut out).unwrap();
        let emitted = testing::scalars(&mut out);
        let norm = testing::scalar(&emitted, "{{name}}/grad_norm").unwrap();
        assert!((norm - 13.0).abs() < 1e-5, "{norm}"); // sqrt(9 + 16 + 144)
        let max_abs = testing::scalar(&emitted, "{{name}}/grad_max_abs");
        assert_eq!(max_abs, Some(12.0));
        // 13 > warn_above: one warning, and no request to stop the run.
        let warning = (LogLevel::Warn, "gradient norm 13.000 at step 20".to_string());
        assert_eq!(host.logs(), vec![warning]);
        assert!(host.stops().is_empty() && host.failure_stops().is_empty());
    }

    #[test]
    fn a_limit_that_is_not_above_zero_is_refused() {
        let options = serde_json::json!({ "warn_above": 0.0 });
        let err = {{Type}}::new(options, HostApi::standalone()).err().unwrap();
        assert_eq!(err.message(), "warn_above = 0: must be above 0");
    }

    #[test]
    fn a_misspelt_option_is_refused_naming_it() {
        let options = serde_json::json!({ "warn_abov": 1.0 });
        let result = {{Type}}::new(options, HostApi::standalone());
        let err = result.err().expect("a misspelt option is refused");
        assert!(err.message().contains("warn_abov"), "{err}");
    }
}
