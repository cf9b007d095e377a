//! `precision = "bf16"` on the CPU: the forward pass runs in autocast (the logits
//! are bfloat16) and the trainer's loss is float32 cross-entropy of those logits
//! cast to float, not a bf16 log-softmax.

use std::sync::{Arc, Mutex};

use ptrain_core::{
    data::{BatchKey, Split, IGNORE_INDEX},
    model::{self, Layer, Model, ModelInput, ModelOutput, Task},
    ConfigBuilder, Trainer,
};
use tch::{Kind, Reduction, Tensor};

/// The configured GPT, remembering the logits of its first training forward.
struct Recording {
    inner: Box<dyn Model>,
    first: Arc<Mutex<Option<Tensor>>>,
}

impl Model for Recording {
    fn forward(&mut self, input: ModelInput) -> ptrain_core::Result<ModelOutput> {
        let train = input.train;
        let logits = self.inner.forward(input)?.logits()?;
        let mut first = self.first.lock().unwrap();
        if train && first.is_none() {
            *first = Some(logits.detach().copy());
        }
        Ok(ModelOutput::Logits(logits))
    }

    fn task(&self) -> Task {
        self.inner.task()
    }

    fn kind(&self) -> &str {
        self.inner.kind()
    }

    fn layers(&self, seq_len: i64) -> Vec<Layer> {
        self.inner.layers(seq_len)
    }
}

#[test]
fn the_first_bf16_loss_is_float32_cross_entropy_of_the_bf16_logits() {
    let dir = tempfile::tempdir().unwrap();
    let config = ConfigBuilder::layered(&[], &[])
        .unwrap()
        .build_with(|c| {
            c.run.run_dir = dir.path().display().to_string();
            c.run.device = ptrain_core::config::DeviceChoice::Cpu;
            c.run.threads = 1;
            c.run.log_every = 0;
            c.train.steps = 1;
            c.train.precision = ptrain_core::config::Precision::Bf16;
            c.model.n_embd = 32;
            c.model.n_head = 2;
            c.model.block_size = 16;
            c.data.batch_size = 4;
        })
        .unwrap();
    let first = Arc::new(Mutex::new(None));
    let dataset = ptrain_core::data::from_config(&config).unwrap();
    let recorded = first.clone();
    let model_config = config.clone();
    let outcome = Trainer::new(config.clone())
        .with_dataset(dataset.clone())
        .progress(false)
        .with_model(move |vs, data| {
            let inner = model::from_config(&model_config, vs, data)?;
            Ok(Box::new(Recording { inner, first: recorded }) as Box<dyn Model>)
        })
        .run()
        .unwrap();
    let logits = first.lock().unwrap().take().expect("a training forward");
    assert_eq!(logits.kind(), Kind::BFloat16, "the CPU forward ran in bf16 autocast");
    let batch = dataset.batch(Split::Train, BatchKey { step: 1, micro: 0, first_sample: 0, count: 4, stream: 0 }).unwrap();
    let vocab = logits.size()[2];
    let ce = |l: &Tensor| l.view([-1, vocab]).cross_entropy_loss::<Tensor>(&batch.targets.view([-1]), None, Reduction::Mean, IGNORE_INDEX, 0.0);
    let in_float = ce(&logits.to_kind(Kind::Float)).double_value(&[]);
    let in_bf16 = ce(&logits).double_value(&[]);
    let got = outcome.summary.first_loss.unwrap();
    assert_eq!(got, in_float, "the trainer's first loss is float32 cross-entropy of the bf16 logits");
    assert_ne!(got, in_bf16, "and not a bf16 one (which rounds to bf16)");
}
