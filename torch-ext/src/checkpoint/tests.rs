use std::sync::{
    atomic::{AtomicUsize, Ordering},
    Arc, Mutex,
};

use tch::{Kind, Tensor};

use super::*;

/// Tests here draw from the global generator: one at a time (cargo test runs threads).
static RNG: Mutex<()> = Mutex::new(());

/// A small residual block with dropout and a pass-through extra input (a mask).
struct Weights {
    w1: Tensor,
    w2: Tensor,
    p: f64,
}

impl Weights {
    fn new(p: f64) -> Weights {
        tch::manual_seed(7);
        let w1 = Tensor::randn([6, 12], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
        let w2 = Tensor::randn([12, 6], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
        Weights { w1, w2, p }
    }

    fn block(&self, x: &Tensor, mask: &Tensor) -> Tensor {
        let h = x.matmul(&self.w1).tanh().dropout(self.p, true) * mask;
        x + h.matmul(&self.w2).dropout(self.p, true)
    }

    fn shallow(&self) -> Weights {
        Weights { w1: self.w1.shallow_clone(), w2: self.w2.shallow_clone(), p: self.p }
    }
}

// SAFETY: the weights are only read (every op makes a new tensor), which libtorch
// allows from several threads at once.
unsafe impl Sync for Weights {}

fn checkpointed(w: &Weights) -> Checkpoint {
    let w = w.shallow();
    Checkpoint::new(move |inputs: &[Tensor]| Ok(w.block(&inputs[0], &inputs[1]))).unwrap()
}

/// Loss, input gradient, weight gradients and the generator's next draw after
/// backward, of two blocks in a row, stored or checkpointed. Each block has its own
/// weights, as a model's layers do: a weight shared by checkpointed blocks gets its
/// gradient added once per block, in another rounding order than one sum per step.
fn run(p: f64, checkpoint: bool, accumulate: usize) -> Vec<Tensor> {
    let (w, v) = (Weights::new(p), Weights::new(p));
    let (ck, cv) = (checkpointed(&w), checkpointed(&v));
    let x0 = Tensor::randn([4, 6], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
    let mask = Tensor::randn([4, 12], (Kind::Float, tch::Device::Cpu)).gt(0.0).to_kind(Kind::Float);
    let mut losses = Vec::new();
    for _ in 0..accumulate {
        let x = x0.sin();
        let x = if checkpoint { ck.apply(&x, &[&mask]).unwrap() } else { w.block(&x, &mask) };
        let x = if checkpoint { cv.apply(&x, &[&mask]).unwrap() } else { v.block(&x, &mask) };
        let loss = x.square().sum(Kind::Float);
        loss.f_backward().unwrap();
        losses.push(loss.detach());
    }
    let next = Tensor::rand([8], (Kind::Float, tch::Device::Cpu));
    vec![Tensor::stack(&losses, 0), x0.grad(), w.w1.grad(), w.w2.grad(), v.w1.grad(), v.w2.grad(), next]
}

fn assert_bit_equal(a: &[Tensor], b: &[Tensor], what: &str) {
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(x.equal(y), "{what}: tensor {i} differs: {x} vs {y}");
    }
}

#[test]
fn checkpointed_blocks_give_the_stored_losses_gradients_and_rng_sequence_bit_for_bit() {
    let _one = RNG.lock().unwrap_or_else(|e| e.into_inner());
    for (p, accumulate) in [(0.0, 1), (0.3, 1), (0.3, 3)] {
        let stored = run(p, false, accumulate);
        let recomputed = run(p, true, accumulate);
        assert_bit_equal(&stored, &recomputed, &format!("dropout {p}, {accumulate} backward(s)"));
    }
}

#[test]
fn the_block_parameters_get_gradients_when_its_input_needs_none() {
    let _one = RNG.lock().unwrap_or_else(|e| e.into_inner());
    let go = |checkpoint: bool| {
        let w = Weights::new(0.2);
        let ck = checkpointed(&w);
        // As after a frozen embedding: the hidden state needs no gradient.
        let x = Tensor::randn([4, 6], (Kind::Float, tch::Device::Cpu));
        let mask = Tensor::ones([4, 12], (Kind::Float, tch::Device::Cpu));
        let y = if checkpoint { ck.apply(&x, &[&mask]).unwrap() } else { w.block(&x, &mask) };
        y.square().sum(Kind::Float).backward();
        vec![y.detach(), w.w1.grad(), w.w2.grad()]
    };
    assert_bit_equal(&go(false), &go(true), "an input without gradient");
}

#[test]
fn forward_keeps_no_graph_of_the_block() {
    let w = Weights::new(0.0);
    let ck = checkpointed(&w);
    let x = Tensor::randn([4, 6], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
    let mask = Tensor::ones([4, 12], (Kind::Float, tch::Device::Cpu));
    let y = ck.apply(&x, &[&mask]).unwrap();
    assert!(y.requires_grad());
    let stored = w.block(&x, &mask);
    assert!(y.equal(&stored));
    // Without grad there is no node at all: the output needs none.
    let y = tch::no_grad(|| ck.apply(&x, &[&mask]).unwrap());
    assert!(!y.requires_grad());
}

#[test]
fn the_recompute_runs_under_the_autocast_state_forward_saw() {
    let _one = RNG.lock().unwrap_or_else(|e| e.into_inner());
    let go = |checkpoint: bool| {
        let w = Weights::new(0.2);
        let ck = checkpointed(&w);
        let x = Tensor::randn([4, 6], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
        let mask = Tensor::ones([4, 12], (Kind::Float, tch::Device::Cpu));
        let y = crate::autocast_bf16(false, || if checkpoint { ck.apply(&x, &[&mask]).unwrap() } else { w.block(&x, &mask) }).unwrap();
        // Backward outside the autocast region, as the trainer runs it.
        y.to_kind(Kind::Float).square().sum(Kind::Float).backward();
        vec![y.to_kind(Kind::Float), x.grad(), w.w1.grad(), w.w2.grad()]
    };
    assert_bit_equal(&go(false), &go(true), "bf16 autocast");
}

#[test]
fn errors_and_panics_in_the_block_come_back_as_errors() {
    let x = Tensor::ones([2, 2], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
    let failing = Checkpoint::new(|_: &[Tensor]| Err("no such layer".to_string())).unwrap();
    let e = failing.apply(&x, &[]).unwrap_err();
    assert!(e.to_string().contains("no such layer"), "{e}");
    let panicking = Checkpoint::new(|_: &[Tensor]| panic!("boom")).unwrap();
    let e = panicking.apply(&x, &[]).unwrap_err();
    assert!(e.to_string().contains("panicked: boom"), "{e}");
    // Fails only in the recompute: backward returns the error.
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&calls);
    let second_fails = Checkpoint::new(move |inputs: &[Tensor]| match seen.fetch_add(1, Ordering::SeqCst) {
        0 => Ok(&inputs[0] * 2.0),
        _ => Err("recompute failed".to_string()),
    })
    .unwrap();
    let y = second_fails.apply(&x, &[]).unwrap();
    let e = y.sum(Kind::Float).f_backward().unwrap_err();
    assert!(e.to_string().contains("recompute failed"), "{e}");
    // An extra input that wants a gradient is refused, not silently given none.
    let e = second_fails.apply(&x, &[&x]).unwrap_err();
    assert!(e.to_string().contains("requires grad"), "{e}");
}

#[test]
fn the_block_outlives_its_checkpoint_while_a_graph_needs_it() {
    let dropped = Arc::new(AtomicUsize::new(0));
    struct Flag(Arc<AtomicUsize>);
    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let flag = Flag(Arc::clone(&dropped));
    let ck = Checkpoint::new(move |inputs: &[Tensor]| {
        let _keep = &flag;
        Ok(inputs[0].sin())
    })
    .unwrap();
    let x = Tensor::ones([3], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
    let y = ck.apply(&x, &[]).unwrap();
    drop(ck);
    assert_eq!(dropped.load(Ordering::SeqCst), 0, "the graph still holds the block");
    y.sum(Kind::Float).backward();
    assert!(x.grad().equal(&x.detach().cos()));
    drop(y);
    assert_eq!(dropped.load(Ordering::SeqCst), 1, "released with the last graph");
}
