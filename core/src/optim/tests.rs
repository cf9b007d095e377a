//! The two implementations of [`Optimizer`] over the one-rank data-parallel
//! layer: a sharded optimizer of one rank must train exactly as the replicated one.

use tch::{Device, Kind, Tensor};

use std::ops::Range;

use super::{GradMemory, LearningRate, Optimizer, Replicated, SavedState, ShardSpec, Sharded};
use crate::{
    config::{Config, ShardMode},
    dist::{DataParallel, SingleRank},
};

fn params() -> Vec<(String, Tensor)> {
    let values = |n: i64, shape: &[i64]| (Tensor::arange(n, (Kind::Float, Device::Cpu)) * 0.25 - 1.0).view(shape).set_requires_grad(true);
    vec![("a".into(), values(6, &[3, 2])), ("b".into(), values(4, &[4]))]
}

/// Three steps of `loss = sum(a^2) + sum(3 b)`: the parameters after them, and
/// the gradient norm of each step.
fn train(optimizer: &mut dyn Optimizer, params: &[(String, Tensor)]) -> (Vec<f32>, Vec<f64>) {
    let mut dp = SingleRank;
    let mut norms = Vec::new();
    for _ in 0..3 {
        optimizer.zero_grad().expect("zero_grad");
        let loss = params[0].1.square().sum(Kind::Float) + (&params[1].1 * 3.0).sum(Kind::Float);
        loss.backward();
        let found_inf = Tensor::zeros([], (Kind::Float, Device::Cpu));
        optimizer.reduce_gradients(&mut dp, &found_inf).expect("reduce");
        norms.push(optimizer.clip_grad_norm().expect("clip").double_value(&[]));
        optimizer.step(&LearningRate::at(Device::Cpu, 0.1).unwrap(), Some(&found_inf)).expect("step");
        optimizer.sync_params(&mut dp).expect("sync");
    }
    let flat = Tensor::cat(&params.iter().map(|(_, p)| p.detach().flatten(0, -1)).collect::<Vec<_>>(), 0);
    (Vec::try_from(flat).expect("f32"), norms)
}

#[test]
fn a_sharded_optimizer_of_one_rank_trains_as_the_replicated_one() {
    let mut config = Config::default().optim;
    config.grad_clip = 1.0;
    let replicated_params = params();
    let (expected, expected_norms) =
        train(&mut Replicated::new(&config, &replicated_params, GradMemory::Kept).expect("replicated"), &replicated_params);
    assert!(expected_norms[0] > 1.0, "the test clips: {expected_norms:?}");
    for mode in [ShardMode::Optimizer, ShardMode::Gradients] {
        let sharded_params = params();
        let spec = ShardSpec { mode, rank: 0, world: SingleRank.world_size(), save_id: 0, launch_secs: 0 };
        let mut sharded = Sharded::new(&config, &sharded_params, spec).expect("sharded");
        let (got, norms) = train(&mut sharded, &sharded_params);
        for (g, e) in got.iter().zip(&expected) {
            assert!((g - e).abs() <= 1e-6, "{mode:?}: {got:?} vs {expected:?}");
        }
        for (n, e) in norms.iter().zip(&expected_norms) {
            assert!((n - e).abs() <= 1e-5 * e, "{mode:?}: norms {norms:?} vs {expected_norms:?}");
        }
        assert_eq!(sharded.shard_mode(), mode);
        assert!(sharded.checkpoint_layout().is_some(), "{mode:?}: state.json records the cut");
    }
}

#[test]
fn released_gradients_train_exactly_as_kept_ones_and_hold_no_memory_between_steps() {
    let mut config = Config::default().optim;
    config.grad_clip = 1.0;
    let run = |grads| {
        let mut params = params();
        // A matrix backward never reaches: weight decay still moves it, through the
        // zero gradient a released optimizer gives it as a kept one would have.
        params.push(("c".into(), Tensor::ones([2, 2], (Kind::Float, Device::Cpu)).set_requires_grad(true)));
        let mut optimizer = Replicated::new(&config, &params, grads).expect("replicated");
        let trained = train(&mut optimizer, &params);
        optimizer.zero_grad().expect("zero_grad");
        (trained, optimizer.gradient_bytes().expect("bytes"))
    };
    let (kept, kept_bytes) = run(GradMemory::Kept);
    let (released, released_bytes) = run(GradMemory::Released);
    assert_eq!(released, kept, "the same updates, bit for bit");
    assert!(kept.0[10] < 1.0, "weight decay moved the unreached matrix: {:?}", kept.0);
    assert!(kept_bytes > 0, "kept gradients are held between steps");
    assert_eq!(released_bytes, 0, "released gradients are not");
}

#[test]
fn the_moments_are_zero_before_the_first_step_and_a_loaded_state_is_kept() {
    let config = Config::default().optim;
    let moments = |o: &Replicated| o.state().into_iter().filter(|(n, _)| n.starts_with("exp_avg")).collect::<Vec<_>>();
    let params = params();
    let fresh = Replicated::new(&config, &params, GradMemory::Released).expect("replicated");
    let saved = moments(&fresh);
    assert_eq!(saved.len(), 4, "two moments of two parameters: {:?}", saved.iter().map(|(n, _)| n).collect::<Vec<_>>());
    for (name, t) in &saved {
        assert_eq!(t.abs().sum(Kind::Double).double_value(&[]), 0.0, "{name} before any step");
    }
    // Moments a checkpoint filled are not zeroed by the first step after it.
    struct Filled;
    impl SavedState for Filled {
        fn load(&self, kinds: &[&str], range: Range<u64>) -> crate::error::Result<(Tensor, Vec<Tensor>)> {
            let len = (range.end - range.start) as i64;
            let value = |kind: &str| if kind == "exp_avg_sq" { 4.0 } else { 2.0 };
            Ok((
                Tensor::zeros([], (Kind::Float, Device::Cpu)),
                kinds.iter().map(|k| Tensor::full([len], value(k), (Kind::Float, Device::Cpu))).collect(),
            ))
        }
    }
    let mut resumed = Replicated::new(&config, &params, GradMemory::Released).expect("replicated");
    resumed.load_state(&Filled).expect("load");
    let mut dp = SingleRank;
    resumed.zero_grad().expect("zero_grad");
    params[0].1.sum(Kind::Float).backward();
    let found_inf = Tensor::zeros([], (Kind::Float, Device::Cpu));
    resumed.reduce_gradients(&mut dp, &found_inf).expect("reduce");
    resumed.step(&LearningRate::at(Device::Cpu, 0.1).unwrap(), Some(&found_inf)).expect("step");
    let after = moments(&resumed);
    let b_avg = after.iter().find(|(n, _)| n == "exp_avg.b").expect("exp_avg.b");
    // b had no gradient: beta1 times the loaded 2.
    let expected = 2.0 * config.beta1;
    assert!((b_avg.1.double_value(&[0]) - expected).abs() < 1e-6, "exp_avg.b {} vs {expected}", b_avg.1.double_value(&[0]));
}
