//! The router's losses over a forward's blocks: transformers' load-balancing loss
//! (`load_balancing_loss_func`, Switch Transformer's: the experts' share of the top-k
//! assignments times their mean routing probability, summed, times the number of
//! experts, over every block's tokens at once), and the ST-MoE z-loss (the mean over
//! tokens of the squared log-sum-exp of the router logits, summed over blocks). With
//! them, each block's load: the assignments of its most and least loaded expert over
//! the mean (1 = balanced), as metrics. All on the device.

use tch::{Kind, Tensor};

use crate::{config::MoeArgs, error::Result, model::entry::AuxLoss};

/// The router losses' weights and the metrics' names.
pub struct Losses {
    experts: i64,
    top_k: i64,
    aux_coef: f64,
    z_coef: f64,
    /// `expert_load_max/<block>` and `expert_load_min/<block>` of each block with
    /// experts, in order, named once per model.
    load_names: Vec<(&'static str, &'static str)>,
}

impl Losses {
    /// Over the blocks with experts of a model of `blocks` blocks.
    pub(super) fn new(a: &MoeArgs, blocks: i64) -> Losses {
        // Metric names are `&'static str`: made once when the model is built (a few
        // bytes per block), not per step.
        let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
        let load_names =
            (0..blocks).filter(|i| a.is_sparse(*i)).map(|i| (leak(format!("expert_load_max/{i}")), leak(format!("expert_load_min/{i}")))).collect();
        Losses { experts: a.experts, top_k: a.top_k, aux_coef: a.router_aux_loss_coef, z_coef: a.router_z_loss_coef, load_names }
    }

    /// How many blocks have experts (give router logits).
    pub(super) fn blocks(&self) -> usize {
        self.load_names.len()
    }

    /// The weighted losses, and `aux_loss` (unweighted, transformers' `out.aux_loss`),
    /// `z_loss` when weighted, and each block's load, from every block's router
    /// logits `[N, experts]` (the blocks with experts).
    pub(super) fn of(&self, logits: &[Tensor]) -> Result<AuxLoss> {
        let Some(first) = logits.first() else { return Err(crate::error::Error::Other("a mixture of experts with no block".into())) };
        let options = (Kind::Float, first.device());
        let (mut counts, mut probs, mut z, mut rows) = (Tensor::f_zeros([self.experts], options)?, None::<Tensor>, None::<Tensor>, 0);
        let mut metrics = Vec::with_capacity(2 + 2 * logits.len());
        for (block, l) in logits.iter().enumerate() {
            let p = l.f_softmax(-1, Kind::Float)?;
            let (_, chosen) = p.f_topk(self.top_k, -1, true, true)?;
            let assigned = Tensor::f_zeros([self.experts], options)?.f_scatter_add(
                0,
                &chosen.f_reshape([-1])?,
                &chosen.f_ones_like()?.f_to_kind(Kind::Float)?.f_reshape([-1])?,
            )?;
            let n = l.size()[0];
            let mean = (n * self.top_k) as f64 / self.experts as f64;
            let (max_name, min_name) = self.load_names[block.min(self.load_names.len() - 1)];
            metrics.push((max_name, assigned.f_max()?.f_div_scalar(mean)?));
            metrics.push((min_name, assigned.f_min()?.f_div_scalar(mean)?));
            counts = counts.f_add(&assigned)?;
            let sum = p.f_sum_dim_intlist(0, false, Kind::Float)?;
            probs = Some(match probs {
                None => sum,
                Some(total) => total.f_add(&sum)?,
            });
            if self.z_coef > 0.0 {
                let block_z = l.f_to_kind(Kind::Float)?.f_logsumexp(-1, false)?.f_square()?.f_mean(Kind::Float)?;
                z = Some(match z {
                    None => block_z,
                    Some(total) => total.f_add(&block_z)?,
                });
            }
            rows += n;
        }
        let probs = probs.expect("one block at least");
        let rows = rows as f64;
        let aux = counts.f_div_scalar(rows)?.f_mul(&probs.f_div_scalar(rows)?)?.f_sum(Kind::Float)?.f_mul_scalar(self.experts as f64)?;
        let mut loss = aux.f_mul_scalar(self.aux_coef)?;
        if let Some(z) = z {
            loss = loss.f_add(&z.f_mul_scalar(self.z_coef)?)?;
            metrics.insert(0, ("z_loss", z.f_detach()?));
        }
        metrics.insert(0, ("aux_loss", aux.f_detach()?));
        Ok(AuxLoss { loss, metrics })
    }
}
