use tch::{Device, Kind, Tensor};

use super::*;

fn t(values: &[f32]) -> Tensor {
    Tensor::from_slice(values)
}

#[test]
fn clip_grad_norm_scales_to_max_norm_and_returns_the_norm() {
    let grads = TensorList::new(vec![t(&[3.0, 0.0]), t(&[0.0, 4.0])]);
    let norm = clip_grad_norm(&grads, 1.0).unwrap();
    assert!((norm.double_value(&[]) - 5.0).abs() < 1e-6);
    let clipped: Vec<f32> = Vec::try_from(Tensor::cat(grads.tensors(), 0)).unwrap();
    let expected = [0.6, 0.0, 0.0, 0.8];
    for (a, b) in clipped.iter().zip(expected) {
        assert!((a - b).abs() < 1e-5, "{clipped:?}");
    }
}

#[test]
fn fused_adamw_matches_the_adamw_formula_and_skips_on_found_inf() {
    let p = t(&[1.0, -2.0]);
    let g = t(&[0.5, 0.25]);
    let (m, v, step) = (p.zeros_like(), p.zeros_like(), Tensor::zeros([], (Kind::Float, Device::Cpu)));
    let lists = [p.shallow_clone(), g.shallow_clone(), m.shallow_clone(), v.shallow_clone()].map(|x| TensorList::new(vec![x]));
    let steps = TensorList::repeat(&step, 1);
    let hp = AdamW { lr: Lr::Value(0.1), beta1: 0.9, beta2: 0.999, weight_decay: 0.0, eps: 1e-8 };

    let skip = Tensor::from(1.0f32);
    fused_adamw(&lists[0], &lists[1], &lists[2], &lists[3], &steps, hp, Some(&skip)).unwrap();
    assert_eq!(Vec::<f32>::try_from(&p).unwrap(), vec![1.0, -2.0], "found_inf skips the update");

    let _ = step.shallow_clone().g_add_scalar_(1.0);
    fused_adamw(&lists[0], &lists[1], &lists[2], &lists[3], &steps, hp, Some(&Tensor::from(0.0f32))).unwrap();
    // First AdamW step moves every coordinate by lr * sign(grad).
    let after: Vec<f32> = Vec::try_from(&p).unwrap();
    assert!((after[0] - 0.9).abs() < 1e-5 && (after[1] + 2.1).abs() < 1e-5, "{after:?}");
}

/// One AdamW update of `[1.0, -2.0]` by `[0.5, 0.25]` after `prior` earlier ones at `lr`.
fn adamw_after(lr: Lr, prior: &[Lr]) -> Vec<f32> {
    let p = t(&[1.0, -2.0]);
    let g = t(&[0.5, 0.25]);
    let (m, v, step) = (p.zeros_like(), p.zeros_like(), Tensor::zeros([], (Kind::Float, Device::Cpu)));
    let lists = [p.shallow_clone(), g.shallow_clone(), m.shallow_clone(), v.shallow_clone()].map(|x| TensorList::new(vec![x]));
    let steps = TensorList::repeat(&step, 1);
    for lr in prior.iter().copied().chain([lr]) {
        let _ = step.shallow_clone().g_add_scalar_(1.0);
        let hp = AdamW { lr, beta1: 0.9, beta2: 0.999, weight_decay: 0.01, eps: 1e-8 };
        fused_adamw(&lists[0], &lists[1], &lists[2], &lists[3], &steps, hp, None).unwrap();
    }
    Vec::try_from(&p).unwrap()
}

#[test]
fn a_learning_rate_tensor_is_read_when_the_kernel_runs_and_equals_the_value() {
    let lr = Tensor::from(1e-3f64);
    // The same update bit for bit: on the CPU the kernel reads the float64 tensor's value.
    assert_eq!(adamw_after(Lr::Tensor(&lr), &[]), adamw_after(Lr::Value(1e-3), &[]));
    // What the tensor holds when the call runs counts (a replayed step's schedule).
    let _ = lr.shallow_clone().fill_(0.25);
    assert_eq!(adamw_after(Lr::Tensor(&lr), &[Lr::Value(1e-3)]), adamw_after(Lr::Value(0.25), &[Lr::Value(1e-3)]));
    assert_ne!(adamw_after(Lr::Tensor(&lr), &[]), adamw_after(Lr::Value(1e-3), &[]));
    // SGD takes it alike.
    let run_sgd = |lr: Lr| {
        let p = t(&[1.0, -2.0]);
        let lists = [p.shallow_clone(), t(&[0.5, 0.25]), p.zeros_like()].map(|x| TensorList::new(vec![x]));
        fused_sgd(&lists[0], &lists[1], &lists[2], Sgd { lr, momentum: 0.9, weight_decay: 0.0, nesterov: false }, None).unwrap();
        Vec::<f32>::try_from(&p).unwrap()
    };
    assert_eq!(run_sgd(Lr::Tensor(&lr)), run_sgd(Lr::Value(0.25)));
}

#[test]
fn profiler_counts_matmul_flops() {
    let a = Tensor::ones([8, 16], (Kind::Float, Device::Cpu));
    let b = Tensor::ones([16, 4], (Kind::Float, Device::Cpu));
    profiler::start().unwrap();
    let _c = a.mm(&b);
    let (flops, ops) = profiler::stop().unwrap();
    assert_eq!(flops, 2 * 8 * 16 * 4);
    assert_eq!(ops, 1);
}

#[test]
fn flop_count_splits_matmul_elementwise_and_attention() {
    let opts = (Kind::Float, Device::Cpu);
    let a = Tensor::ones([8, 16], opts);
    let b = Tensor::ones([16, 4], opts);
    // [batch 2, heads 3, T 5, E 4]; keys and values over S 7 positions.
    let q = Tensor::ones([2, 3, 5, 4], opts).set_requires_grad(true);
    let kv = Tensor::ones([2, 3, 7, 4], opts);
    profiler::count_start().unwrap();
    let _c = a.mm(&b);
    let _d = &a + &a;
    let y = Tensor::scaled_dot_product_attention::<Tensor>(&q, &kv, &kv, None, 0.0, false, None, false);
    y.sum(Kind::Float).backward();
    let counts = profiler::count_stop().unwrap();
    assert_eq!(counts.matmul, 2 * 8 * 16 * 4);
    assert_eq!(counts.elementwise, 8 * 16);
    let forward = 2 * 2 * 3 * 5 * 7 * (4 + 4);
    assert_eq!(counts.attention, 3 * forward, "forward plus a backward of twice the forward");
    assert_eq!(counts.attention_ops, 2);
}

#[test]
fn cuda_helpers_are_harmless_without_a_gpu_and_report_the_allocator_on_one() {
    if !tch::Cuda::is_available() {
        assert!(cuda::empty_cache().is_ok());
        assert_eq!(cuda::memory(0).unwrap_or_default(), cuda::Memory::default());
        return;
    }
    // On a GPU: 4 MiB allocated show in the counters; freed and emptied, the
    // allocator gives the memory back.
    let before = cuda::memory(0).unwrap();
    let x = Tensor::zeros([1 << 20], (Kind::Float, Device::Cuda(0)));
    let during = cuda::memory(0).unwrap();
    assert!(during.allocated >= before.allocated + (4 << 20), "{before:?} -> {during:?}");
    assert!(during.peak >= during.allocated && during.reserved >= during.allocated, "{during:?}");
    drop(x);
    cuda::empty_cache().unwrap();
    let after = cuda::memory(0).unwrap();
    assert!(after.allocated < during.allocated && after.reserved < during.reserved, "{during:?} -> {after:?}");
}

#[test]
fn foreach_norms_count_nonzeros_and_non_finite_entries() {
    let ts = TensorList::new(vec![t(&[3.0, 4.0, 0.0]), t(&[f32::NAN, 0.0]), t(&[f32::INFINITY])]);
    let l2: Vec<f64> = Vec::try_from(foreach::norms(&ts, 2.0).unwrap()).unwrap();
    assert_eq!(l2[0], 5.0);
    assert!(l2[1].is_nan() && l2[2].is_infinite());
    let nonzero: Vec<f64> = Vec::try_from(foreach::norms(&ts, 0.0).unwrap()).unwrap();
    assert_eq!(nonzero, [2.0, 1.0, 1.0]);
    let nonfinite: Vec<f64> = Vec::try_from(foreach::norms(&foreach::mul_scalar(&ts, 0.0).unwrap(), 0.0).unwrap()).unwrap();
    assert_eq!(nonfinite, [0.0, 1.0, 1.0]);
    let (a, b) = (TensorList::new(vec![t(&[1.0, 2.0])]), TensorList::new(vec![t(&[0.5, 0.5])]));
    foreach::sub_(&a, &b).unwrap();
    assert_eq!(Vec::<f32>::try_from(&a.tensors()[0]).unwrap(), [0.5, 1.5]);
}

#[test]
fn a_trace_records_spans_and_operators_and_saves_chrome_json() {
    let o = trace::Options { cuda: false, shapes: true, memory: false };
    trace::prepare(o).unwrap();
    trace::start(o).unwrap();
    trace::metadata("distributedInfo", "{\"rank\": 3, \"world_size\": 4}").unwrap();
    let span = trace::Span::begin("ProfilerStep#7").unwrap();
    let x = Tensor::ones([4, 4], (Kind::Float, Device::Cpu));
    let _ = x.matmul(&x);
    span.end().unwrap();
    let recorded = trace::stop(None).unwrap();
    let path = std::env::temp_dir().join(format!("ptrain-torch-ext-trace-{}.json", std::process::id()));
    // Written on another thread, as the trace plugin does.
    let saved = std::thread::spawn({
        let path = path.clone();
        move || recorded.save(&path)
    });
    saved.join().unwrap().unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    assert!(text.contains("\"name\": \"ProfilerStep#7\"") || text.contains("\"name\":\"ProfilerStep#7\""), "{}", &text[..text.len().min(2000)]);
    assert!(text.contains("aten::matmul") && text.contains("\"rank\": 3"), "{}", &text[..text.len().min(2000)]);
}

#[test]
fn autocast_restores_the_dtype_it_found() {
    // libtorch's default CUDA autocast dtype is float16; the state is per thread
    // and needs no GPU to set or read.
    let before = autocast_dtype(true).unwrap();
    assert_eq!(before, Kind::Half);
    let inside = autocast_bf16(true, || autocast_dtype(true).unwrap()).unwrap();
    assert_eq!(inside, Kind::BFloat16);
    assert_eq!(autocast_dtype(true).unwrap(), before, "the region's bfloat16 leaked out of it");
    assert_eq!(autocast_bf16(false, || autocast_dtype(false).unwrap()).unwrap(), Kind::BFloat16);
}

#[test]
fn pinning_passes_no_device_and_pins_on_a_gpu() {
    let host = t(&[1.0, 2.0]);
    if !tch::Cuda::is_available() {
        // Without a GPU: nothing is pinned, and pinning is an error, not a crash.
        assert!(!is_pinned(&host).unwrap());
        let err = pin_memory(&host).expect_err("no device to pin for");
        assert!(!err.0.is_empty());
        return;
    }
    assert!(!is_pinned(&host).unwrap());
    let pinned = pin_memory(&host).unwrap();
    assert!(is_pinned(&pinned).unwrap());
    assert_eq!(Vec::<f32>::try_from(&pinned).unwrap(), [1.0, 2.0]);
}

#[test]
fn a_span_ends_only_on_the_thread_that_began_it() {
    let span = trace::Span::begin("moved").unwrap();
    let ended = std::thread::spawn(move || span.end()).join().unwrap();
    assert!(ended.unwrap_err().0.contains("thread that began it"));
    // Dropped on another thread: left open, not ended there.
    let span = trace::Span::begin("dropped").unwrap();
    std::thread::spawn(move || drop(span)).join().unwrap();
    trace::Span::begin("here").unwrap().end().unwrap();
}

#[test]
fn precomputed_gradients_reach_the_leaves_scaled_and_without_a_copy() {
    let hidden = Tensor::ones([3, 2], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let weight = Tensor::ones([4, 2], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let grad_weight = Tensor::arange(8, (Kind::Float, Device::Cpu)).view([4, 2]);
    let grad_hidden = Tensor::full([3, 2], 2.0, (Kind::Float, Device::Cpu));
    let at = grad_weight.data_ptr();
    let value = Tensor::from(5.0f32);
    let out = crate::precomputed(&hidden, &weight, &value, grad_hidden, Some(grad_weight)).unwrap();
    assert_eq!(out.double_value(&[]), 5.0);
    // A scaled loss (as 1 / tokens scales it): the gradients are scaled with it.
    (&out * 0.5).backward();
    assert_eq!(Vec::<f32>::try_from(weight.grad().flatten(0, -1)).unwrap(), (0..8).map(|i| i as f32 * 0.5).collect::<Vec<_>>());
    assert_eq!(Vec::<f32>::try_from(hidden.grad().flatten(0, -1)).unwrap(), vec![1.0; 6]);
    assert_eq!(weight.grad().data_ptr(), at, "the weight's gradient is the precomputed buffer itself, not a copy");
}

#[test]
fn a_frozen_weight_gets_no_precomputed_gradient() {
    let hidden = Tensor::ones([3, 2], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let weight = Tensor::ones([4, 2], (Kind::Float, Device::Cpu));
    let out = crate::precomputed(&hidden, &weight, &Tensor::from(1.0f32), Tensor::ones([3, 2], (Kind::Float, Device::Cpu)), None).unwrap();
    out.backward();
    assert!(!weight.grad().defined());
    assert_eq!(hidden.grad().sum(Kind::Float).double_value(&[]), 6.0);
}

#[test]
fn swiglu_gives_autograds_output_and_gradients_bit_for_bit() {
    for (gate_kind, up_kind) in [(Kind::Float, Kind::Float), (Kind::BFloat16, Kind::BFloat16), (Kind::BFloat16, Kind::Float)] {
        tch::manual_seed(0);
        let leaf = |kind| Tensor::randn([5, 37], (Kind::Float, Device::Cpu)).to_kind(kind).set_requires_grad(true);
        let (gate, up) = (leaf(gate_kind), leaf(up_kind));
        let weights = Tensor::randn([5, 37], (Kind::Float, Device::Cpu));
        let run = |fused: bool| {
            let out = if fused { swiglu(&gate, &up).unwrap() } else { gate.silu() * &up };
            let grads = Tensor::run_backward(&[(&out * &weights).sum(Kind::Float)], &[&gate, &up], false, false);
            (out, grads)
        };
        let ((fused, fused_grads), (plain, plain_grads)) = (run(true), run(false));
        let what = format!("gate {gate_kind:?}, up {up_kind:?}");
        assert_eq!(fused.kind(), plain.kind(), "{what}");
        assert!(fused.equal(&plain), "{what}: the output");
        assert!(fused_grads[0].equal(&plain_grads[0]), "{what}: the gate's gradient");
        assert!(fused_grads[1].equal(&plain_grads[1]), "{what}: up's gradient");
    }
}

#[test]
fn a_recomputed_swiglu_product_gives_the_saved_ones_gradients_bit_for_bit() {
    // A down projection over the product: trained (full fine-tuning, with and without
    // a bias: MmBackward0 and AddmmBackward0 keep it) or frozen with a LoRA adapter
    // (its A's MmBackward0 keeps it).
    for (lora, bias) in [(false, false), (false, true), (true, false), (true, true)] {
        tch::manual_seed(0);
        let leaf = |shape: &[i64], grad: bool| (Tensor::randn(shape, (Kind::Float, Device::Cpu)) * 0.5).set_requires_grad(grad);
        let (gate, up) = (leaf(&[2, 7, 24], true), leaf(&[2, 7, 24], true));
        let (w, b) = (leaf(&[5, 24], !lora), bias.then(|| leaf(&[5], !lora)));
        let (lora_a, lora_b) = (leaf(&[3, 24], true), leaf(&[5, 3], true));
        let weights = Tensor::randn([2, 7, 5], (Kind::Float, Device::Cpu));
        let mut trained = vec![&gate, &up];
        match lora {
            true => trained.extend([&lora_a, &lora_b]),
            false => trained.extend(std::iter::once(&w).chain(b.as_ref())),
        }
        let run = |recompute: bool| {
            let product = swiglu(&gate, &up).unwrap();
            let mut out = product.linear(&w, b.as_ref());
            if lora {
                out += product.linear::<Tensor>(&lora_a, None).linear::<Tensor>(&lora_b, None) * 2.0;
            }
            let dropped = if recompute { recompute_swiglu_product(&out, &product, &gate, &up).unwrap() } else { 0 };
            drop(product);
            (dropped, Tensor::run_backward(&[(&out * &weights).sum(Kind::Float)], &trained, false, false))
        };
        let ((dropped, recomputed), (_, saved)) = (run(true), run(false));
        let what = format!("LoRA {lora}, bias {bias}");
        assert_eq!(dropped, 1, "{what}: the saved product is dropped");
        for (i, (r, s)) in recomputed.iter().zip(&saved).enumerate() {
            assert!(r.equal(s), "{what}: gradient {i}");
        }
    }
}
