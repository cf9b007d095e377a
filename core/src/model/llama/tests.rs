use std::cell::Cell;

use tch::{nn, Device, Kind, Reduction, Tensor};

use super::*;
use crate::{
    config::{Config, LoraConfig, ModelKind},
    model::{decoder::BlockPlan, Model, ModelInput},
    objective::cross_entropy,
};

thread_local! {
    /// Set: the MLP gates as autograd's two nodes, `silu(gate)` then `* up` (the reference).
    pub(super) static UNFUSED: Cell<bool> = const { Cell::new(false) };
}

/// The loss and every trained parameter's gradient (by name) of one step of a small
/// Llama, its blocks checkpointed or not, with LoRA adapters or not.
fn step(lora: Option<&LoraConfig>, checkpointed: bool, unfused: bool) -> (f64, Vec<(String, Tensor)>) {
    UNFUSED.set(unfused);
    tch::manual_seed(7);
    let mut m = Config::default().model;
    (m.kind, m.n_layer, m.n_head, m.n_embd, m.block_size, m.vocab_size) = (ModelKind::Llama, 2, 2, 16, 16, 40);
    let vs = nn::VarStore::new(Device::Cpu);
    let mut model = Llama::decoder(&vs.root(), &m, lora::Targets { lora, kind: ModelKind::Llama });
    model.plan(BlockPlan { checkpointed: vec![checkpointed; 2], wrap: None }).unwrap();
    if lora.is_some() {
        lora::freeze_base(&vs);
        // peft's B starts at zero, which would leave every A without a gradient (drawn
        // in name order: the variables come as a HashMap).
        let mut bs: Vec<(String, Tensor)> = vs.variables().into_iter().filter(|(n, _)| n.contains("lora_B")).collect();
        bs.sort_by(|a, b| a.0.cmp(&b.0));
        tch::no_grad(|| {
            for (_, b) in bs {
                b.shallow_clone().copy_(&(Tensor::randn_like(&b) * 0.1));
            }
        });
    }
    let ids = Tensor::randint(40, [2, 13], (Kind::Int64, Device::Cpu));
    let logits = model.forward(ModelInput::new(&ids.narrow(1, 0, 12), true)).unwrap().logits().unwrap();
    let loss = cross_entropy(&logits, &ids.narrow(1, 1, 12).contiguous(), Reduction::Mean).unwrap();
    loss.backward();
    UNFUSED.set(false);
    let mut grads: Vec<(String, Tensor)> = vs.variables().into_iter().filter(|(_, t)| t.requires_grad()).map(|(n, t)| (n, t.grad())).collect();
    grads.sort_by(|a, b| a.0.cmp(&b.0));
    (loss.double_value(&[]), grads)
}

#[test]
fn the_fused_swiglu_gives_autograds_losses_and_gradients_bit_for_bit() {
    let lora = LoraConfig { rank: 4, alpha: 8.0, dropout: 0.0, ..LoraConfig::default() };
    for (what, lora, checkpointed) in
        [("full", None, false), ("full, checkpointed", None, true), ("LoRA", Some(&lora), false), ("LoRA, checkpointed", Some(&lora), true)]
    {
        let (fused_loss, fused) = step(lora, checkpointed, false);
        let (loss, unfused) = step(lora, checkpointed, true);
        assert_eq!(fused_loss.to_bits(), loss.to_bits(), "{what}: the loss");
        let names = |g: &[(String, Tensor)]| g.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
        assert_eq!(names(&fused), names(&unfused), "{what}");
        assert!(fused.iter().any(|(n, _)| n.contains("gate_proj")), "{what}: the gate is trained");
        for ((name, a), (_, b)) in fused.iter().zip(&unfused) {
            assert!(a.defined() && a.equal(b), "{what}: {name}'s gradient");
        }
    }
}
