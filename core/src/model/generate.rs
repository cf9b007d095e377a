//! Sampling from a model with its key/value cache (`ptrain generate`): the prompt is
//! run once (prefill), then each new token costs one single-position forward.

use std::time::Instant;

use tch::{Device, Kind, Tensor};

use super::{Model, ModelInput};
use crate::error::{Error, Result};

/// How to pick each new token. `temperature == 0` is greedy decoding.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampling {
    pub max_new_tokens: usize,
    pub temperature: f64,
    /// Keep the `top_k` most likely tokens (0 = all).
    pub top_k: i64,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p` (1 = all).
    pub top_p: f64,
    pub seed: u64,
}

/// What a generation produced, and how long it took.
#[derive(Debug, Clone)]
pub struct Generated {
    /// The new tokens, the end-of-sequence token included when one ended it.
    pub ids: Vec<i64>,
    pub stopped_at_eos: bool,
    pub prompt_tokens: usize,
    pub prefill_s: f64,
    pub decode_s: f64,
}

impl Generated {
    /// New tokens per second after the prompt (each one a forward of one position).
    pub fn tokens_per_s(&self) -> f64 {
        let decoded = self.ids.len().saturating_sub(1);
        if self.decode_s > 0.0 {
            decoded as f64 / self.decode_s
        } else {
            0.0
        }
    }
}

/// The next token from the last position's logits `[V]` (float32).
fn pick(logits: Tensor, s: &Sampling) -> Result<i64> {
    if s.temperature == 0.0 {
        return Ok(logits.f_argmax(-1, false)?.int64_value(&[]));
    }
    let mut logits = logits / s.temperature;
    let vocab = logits.size()[0];
    if s.top_k > 0 && s.top_k < vocab {
        let (kth, _) = logits.f_topk(s.top_k, -1, true, true)?;
        let threshold = kth.get(s.top_k - 1);
        logits = logits.masked_fill(&logits.lt_tensor(&threshold), f64::NEG_INFINITY);
    }
    if s.top_p < 1.0 {
        let (sorted, order) = logits.f_sort(-1, true)?;
        let cumulative = sorted.softmax(-1, Kind::Float).cumsum(-1, Kind::Float);
        // Drop a token when the ones before it already reach top_p (the first always stays).
        let before = &cumulative - sorted.softmax(-1, Kind::Float);
        let drop_sorted = before.ge(s.top_p);
        let drop = drop_sorted.scatter(-1, &order, &drop_sorted);
        logits = logits.masked_fill(&drop, f64::NEG_INFINITY);
    }
    let probs = logits.softmax(-1, Kind::Float);
    Ok(probs.f_multinomial(1, false)?.int64_value(&[0]))
}

/// Continues `prompt` until `eos` or `max_new_tokens`.
pub fn generate(model: &mut dyn Model, prompt: &[i64], eos: &[i64], s: &Sampling, device: Device) -> Result<Generated> {
    if prompt.is_empty() {
        return Err(Error::Other("the prompt is empty: give at least one token".into()));
    }
    let capacity = (prompt.len() + s.max_new_tokens) as i64;
    let mut cache = model.new_cache(capacity).ok_or_else(|| {
        let kinds = super::family::kinds(|f| f.kv_cache, str::to_string).replace(" or ", " and ");
        Error::Other(format!("model.kind {:?} has no key/value cache: generate works with {kinds}", model.kind()))
    })?;
    if cache.capacity() < capacity {
        return Err(Error::Other(format!(
            "{} prompt tokens + {} new ones exceed the model's context of {} (model.block_size)",
            prompt.len(),
            s.max_new_tokens,
            cache.capacity()
        )));
    }
    tch::manual_seed(s.seed as i64);
    let started = Instant::now();
    let last = |logits: Tensor| logits.get(0).get(-1).to_kind(Kind::Float);
    let mut ids = Vec::with_capacity(s.max_new_tokens);
    let mut stopped_at_eos = false;
    let prompt_t = Tensor::from_slice(prompt).to_device(device).unsqueeze(0);
    let mut step = |input: &Tensor| tch::no_grad(|| model.forward(ModelInput::new(input, false).cache(&mut cache))?.logits()).map(last);
    let mut logits = step(&prompt_t)?;
    let mut prefill_s = None;
    while ids.len() < s.max_new_tokens {
        let next = pick(logits, s)?;
        prefill_s.get_or_insert_with(|| started.elapsed().as_secs_f64());
        ids.push(next);
        if eos.contains(&next) {
            stopped_at_eos = true;
            break;
        }
        if ids.len() == s.max_new_tokens {
            break;
        }
        let input = Tensor::from_slice(&[next]).to_device(device).unsqueeze(0);
        logits = step(&input)?;
    }
    let total = started.elapsed().as_secs_f64();
    let prefill_s = prefill_s.unwrap_or(total);
    Ok(Generated { ids, stopped_at_eos, prompt_tokens: prompt.len(), prefill_s, decode_s: total - prefill_s })
}
