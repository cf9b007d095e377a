//! Per-dataset sums kept on the device: one `[3, datasets]` float64 tensor of
//! (loss sum, correct predictions, samples), added to by an `index_add_` keyed by
//! each sample's dataset id. Nothing here reads a value back to the host.
//!
//! On the CPU the device is the host: there the sums are kept in a plain array
//! and filled by one pass over the logits' memory. Six tiny libtorch operations
//! cost tens of microseconds in dispatch on the CPU (several percent of a small
//! model's step); the pass costs a few.

use ptrain_plugin_api::loss::{cross_entropy, IGNORE_INDEX};
use tch::{Device, Kind, Reduction, Tensor};

/// Rows of the accumulator.
pub const LOSS: usize = 0;
pub const CORRECT: usize = 1;
pub const SAMPLES: usize = 2;

/// Per-batch scratch, reused while the batch size stays the same.
struct Scratch {
    batch: i64,
    /// `[3, batch]` float64: per-sample loss, correct (0/1) and 1.
    rows: Tensor,
    loss: Tensor,
    correct: Tensor,
    predicted: Tensor,
}

impl Scratch {
    fn new(batch: i64, device: Device) -> Result<Scratch, tch::TchError> {
        let rows = Tensor::f_zeros([3, batch], (Kind::Double, device))?;
        let _ = rows.f_select(0, SAMPLES as i64)?.f_fill_(1.0)?;
        Ok(Scratch {
            batch,
            loss: rows.f_select(0, LOSS as i64)?,
            correct: rows.f_select(0, CORRECT as i64)?,
            rows,
            predicted: Tensor::f_empty([batch], (Kind::Int64, device))?,
        })
    }
}

pub struct Accumulator {
    datasets: i64,
    sums: Option<Tensor>,
    scratch: Option<Scratch>,
    /// The CPU path's sums, `[row * datasets + dataset]`.
    host: Vec<f64>,
    host_path: bool,
}

impl Accumulator {
    pub fn new(datasets: usize) -> Accumulator {
        Accumulator { datasets: datasets as i64, sums: None, scratch: None, host: vec![0.0; 3 * datasets], host_path: true }
    }

    /// Always uses tensor operations (as on CUDA), also on the CPU: for tests.
    #[cfg(test)]
    pub fn with_tensor_ops(datasets: usize) -> Accumulator {
        Accumulator { host_path: false, ..Accumulator::new(datasets) }
    }

    /// Adds a batch: `logits [B, C]`, `labels [B]` class ids, `ids [B]` dataset
    /// indices, all on one device.
    pub fn add(&mut self, logits: &Tensor, labels: &Tensor, ids: &Tensor) -> Result<(), tch::TchError> {
        if self.host_path && self.add_on_host(logits, labels, ids) {
            return Ok(());
        }
        self.add_with_tensor_ops(logits, labels, ids)
    }

    /// The CPU path; false (nothing added) when the tensors do not suit it.
    fn add_on_host(&mut self, logits: &Tensor, labels: &Tensor, ids: &Tensor) -> bool {
        let (Ok((b, c)), Ok(nl), Ok(ni)) = (logits.size2(), labels.size1(), ids.size1()) else { return false };
        let on_cpu = [logits, labels, ids].iter().all(|t| t.device() == Device::Cpu && t.is_contiguous());
        if !on_cpu || logits.kind() != Kind::Float || labels.kind() != Kind::Int64 || ids.kind() != Kind::Int64 || nl != b || ni != b || c < 1 {
            return false;
        }
        let (b, c, datasets) = (b as usize, c as usize, self.datasets as usize);
        // SAFETY: contiguous CPU tensors of these kinds and sizes, borrowed for the
        // duration of this call by the host that owns them.
        let (logits, labels, ids) = unsafe {
            (
                std::slice::from_raw_parts(logits.data_ptr() as *const f32, b * c),
                std::slice::from_raw_parts(labels.data_ptr() as *const i64, b),
                std::slice::from_raw_parts(ids.data_ptr() as *const i64, b),
            )
        };
        if labels.iter().any(|&y| y < 0 || y as usize >= c) || ids.iter().any(|&d| d < 0 || d as usize >= datasets) {
            return false;
        }
        for ((row, &y), &d) in logits.chunks_exact(c).zip(labels).zip(ids) {
            // argmax as torch's: the first of equal maxima.
            let (argmax, max) = row.iter().enumerate().fold((0, f32::NEG_INFINITY), |best, (i, &v)| if v > best.1 { (i, v) } else { best });
            let log_sum_exp = max as f64 + row.iter().map(|&v| (v as f64 - max as f64).exp()).sum::<f64>().ln();
            let d = d as usize;
            self.host[LOSS * datasets + d] += log_sum_exp - row[y as usize] as f64;
            self.host[CORRECT * datasets + d] += (argmax == y as usize) as u8 as f64;
            self.host[SAMPLES * datasets + d] += 1.0;
        }
        true
    }

    /// Moves what the CPU path summed into the sums tensor (at report time).
    fn fold_host(&mut self) -> Result<(), tch::TchError> {
        if self.host.iter().all(|&v| v == 0.0) {
            return Ok(());
        }
        let host = Tensor::f_from_slice(&self.host)?.f_view([3, self.datasets])?;
        self.sums = Some(match self.sums.take() {
            Some(sums) => sums.f_add(&host.f_to_device(sums.device())?)?,
            None => host,
        });
        self.host.iter_mut().for_each(|v| *v = 0.0);
        Ok(())
    }

    /// The trainer's cross-entropy (plugin-api's, a log-softmax and a gather) and four
    /// kernels, all on the tensors' device.
    fn add_with_tensor_ops(&mut self, logits: &Tensor, labels: &Tensor, ids: &Tensor) -> Result<(), tch::TchError> {
        let _guard = tch::no_grad_guard();
        let batch = logits.size()[0];
        let device = logits.device();
        if self.scratch.as_ref().is_none_or(|s| s.batch != batch) {
            self.scratch = Some(Scratch::new(batch, device)?);
        }
        if self.sums.is_none() {
            self.sums = Some(Tensor::f_zeros([3, self.datasets], (Kind::Double, device))?);
        }
        let (s, sums) = (self.scratch.as_mut().expect("scratch"), self.sums.as_mut().expect("sums"));
        // The trainer's loss, per sample (float32, bf16 logits included).
        s.loss.f_copy_(&cross_entropy(logits, labels, Reduction::None)?)?;
        // The log-softmax keeps the logits' order: their argmax is the prediction.
        let _ = logits.f_argmax_out(&s.predicted, -1, false)?;
        let _ = s.predicted.f_eq_tensor_out(&s.correct, labels)?;
        let _ = sums.f_index_add_(1, ids, &s.rows)?;
        Ok(())
    }

    /// Adds a language model's batch: `logits [B, T, V]`, `labels [B, T]`
    /// ([`IGNORE_INDEX`]: not trained), `ids [B, T]` each token's dataset (a packed
    /// sequence holds rows of several). The rows become (loss, correct, 1) per
    /// trained token, 0 for the rest: the sums are per-token means' numerators and
    /// token counts.
    pub fn add_tokens(&mut self, logits: &Tensor, labels: &Tensor, ids: &Tensor) -> Result<(), tch::TchError> {
        let _guard = tch::no_grad_guard();
        let vocab = logits.size().last().copied().unwrap_or(1);
        let device = logits.device();
        if self.sums.is_none() {
            self.sums = Some(Tensor::f_zeros([3, self.datasets], (Kind::Double, device))?);
        }
        let labels = labels.f_reshape([-1])?;
        let logits = logits.f_reshape([-1, vocab])?;
        // The trainer's per-token loss: 0 where not trained.
        let loss = cross_entropy(&logits, &labels, Reduction::None)?.f_to_kind(Kind::Double)?;
        let trained = labels.f_ne(IGNORE_INDEX)?.f_to_kind(Kind::Double)?;
        let correct = logits.f_argmax(-1, false)?.f_eq_tensor(&labels)?.f_to_kind(Kind::Double)?.f_mul(&trained)?;
        let rows = Tensor::f_stack(&[loss, correct, trained], 0)?;
        let _ = self.sums.as_mut().expect("sums").f_index_add_(1, &ids.f_reshape([-1])?, &rows)?;
        Ok(())
    }

    /// The device tensor of sums, `[3, datasets]`, if anything was added; for an
    /// all-reduce in place before [`Accumulator::take`].
    pub fn sums(&mut self) -> Result<Option<&Tensor>, tch::TchError> {
        self.fold_host()?;
        Ok(self.sums.as_ref())
    }

    /// Reads the sums (the one host sync) and zeroes them for the next window:
    /// `[row][dataset]`.
    pub fn take(&mut self) -> Result<Option<[Vec<f64>; 3]>, tch::TchError> {
        self.fold_host()?;
        let Some(sums) = self.sums.as_mut() else { return Ok(None) };
        let flat = Vec::<f64>::try_from(sums.f_to_device(Device::Cpu)?.f_view([-1])?)?;
        let _ = sums.f_zero_()?;
        let n = self.datasets as usize;
        Ok(Some([flat[..n].to_vec(), flat[n..2 * n].to_vec(), flat[2 * n..].to_vec()]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Logits, labels and dataset ids of one batch of three-class samples.
    type Batch<'a> = (&'a [[f32; 3]], &'a [i64], &'a [i64]);

    /// What the host would compute, sample by sample.
    fn reference(logits: &[[f32; 3]], labels: &[i64], ids: &[i64], datasets: usize) -> [Vec<f64>; 3] {
        let mut out = [vec![0.0; datasets], vec![0.0; datasets], vec![0.0; datasets]];
        for ((row, &label), &id) in logits.iter().zip(labels).zip(ids) {
            let max = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
            let log_sum = row.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln() + max;
            let argmax = (0..3).max_by(|&a, &b| row[a].total_cmp(&row[b])).unwrap();
            out[LOSS][id as usize] += log_sum - row[label as usize] as f64;
            out[CORRECT][id as usize] += (argmax as i64 == label) as u8 as f64;
            out[SAMPLES][id as usize] += 1.0;
        }
        out
    }

    fn batch(logits: &[[f32; 3]], labels: &[i64], ids: &[i64]) -> (Tensor, Tensor, Tensor) {
        let flat: Vec<f32> = logits.iter().flatten().copied().collect();
        (Tensor::from_slice(&flat).view([logits.len() as i64, 3]), Tensor::from_slice(labels), Tensor::from_slice(ids))
    }

    fn assert_close(got: &[Vec<f64>; 3], want: &[Vec<f64>; 3]) {
        for (g, w) in got.iter().flatten().zip(want.iter().flatten()) {
            assert!((g - w).abs() < 1e-5 * w.abs().max(1.0), "got {got:?}, want {want:?}");
        }
    }

    #[test]
    fn sums_per_dataset_equal_a_host_computation_over_several_batches() {
        sums_equal_a_host_computation(Accumulator::new(3));
        sums_equal_a_host_computation(Accumulator::with_tensor_ops(3));
    }

    fn sums_equal_a_host_computation(mut acc: Accumulator) {
        let batches: [Batch; 2] = [
            (&[[2.0, 0.5, -1.0], [0.1, 0.2, 0.3], [-3.0, 4.0, 0.0], [1.0, 1.5, 1.2]], &[0, 2, 0, 1], &[0, 2, 2, 0]),
            (&[[0.0, 0.0, 5.0], [9.0, -9.0, 0.0], [0.3, 0.1, 0.2], [1.0, 2.0, 3.0]], &[2, 1, 0, 2], &[1, 1, 0, 2]),
        ];
        let mut want = [vec![0.0; 3], vec![0.0; 3], vec![0.0; 3]];
        for (logits, labels, ids) in batches {
            let (l, y, d) = batch(logits, labels, ids);
            // The trainer's logits require grad; the accumulator must not record a graph.
            let l = l.set_requires_grad(true);
            acc.add(&l, &y, &d).unwrap();
            let r = reference(logits, labels, ids, 3);
            for row in 0..3 {
                for d in 0..3 {
                    want[row][d] += r[row][d];
                }
            }
        }
        assert_close(&acc.take().unwrap().unwrap(), &want);
    }

    #[test]
    fn taking_starts_a_new_window_and_a_new_batch_size_is_handled() {
        let mut acc = Accumulator::new(2);
        let first: &[[f32; 3]] = &[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]];
        let (l, y, d) = batch(first, &[0, 0], &[0, 1]);
        acc.add(&l, &y, &d).unwrap();
        acc.take().unwrap();
        let second: &[[f32; 3]] = &[[0.0, 0.0, 1.0], [0.5, 0.0, 0.0], [0.0, 2.0, 0.0]];
        let (l, y, d) = batch(second, &[2, 0, 0], &[1, 1, 0]);
        acc.add(&l, &y, &d).unwrap();
        assert_close(&acc.take().unwrap().unwrap(), &reference(second, &[2, 0, 0], &[1, 1, 0], 2));
    }

    #[test]
    fn language_model_tokens_are_summed_per_dataset_skipping_untrained_ones() {
        // Two sequences of three positions over a vocabulary of three, per-token
        // dataset ids as packed rows of two sources carry them; IGNORE_INDEX is
        // not trained.
        let logits: &[[f32; 3]] = &[[2.0, 0.5, -1.0], [0.1, 0.2, 0.3], [-3.0, 4.0, 0.0], [1.0, 1.5, 1.2], [0.0, 0.0, 5.0], [9.0, -9.0, 0.0]];
        let (labels, ids) = ([0i64, IGNORE_INDEX, 1, 1, 2, IGNORE_INDEX], [0i64, 0, 1, 1, 1, 0]);
        let (l, _, _) = batch(logits, &labels, &ids);
        let mut acc = Accumulator::new(2);
        let shaped = |v: &[i64]| Tensor::from_slice(v).view([2, 3]);
        acc.add_tokens(&l.view([2, 3, 3]), &shaped(&labels), &shaped(&ids)).unwrap();
        let trained: Vec<usize> = (0..6).filter(|&i| labels[i] != IGNORE_INDEX).collect();
        let pick = |v: &[i64]| trained.iter().map(|&i| v[i]).collect::<Vec<_>>();
        let rows: Vec<[f32; 3]> = trained.iter().map(|&i| logits[i]).collect();
        assert_close(&acc.take().unwrap().unwrap(), &reference(&rows, &pick(&labels), &pick(&ids), 2));
    }

    #[test]
    fn nothing_added_reads_nothing() {
        assert!(Accumulator::new(3).take().unwrap().is_none());
    }
}
