use tch::{Device, Kind, Tensor};

use super::{experts::Experts, router::Losses};
use crate::config::Config;

/// The experts' output as transformers' eager loop computes it: each expert over the
/// tokens routed to it, weighted, added up.
fn looped(experts: &Experts, x: &Tensor, chosen: &Tensor, weights: &Tensor) -> Tensor {
    let out = x.zeros_like();
    let (n, k) = (chosen.size()[0], chosen.size()[1]);
    for token in 0..n {
        for slot in 0..k {
            let e = chosen.int64_value(&[token, slot]);
            let row = x.get(token).unsqueeze(0);
            let gate_up = row.matmul(&experts.gate_up.get(e).tr());
            let parts = gate_up.chunk(2, -1);
            let y = (parts[0].silu() * &parts[1]).matmul(&experts.down.get(e).tr()) * weights.double_value(&[token, slot]);
            let mut dst = out.get(token);
            dst += y.squeeze_dim(0);
        }
    }
    out
}

#[test]
fn grouped_expert_products_equal_a_loop_over_the_routed_tokens() {
    tch::manual_seed(1);
    // A width of 6 floats: not whole 16-byte lines, so the padded path runs too.
    let (n, d, width, experts, k) = (13, 8, 6, 5, 2);
    let e = Experts {
        gate_up: Tensor::randn([experts, 2 * width, d], (Kind::Float, Device::Cpu)),
        down: Tensor::randn([experts, d, width], (Kind::Float, Device::Cpu)),
        adapters: [None, None],
    };
    let x = Tensor::randn([n, d], (Kind::Float, Device::Cpu));
    // Each token's first expert among 0-2, its second 4: expert 3 gets nobody (an empty group).
    let firsts: Vec<i64> = (0..n).map(|i| (i * 7 + 1) % 3).collect();
    let chosen = Tensor::stack(&[Tensor::from_slice(&firsts), Tensor::full([n], 4, (Kind::Int64, Device::Cpu))], 1);
    let weights = Tensor::rand([n, k], (Kind::Float, Device::Cpu));
    let grouped = e.forward(&x, &chosen, &weights).unwrap();
    let expected = looped(&e, &x, &chosen, &weights);
    let diff = (&grouped - &expected).abs().max().double_value(&[]);
    assert!(diff < 1e-4, "grouped vs looped: {diff}");
}

#[test]
fn the_load_balancing_loss_is_the_experts_share_times_their_probability() {
    let mut a = Config::default().model.moe;
    (a.experts, a.top_k, a.router_aux_loss_coef) = (3, 1, 0.5);
    let losses = Losses::new(&a, 2);
    // Two blocks of two tokens: block 0 sends both to expert 0, block 1 one to 1, one to 2.
    let l0 = Tensor::from_slice(&[5.0f32, 0.0, 0.0, 5.0, 0.0, 0.0]).reshape([2, 3]);
    let l1 = Tensor::from_slice(&[0.0f32, 5.0, 0.0, 0.0, 0.0, 5.0]).reshape([2, 3]);
    let out = losses.of(&[l0.shallow_clone(), l1.shallow_clone()]).unwrap();
    let p = Tensor::cat(&[l0.softmax(-1, Kind::Float), l1.softmax(-1, Kind::Float)], 0).mean_dim(0, false, Kind::Float);
    let share = Tensor::from_slice(&[0.5f32, 0.25, 0.25]);
    let expected = (share * p).sum(Kind::Float).double_value(&[]) * 3.0;
    let aux = out.metrics.iter().find(|(n, _)| *n == "aux_loss").unwrap().1.double_value(&[]);
    assert!((aux - expected).abs() < 1e-6, "{aux} vs {expected}");
    assert!((out.loss.double_value(&[]) - 0.5 * expected).abs() < 1e-6);
    // Block 0 sent both tokens to one expert: 2 over a mean of 2/3.
    let max0 = out.metrics.iter().find(|(n, _)| *n == "expert_load_max/0").unwrap().1.double_value(&[]);
    assert!((max0 - 3.0).abs() < 1e-6, "{max0}");
}
