//! The logits processors of sampling, as transformers' `generate` applies them
//! (`generation/utils.py`, `_get_logits_processor`), in its order: the repetition
//! penalty (CTRL's: a seen token's logit divided by the penalty when positive,
//! multiplied when negative; the prompt's tokens count), then the temperature, top-k,
//! top-p and min-p warpers, each keeping at least one token. Removed tokens get -inf.
//! Everything stays on the device: `[R, V]` float32 logits, one row per completion.

use tch::{Kind, Tensor};

use crate::error::Result;

/// `[grpo]`'s sampling keys.
#[derive(Debug, Clone, PartialEq)]
pub struct Processors {
    pub temperature: f64,
    /// 0: all tokens.
    pub top_k: i64,
    /// 1: all tokens.
    pub top_p: f64,
    pub min_p: Option<f64>,
    /// 1: none.
    pub repetition_penalty: f64,
}

impl Processors {
    pub fn from_config(grpo: &crate::config::GrpoConfig) -> Processors {
        Processors {
            temperature: grpo.temperature,
            top_k: grpo.top_k,
            top_p: grpo.top_p,
            min_p: grpo.min_p,
            repetition_penalty: grpo.repetition_penalty,
        }
    }

    /// The processed logits of `logits` `[R, V]`; `seen` `[R, V]` boolean marks the
    /// tokens of each row's prompt and completion so far (the repetition penalty's).
    pub fn apply(&self, logits: &Tensor, seen: &Tensor) -> Result<Tensor> {
        let mut scores = logits.f_to_kind(Kind::Float)?;
        if self.repetition_penalty != 1.0 {
            let p = self.repetition_penalty;
            // `a.where_self(c, b)` is `torch.where(c, a, b)`.
            let penalised = scores.f_mul_scalar(p)?.f_where_self(&scores.f_lt(0.0)?, &scores.f_div_scalar(p)?)?;
            scores = penalised.f_where_self(seen, &scores)?;
        }
        if self.temperature != 1.0 {
            scores = scores.f_div_scalar(self.temperature)?;
        }
        let vocab = scores.size()[1];
        if self.top_k > 0 {
            let k = self.top_k.min(vocab);
            let (kth, _) = scores.f_topk(k, -1, true, true)?;
            let threshold = kth.f_narrow(1, k - 1, 1)?;
            scores = scores.f_masked_fill(&scores.f_lt_tensor(&threshold)?, f64::NEG_INFINITY)?;
        }
        if self.top_p < 1.0 {
            // Ascending: drop the tokens whose cumulative probability stays within 1 - top_p
            // (the most likely one always stays).
            let (sorted, order) = scores.f_sort(-1, false)?;
            let cumulative = sorted.f_softmax(-1, Kind::Float)?.f_cumsum(-1, Kind::Float)?;
            let drop_sorted = cumulative.f_le(1.0 - self.top_p)?;
            let _ = drop_sorted.f_narrow(1, vocab - 1, 1)?.f_fill_(0)?;
            let drop = drop_sorted.f_scatter(1, &order, &drop_sorted)?;
            scores = scores.f_masked_fill(&drop, f64::NEG_INFINITY)?;
        }
        if let Some(min_p) = self.min_p {
            let probs = scores.f_softmax(-1, Kind::Float)?;
            let top = probs.f_amax(&[-1i64][..], true)?;
            let drop = probs.f_lt_tensor(&top.f_mul_scalar(min_p)?)?;
            let best = probs.f_argmax(-1, true)?;
            let drop = drop.f_scatter_value(1, &best, 0)?;
            scores = scores.f_masked_fill(&drop, f64::NEG_INFINITY)?;
        }
        Ok(scores)
    }
}

#[cfg(test)]
mod tests {
    use tch::Device;

    use super::*;

    fn plain() -> Processors {
        Processors { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: None, repetition_penalty: 1.0 }
    }

    fn row(values: &[f32]) -> Tensor {
        Tensor::from_slice(values).view([1, -1])
    }

    fn kept(t: &Tensor) -> Vec<bool> {
        Vec::<bool>::try_from(t.isfinite().view([-1])).unwrap()
    }

    #[test]
    fn each_processor_removes_what_transformers_removes() {
        let logits = row(&[2.0, 1.0, 0.0, -1.0, 3.0]);
        let none = Tensor::zeros([1, 5], (Kind::Bool, Device::Cpu));
        assert!(plain().apply(&logits, &none).unwrap().equal(&logits), "nothing set: unchanged");
        let top_k = Processors { top_k: 2, ..plain() }.apply(&logits, &none).unwrap();
        assert_eq!(kept(&top_k), [true, false, false, false, true]);
        // Probabilities ~ [.24, .09, .03, .01, .64]: 0.7 needs the two most likely.
        let top_p = Processors { top_p: 0.7, ..plain() }.apply(&logits, &none).unwrap();
        assert_eq!(kept(&top_p), [true, false, false, false, true]);
        let min_p = Processors { min_p: Some(0.3), ..plain() }.apply(&logits, &none).unwrap();
        assert_eq!(kept(&min_p), [true, false, false, false, true], "p >= 0.3 * 0.64");
        let seen = Tensor::from_slice(&[true, false, false, true, false]).view([1, 5]);
        let penalised = Processors { repetition_penalty: 2.0, temperature: 0.5, ..plain() }.apply(&logits, &seen).unwrap();
        assert_eq!(Vec::<f32>::try_from(penalised.view([-1])).unwrap(), [2.0, 2.0, 0.0, -4.0, 6.0], "2/2 and -1*2, then / 0.5");
    }
}
