//! A multi-layer perceptron classifier with ReLU activations.

use tch::{nn, nn::Module, Tensor};

use super::{Layer, Model, Task};

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
    fn forward(&mut self, inputs: &Tensor, _train: bool) -> Tensor {
        let mut x = self.layers[0].forward(inputs);
        for layer in &self.layers[1..] {
            x = layer.forward(&x.relu());
        }
        x
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
