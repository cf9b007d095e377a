//! Cutting a model into parameter sharding's units (see [`gather`](super::gather)):
//! each unit's variables come to view one flat buffer with no memory (a gather gives
//! it some), and this rank's chunk of it is copied into a shard.
//!
//! Two ways to get there, to the same result:
//! - [`cut_whole`]: every variable whole on every rank (a model built by a factory,
//!   LoRA's frozen base), rank 0's values broadcast, then cut unit by unit;
//! - [`StreamingCut`]: a `gpt` or `llama` cut while it is built, each block as soon as
//!   its variables exist, so a rank never holds more than its chunks, unit 0 and one
//!   block ([`StreamingCut::block_built`]); `model.init_from`'s values are then read
//!   straight into the chunks ([`CutModel::owned_pieces`]).

use ptrain_torch_ext::{sharding, TensorList};
use tch::{nn, Device, Kind, Tensor};

use super::{gather::Part, layout::FlatLayout};
use crate::{
    dist::ShardCollectives,
    error::{Error, Result},
};

fn torch(e: tch::TchError) -> Error {
    Error::Other(format!("parameter sharding: {e}"))
}

/// The unit of a parameter: its block's (1 + the first number in its name), or 0.
fn unit_of(name: &str) -> usize {
    name.split('.').find_map(|part| part.parse::<usize>().ok()).map_or(0, |block| block + 1)
}

/// The names and shapes of a unit's trainable parameters, in the flat order.
pub(super) type Members = Vec<(String, Vec<i64>)>;

/// One unit, cut: its trainable part (with its members) and its frozen parts.
pub(super) struct CutUnit {
    pub trained: Option<(Members, Part)>,
    pub frozen: Vec<Part>,
}

/// A model cut into units: this rank's chunks of the trainable parts back to back in
/// `master` (the optimizer's float32 master weights), in unit order.
pub struct CutModel {
    pub(super) master: Tensor,
    pub(super) units: Vec<CutUnit>,
    pub(super) rank: u32,
}

/// A piece of a parameter this rank holds: `dest` (a view of the master chunks)
/// takes elements `[offset, offset + dest.numel())` of the flattened parameter.
pub struct OwnedPiece {
    pub name: String,
    pub offset: u64,
    pub dest: Tensor,
}

impl CutModel {
    /// Every piece of a trainable parameter this rank holds, in the flat order.
    pub fn owned_pieces(&self) -> Vec<OwnedPiece> {
        let mut out = Vec::new();
        let mut at = 0i64;
        for (members, part) in self.units.iter().filter_map(|u| u.trained.as_ref()) {
            let owned = part.layout.range(self.rank);
            for piece in part.layout.pieces(owned.clone()) {
                let dest = self.master.narrow(0, at + (piece.flat_offset - owned.start) as i64, piece.len as i64);
                out.push(OwnedPiece { name: members[piece.param].0.clone(), offset: piece.param_offset, dest });
            }
            at += part.layout.chunk as i64;
        }
        out
    }
}

/// Copies this rank's chunk of `members` (laid out as `layout`) into `shard`, but
/// for the members `done` says are there already.
fn copy_chunk(members: &[&(String, Tensor)], layout: &FlatLayout, shard: &Tensor, rank: u32, done: impl Fn(usize) -> bool) -> Result<()> {
    let owned = layout.range(rank);
    tch::no_grad(|| -> std::result::Result<(), tch::TchError> {
        for piece in layout.pieces(owned.clone()).into_iter().filter(|p| !done(p.param)) {
            let src = members[piece.param].1.f_reshape([-1])?.f_narrow(0, piece.param_offset as i64, piece.len as i64)?;
            shard.f_narrow(0, (piece.flat_offset - owned.start) as i64, piece.len as i64)?.f_copy_(&src)?;
        }
        Ok(())
    })
    .map_err(torch)
}

/// Moves `members` (of the shapes given) into one flat buffer without memory, which
/// every handle to them (model, var store, trainer) views from here on: their own
/// memory goes.
fn move_to_flat(members: &[&(String, Tensor)], shapes: &[Vec<i64>], layout: FlatLayout, shard: Tensor) -> Result<Part> {
    let (kind, device) = (members[0].1.kind(), members[0].1.device());
    let full = tch::no_grad(|| -> std::result::Result<Tensor, tch::TchError> {
        // Never written: on the host its pages are never touched, so it costs no memory.
        let full = Tensor::f_empty([layout.padded() as i64], (kind, device))?;
        for (((_, p), shape), &(offset, n)) in members.iter().zip(shapes).zip(&layout.params) {
            p.shallow_clone().f_set_data(&full.f_narrow(0, offset as i64, n as i64)?.f_view(shape.as_slice())?)?;
        }
        Ok(full)
    })
    .map_err(torch)?;
    sharding::resize_storage(&full, 0).map_err(|e| Error::Other(format!("parameter sharding: {e}")))?;
    let params = TensorList::new(members.iter().map(|(_, p)| p.shallow_clone()).collect());
    Ok(Part { params, layout, full, shard })
}

/// Copies this rank's chunk of `members` (laid out as `layout`) into `shard` and
/// moves them into the unit's flat buffer ([`move_to_flat`]).
fn cut(members: &[&(String, Tensor)], layout: FlatLayout, shard: Tensor, rank: u32) -> Result<Part> {
    copy_chunk(members, &layout, &shard, rank, |_| false)?;
    let shapes: Vec<Vec<i64>> = members.iter().map(|(_, p)| p.size()).collect();
    move_to_flat(members, &shapes, layout, shard)
}

/// The variables of each unit, in the order given (unit 0 first).
fn by_unit(vars: &[(String, Tensor)]) -> Vec<Vec<&(String, Tensor)>> {
    let mut units: Vec<Vec<&(String, Tensor)>> = Vec::new();
    for var in vars {
        let u = unit_of(&var.0);
        if units.len() <= u {
            units.resize(u + 1, Vec::new());
        }
        units[u].push(var);
    }
    units
}

fn layout_of(members: &[&(String, Tensor)], world: u32) -> FlatLayout {
    FlatLayout::new(&members.iter().map(|(_, t)| t.numel() as u64).collect::<Vec<_>>(), world)
}

/// Cuts `params` (trainable, sorted by name) and `frozen` (by name), whole on every
/// rank, into units; rank 0's values win.
pub fn cut_whole(
    params: &[(String, Tensor)],
    frozen: &[(String, Tensor)],
    rank: u32,
    world: u32,
    collectives: &dyn ShardCollectives,
) -> Result<CutModel> {
    let Some((_, first)) = params.first() else { return Err(Error::Other("the model has no trainable parameters".into())) };
    let device = first.device();
    let wrong = params.iter().find(|(_, p)| p.kind() != Kind::Float).or_else(|| params.iter().chain(frozen).find(|(_, p)| p.device() != device));
    if let Some((name, p)) = wrong {
        return Err(Error::Other(format!(
            "dist.shard = \"parameters\" needs every trainable parameter in float32 and every variable on one device; `{name}` is {:?} on {:?}",
            p.kind(),
            p.device()
        )));
    }
    for (_, p) in params.iter().chain(frozen) {
        collectives.broadcast(p, 0).map_err(Error::Dist)?;
    }
    let (trained, kept) = (by_unit(params), by_unit(frozen));
    let count = trained.len().max(kept.len());
    let layouts: Vec<Option<FlatLayout>> = (0..count).map(|u| trained.get(u).filter(|m| !m.is_empty()).map(|m| layout_of(m, world))).collect();
    let total: i64 = layouts.iter().flatten().map(|l| l.chunk as i64).sum();
    let master = Tensor::f_zeros([total], (Kind::Float, device)).map_err(torch)?;
    let (mut units, mut at) = (Vec::with_capacity(count), 0i64);
    for (u, layout) in layouts.into_iter().enumerate() {
        let trained = match layout {
            Some(layout) => {
                let members = &trained[u];
                let chunk = layout.chunk as i64;
                let part = cut(members, layout, master.narrow(0, at, chunk), rank)?;
                at += chunk;
                Some((members.iter().map(|(n, t)| (n.clone(), t.size())).collect(), part))
            }
            None => None,
        };
        let others = kept.get(u).cloned().unwrap_or_default();
        let mut kinds: Vec<Kind> = Vec::new();
        for (_, t) in &others {
            if !kinds.contains(&t.kind()) {
                kinds.push(t.kind());
            }
        }
        let mut frozen = Vec::new();
        for kind in kinds {
            let members: Vec<&(String, Tensor)> = others.iter().copied().filter(|(_, t)| t.kind() == kind).collect();
            let layout = layout_of(&members, world);
            let shard = Tensor::f_zeros([layout.chunk as i64], (kind, device)).map_err(torch)?;
            frozen.push(cut(&members, layout, shard, rank)?);
        }
        units.push(CutUnit { trained, frozen });
    }
    Ok(CutModel { master, units, rank })
}

/// A `gpt` or `llama` (every variable trained, float32) cut as it is built: the
/// units' layouts come from the parameters the configuration names, so the master
/// chunks exist before the first block does.
pub struct StreamingCut {
    rank: u32,
    /// Each unit's members, layout and offset in `master`.
    plan: Vec<(Members, FlatLayout, i64)>,
    master: Tensor,
    units: Vec<Option<CutUnit>>,
    /// Unit 0's members whose chunk is copied already (their memory went then; they
    /// join the unit's flat buffer when the model is built).
    early: Vec<bool>,
    /// The first failure, reported by [`StreamingCut::finish`] (the model's builder
    /// cannot return one from inside a block's construction).
    failed: Option<Error>,
}

impl StreamingCut {
    /// `params`: every variable the model will have, by name with its shape.
    pub fn new(params: &[(String, Vec<i64>)], rank: u32, world: u32, device: Device) -> Result<StreamingCut> {
        let mut sorted: Vec<&(String, Vec<i64>)> = params.iter().collect();
        sorted.sort_by(|a, b| a.0.cmp(&b.0));
        let mut members: Vec<Members> = vec![Vec::new()];
        for (name, shape) in sorted {
            let u = unit_of(name);
            if members.len() <= u {
                members.resize(u + 1, Vec::new());
            }
            members[u].push((name.clone(), shape.clone()));
        }
        let mut plan = Vec::with_capacity(members.len());
        let mut at = 0i64;
        for m in members {
            let layout = FlatLayout::new(&m.iter().map(|(_, s)| s.iter().product::<i64>() as u64).collect::<Vec<_>>(), world);
            let chunk = layout.chunk as i64;
            plan.push((m, layout, at));
            at += chunk;
        }
        let master = Tensor::f_zeros([at], (Kind::Float, device)).map_err(torch)?;
        let units = (0..plan.len()).map(|_| None).collect();
        let early = vec![false; plan[0].0.len()];
        Ok(StreamingCut { rank, plan, master, units, early, failed: None })
    }

    /// Block `block` of the model under `vs` has been built: its unit is cut now,
    /// before the next block takes memory, and so are the members of unit 0 made so
    /// far (the embeddings, built before the blocks).
    pub fn block_built(&mut self, vs: &nn::VarStore, block: usize) {
        if self.failed.is_none() {
            if let Err(e) = self.cut_early(vs).and_then(|()| self.cut_unit(vs, block + 1)) {
                self.failed = Some(e);
            }
        }
    }

    /// Unit `u`'s planned members as they are in `vs`, checked against the plan; `None`
    /// for those missing when `missing_ok`.
    fn members(&self, vars: &std::collections::HashMap<String, Tensor>, u: usize, missing_ok: bool) -> Result<Vec<Option<(String, Tensor)>>> {
        let Some((members, _, _)) = self.plan.get(u) else {
            return Err(Error::Other(format!("parameter sharding: the model has a block {} its configuration does not name", u as i64 - 1)));
        };
        let mut found = Vec::with_capacity(members.len());
        for (i, (name, shape)) in members.iter().enumerate() {
            match vars.get(name) {
                _ if u == 0 && self.early[i] => found.push(vars.get(name).map(|t| (name.clone(), t.shallow_clone()))),
                Some(t) if t.size() == *shape && t.kind() == Kind::Float => found.push(Some((name.clone(), t.shallow_clone()))),
                None if missing_ok => found.push(None),
                other => {
                    let got = other.map_or("missing".to_string(), |t| format!("{:?} {:?}", t.kind(), t.size()));
                    return Err(Error::Other(format!("parameter sharding: `{name}` is {got}, its configuration says Float {shape:?}")));
                }
            }
        }
        Ok(found)
    }

    /// Copies the chunk of each member of unit 0 that exists and was not copied yet,
    /// and frees its memory.
    fn cut_early(&mut self, vs: &nn::VarStore) -> Result<()> {
        let found = self.members(&vs.variables(), 0, true)?;
        let (_, layout, at) = &self.plan[0];
        let shard = self.master.narrow(0, *at, layout.chunk as i64);
        let ready: Vec<usize> = (0..found.len()).filter(|&i| found[i].is_some() && !self.early[i]).collect();
        if ready.is_empty() {
            return Ok(());
        }
        // Placeholders for the absent ones: their pieces are skipped.
        let none = (String::new(), Tensor::f_empty([0], (Kind::Float, Device::Cpu)).map_err(torch)?);
        let refs: Vec<&(String, Tensor)> = found.iter().map(|m| m.as_ref().unwrap_or(&none)).collect();
        copy_chunk(&refs, layout, &shard, self.rank, |i| !ready.contains(&i))?;
        tch::no_grad(|| -> std::result::Result<(), tch::TchError> {
            let nothing = Tensor::f_empty([0], (Kind::Float, shard.device()))?;
            for &i in &ready {
                refs[i].1.shallow_clone().f_set_data(&nothing)?;
            }
            Ok(())
        })
        .map_err(torch)?;
        ready.iter().for_each(|&i| self.early[i] = true);
        Ok(())
    }

    fn cut_unit(&mut self, vs: &nn::VarStore, u: usize) -> Result<()> {
        let found: Vec<(String, Tensor)> = self.members(&vs.variables(), u, false)?.into_iter().flatten().collect();
        if found.is_empty() {
            self.units[u] = Some(CutUnit { trained: None, frozen: Vec::new() });
            return Ok(());
        }
        let (members, layout, at) = &self.plan[u];
        let refs: Vec<&(String, Tensor)> = found.iter().collect();
        let shard = self.master.narrow(0, *at, layout.chunk as i64);
        let early = |i: usize| u == 0 && self.early[i];
        copy_chunk(&refs, layout, &shard, self.rank, early)?;
        let shapes: Vec<Vec<i64>> = members.iter().map(|(_, s)| s.clone()).collect();
        let part = move_to_flat(&refs, &shapes, layout.clone(), shard)?;
        self.units[u] = Some(CutUnit { trained: Some((members.clone(), part)), frozen: Vec::new() });
        Ok(())
    }

    /// The model is built: unit 0 is cut, and every variable of `vs` must be one the
    /// plan named, each unit cut once.
    pub fn finish(mut self, vs: &nn::VarStore) -> Result<CutModel> {
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        self.cut_unit(vs, 0)?;
        let planned = self.plan.iter().map(|(m, _, _)| m.len()).sum::<usize>();
        let vars = vs.variables();
        if vars.len() != planned || vars.keys().any(|n| !self.plan.get(unit_of(n)).is_some_and(|(m, _, _)| m.iter().any(|(p, _)| p == n))) {
            return Err(Error::Other(format!(
                "parameter sharding: the model has {} variables, its configuration names {planned} (cut while built, they must agree)",
                vars.len()
            )));
        }
        let units = self
            .units
            .into_iter()
            .enumerate()
            .map(|(u, unit)| unit.ok_or_else(|| Error::Other(format!("parameter sharding: block {} was never built", u as i64 - 1))));
        Ok(CutModel { master: self.master, units: units.collect::<Result<_>>()?, rank: self.rank })
    }
}

#[cfg(test)]
mod tests {
    use super::unit_of;

    #[test]
    fn a_parameter_belongs_to_the_block_its_name_numbers() {
        assert_eq!(unit_of("transformer.h.3.ln_1.weight"), 4);
        assert_eq!(unit_of("model.layers.0.mlp.up_proj.weight"), 1);
        assert_eq!(unit_of("transformer.wte.weight"), 0);
        assert_eq!(unit_of("lm_head.weight"), 0);
    }
}
