use tch::{Device, Kind, Reduction, Tensor};

use super::*;
use crate::{
    config::{Config, DataKind},
    data::Batch,
    dist::SingleRank,
};

/// A model whose logits are `hidden @ weight^T`, handing out its hidden states
/// when `split` is set.
struct Linear {
    hidden: Tensor,
    weight: Tensor,
    split: bool,
}

impl Linear {
    fn new(shape: &[i64], classes: i64, split: bool) -> Linear {
        let width = *shape.last().unwrap();
        let hidden = Tensor::randn(shape, (Kind::Float, Device::Cpu));
        Linear { hidden, weight: Tensor::randn([classes, width], (Kind::Float, Device::Cpu)), split }
    }
}

impl Forward for Linear {
    fn forward(&mut self, _batch: &Batch, _train: bool) -> Result<Tensor> {
        Ok(self.hidden.matmul(&self.weight.tr()))
    }

    fn forward_hidden(&mut self, _batch: &Batch, _train: bool) -> Result<Option<(Tensor, crate::model::Head)>> {
        Ok(self.split.then(|| (self.hidden.shallow_clone(), crate::model::Head::plain(self.weight.shallow_clone()))))
    }
}

fn batch(targets: Tensor, trained_tokens: Option<i64>) -> Batch {
    let samples = targets.size()[0];
    Batch {
        inputs: targets.zeros_like(),
        targets,
        dataset_ids: None,
        segments: None,
        payload: trained_tokens.map_or(crate::data::Payload::None, crate::data::Payload::TrainedTokens),
        samples,
        tokens: 0,
    }
}

/// Next tokens of `rows` x `t` positions, the first `untrained[r]` of row r ignored.
fn lm_targets(rows: i64, t: i64, vocab: i64, untrained: &[i64]) -> (Tensor, i64) {
    let targets = Tensor::randint(vocab, [rows, t], (Kind::Int64, Device::Cpu));
    for (r, &n) in untrained.iter().enumerate() {
        let _ = targets.get(r as i64).narrow(0, 0, n).fill_(IGNORE_INDEX);
    }
    let trained = rows * t - untrained.iter().sum::<i64>();
    (targets, trained)
}

fn value(t: &Tensor) -> f64 {
    t.double_value(&[])
}

#[test]
fn a_step_counted_in_tokens_divides_by_the_tokens_of_the_whole_step() {
    tch::manual_seed(1);
    let objective = CausalLmPerToken { chunk: 0 };
    // Two micro-batches training 3 and 11 tokens of 12.
    let micro = [lm_targets(2, 6, 9, &[6, 3]), lm_targets(2, 6, 9, &[1, 0])];
    let (mut models, batches): (Vec<_>, Vec<_>) = micro.into_iter().map(|(t, n)| (Linear::new(&[2, 6, 4], 9, false), batch(t, Some(n)))).unzip();
    let units: u64 = batches
        .iter()
        .map(|b| match objective.count(b).unwrap() {
            Count::Units(n) => n,
            Count::MicroBatch => panic!("instruction data counts tokens"),
        })
        .sum();
    assert_eq!(units, 14);
    let (scale, all_ranks) = StepScale::of_step(Count::Units(units), 2, &SingleRank, Device::Cpu).unwrap();
    assert!(all_ranks.is_none(), "one rank counts on the host");
    let mut step = 0.0;
    let (mut sum, mut means) = (0.0, 0.0);
    for (model, b) in models.iter_mut().zip(&batches) {
        let s = objective.sum(model, b, true).unwrap();
        step += value(&scale.apply(s.loss.shallow_clone()).unwrap());
        sum += value(&s.loss);
        means += value(&cross_entropy(&s.logits.unwrap(), &b.targets, Reduction::Mean).unwrap()) / 2.0;
    }
    assert!((step - sum / 14.0).abs() < 1e-6, "the step's loss {step} is the sum over its 14 trained tokens / 14 ({})", sum / 14.0);
    assert!((step - means).abs() > 1e-3, "not the mean of the micro-batches' means ({means})");
}

#[test]
fn micro_batch_means_are_divided_by_their_number_exactly_as_before() {
    let (three, _) = StepScale::of_step(Count::MicroBatch, 3, &SingleRank, Device::Cpu).unwrap();
    let (one, _) = StepScale::of_step(Count::MicroBatch, 1, &SingleRank, Device::Cpu).unwrap();
    // 5.55 / 3 is not 5.55 * (1 / 3) in float32.
    for v in [0.7_f32, 5.55, 2.574_776] {
        let x = Tensor::from(v);
        assert_eq!(value(&three.apply(x.shallow_clone()).unwrap()), value(&(&x / 3.0)), "{v}: (mean) / accum, bit for bit");
        assert_eq!(value(&one.apply(x.shallow_clone()).unwrap()), value(&x), "{v}: one micro-batch, the mean itself");
    }
}

#[test]
fn the_per_token_loss_refuses_batches_that_do_not_count_their_tokens() {
    let (targets, _) = lm_targets(1, 4, 5, &[0]);
    let err = CausalLmPerToken { chunk: 0 }.count(&batch(targets, None)).unwrap_err();
    assert!(err.to_string().contains("trained tokens"), "{err}");
}

#[test]
fn cross_entropy_is_float32_of_bf16_logits_and_skips_ignored_targets() {
    tch::manual_seed(2);
    let logits = Tensor::randn([2, 5, 7], (Kind::Float, Device::Cpu)).to_kind(Kind::BFloat16);
    let (targets, trained) = lm_targets(2, 5, 7, &[2, 0]);
    let each = cross_entropy(&logits, &targets, Reduction::None).unwrap();
    assert_eq!(each.kind(), Kind::Float);
    assert_eq!(each.size(), targets.size(), "one loss per target");
    assert_eq!(value(&each.get(0).narrow(0, 0, 2).abs().sum(Kind::Float)), 0.0, "ignored targets cost nothing");
    let in_float = cross_entropy(&logits.to_kind(Kind::Float), &targets, Reduction::Sum).unwrap();
    assert_eq!(value(&cross_entropy(&logits, &targets, Reduction::Sum).unwrap()), value(&in_float));
    let mean = value(&cross_entropy(&logits, &targets, Reduction::Mean).unwrap());
    assert!((mean - value(&in_float) / trained as f64).abs() < 1e-6, "the mean is over the trained targets");
}

#[test]
fn a_chunked_mean_is_the_whole_logits_mean_without_the_logits() {
    tch::manual_seed(3);
    let (targets, _) = lm_targets(3, 8, 11, &[3, 0, 8]);
    let b = batch(targets, None);
    let mut model = Linear::new(&[3, 8, 5], 11, true);
    for train in [true, false] {
        let whole = CausalLmMean { chunk: 0 }.sum(&mut model, &b, train).unwrap();
        let chunked = CausalLmMean { chunk: 5 }.sum(&mut model, &b, train).unwrap();
        assert!(whole.logits.is_some() && chunked.logits.is_none(), "chunks never make the whole logits");
        let (w, c) = (value(&whole.loss), value(&chunked.loss));
        assert!((w - c).abs() <= 1e-6 * w.abs(), "train {train}: {w} (whole) vs {c} (chunks of 5)");
    }
    // A model without hidden states: the whole logits, whatever the chunk.
    model.split = false;
    assert!(CausalLmMean { chunk: 5 }.sum(&mut model, &b, true).unwrap().logits.is_some());
}

#[test]
fn classification_reports_its_accuracy_in_evaluation_only() {
    tch::manual_seed(4);
    let mut model = Linear::new(&[8, 3], 4, false);
    let logits = model.forward(&batch(Tensor::zeros([8], (Kind::Int64, Device::Cpu)), None), false).unwrap();
    // Targets right for the first 5 samples.
    let targets = logits.argmax(-1, false);
    let _ = targets.narrow(0, 5, 3).g_add_scalar_(1).remainder_(4);
    let b = batch(targets, None);
    assert_eq!(Classification.count(&b).unwrap(), Count::MicroBatch);
    assert!(Classification.sum(&mut model, &b, true).unwrap().metrics.is_empty(), "training pays no argmax");
    let eval = Classification.sum(&mut model, &b, false).unwrap();
    assert_eq!(eval.metrics.len(), 1);
    assert_eq!(eval.metrics[0].0, "accuracy");
    assert_eq!(value(&eval.metrics[0].1), 5.0 / 8.0);
}

#[test]
fn metrics_add_up_name_by_name() {
    let t = |v: f64| Tensor::from(v);
    let mut total = Metrics::new();
    add_metrics(&mut total, vec![("a", t(1.0)), ("b", t(2.0))]).unwrap();
    add_metrics(&mut total, vec![("b", t(3.0)), ("c", t(4.0))]).unwrap();
    let got: Vec<(&str, f64)> = total.iter().map(|(n, v)| (*n, value(v))).collect();
    assert_eq!(got, [("a", 1.0), ("b", 5.0), ("c", 4.0)]);
}

#[test]
fn the_objective_is_chosen_from_the_task_and_the_data() {
    let mut config = Config::default();
    assert_eq!(from_config(&config, Task::LanguageModel).name(), "causal_lm_mean");
    assert_eq!(from_config(&config, Task::Classification).name(), "classification");
    config.data.kind = DataKind::Chat;
    assert_eq!(from_config(&config, Task::LanguageModel).name(), "causal_lm_per_token");
    config.data.kind = DataKind::PromptCompletion;
    assert_eq!(from_config(&config, Task::LanguageModel).name(), "causal_lm_per_token");
}

/// A language model as the learner hands it to an objective.
struct Lm(Box<dyn crate::model::Model>);

impl Forward for Lm {
    fn forward(&mut self, batch: &Batch, train: bool) -> Result<Tensor> {
        self.0.forward(crate::model::ModelInput::new(&batch.inputs, train))?.logits()
    }

    fn forward_hidden(&mut self, batch: &Batch, train: bool) -> Result<Option<(Tensor, crate::model::Head)>> {
        let input = crate::model::ModelInput::new(&batch.inputs, train).returns(crate::model::Returns::Hidden);
        match self.0.forward(input)? {
            crate::model::ModelOutput::Hidden { states, head } => Ok(Some((states, head))),
            crate::model::ModelOutput::Logits(_) => Ok(None),
        }
    }
}

/// A tied head (`llama.tie_embeddings`, as Qwen2) gets the token lookup's gradient
/// added into the head's as a sparse tensor (`decoder::lookup`): the result equals what the
/// untied model with the same weights gets as its embedding's and its head's dense
/// gradients, summed, with the chunked loss and with the whole logits, over two
/// micro-batches (the first makes `.grad`, the second adds into it in place). Every
/// other gradient, and the losses, are the same bit for bit.
#[test]
fn a_tied_embedding_gets_the_dense_lookups_gradient_added_into_the_heads() {
    use crate::{
        config::ModelKind,
        model::{lora, Llama},
    };
    let shape = |tied: bool| {
        let mut m = Config::default().model;
        (m.kind, m.n_layer, m.n_head, m.n_embd, m.block_size, m.vocab_size) = (ModelKind::Llama, 2, 2, 16, 16, 40);
        m.llama.tie_embeddings = tied;
        m
    };
    for chunk in [5, 0] {
        tch::manual_seed(6);
        let (tied_vs, untied_vs) = (tch::nn::VarStore::new(Device::Cpu), tch::nn::VarStore::new(Device::Cpu));
        let mut tied = Lm(Box::new(Llama::decoder(&tied_vs.root(), &shape(true), lora::Targets::NONE)));
        let mut untied = Lm(Box::new(Llama::decoder(&untied_vs.root(), &shape(false), lora::Targets::NONE)));
        let (tv, uv) = (tied_vs.variables(), untied_vs.variables());
        tch::no_grad(|| {
            for (name, t) in &tv {
                uv[name].shallow_clone().copy_(t);
            }
            uv["lm_head.weight"].shallow_clone().copy_(&tv["model.embed_tokens.weight"]);
        });
        let objective = CausalLmMean { chunk };
        let mut held = None;
        for micro in 0..2 {
            // 24 ids of 40: some come more than once, so their rows' gradients add up.
            let ids = Tensor::randint(40, [2, 13], (Kind::Int64, Device::Cpu));
            let b = Batch { inputs: ids.narrow(1, 0, 12).contiguous(), ..batch(ids.narrow(1, 1, 12).contiguous(), None) };
            let (a, u) = (objective.sum(&mut tied, &b, true).unwrap().loss, objective.sum(&mut untied, &b, true).unwrap().loss);
            assert_eq!(value(&a), value(&u), "chunk {chunk}, micro-batch {micro}: the loss");
            a.backward();
            u.backward();
            let grad = tv["model.embed_tokens.weight"].grad();
            assert!(!grad.is_sparse(), "the tied weight's gradient is dense");
            if let Some(first) = held.replace(grad.data_ptr()) {
                assert_eq!(grad.data_ptr(), first, "the second micro-batch adds into the first's gradient");
            }
        }
        let rel = |a: &Tensor, b: &Tensor| (a - b).abs().max().double_value(&[]) / b.abs().max().double_value(&[]);
        let dense = uv["model.embed_tokens.weight"].grad() + uv["lm_head.weight"].grad();
        let off = rel(&tv["model.embed_tokens.weight"].grad(), &dense);
        assert!(off < 1e-6, "chunk {chunk}: the tied gradient is off the dense lookup's + the head's by {off}");
        for (name, t) in tv.iter().filter(|(n, _)| !n.contains("embed_tokens")) {
            assert!(t.grad().equal(&uv[name].grad()), "chunk {chunk}: {name}'s gradient");
        }
    }
}
