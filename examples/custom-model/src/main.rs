//! Training your own model with ptrain as a library: implement `Model`, hand a
//! factory to `Trainer::with_model`, and keep everything else (data, optimizer,
//! schedule, plugins, checkpoints) from the configuration.
//!
//! ```sh
//! cargo run --release -p ptrain-example-custom-model -- [--plugins jsonl] [--run-dir DIR]
//! ```

use ptrain_core::{
    model::{Layer, Model, Task},
    ConfigBuilder, Trainer,
};
use tch::{nn, nn::Module, Tensor};

/// A residual MLP classifier: x + W2 relu(W1 norm(x)), per block.
struct ResidualMlp {
    input: nn::Linear,
    blocks: Vec<(nn::LayerNorm, nn::Linear, nn::Linear)>,
    head: nn::Linear,
    dims: (i64, i64, i64),
}

impl ResidualMlp {
    fn new(vs: &nn::Path, inputs: i64, width: i64, depth: usize, classes: i64) -> ResidualMlp {
        let blocks = (0..depth)
            .map(|i| {
                let b = vs / "blocks" / i;
                (
                    nn::layer_norm(&b / "norm", vec![width], Default::default()),
                    nn::linear(&b / "up", width, 2 * width, Default::default()),
                    nn::linear(&b / "down", 2 * width, width, Default::default()),
                )
            })
            .collect();
        ResidualMlp {
            input: nn::linear(vs / "input", inputs, width, Default::default()),
            blocks,
            head: nn::linear(vs / "head", width, classes, Default::default()),
            dims: (inputs, width, classes),
        }
    }
}

impl Model for ResidualMlp {
    fn forward(&mut self, inputs: &Tensor, _train: bool) -> Tensor {
        let mut x = self.input.forward(inputs);
        for (norm, up, down) in &self.blocks {
            x = &x + down.forward(&up.forward(&norm.forward(&x)).relu());
        }
        self.head.forward(&x)
    }

    fn task(&self) -> Task {
        Task::Classification
    }

    fn kind(&self) -> &str {
        "residual-mlp"
    }

    // Describing the layers gives the `flops` plugin an exact count.
    fn layers(&self, _seq_len: i64) -> Vec<Layer> {
        let (inputs, width, classes) = self.dims;
        let mut layers = vec![Layer::linear("input", inputs, width, 1, false)];
        for i in 0..self.blocks.len() {
            layers.push(Layer::linear(format!("blocks.{i}.up"), width, 2 * width, 1, true));
            layers.push(Layer::linear(format!("blocks.{i}.down"), 2 * width, width, 1, true));
        }
        layers.push(Layer::linear("head", width, classes, 1, true));
        layers
    }
}

fn main() -> anyhow::Result<()> {
    let flag = |name: &str| std::env::args().skip_while(|a| a != name).nth(1);
    let plugins: Vec<String> = flag("--plugins").map(|p| p.split(',').map(String::from).collect()).unwrap_or_default();
    let list = plugins.iter().map(|p| format!("{p:?}")).collect::<Vec<_>>().join(",");
    let mut config = ConfigBuilder::default()
        .file("configs/mlp-multi.toml".as_ref())?
        .set("run.name=\"custom-model\"")?
        .set("train.steps=150")?
        .set(&format!("run.plugins=[{list}]"))?;
    if let Some(dir) = flag("--run-dir") {
        config = config.set(&format!("run.run_dir={dir:?}"))?;
    }
    let config = config.build()?;
    let outcome = Trainer::new(config)
        .with_model(|vs, data| Ok(Box::new(ResidualMlp::new(vs, data.input_dim(), 64, 2, data.num_classes())) as Box<dyn Model>))
        .run()?;
    let s = &outcome.summary;
    println!(
        "{} {}: loss {:.4} -> {:.4}, eval accuracy {:.3}",
        s.model,
        s.status,
        s.first_loss.unwrap_or(f64::NAN),
        s.final_loss.unwrap_or(f64::NAN),
        s.evals.last().and_then(|e| e.accuracy).unwrap_or(f64::NAN)
    );
    Ok(())
}
