//! The allowed range of every numeric key. Checked on each layer as it is applied,
//! so an out-of-range value is refused naming the file or `--set` that brought it,
//! the key, the value and the range. Checks across keys (`min_lr <= lr`) wait for
//! the last layer (`Config::validate`).

use std::fmt;

use crate::error::ConfigError;

/// One end of a range.
#[derive(Debug, Clone, Copy)]
enum End {
    Open(f64),
    Closed(f64),
    Unbounded,
}

/// What a numeric key may hold.
#[derive(Debug, Clone, Copy)]
pub struct Range {
    integer: bool,
    low: End,
    high: End,
    /// 0 is also allowed, with this meaning, outside the range (`num_classes = 0`:
    /// taken from the data).
    zero_means: Option<&'static str>,
}

const fn int(min: i64) -> Range {
    Range { integer: true, low: End::Closed(min as f64), high: End::Unbounded, zero_means: None }
}

const fn positive() -> Range {
    Range { integer: false, low: End::Open(0.0), high: End::Unbounded, zero_means: None }
}

const fn non_negative() -> Range {
    Range { integer: false, low: End::Closed(0.0), high: End::Unbounded, zero_means: None }
}

/// `[0, 1)`: probabilities and decay rates.
const fn unit() -> Range {
    Range { integer: false, low: End::Closed(0.0), high: End::Open(1.0), zero_means: None }
}

/// `[0, 1]`: fractions that may be whole.
const fn closed_unit() -> Range {
    Range { integer: false, low: End::Closed(0.0), high: End::Closed(1.0), zero_means: None }
}

/// `(0, 1]`: a share of probability mass that may be all of it.
const fn mass() -> Range {
    Range { integer: false, low: End::Open(0.0), high: End::Closed(1.0), zero_means: None }
}

const fn fraction() -> Range {
    Range { integer: false, low: End::Open(0.0), high: End::Open(1.0), zero_means: None }
}

impl Range {
    const fn or_zero(self, meaning: &'static str) -> Range {
        Range { zero_means: Some(meaning), ..self }
    }

    fn contains(&self, v: f64) -> bool {
        let above = match self.low {
            End::Open(l) => v > l,
            End::Closed(l) => v >= l,
            End::Unbounded => true,
        };
        let below = match self.high {
            End::Open(h) => v < h,
            End::Closed(h) => v <= h,
            End::Unbounded => true,
        };
        v.is_finite() && ((above && below) || (v == 0.0 && self.zero_means.is_some()))
    }
}

impl fmt::Display for Range {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = if self.integer { "an integer" } else { "a number" };
        match (self.low, self.high) {
            (End::Closed(l), End::Unbounded) => write!(f, "{what} >= {l}")?,
            (End::Open(l), End::Unbounded) => write!(f, "{what} > {l}")?,
            (low, high) => {
                let (open, l) = match low {
                    End::Open(l) => ('(', l),
                    End::Closed(l) => ('[', l),
                    End::Unbounded => ('(', f64::NEG_INFINITY),
                };
                let (h, close) = match high {
                    End::Open(h) => (h, ')'),
                    End::Closed(h) => (h, ']'),
                    End::Unbounded => (f64::INFINITY, ')'),
                };
                write!(f, "{what} in {open}{l}, {h}{close}")?
            }
        }
        if let Some(meaning) = self.zero_means {
            write!(f, ", or 0 ({meaning})")?;
        }
        Ok(())
    }
}

/// Every numeric key of the configuration with its range. `name[]` is each element
/// of an array, `name[].key` a key of each table in an array of tables.
pub const RULES: &[(&str, Range)] = &[
    ("run.seed", int(0)),
    ("run.log_every", int(1).or_zero("no progress lines")),
    ("run.threads", int(1).or_zero("libtorch's default")),
    ("run.shutdown_timeout_s", positive()),
    ("train.steps", int(1)),
    ("train.epochs", non_negative()),
    ("train.loss_chunk", int(1).or_zero("off: the whole logits")),
    ("train.activation_checkpointing_every", int(1)),
    ("train.eval_every", int(1).or_zero("only at the end")),
    ("train.eval_batches", int(1).or_zero("the whole held-out set once")),
    ("train.empty_cache_every", int(1).or_zero("never")),
    ("train.max_nonfinite_in_row", int(1)),
    ("train.nonfinite_check_every", int(1)),
    ("model.vocab_size", int(2)),
    ("model.n_layer", int(1)),
    ("model.n_head", int(1)),
    ("model.n_embd", int(1)),
    ("model.block_size", int(1)),
    ("model.dropout", unit()),
    ("model.gpt.layer_norm_eps", positive()),
    ("model.mlp.hidden[]", int(1)),
    ("model.mlp.input_dim", int(1).or_zero("taken from the data")),
    ("model.mlp.num_classes", int(2).or_zero("taken from the data")),
    ("model.llama.n_kv_head", int(1).or_zero("n_head")),
    ("model.llama.head_dim", int(1).or_zero("n_embd / n_head")),
    ("model.llama.intermediate_size", int(1).or_zero("8/3 n_embd")),
    ("model.llama.rms_norm_eps", positive()),
    ("model.llama.rope_theta", positive()),
    ("model.llama.rope_factor", positive()),
    ("model.llama.rope_low_freq_factor", positive()),
    ("model.llama.rope_high_freq_factor", positive()),
    ("model.llama.rope_original_max_positions", int(1)),
    ("model.gemma.n_kv_head", int(1).or_zero("n_head")),
    ("model.gemma.head_dim", int(1).or_zero("n_embd / n_head")),
    ("model.gemma.intermediate_size", int(1).or_zero("4 n_embd")),
    ("model.gemma.rms_norm_eps", positive()),
    ("model.gemma.rope_theta", positive()),
    ("model.gemma.rope_local_theta", positive().or_zero("rope_theta")),
    ("model.gemma.query_pre_attn_scalar", positive().or_zero("head_dim")),
    ("model.gemma.attn_softcap", positive().or_zero("none")),
    ("model.gemma.final_softcap", positive().or_zero("none")),
    ("model.gemma.sliding_window", int(1).or_zero("no sliding-window layers")),
    ("model.gemma.sliding_pattern", int(1)),
    ("model.moe.experts", int(1)),
    ("model.moe.top_k", int(1)),
    ("model.moe.expert_intermediate_size", int(1).or_zero("model.llama.intermediate_size's width")),
    ("model.moe.router_aux_loss_coef", non_negative()),
    ("model.moe.router_z_loss_coef", non_negative()),
    ("model.moe.shared_expert_intermediate_size", int(1).or_zero("no shared expert")),
    ("model.moe.mlp_only_layers[]", int(0)),
    ("model.moe.decoder_sparse_step", int(1)),
    ("model.moe.router_jitter_noise", unit()),
    ("data.val_fraction", fraction().or_zero("nothing held out: no evaluation without data.val_path")),
    ("data.batch_size", int(1)),
    ("data.max_seq_len", int(1).or_zero("the model's block_size")),
    ("data.num_workers", int(0)),
    ("data.prefetch", int(1)),
    ("data.synthetic_len", int(1)),
    ("data.synthetic_features", int(1)),
    ("data.synthetic_classes", int(2)),
    ("data.datasets[].weight", positive()),
    ("optim.lr", positive()),
    ("optim.min_lr", non_negative()),
    ("optim.min_lr_ratio", closed_unit()),
    ("optim.warmup_steps", int(0)),
    ("optim.warmup_ratio", unit()),
    ("optim.weight_decay", non_negative()),
    ("optim.beta1", unit()),
    ("optim.beta2", unit()),
    ("optim.eps", positive()),
    ("optim.momentum", unit()),
    ("optim.grad_clip", non_negative()),
    ("optim.accum_steps", int(1)),
    ("lora.rank", int(1)),
    ("lora.alpha", positive()),
    ("lora.dropout", unit()),
    ("dpo.beta", positive()),
    ("grpo.num_generations", int(2)),
    ("grpo.epsilon", positive()),
    ("grpo.epsilon_high", positive()),
    ("grpo.beta", non_negative()),
    ("grpo.num_iterations", int(1)),
    ("grpo.temperature", positive()),
    ("grpo.max_completion_length", int(1)),
    ("grpo.top_k", int(1).or_zero("all tokens")),
    ("grpo.top_p", mass()),
    ("grpo.min_p", closed_unit()),
    ("grpo.repetition_penalty", positive()),
    ("grpo.log_completions_every", int(1).or_zero("never")),
    ("dist.timeout_s", int(1)),
    ("dist.nccl_timeout_s", int(1)),
    ("dist.end_timeout_s", int(1)),
    ("dist.bucket_mb", positive().or_zero("one tensor per all-reduce")),
    ("debug.nonfinite_loss_at[]", int(1)),
    ("debug.grad_spike_at[]", int(1)),
    ("debug.grad_spike_factor", positive()),
    ("debug.dump_tensors_at[]", int(1)),
    ("debug.fail_at_step", int(0)),
    ("debug.alloc_at_step", int(0)),
    ("debug.alloc_bytes", int(1)),
    ("debug.data_panic_at_step", int(0)),
    ("debug.pause_save_at_step", int(0)),
    ("debug.late_save_at_step", int(0)),
    ("debug.pause_save_after_files", int(1)),
];

fn number(value: &toml::Value) -> Option<f64> {
    value.as_float().or_else(|| value.as_integer().map(|i| i as f64))
}

/// The values at `path` (`a.b`, `a.b[]`, `a.b[].c`), with their full key paths.
fn values<'a>(table: &'a toml::Table, path: &str) -> Vec<(String, &'a toml::Value)> {
    let (head, rest) = match path.split_once("[]") {
        Some((head, rest)) => (head, Some(rest.trim_start_matches('.'))),
        None => (path, None),
    };
    let lookup = || {
        let keys: Vec<&str> = head.split('.').collect();
        let (last, parents) = keys.split_last()?;
        let mut t = table;
        for key in parents {
            t = t.get(*key)?.as_table()?;
        }
        t.get(*last)
    };
    let Some(value) = lookup() else { return Vec::new() };
    match (rest, value.as_array()) {
        (None, _) => vec![(head.to_string(), value)],
        (Some(""), Some(items)) => items.iter().enumerate().map(|(i, v)| (format!("{head}[{i}]"), v)).collect(),
        (Some(key), Some(items)) => {
            items.iter().enumerate().filter_map(|(i, v)| Some((format!("{head}[{i}].{key}"), v.as_table()?.get(key)?))).collect()
        }
        (Some(_), None) => Vec::new(),
    }
}

/// Checks every numeric key of `table` against its range.
pub fn check(table: &toml::Table, origin: &str) -> Result<(), ConfigError> {
    for (path, range) in RULES {
        for (key, value) in values(table, path) {
            let Some(v) = number(value) else { continue };
            let whole = value.is_integer() || (v.is_finite() && v.fract() == 0.0);
            if !range.contains(v) || (range.integer && !whole) {
                return Err(ConfigError { origin: origin.into(), key, message: format!("{value} is out of range: must be {range}") });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
/// Every numeric leaf of `table` as a rule path (array elements as `[]`), for
/// checking that every key has a rule.
pub fn numeric_paths(table: &toml::Table) -> Vec<String> {
    fn walk(prefix: &str, value: &toml::Value, out: &mut Vec<String>) {
        match value {
            toml::Value::Integer(_) | toml::Value::Float(_) => out.push(prefix.to_string()),
            toml::Value::Table(t) => t.iter().for_each(|(k, v)| walk(&format!("{prefix}.{k}"), v, out)),
            toml::Value::Array(items) => items.iter().for_each(|v| walk(&format!("{prefix}[]"), v, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    for (k, v) in table {
        walk(k, v, &mut out);
    }
    out.sort();
    out.dedup();
    out
}
