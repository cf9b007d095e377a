//! A multi-layer perceptron classifier with ReLU activations, and its descriptor.

use tch::nn;

use super::{family::FamilySpec, Layer, Model, ModelInput, ModelOutput, Task};
use crate::{
    config::{Config, ModelKind},
    data::Dataset,
    error::{ConfigError, Error, Result},
};

/// The `mlp` kind, registered in `model::family`.
pub const SPEC: FamilySpec = FamilySpec::without_blocks(ModelKind::Mlp, build);

/// The configured classifier, its widths taken from the data where unset.
fn build(config: &Config, vs: &nn::Path, dataset: &dyn Dataset) -> Result<Box<dyn Model>> {
    let m = &config.model;
    let input_dim = if m.mlp.input_dim > 0 { m.mlp.input_dim } else { dataset.input_dim() };
    let classes = if m.mlp.num_classes > 0 { m.mlp.num_classes } else { dataset.num_classes() };
    if input_dim <= 0 || classes <= 1 {
        return Err(Error::Config(ConfigError {
            origin: "configuration".into(),
            key: "model.kind".into(),
            message: "mlp needs classification data (data.kind = \"jsonl\" or synthetic classification)".into(),
        }));
    }
    Ok(Box::new(Mlp::new(vs, input_dim, &m.mlp.hidden, classes)))
}

pub struct Mlp {
    layers: Vec<nn::Linear>,
    dims: Vec<i64>,
}

impl Mlp {
    pub fn new(vs: &nn::Path, input_dim: i64, hidden: &[i64], classes: i64) -> Mlp {
        let dims: Vec<i64> = std::iter::once(input_dim).chain(hidden.iter().copied()).chain([classes]).collect();
        let layers = dims.windows(2).enumerate().map(|(i, w)| nn::linear(vs / "layers" / i, w[0], w[1], Default::default())).collect();
        Mlp { layers, dims }
    }
}

impl Model for Mlp {
    /// With tch's `f_` functions: a libtorch error comes back as an error.
    fn forward(&mut self, input: ModelInput) -> Result<ModelOutput> {
        let first = &self.layers[0];
        let mut x = input.tokens.f_linear(&first.ws, first.bs.as_ref())?;
        for layer in &self.layers[1..] {
            x = x.f_relu()?.f_linear(&layer.ws, layer.bs.as_ref())?;
        }
        Ok(ModelOutput::Logits(x))
    }

    fn task(&self) -> Task {
        Task::Classification
    }

    fn kind(&self) -> &str {
        "mlp"
    }

    fn uses_randomness(&self) -> bool {
        false
    }

    fn layers(&self, _seq_len: i64) -> Vec<Layer> {
        self.dims.windows(2).enumerate().map(|(i, w)| Layer::linear(format!("layers.{i}"), w[0], w[1], 1, i > 0)).collect()
    }
}
