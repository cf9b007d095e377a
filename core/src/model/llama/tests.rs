use std::cell::Cell;

use tch::{nn, Device, Kind, Reduction, Tensor};

use super::*;
use crate::{
    config::{Config, LoraConfig, ModelKind},
    model::{decoder::BlockPlan, lora, Model, ModelInput},
    objective::cross_entropy,
};

thread_local! {
    /// Set: the MLP gates as autograd's two nodes, `silu(gate)` then `* up` (the reference).
    pub(super) static UNFUSED: Cell<bool> = const { Cell::new(false) };
    /// Set: backward keeps the SwiGLU product rather than recomputing it (the reference).
    pub(super) static PRODUCT_KEPT: Cell<bool> = const { Cell::new(false) };
    /// How many saved copies of the SwiGLU product were dropped for recompute.
    pub(super) static PRODUCTS_DROPPED: Cell<usize> = const { Cell::new(0) };
}

/// Which computations run as their unoptimised reference, and in what precision.
#[derive(Clone, Copy, Default)]
struct Reference {
    unfused_swiglu: bool,
    separate_a: bool,
    product_kept: bool,
    /// Set: parameters in float64, where sums taken in another order round far below
    /// the 1e-6 a computation that differs only in its order has to meet.
    float64: bool,
}

/// One step's loss, every trained parameter's gradient (by name), and how many saved
/// SwiGLU products were dropped.
struct Step {
    loss: f64,
    grads: Vec<(String, Tensor)>,
    dropped: usize,
}

/// One step of a small Llama, its blocks checkpointed or not, with LoRA adapters or not.
fn step(lora: Option<&LoraConfig>, checkpointed: bool, reference: Reference) -> Step {
    UNFUSED.set(reference.unfused_swiglu);
    lora::SEPARATE_A.set(reference.separate_a);
    PRODUCT_KEPT.set(reference.product_kept);
    PRODUCTS_DROPPED.set(0);
    tch::manual_seed(7);
    let mut m = Config::default().model;
    (m.kind, m.n_layer, m.n_head, m.n_embd, m.block_size, m.vocab_size) = (ModelKind::Llama, 2, 2, 16, 16, 40);
    let mut vs = nn::VarStore::new(Device::Cpu);
    let mut model = Llama::decoder(&vs.root(), &m, lora::Targets::new(lora, ModelKind::Llama));
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
    if reference.float64 {
        vs.double();
    }
    let ids = Tensor::randint(40, [2, 13], (Kind::Int64, Device::Cpu));
    let logits = model.forward(ModelInput::new(&ids.narrow(1, 0, 12), true)).unwrap().logits().unwrap();
    let loss = cross_entropy(&logits, &ids.narrow(1, 1, 12).contiguous(), Reduction::Mean).unwrap();
    loss.backward();
    UNFUSED.set(false);
    lora::SEPARATE_A.set(false);
    PRODUCT_KEPT.set(false);
    let mut grads: Vec<(String, Tensor)> = vs.variables().into_iter().filter(|(_, t)| t.requires_grad()).map(|(n, t)| (n, t.grad())).collect();
    grads.sort_by(|a, b| a.0.cmp(&b.0));
    Step { loss: loss.double_value(&[]), grads, dropped: PRODUCTS_DROPPED.get() }
}

fn names(g: &[(String, Tensor)]) -> Vec<String> {
    g.iter().map(|(n, _)| n.clone()).collect()
}

/// `a`'s loss and gradients are `b`'s bit for bit.
fn assert_same_bits(a: &Step, b: &Step, what: &str) {
    assert_eq!(a.loss.to_bits(), b.loss.to_bits(), "{what}: the loss");
    assert_eq!(names(&a.grads), names(&b.grads), "{what}");
    for ((name, x), (_, y)) in a.grads.iter().zip(&b.grads) {
        assert!(x.defined() && x.equal(y), "{what}: {name}'s gradient");
    }
}

const CASES: [(&str, bool, bool); 4] =
    [("full", false, false), ("full, checkpointed", false, true), ("LoRA", true, false), ("LoRA, checkpointed", true, true)];

#[test]
fn the_fused_swiglu_gives_autograds_losses_and_gradients_bit_for_bit() {
    let lora = LoraConfig { rank: 4, alpha: 8.0, dropout: 0.0, ..LoraConfig::default() };
    for (what, with_lora, checkpointed) in CASES {
        let lora = with_lora.then_some(&lora);
        let fused = step(lora, checkpointed, Reference::default());
        let unfused = step(lora, checkpointed, Reference { unfused_swiglu: true, ..Reference::default() });
        assert!(fused.grads.iter().any(|(n, _)| n.contains("gate_proj")), "{what}: the gate is trained");
        assert_same_bits(&fused, &unfused, what);
    }
}

#[test]
fn the_recomputed_swiglu_product_gives_the_kept_ones_losses_and_gradients_bit_for_bit() {
    let lora = LoraConfig { rank: 4, alpha: 8.0, dropout: 0.0, ..LoraConfig::default() };
    for (what, with_lora, checkpointed) in CASES {
        let lora = with_lora.then_some(&lora);
        let recomputed = step(lora, checkpointed, Reference::default());
        let kept = step(lora, checkpointed, Reference { product_kept: true, ..Reference::default() });
        // One per block: the down projection's weight (full) or its adapter's A (LoRA),
        // in forward, or in backward's recompute of a checkpointed block.
        assert_eq!(recomputed.dropped, 2, "{what}: the saved products dropped");
        assert_same_bits(&recomputed, &kept, what);
    }
}

#[test]
fn the_fused_lora_a_matmuls_give_the_separate_ones_losses_and_gradients() {
    let rel = |a: &Tensor, b: &Tensor| (a - b).abs().max().double_value(&[]) / b.abs().max().double_value(&[]).max(1e-12);
    // One GEMM over the stacked A's sums in another order than three narrow ones (the
    // kernel blocks a wider N differently, and differently on AVX2 and AVX-512 hosts):
    // in float32 that reached 1.1e-6 on an AVX2 host, so both sides run in float64.
    // A wrong fusion (an adapter given another's A) is off by 1e-3 in the loss.
    let tolerance = 1e-6;
    let f64 = Reference { float64: true, ..Reference::default() };
    let every = LoraConfig { rank: 4, alpha: 8.0, dropout: 0.0, ..LoraConfig::default() };
    // q and v fused, k alone without an adapter; up alone beside an unadapted gate.
    let targets = ["q_proj", "v_proj", "up_proj", "down_proj"].map(String::from).to_vec();
    let some = LoraConfig { targets, ..every.clone() };
    for (what, lora) in [("every projection", &every), ("q, v, up and down", &some)] {
        for checkpointed in [false, true] {
            let what = format!("{what}, checkpointed {checkpointed}");
            let fused = step(Some(lora), checkpointed, f64);
            let separate = step(Some(lora), checkpointed, Reference { separate_a: true, ..f64 });
            assert!((fused.loss - separate.loss).abs() <= tolerance * separate.loss.abs(), "{what}: loss {} vs {}", fused.loss, separate.loss);
            assert_eq!(names(&fused.grads), names(&separate.grads), "{what}");
            assert!(fused.grads.iter().any(|(n, _)| n.contains("k_proj")) == (lora.targets.is_empty()), "{what}: k's adapter");
            for ((name, a), (_, b)) in fused.grads.iter().zip(&separate.grads) {
                assert!(a.defined() && rel(a, b) < tolerance, "{what}: {name}'s gradient off by {}", rel(a, b));
            }
        }
    }
}

#[test]
fn with_adapter_dropout_each_adapter_draws_its_own_mask() {
    // Fusing the A matmuls would give every adapter one input: with dropout each keeps its own.
    let lora = LoraConfig { rank: 4, alpha: 8.0, dropout: 0.3, ..LoraConfig::default() };
    for checkpointed in [false, true] {
        let shared = step(Some(&lora), checkpointed, Reference::default());
        let separate = step(Some(&lora), checkpointed, Reference { separate_a: true, ..Reference::default() });
        assert_same_bits(&shared, &separate, &format!("dropout, checkpointed {checkpointed}"));
    }
}
