use std::sync::Mutex;

use tch::{nn, Device, Kind, Tensor};

use super::*;
use crate::{
    config::{Config, LoraConfig, ModelConfig, ModelKind},
    model::{lora, Gpt, Llama},
};

fn shape(kind: ModelKind) -> ModelConfig {
    let mut m = Config::default().model;
    (m.kind, m.n_layer, m.n_head, m.n_embd, m.block_size, m.vocab_size) = (kind, 2, 2, 16, 16, 32);
    m
}

fn tokens(v: &[i64]) -> Tensor {
    Tensor::from_slice(v).view([1, -1])
}

fn logits(model: &mut dyn Model, input: ModelInput) -> Tensor {
    model.forward(input).unwrap().logits().unwrap()
}

/// A prompt with two answers packed as one sequence: each answer's logits are those
/// of the prompt followed by that answer alone.
fn shared_prefix_pair_gives_each_answer_its_own_logits(model: &mut dyn Model) {
    let (prompt, chosen, rejected) = ([3i64, 7, 1], [9i64, 4], [5i64, 2, 8]);
    let packed: Vec<i64> = prompt.iter().chain(&chosen).chain(&rejected).copied().collect();
    let segments = Segments { positions: tokens(&[0, 1, 2, 3, 4, 3, 4, 5]), ids: tokens(&[1, 1, 1, 2, 2, 3, 3, 3]), prefix: Some(tokens(&[1; 8])) };
    let together = logits(model, ModelInput::new(&tokens(&packed), false).segments(Some(&segments)));
    for (answer, at) in [(&chosen[..], 3), (&rejected[..], 5)] {
        let alone: Vec<i64> = prompt.iter().chain(answer).copied().collect();
        let alone = logits(model, ModelInput::new(&tokens(&alone), false));
        let n = answer.len() as i64;
        let diff = (together.narrow(1, at, n) - alone.narrow(1, 3, n)).abs().max().double_value(&[]);
        assert!(diff < 1e-5, "{}: the answer at {at} differs by {diff} from its sequence alone", model.kind());
    }
    let prompt_diff = (together.narrow(1, 0, 3) - logits(model, ModelInput::new(&tokens(&prompt), false))).abs().max().double_value(&[]);
    assert!(prompt_diff < 1e-5, "{}: the prompt differs by {prompt_diff}", model.kind());
}

#[test]
fn gpt_and_llama_attend_over_a_shared_prefix_pair_as_over_each_answer_alone() {
    tch::manual_seed(0);
    let vs = nn::VarStore::new(Device::Cpu);
    shared_prefix_pair_gives_each_answer_its_own_logits(&mut Gpt::decoder(&vs.root(), &shape(ModelKind::Gpt), lora::Targets::NONE));
    let vs = nn::VarStore::new(Device::Cpu);
    shared_prefix_pair_gives_each_answer_its_own_logits(&mut Llama::decoder(&vs.root(), &shape(ModelKind::Llama), lora::Targets::NONE));
}

/// Records which block each call of the wrap ran (`usize::MAX`: a forward's start),
/// and that it was told whether the block is checkpointed.
#[derive(Default)]
struct Calls(Mutex<Vec<usize>>, Mutex<Vec<bool>>);

impl BlockWrap for Calls {
    fn enter(&self) -> Result<()> {
        self.0.lock().unwrap().push(usize::MAX);
        Ok(())
    }

    fn around(&self, index: usize, input: &Tensor, checkpointed: bool, forward: &mut dyn FnMut() -> Result<Tensor>) -> Result<Tensor> {
        assert_eq!(input.size().len(), 3, "the block's hidden state");
        self.0.lock().unwrap().push(index);
        self.1.lock().unwrap().push(checkpointed);
        forward()
    }
}

#[test]
fn the_block_wrap_runs_around_every_block_forward_and_every_recompute() {
    for checkpointed in [false, true] {
        tch::manual_seed(0);
        let vs = nn::VarStore::new(Device::Cpu);
        let mut model = Llama::decoder(&vs.root(), &shape(ModelKind::Llama), lora::Targets::NONE);
        let calls = Arc::new(Calls::default());
        model.plan(BlockPlan { checkpointed: vec![checkpointed; 2], wrap: Some(calls.clone()) }).unwrap();
        let x = tokens(&[1, 2, 3, 4]);
        logits(&mut model, ModelInput::new(&x, true)).sum(Kind::Float).backward();
        let want = if checkpointed { vec![usize::MAX, 0, 1, 1, 0] } else { vec![usize::MAX, 0, 1] };
        assert_eq!(*calls.0.lock().unwrap(), want, "checkpointed = {checkpointed}: forward, then backward's recompute");
        assert!(calls.1.lock().unwrap().iter().all(|&c| c == checkpointed));
        calls.0.lock().unwrap().clear();
        calls.1.lock().unwrap().clear();
        let _ = tch::no_grad(|| logits(&mut model, ModelInput::new(&x, false)));
        assert_eq!(*calls.0.lock().unwrap(), [usize::MAX, 0, 1], "evaluation recomputes nothing");
    }
}

#[test]
fn lora_stores_the_frozen_block_matrices_in_bf16_and_nothing_else() {
    let lora = LoraConfig { dropout: 0.0, ..LoraConfig::default() };
    for kind in [ModelKind::Gpt, ModelKind::Llama] {
        let vs = nn::VarStore::new(Device::Cpu);
        let targets = lora::Targets::new(Some(&lora), kind);
        let model: Box<dyn Model> = match kind {
            ModelKind::Gpt => Box::new(Gpt::decoder(&vs.root(), &shape(kind), targets)),
            _ => Box::new(Llama::decoder(&vs.root(), &shape(kind), targets)),
        };
        lora::freeze_base(&vs);
        lora::store_base_bf16(model.as_ref()).unwrap();
        let mut bf16: Vec<String> = vs.variables().into_iter().filter(|(_, t)| t.kind() == Kind::BFloat16).map(|(n, _)| n).collect();
        bf16.sort();
        let linears = if kind == ModelKind::Gpt { 4 } else { 7 };
        assert_eq!(bf16.len(), 2 * linears, "{kind:?}: every block's base matrix, no other: {bf16:?}");
        assert!(bf16.iter().all(|n| n.ends_with(".weight") && !n.contains(lora::ADAPTER)), "{bf16:?}");
    }
}
