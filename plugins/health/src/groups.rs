//! Parameter groups: a parameter belongs to its module path (its name without the
//! last component) cut to `depth` components, so `transformer.h.0.attn.c_attn.weight`
//! is in `transformer.h.0` at depth 3, and `transformer.wte.weight` in
//! `transformer.wte`. Depth 0 keeps the whole module path.

use crate::stats::{GRAD_NONFINITE, GRAD_NONZERO, GRAD_NORM, PARAM_NORM, UPDATE_NORM};

pub fn group_of(name: &str, depth: usize) -> String {
    let parts: Vec<&str> = name.split('.').collect();
    let module = if parts.len() > 1 { &parts[..parts.len() - 1] } else { &parts[..] };
    let keep = if depth == 0 { module.len() } else { depth.min(module.len()) };
    module[..keep].join(".")
}

/// Health figures of a set of tensors.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Figures {
    pub grad_norm: f64,
    pub param_norm: f64,
    pub update_ratio: f64,
    pub grad_zero_frac: f64,
    pub grad_nonfinite_frac: f64,
    /// The squared gradient norm, for shares of the total.
    pub grad_sq: f64,
}

/// Figures over the tensors `members` (indices), from per-tensor `rows` and sizes.
pub fn figures(rows: &[Vec<f64>], numel: &[f64], members: impl Iterator<Item = usize>) -> Figures {
    let (mut g, mut p, mut u, mut nonzero, mut nonfinite, mut n) = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    for i in members {
        g += rows[GRAD_NORM][i] * rows[GRAD_NORM][i];
        p += rows[PARAM_NORM][i] * rows[PARAM_NORM][i];
        u += rows[UPDATE_NORM][i] * rows[UPDATE_NORM][i];
        nonzero += rows[GRAD_NONZERO][i];
        nonfinite += rows[GRAD_NONFINITE][i];
        n += numel[i];
    }
    let n = n.max(1.0);
    Figures {
        grad_norm: g.sqrt(),
        param_norm: p.sqrt(),
        update_ratio: if p > 0.0 { u.sqrt() / p.sqrt() } else { 0.0 },
        grad_zero_frac: (n - nonzero) / n,
        grad_nonfinite_frac: nonfinite / n,
        grad_sq: g,
    }
}

/// The groups of a model's parameters, with their metric names built once.
pub struct Groups {
    pub names: Vec<String>,
    /// Group index of each parameter tensor.
    pub of_tensor: Vec<usize>,
    pub metric_names: Vec<[String; 5]>,
}

pub const FIGURES: [&str; 5] = ["grad_norm", "param_norm", "update_ratio", "grad_zero_frac", "grad_nonfinite_frac"];

impl Groups {
    pub fn new<'a>(params: impl Iterator<Item = &'a str>, depth: usize) -> Groups {
        let mut names: Vec<String> = Vec::new();
        let mut of_tensor = Vec::new();
        for p in params {
            let g = group_of(p, depth);
            let index = names.iter().position(|n| *n == g).unwrap_or_else(|| {
                names.push(g);
                names.len() - 1
            });
            of_tensor.push(index);
        }
        let metric_names = names.iter().map(|g| FIGURES.map(|f| format!("health/{g}/{f}"))).collect();
        Groups { names, of_tensor, metric_names }
    }

    pub fn members(&self, group: usize) -> impl Iterator<Item = usize> + '_ {
        self.of_tensor.iter().enumerate().filter(move |(_, g)| **g == group).map(|(i, _)| i)
    }
}

impl Figures {
    pub fn values(&self) -> [f64; 5] {
        [self.grad_norm, self.param_norm, self.update_ratio, self.grad_zero_frac, self.grad_nonfinite_frac]
    }
}
