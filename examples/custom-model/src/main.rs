//! Training your own model with ptrain as a library: implement `Model`, hand a
//! factory to `Trainer::with_model`, and keep everything else (data, optimizer,
//! schedule, plugins, checkpoints) from the configuration.
//!
//! ```sh
//! cargo run --release -p ptrain-example-custom-model -- [--plugins jsonl] [--run-dir DIR]
//!     [--dropout P] [--steps N] [--resume PATH] [--set section.key=value]...
//! ```
//!
//! With `--dropout` the model draws random numbers in training; it says so through
//! `Model::uses_randomness` (the default), so a resumed run repeats the
//! uninterrupted one exactly.
//!
//! Started by torchrun (`torchrun --no-python --nproc-per-node 2 <binary> ...`) each
//! process joins the group its environment describes (`ptrain_dist::from_env`), and
//! every `dist.shard` mode applies to the model: under `"parameters"` each rank
//! builds it whole, then keeps its shard of every block (`blocks.<i>.` in a name
//! makes a block).

use std::sync::Arc;

use ptrain_core::{
    model::{decoder::BlockWrap, Layer, Model, ModelInput, ModelOutput, Task},
    ConfigBuilder, Resume, Trainer,
};
use tch::{nn, nn::Module, Tensor};

/// A residual MLP classifier: x + W2 dropout(relu(W1 norm(x))), per block.
struct ResidualMlp {
    input: nn::Linear,
    blocks: Vec<(nn::LayerNorm, nn::Linear, nn::Linear)>,
    head: nn::Linear,
    dims: (i64, i64, i64),
    dropout: f64,
    /// Parameter sharding's gathers around each block (`Model::wrap_blocks`).
    wrap: Option<Arc<dyn BlockWrap>>,
}

impl ResidualMlp {
    fn new(vs: &nn::Path, inputs: i64, width: i64, depth: usize, classes: i64, dropout: f64) -> ResidualMlp {
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
            dropout,
            wrap: None,
        }
    }
}

impl Model for ResidualMlp {
    // A classifier reads the input's tokens (here features) and train flag, and
    // returns logits. `forward` returns a `Result`: libtorch errors (a bad shape, out
    // of memory) from tch's `f_` functions end the run as failed, with its summary
    // written. `Module::forward` panics on them instead, which the trainer also catches.
    fn forward(&mut self, input: ModelInput) -> ptrain_core::Result<ModelOutput> {
        let linear = |l: &nn::Linear, x: &Tensor| x.f_linear(&l.ws, l.bs.as_ref());
        if let Some(wrap) = &self.wrap {
            wrap.enter()?;
        }
        let mut x = linear(&self.input, input.tokens)?;
        for (i, (norm, up, down)) in self.blocks.iter().enumerate() {
            let mut block = || -> ptrain_core::Result<Tensor> {
                let h = linear(up, &norm.forward(&x))?.f_relu()?.f_dropout(self.dropout, input.train)?;
                Ok(x.f_add(&linear(down, &h)?)?)
            };
            x = match &self.wrap {
                Some(wrap) => wrap.around(i, &x, false, &mut block)?,
                None => block()?,
            };
        }
        Ok(ModelOutput::Logits(linear(&self.head, &x)?))
    }

    // Under `dist.shard = "parameters"` each block's parameters (those named
    // `blocks.<i>.`) exist only while `wrap` runs the block: it gathers them before
    // and frees them after. Without this the trainer refuses parameter sharding.
    fn wrap_blocks(&mut self, wrap: Arc<dyn BlockWrap>) -> ptrain_core::Result<Option<usize>> {
        self.wrap = Some(wrap);
        Ok(Some(self.blocks.len()))
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
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str| args.iter().skip_while(|a| *a != name).nth(1).cloned();
    let plugins: Vec<String> = flag("--plugins").map(|p| p.split(',').map(String::from).collect()).unwrap_or_default();
    let list = plugins.iter().map(|p| format!("{p:?}")).collect::<Vec<_>>().join(",");
    let steps = flag("--steps").unwrap_or_else(|| "150".into());
    let dropout: f64 = flag("--dropout").map(|p| p.parse()).transpose()?.unwrap_or(0.0);
    let mut config = ConfigBuilder::default()
        .file("configs/mlp-multi.toml".as_ref())?
        .set("run.name=\"custom-model\"")?
        .set(&format!("train.steps={steps}"))?
        .set(&format!("run.plugins=[{list}]"))?;
    if let Some(dir) = flag("--run-dir") {
        config = config.set(&format!("run.run_dir={dir:?}"))?;
    }
    for (i, arg) in args.iter().enumerate() {
        if arg == "--set" {
            config = config.set(args.get(i + 1).map_or("", String::as_str))?;
        }
    }
    let config = config.build()?;
    // One rank of several (torchrun, Slurm, `ptrain launch`) joins the process group.
    let dist = ptrain_dist::from_env(&config)?;
    let outcome = Trainer::new(config)
        .data_parallel(dist)
        .with_model(move |vs, data| Ok(Box::new(ResidualMlp::new(vs, data.input_dim(), 64, 2, data.num_classes(), dropout)) as Box<dyn Model>))
        .resume(flag("--resume").map(|p| Resume::Path(p.into())))
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
