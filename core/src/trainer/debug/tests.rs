use super::*;

fn debug(set: impl FnOnce(&mut DebugConfig)) -> DebugConfig {
    let mut debug = crate::config::Config::default().debug;
    set(&mut debug);
    debug
}

#[test]
fn faults_fire_at_their_steps_only_and_as_errors() {
    let faults = Faults::new(
        &debug(|d| {
            d.fail_at_step = 3;
            d.grad_spike_at = vec![2, 5];
            d.grad_spike_factor = 100.0;
        }),
        Device::Cpu,
    );
    assert!(!faults.at(2) && faults.at(3));
    assert!(faults.inject(2).is_ok());
    let err = faults.inject(3).unwrap_err();
    assert!(matches!(err, Error::Torch(_)), "a libtorch error, not a panic: {err}");
    assert_eq!([1, 2, 5].map(|s| faults.grad_spike(s)), [None, Some(100.0), Some(100.0)]);
    let nan = Faults::new(&debug(|d| d.nonfinite_loss_at = vec![4]), Device::Cpu);
    assert!(nan.nan_at(4) && !nan.nan_at(3) && !faults.nan_at(4));
    let none = Faults::new(&debug(|_| {}), Device::Cpu);
    assert!(!(1..100).any(|s| none.at(s) || none.grad_spike(s).is_some() || none.nan_at(s)), "nothing by default");
}

#[test]
fn a_dump_holds_the_batches_their_token_losses_and_the_parameters_around_the_update() {
    let dir = tempfile::tempdir().unwrap();
    let mut dump = TensorDump::new(&debug(|d| d.dump_tensors_at = vec![4]));
    assert!(dump.at(4) && !dump.at(3));
    let w = Tensor::from_slice(&[1.0f32, 2.0]).set_requires_grad(true);
    (&w * 3.0).sum(Kind::Float).backward();
    let params = [("w".to_string(), w)];
    let inputs = Tensor::from_slice(&[1i64, 2, 3]).view([1, 3]);
    let targets = Tensor::from_slice(&[2i64, 3, crate::data::IGNORE_INDEX]).view([1, 3]);
    let batch = Batch { inputs, targets, dataset_ids: None, segments: None, payload: crate::data::Payload::TrainedTokens(2), samples: 1, tokens: 3 };
    let logits = Tensor::zeros([1, 3, 4], (Kind::Float, Device::Cpu));
    dump.keep_batch(0, &batch, Some(&logits)).unwrap();
    dump.keep_before_update(&params);
    let _ = tch::no_grad(|| params[0].1.shallow_clone().f_sub_(&params[0].1.grad())).unwrap();
    dump.write(4, &params, dir.path(), 1).unwrap();
    let written: std::collections::HashMap<String, Tensor> =
        Tensor::read_safetensors(dir.path().join("tensors-step4.rank1.safetensors")).unwrap().into_iter().collect();
    let values = |name: &str| Vec::<f64>::try_from(written[name].to_kind(Kind::Double).flatten(0, -1)).unwrap();
    assert_eq!(values("param/w"), [1.0, 2.0]);
    assert_eq!(values("grad/w"), [3.0, 3.0]);
    assert_eq!(values("updated/w"), [-2.0, -1.0]);
    assert_eq!(values("batch0/targets"), [2.0, 3.0, -100.0]);
    let losses = values("batch0/token_loss");
    assert!(losses[..2].iter().all(|l| (l - 4f64.ln()).abs() < 1e-6) && losses[2] == 0.0, "ln 4 on uniform logits, 0 where not trained: {losses:?}");
    dump.write(5, &params, dir.path(), 1).unwrap();
    let next: Vec<String> =
        Tensor::read_safetensors(dir.path().join("tensors-step5.rank1.safetensors")).unwrap().into_iter().map(|(n, _)| n).collect();
    assert_eq!(next, ["updated/w"], "the batches kept went with their step");
}
