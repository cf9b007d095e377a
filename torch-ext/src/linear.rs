//! Linear layers and the loss's products through oneDNN's float32 CPU kernels where
//! they are the faster ones (`csrc/linear.cpp`): forwards and input gradients, and the
//! weight gradient of a layer that narrows; MKL's (ATen's) for the other weight
//! gradients. Process-wide, like `torch.backends.mkldnn`: off until
//! [`set_onednn_matmuls`] turns it on; off, or for anything but float32 CPU tensors
//! outside CPU autocast, these are `at::linear` and `at::matmul`.

use std::ffi::c_char;

use tch::Tensor;

use crate::{error::check, list::Raw, TorchError};

extern "C" {
    fn ptx_set_onednn_matmuls(on: bool, applied: *mut bool) -> *mut c_char;
    fn ptx_onednn_matmuls(on: *mut bool) -> *mut c_char;
    fn ptx_linear(x: Raw, w: Raw, b: Raw, gate: Raw, up: Raw, out: *mut Raw) -> *mut c_char;
    fn ptx_matmul_t(a: Raw, w: Raw, out: *mut Raw) -> *mut c_char;
}

/// Turns oneDNN's products on or off for the whole process; returns whether they are
/// on (false where this libtorch lacks oneDNN or `torch.backends.mkldnn` is off).
pub fn set_onednn_matmuls(on: bool) -> Result<bool, TorchError> {
    let mut applied = false;
    // SAFETY: the shim writes only `applied` and catches C++ exceptions.
    check(unsafe { ptx_set_onednn_matmuls(on, &mut applied) })?;
    Ok(applied)
}

/// Whether oneDNN's products are on.
pub fn onednn_matmuls() -> Result<bool, TorchError> {
    let mut on = false;
    // SAFETY: the shim writes only `on` and catches C++ exceptions.
    check(unsafe { ptx_onednn_matmuls(&mut on) })?;
    Ok(on)
}

fn raw(t: Option<&Tensor>) -> Raw {
    t.map_or(std::ptr::null_mut(), |t| t.as_ptr() as Raw)
}

/// `x W^T + b` with autograd, as `Tensor::linear`. With `recompute = (gate, up)`,
/// `x` is `silu(gate) * up` and backward recomputes it for the weight gradient
/// instead of keeping it (the caller keeps `gate` and `up` anyway).
pub fn linear(x: &Tensor, w: &Tensor, b: Option<&Tensor>, recompute: Option<(&Tensor, &Tensor)>) -> Result<Tensor, TorchError> {
    let (gate, up) = recompute.map_or((None, None), |(g, u)| (Some(g), Some(u)));
    let mut out: Raw = std::ptr::null_mut();
    // SAFETY: every non-null handle is a live tensor borrowed for the call (null is
    // "absent"); the shim keeps reference-counted copies of what backward needs, writes
    // one owned heap tensor to `out` and catches C++ exceptions.
    check(unsafe { ptx_linear(x.as_ptr() as Raw, w.as_ptr() as Raw, raw(b), raw(gate), raw(up), &mut out) })?;
    // SAFETY: on success the shim wrote a heap `at::Tensor*` that we now own.
    Ok(unsafe { Tensor::from_ptr(out as *mut _) })
}

/// `a W^T` for 2-D `a` and `w`, without autograd (call it under no-grad).
pub fn matmul_t(a: &Tensor, w: &Tensor) -> Result<Tensor, TorchError> {
    let mut out: Raw = std::ptr::null_mut();
    // SAFETY: both handles are live tensors borrowed for the call; the shim writes one
    // owned heap tensor to `out` and catches C++ exceptions.
    check(unsafe { ptx_matmul_t(a.as_ptr() as Raw, w.as_ptr() as Raw, &mut out) })?;
    // SAFETY: on success the shim wrote a heap `at::Tensor*` that we now own.
    Ok(unsafe { Tensor::from_ptr(out as *mut _) })
}

#[cfg(test)]
mod tests {
    use tch::{Device, Kind, Tensor};

    use super::*;
    use crate::swiglu;

    fn close(a: &Tensor, b: &Tensor, what: &str) {
        let err = (a - b).abs().max().double_value(&[]);
        let scale = b.abs().max().double_value(&[]).max(1e-6);
        assert!(err <= 1e-5 * scale, "{what}: off by {err} of {scale}");
    }

    // One test: the switch is process-wide, and tests of one binary share the process.
    #[test]
    fn onednn_products_give_at_linears_values_and_gradients_and_the_recompute_changes_nothing() {
        assert!(set_onednn_matmuls(true).unwrap(), "this libtorch has oneDNN: the products take it");
        let leaf = |shape: &[i64], grad: bool| (Tensor::randn(shape, (Kind::Float, Device::Cpu)) * 0.5).set_requires_grad(grad);
        // A layer that narrows (oneDNN's weight gradient) and one that widens (MKL's), with
        // and without a bias, trained or frozen (LoRA's base), on [batch, positions, in].
        for (inp, out, bias, trained) in [(24, 5, false, true), (24, 5, true, true), (5, 24, true, true), (5, 24, false, false), (24, 5, true, false)]
        {
            tch::manual_seed(0);
            let (x, w, b) = (leaf(&[2, 7, inp], true), leaf(&[out, inp], trained), bias.then(|| leaf(&[out], trained)));
            let weights = Tensor::randn([2, 7, out], (Kind::Float, Device::Cpu));
            let leaves: Vec<&Tensor> = std::iter::once(&x).chain(trained.then_some(&w)).chain(b.as_ref().filter(|_| trained)).collect();
            let run = |onednn: bool| {
                set_onednn_matmuls(onednn).unwrap();
                let y = linear(&x, &w, b.as_ref(), None).unwrap();
                let grads = Tensor::run_backward(&[(&y * &weights).sum(Kind::Float)], &leaves, false, false);
                (y, grads)
            };
            let ((y, grads), (plain_y, plain_grads)) = (run(true), run(false));
            let what = format!("{inp} -> {out}, bias {bias}, trained {trained}");
            assert_eq!(y.size(), plain_y.size(), "{what}");
            close(&y, &plain_y, &format!("{what}: the output"));
            for (i, (g, p)) in grads.iter().zip(&plain_grads).enumerate() {
                close(g, p, &format!("{what}: gradient {i}"));
            }
        }
        // The down projection over silu(gate) * up, the product kept or recomputed.
        set_onednn_matmuls(true).unwrap();
        let (gate, up, w) = (leaf(&[2, 7, 24], true), leaf(&[2, 7, 24], true), leaf(&[5, 24], true));
        let run = |recompute: bool| {
            let product = swiglu(&gate, &up).unwrap();
            let y = linear(&product, &w, None, recompute.then_some((&gate, &up))).unwrap();
            drop(product);
            Tensor::run_backward(&[y.square().sum(Kind::Float)], &[&gate, &up, &w], false, false)
        };
        for (i, (r, k)) in run(true).iter().zip(&run(false)).enumerate() {
            assert!(r.equal(k), "recomputed product: gradient {i} bit for bit");
        }
        // matmul_t: a W^T, as matmul computes it (bit for bit when off).
        let (a, w) = (Tensor::randn([9, 24], (Kind::Float, Device::Cpu)), Tensor::randn([5, 24], (Kind::Float, Device::Cpu)));
        close(&matmul_t(&a, &w).unwrap(), &a.matmul(&w.tr()), "matmul_t");
        set_onednn_matmuls(false).unwrap();
        assert!(!onednn_matmuls().unwrap());
        assert!(matmul_t(&a, &w).unwrap().equal(&a.matmul(&w.tr())), "matmul_t off is matmul");
        // The FLOP counter counts oneDNN's products: forward, dX and (narrowing) dW, each 2 x 14 x 5 x 24.
        set_onednn_matmuls(true).unwrap();
        let (x, w) = (leaf(&[2, 7, 24], true), leaf(&[5, 24], true));
        crate::profiler::count_start().unwrap();
        linear(&x, &w, None, None).unwrap().sum(Kind::Float).backward();
        let counts = crate::profiler::count_stop().unwrap();
        assert_eq!((counts.matmul, counts.counted_ops), (3 * 2 * 14 * 5 * 24, 3), "{counts:?}");
        // Under CPU autocast the layer is at::linear's: it casts to bfloat16.
        let y = crate::autocast_bf16(false, || linear(&a, &w, None, None).unwrap()).unwrap();
        assert_eq!(y.kind(), Kind::BFloat16);
        set_onednn_matmuls(false).unwrap();
    }
}
