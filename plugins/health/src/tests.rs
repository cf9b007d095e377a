use abi_stable::std_types::RSlice;
use ptrain_plugin_api::{testing, Hook, HostApi, NamedTensor, Outbox, Plugin, StepContext, TensorRef};
use tch::Tensor;

use super::{detector::SpikeDetector, groups::group_of, Health};

#[test]
fn groups_are_module_paths_cut_to_a_depth() {
    assert_eq!(group_of("transformer.h.0.attn.c_attn.weight", 3), "transformer.h.0");
    assert_eq!(group_of("transformer.wte.weight", 3), "transformer.wte");
    assert_eq!(group_of("layers.1.bias", 3), "layers.1");
    assert_eq!(group_of("transformer.h.0.attn.c_attn.weight", 0), "transformer.h.0.attn.c_attn");
    assert_eq!(group_of("scale", 2), "scale");
}

#[test]
fn the_detector_waits_for_a_history_then_flags_a_spike_only() {
    let mut d = SpikeDetector::new(10, 6.0, 5);
    for (i, v) in [1.0, 1.1, 0.9, 1.05, 0.95].iter().enumerate() {
        let verdict = d.check(*v);
        assert!(!verdict.anomaly && verdict.zscore.is_none(), "check {i}: {verdict:?}");
    }
    assert!(!d.check(1.08).anomaly, "within the spread");
    let spike = d.check(50.0);
    assert!(spike.anomaly && spike.zscore.unwrap() > 100.0, "{spike:?}");
    assert!(!d.check(1.0).anomaly, "the median is robust to the spike in the history");
    assert!(d.check(f64::NAN).anomaly, "non-finite is an anomaly");
    assert_eq!(d.history().len(), 8, "non-finite values stay out of the history");
}

#[test]
fn the_history_is_bounded_and_restored() {
    let mut d = SpikeDetector::new(3, 6.0, 1);
    for v in [1.0, 2.0, 3.0, 4.0] {
        d.check(v);
    }
    assert_eq!(d.history(), vec![2.0, 3.0, 4.0]);
    let mut e = SpikeDetector::new(2, 6.0, 1);
    e.restore(&d.history());
    assert_eq!(e.history(), vec![3.0, 4.0]);
}

fn named<'a>(names: &'a [&'a str], tensors: &[Tensor]) -> Vec<NamedTensor<'a>> {
    names.iter().zip(tensors).map(|(n, t)| NamedTensor { name: (*n).into(), tensor: TensorRef::of(t) }).collect()
}

#[test]
fn a_due_step_reports_norms_ratio_and_fractions_per_group_and_in_total() {
    let mut plugin = Health::new(serde_json::json!({"group_depth": 1}), HostApi::standalone()).unwrap();
    let names = ["a.weight", "a.bias", "b.weight"];
    let params = [Tensor::from_slice(&[3.0f32, 4.0]), Tensor::from_slice(&[0.0f32, 12.0]), Tensor::from_slice(&[1.0f32, 1.0, 1.0, 1.0])];
    let grads = [Tensor::from_slice(&[0.0f32, 2.0]), Tensor::from_slice(&[f32::INFINITY, 0.0]), Tensor::from_slice(&[1.0f32, -1.0, 1.0, -1.0])];
    let (p, g) = (named(&names, &params), named(&names, &grads));
    let mut out = Outbox::new();
    let ctx = StepContext { params: RSlice::from_slice(&p), grads: RSlice::from_slice(&g), ..testing::step(Hook::AfterBackward, 100) };
    plugin.on_step(&ctx, &mut out).unwrap();
    // The update: a.weight moves by (0.3, 0.4), the others stay.
    let _ = tch::no_grad(|| params[0].shallow_clone().g_sub_(&Tensor::from_slice(&[0.3f32, 0.4])));
    let ctx = StepContext { params: RSlice::from_slice(&p), ..testing::step(Hook::StepEnd, 100) };
    plugin.on_step(&ctx, &mut out).unwrap();
    let m = testing::scalars(&mut out);
    let v = |name: &str| testing::scalar(&m, name).unwrap_or_else(|| panic!("{name} missing from {m:?}"));
    assert!((v("health/a/param_norm") - 13.0).abs() < 1e-6, "sqrt(9 + 16 + 144)");
    assert!((v("health/a/update_ratio") - 0.5 / 13.0).abs() < 1e-6);
    assert_eq!(v("health/a/grad_zero_frac"), 0.5);
    assert_eq!(v("health/a/grad_nonfinite_frac"), 0.25);
    assert!(v("health/a/grad_norm").is_infinite());
    assert!((v("health/b/grad_norm") - 2.0).abs() < 1e-9);
    assert_eq!(v("health/b/update_ratio"), 0.0);
    assert!((v("health/param_norm") - (169.0f64 + 4.0).sqrt()).abs() < 1e-6);
    assert_eq!(v("health/grad_zero_frac"), 2.0 / 8.0);
    assert_eq!(v("health/anomaly"), 1.0, "a non-finite gradient norm is an anomaly");
}
