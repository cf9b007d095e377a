//! A multi-layer perceptron classifier with ReLU activations.

use tch::nn;

use super::{Layer, Model, ModelInput, ModelOutput, Task};
use crate::error::Result;

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
