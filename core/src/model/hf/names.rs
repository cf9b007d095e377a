//! ptrain's parameters and their Hugging Face counterparts: each family's table
//! ([`family::HfSpec::params`], from its [`Layout`]), which the loader, the exporter and
//! parameter sharding read.
//!
//! Every family names its parameters as `transformers` does (`gpt` uses nanoGPT's
//! names, which are `GPT2LMHeadModel`'s); only GPT-2 stores its linear weights in
//! another layout (`Conv1D`, `[in, out]`).

use crate::{
    config::{ModelConfig, ModelKind},
    model::{
        family,
        layout::{Layout, Part},
    },
};

/// One parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Param {
    /// The name in ptrain's `VarStore` and checkpoints.
    pub name: String,
    /// Its shape in ptrain (`[out, in]` for linear weights).
    pub shape: Vec<i64>,
    /// Stored transposed by Hugging Face (GPT-2's `Conv1D` weights).
    pub conv1d: bool,
    /// Stored by Hugging Face as these tensors (name, shape), one after the other in
    /// this parameter's elements: a mixture's experts, which ptrain holds stacked as
    /// transformers 5 does in memory, and `save_pretrained` writes one per expert
    /// (`mlp.experts.3.up_proj.weight`). Empty: stored whole under [`Param::hf_name`].
    /// A file holding the stacked tensor under the parameter's own name is read too.
    pub split: Vec<(String, Vec<i64>)>,
}

impl Param {
    /// The name in a Hugging Face state dict (the same as ptrain's).
    pub fn hf_name(&self) -> &str {
        &self.name
    }

    /// Its shape in Hugging Face's files.
    pub fn hf_shape(&self) -> Vec<i64> {
        if self.conv1d {
            self.shape.iter().rev().copied().collect()
        } else {
            self.shape.clone()
        }
    }
}

/// Every parameter of the configured model under its Hugging Face name, in a fixed
/// order (its family's table: [`family::HfSpec::params`]); none for a kind without one.
pub fn params(m: &ModelConfig) -> Vec<Param> {
    family::of(m.kind).hf.as_ref().map_or_else(Vec::new, |hf| (hf.params)(m))
}

/// The parameters `layout` declares, under their own names (which are the Hugging Face
/// ones); with `conv1d`, the blocks' linear weights are stored `[in, out]` by Hugging
/// Face (GPT-2's `Conv1D`).
pub fn from_layout(layout: &Layout, conv1d: bool) -> Vec<Param> {
    let mut out = Vec::new();
    let mut add = |name: String, part: &Part, in_block: bool| {
        let p = |name: String, shape: &[i64], conv1d: bool| Param { name, shape: shape.to_vec(), conv1d, split: Vec::new() };
        match *part {
            Part::Linear { inp, out: width, bias, .. } => {
                out.push(p(format!("{name}.weight"), &[width, inp], conv1d && in_block));
                if bias {
                    out.push(p(format!("{name}.bias"), &[width], false));
                }
            }
            Part::Vector { width, .. } => out.push(p(name, &[width], false)),
            Part::Table { rows, cols, .. } => out.push(p(name, &[rows, cols], false)),
            Part::Experts { experts, inp, out: width, .. } => out.push(p(name, &[experts, width, inp], false)),
            Part::Attention { .. } | Part::TiedHead { .. } => {}
        }
    };
    for part in &layout.before {
        add(part.path().to_string(), part, false);
    }
    for i in 0..layout.blocks {
        for part in layout.parts(i) {
            add(layout.in_block(i, part.path()), part, true);
        }
    }
    for part in &layout.after {
        add(part.path().to_string(), part, false);
    }
    out
}

/// A file's tensor name in ptrain's terms, for a model of `kind`.
pub fn canonical_for(kind: ModelKind, hf_name: &str) -> String {
    match &family::of(kind).hf {
        Some(hf) => (hf.canonical)(hf_name),
        None => hf_name.to_string(),
    }
}

/// Tensors a file may hold that are not parameters of the configured model.
pub fn is_known_extra_for(m: &ModelConfig, canonical_name: &str) -> bool {
    family::of(m.kind).hf.as_ref().is_some_and(|hf| (hf.known_extra)(m, canonical_name))
}

/// Transposes a row-major `[rows, cols]` matrix of `elem`-byte elements.
pub fn transpose_bytes(data: &[u8], rows: usize, cols: usize, elem: usize) -> Vec<u8> {
    assert_eq!(data.len(), rows * cols * elem, "matrix bytes");
    let mut out = vec![0u8; data.len()];
    for r in 0..rows {
        for c in 0..cols {
            let from = (r * cols + c) * elem;
            let to = (c * rows + r) * elem;
            out[to..to + elem].copy_from_slice(&data[from..from + elem]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transpose_moves_elements_not_bytes() {
        let m: Vec<u8> = (0u16..6).flat_map(|v| v.to_le_bytes()).collect();
        let t = transpose_bytes(&m, 2, 3, 2);
        let values: Vec<u16> = t.chunks(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
        assert_eq!(values, vec![0, 3, 1, 4, 2, 5]);
    }
}
