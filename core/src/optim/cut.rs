//! Cutting a model into parameter sharding's units (see [`gather`](super::gather)):
//! each unit's variables come to view one flat buffer with no memory (a gather gives
//! it some), and this rank's chunk of it is copied into a shard.
//!
//! Two ways to get there, to the same result:
//! - [`cut_whole`]: every variable whole on every rank (a model the configuration
//!   does not name: a factory's, an `mlp`, a `torchscript`), rank 0's values
//!   broadcast, then cut unit by unit;
//! - [`StreamingCut`](super::stream_cut::StreamingCut): a decoder cut while
//!   it is built, each block as soon as its variables exist, so a rank never holds
//!   more than its chunks, unit 0 and one block; `model.init_from`'s values are then
//!   read straight into the chunks ([`CutModel::owned_pieces`]).

use ptrain_torch_ext::{sharding, TensorList};
use tch::{Kind, Tensor};

use super::{gather::Part, layout::FlatLayout};
use crate::{
    dist::ShardCollectives,
    error::{Error, Result},
};

pub(super) fn torch(e: tch::TchError) -> Error {
    Error::Other(format!("parameter sharding: {}", crate::error::torch_message(&e)))
}

/// The unit of a parameter: its block's (1 + the first number in its name), or 0.
pub(super) fn unit_of(name: &str) -> usize {
    name.split('.').find_map(|part| part.parse::<usize>().ok()).map_or(0, |block| block + 1)
}

/// The names and shapes of a unit's trainable parameters, in the flat order.
pub(super) type Members = Vec<(String, Vec<i64>)>;

/// One unit, cut: its trainable part and its frozen parts, each with its members.
pub(super) struct CutUnit {
    pub trained: Option<(Members, Part)>,
    pub frozen: Vec<(Members, Part)>,
}

/// A model cut into units: this rank's chunks of the trainable parts back to back in
/// `master` (the optimizer's float32 master weights), in unit order.
pub struct CutModel {
    pub(super) master: Tensor,
    pub(super) units: Vec<CutUnit>,
    pub(super) rank: u32,
}

/// A piece of a variable this rank holds: `dest` (a view of the master chunks, or of
/// a frozen part's chunk) takes elements `[offset, offset + dest.numel())` of the
/// flattened variable.
pub struct OwnedPiece {
    pub name: String,
    pub offset: u64,
    pub dest: Tensor,
}

impl CutModel {
    /// Every piece of a variable this rank holds, trainable or frozen, unit by unit.
    pub fn owned_pieces(&self) -> Vec<OwnedPiece> {
        let mut out = Vec::new();
        for (members, part) in self.units.iter().flat_map(|u| u.trained.iter().chain(&u.frozen)) {
            let owned = part.layout.range(self.rank);
            for piece in part.layout.pieces(owned.clone()) {
                let dest = part.shard.narrow(0, (piece.flat_offset - owned.start) as i64, piece.len as i64);
                out.push(OwnedPiece { name: members[piece.param].0.clone(), offset: piece.param_offset, dest });
            }
        }
        out
    }
}

/// Copies this rank's chunk of `members` (laid out as `layout`) into `shard`, but
/// for the members `done` says are there already.
pub(super) fn copy_chunk(members: &[&(String, Tensor)], layout: &FlatLayout, shard: &Tensor, rank: u32, done: impl Fn(usize) -> bool) -> Result<()> {
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
/// The buffer takes the shard's dtype (a frozen part may be stored in another than
/// its variables were made in).
pub(super) fn move_to_flat(members: &[&(String, Tensor)], shapes: &[Vec<i64>], layout: FlatLayout, shard: Tensor) -> Result<Part> {
    let (kind, device) = (shard.kind(), shard.device());
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
    Ok(Part { params, layout, full, shard, vectors: None })
}

/// Copies this rank's chunk of `members` (laid out as `layout`) into `shard` and
/// moves them into the unit's flat buffer ([`move_to_flat`]).
pub(super) fn cut(members: &[&(String, Tensor)], layout: FlatLayout, shard: Tensor, rank: u32) -> Result<Part> {
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

pub(super) fn members_of(vars: &[&(String, Tensor)]) -> Members {
    vars.iter().map(|(n, t)| (n.clone(), t.size())).collect()
}

/// Each unit's trainable members and its part, if it has trainable parameters.
pub(super) type TrainedParts = Vec<Option<(Members, Part)>>;

/// Cuts `params` (trainable, float32, sorted by name) unit by unit into this rank's
/// chunks, back to back in a new master buffer; at least `units` units (those past the
/// parameters' have no trainable part).
pub(super) fn cut_trained(params: &[(String, Tensor)], units: usize, rank: u32, world: u32) -> Result<(Tensor, TrainedParts)> {
    let trained = by_unit(params);
    let count = trained.len().max(units);
    let layouts: Vec<Option<FlatLayout>> = (0..count).map(|u| trained.get(u).filter(|m| !m.is_empty()).map(|m| layout_of(m, world))).collect();
    let total: i64 = layouts.iter().flatten().map(|l| l.chunk as i64).sum();
    let device = params.first().map_or(tch::Device::Cpu, |(_, p)| p.device());
    let master = Tensor::f_zeros([total], (Kind::Float, device)).map_err(torch)?;
    let (mut parts, mut at) = (Vec::with_capacity(count), 0i64);
    for (u, layout) in layouts.into_iter().enumerate() {
        parts.push(match layout {
            Some(layout) => {
                let chunk = layout.chunk as i64;
                let part = cut(&trained[u], layout, master.narrow(0, at, chunk), rank)?;
                at += chunk;
                Some((members_of(&trained[u]), part))
            }
            None => None,
        });
    }
    Ok((master, parts))
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
    let kept = by_unit(frozen);
    let (master, trained) = cut_trained(params, kept.len(), rank, world)?;
    let mut units = Vec::with_capacity(trained.len());
    for (u, trained) in trained.into_iter().enumerate() {
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
            frozen.push((members_of(&members), cut(&members, layout, shard, rank)?));
        }
        units.push(CutUnit { trained, frozen });
    }
    Ok(CutModel { master, units, rank })
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
