//! A decoder cut into parameter sharding's units while it is built (see
//! [`cut`](super::cut)): the units' layouts come from the variables the
//! configuration names, so the chunks exist before the first block does, and each
//! block is cut as soon as its variables exist. A rank never holds more than its
//! chunks, unit 0 and one block.
//!
//! Without LoRA every named variable is trained: the chunks are the float32 master
//! buffer. With LoRA the named variables are the frozen base, cut into chunks of
//! their own (the blocks' matrices in bf16 under `train.precision = "bf16"`, as
//! LoRA stores them unsharded); the adapters, which the configuration does not name,
//! stay whole (they are small) until the model is built, then are cut as trained.
//! A drawn base (no `model.init_from`) is digested tensor by tensor before it is cut,
//! as `lora::base_digest` digests a whole one.

use tch::{nn, Device, Kind, Tensor};

use super::{
    cut::{copy_chunk, cut_trained, move_to_flat, torch, unit_of, CutModel, CutUnit, Members},
    gather::Part,
    layout::FlatLayout,
};
use crate::{
    error::{Error, Result},
    model::{base_digest::BaseDigest, lora::ADAPTER},
};

/// What the variables the configuration names are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Planned {
    /// Every variable, trained.
    Trained,
    /// LoRA's frozen base; the blocks' matrices (their 2-D variables) stored in `matrices`.
    Frozen { matrices: Kind },
}

/// Named variables of one unit that share one shard: all of them (trained), or
/// those of one dtype (frozen).
struct Group {
    members: Members,
    layout: FlatLayout,
    shard: Tensor,
}

pub struct StreamingCut {
    rank: u32,
    world: u32,
    planned: Planned,
    /// Each unit's groups (trained: exactly one, empty for a unit without variables).
    plan: Vec<Vec<Group>>,
    /// Trained: the master chunks, which the groups' shards view.
    master: Option<Tensor>,
    units: Vec<Option<Vec<(Members, Part)>>>,
    /// Unit 0's first group's members whose chunk is copied already (their memory
    /// went then; they join the unit's flat buffer when the model is built).
    early: Vec<bool>,
    /// The first failure, reported by [`StreamingCut::finish`] (the model's builder
    /// cannot return one from inside a block's construction).
    failed: Option<Error>,
    /// The frozen base's digest, when it is taken from the drawn tensors.
    digest: Option<BaseDigest>,
}

impl StreamingCut {
    /// `params`: every variable the configuration names, with its shape.
    pub fn new(params: &[(String, Vec<i64>)], rank: u32, world: u32, device: Device, planned: Planned) -> Result<StreamingCut> {
        let mut sorted: Vec<&(String, Vec<i64>)> = params.iter().collect();
        sorted.sort_by(|a, b| a.0.cmp(&b.0));
        let mut by_unit: Vec<Members> = vec![Vec::new()];
        for (name, shape) in sorted {
            let u = unit_of(name);
            if by_unit.len() <= u {
                by_unit.resize(u + 1, Vec::new());
            }
            by_unit[u].push((name.clone(), shape.clone()));
        }
        let layout = |m: &Members| FlatLayout::new(&m.iter().map(|(_, s)| s.iter().product::<i64>() as u64).collect::<Vec<_>>(), world);
        let zeros = |n: u64, kind: Kind| Tensor::f_zeros([n as i64], (kind, device)).map_err(torch);
        let (plan, master) = match planned {
            Planned::Trained => {
                let layouts: Vec<FlatLayout> = by_unit.iter().map(layout).collect();
                let master = zeros(layouts.iter().map(|l| l.chunk).sum(), Kind::Float)?;
                let mut at = 0;
                let mut plan = Vec::with_capacity(by_unit.len());
                for (members, layout) in by_unit.into_iter().zip(layouts) {
                    let shard = master.narrow(0, at, layout.chunk as i64);
                    at += layout.chunk as i64;
                    plan.push(vec![Group { members, layout, shard }]);
                }
                (plan, Some(master))
            }
            Planned::Frozen { matrices } => {
                // Each dtype's chunks in one buffer (one allocation, as the master's).
                let kinds = if matrices == Kind::Float { vec![Kind::Float] } else { vec![Kind::Float, matrices] };
                let mut planned: Vec<Vec<(Kind, Members, FlatLayout)>> = Vec::with_capacity(by_unit.len());
                for (u, members) in by_unit.into_iter().enumerate() {
                    let kind_of = |shape: &Vec<i64>| if u > 0 && shape.len() == 2 { matrices } else { Kind::Float };
                    let groups = kinds.iter().map(|&kind| (kind, members.iter().filter(|(_, s)| kind_of(s) == kind).cloned().collect::<Members>()));
                    planned.push(
                        groups.filter(|(_, m)| !m.is_empty()).map(|(kind, m)| (kind, layout(&m), m)).map(|(kind, l, m)| (kind, m, l)).collect(),
                    );
                }
                let mut buffers = Vec::new();
                for &kind in &kinds {
                    let total = planned.iter().flatten().filter(|g| g.0 == kind).map(|g| g.2.chunk).sum();
                    buffers.push((kind, zeros(total, kind)?, 0i64));
                }
                let mut plan = Vec::with_capacity(planned.len());
                for groups in planned {
                    let mut unit = Vec::with_capacity(groups.len());
                    for (kind, members, layout) in groups {
                        let (_, buffer, at) = buffers.iter_mut().find(|b| b.0 == kind).expect("a buffer of every kind");
                        let shard = buffer.narrow(0, *at, layout.chunk as i64);
                        *at += layout.chunk as i64;
                        unit.push(Group { members, layout, shard });
                    }
                    plan.push(unit);
                }
                (plan, None)
            }
        };
        let early = vec![false; plan[0].first().map_or(0, |g| g.members.len())];
        let units = (0..plan.len()).map(|_| None).collect();
        Ok(StreamingCut { rank, world, planned, plan, master, units, early, failed: None, digest: None })
    }

    /// Digests the frozen base (`Planned::Frozen`) as it is drawn, each tensor before
    /// its chunk is copied: [`StreamingCut::finish`] returns the digest.
    pub fn digesting_base(mut self) -> StreamingCut {
        self.digest = (self.planned != Planned::Trained).then(BaseDigest::default);
        self
    }

    fn digest(&mut self, members: &[&(String, Tensor)]) -> Result<()> {
        match self.digest.as_mut() {
            Some(digest) => members.iter().try_for_each(|(name, t)| digest.add_tensor(name, t)),
            None => Ok(()),
        }
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

    /// Group `g` of unit `u` as it is in `vs`, checked against the plan; `None` for
    /// those missing when `missing_ok`.
    fn members(
        &self,
        vars: &std::collections::HashMap<String, Tensor>,
        u: usize,
        g: usize,
        missing_ok: bool,
    ) -> Result<Vec<Option<(String, Tensor)>>> {
        let Some(groups) = self.plan.get(u) else {
            return Err(Error::Other(format!("parameter sharding: the model has a block {} its configuration does not name", u as i64 - 1)));
        };
        let mut found = Vec::with_capacity(groups[g].members.len());
        for (i, (name, shape)) in groups[g].members.iter().enumerate() {
            match vars.get(name) {
                _ if u == 0 && g == 0 && self.early[i] => found.push(vars.get(name).map(|t| (name.clone(), t.shallow_clone()))),
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

    /// Copies the chunk of each member of unit 0's first group that exists and was
    /// not copied yet, and frees its memory.
    fn cut_early(&mut self, vs: &nn::VarStore) -> Result<()> {
        if self.early.is_empty() {
            return Ok(());
        }
        let found = self.members(&vs.variables(), 0, 0, true)?;
        let ready: Vec<usize> = (0..found.len()).filter(|&i| found[i].is_some() && !self.early[i]).collect();
        if ready.is_empty() {
            return Ok(());
        }
        // Placeholders for the absent ones: their pieces are skipped.
        let none = (String::new(), Tensor::f_empty([0], (Kind::Float, Device::Cpu)).map_err(torch)?);
        let refs: Vec<&(String, Tensor)> = found.iter().map(|m| m.as_ref().unwrap_or(&none)).collect();
        self.digest(&ready.iter().map(|&i| refs[i]).collect::<Vec<_>>())?;
        let group = &self.plan[0][0];
        copy_chunk(&refs, &group.layout, &group.shard, self.rank, |i| !ready.contains(&i))?;
        tch::no_grad(|| -> std::result::Result<(), tch::TchError> {
            let nothing = Tensor::f_empty([0], (Kind::Float, group.shard.device()))?;
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
        let vars = vs.variables();
        let mut parts = Vec::new();
        for g in 0..self.plan.get(u).map_or(1, Vec::len) {
            let found: Vec<(String, Tensor)> = self.members(&vars, u, g, false)?.into_iter().flatten().collect();
            if found.is_empty() {
                continue;
            }
            let refs: Vec<&(String, Tensor)> = found.iter().collect();
            // Unit 0's members cut early are digested and copied already.
            let early: Vec<bool> = (0..refs.len()).map(|i| u == 0 && g == 0 && self.early[i]).collect();
            self.digest(&refs.iter().zip(&early).filter(|(_, &e)| !e).map(|(m, _)| *m).collect::<Vec<_>>())?;
            let group = &self.plan[u][g];
            copy_chunk(&refs, &group.layout, &group.shard, self.rank, |i| early[i])?;
            let shapes: Vec<Vec<i64>> = group.members.iter().map(|(_, s)| s.clone()).collect();
            parts.push((group.members.clone(), move_to_flat(&refs, &shapes, group.layout.clone(), group.shard.shallow_clone())?));
        }
        self.units[u] = Some(parts);
        Ok(())
    }

    /// The model is built: unit 0 is cut, every variable of `vs` must be one the
    /// plan named (or, with LoRA, an adapter), each unit cut once; with LoRA the
    /// adapters are cut now. With [`StreamingCut::digesting_base`], the base's digest.
    pub fn finish(mut self, vs: &nn::VarStore) -> Result<(CutModel, Option<String>)> {
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        self.cut_unit(vs, 0)?;
        let named = |n: &str| self.plan.get(unit_of(n)).is_some_and(|groups| groups.iter().any(|g| g.members.iter().any(|(p, _)| p == n)));
        let mut adapters: Vec<(String, Tensor)> = vs.variables().into_iter().filter(|(n, _)| !named(n)).collect();
        adapters.sort_by(|a, b| a.0.cmp(&b.0));
        if let Some((name, _)) = adapters.iter().find(|(n, _)| self.planned == Planned::Trained || !n.contains(ADAPTER)) {
            return Err(Error::Other(format!(
                "parameter sharding: the model has `{name}`, which its configuration does not name (cut while built, they must agree)"
            )));
        }
        let mut cut = Vec::with_capacity(self.units.len());
        for (u, unit) in self.units.into_iter().enumerate() {
            cut.push(unit.ok_or_else(|| Error::Other(format!("parameter sharding: block {} was never built", u as i64 - 1)))?);
        }
        let (master, units): (Tensor, Vec<CutUnit>) = match self.master {
            Some(master) => (master, cut.into_iter().map(|parts| CutUnit { trained: parts.into_iter().next(), frozen: Vec::new() }).collect()),
            None => {
                let (master, trained) = cut_trained(&adapters, cut.len(), self.rank, self.world)?;
                let frozen = cut.into_iter().chain(std::iter::repeat_with(Vec::new));
                (master, trained.into_iter().zip(frozen).map(|(trained, frozen)| CutUnit { trained, frozen }).collect())
            }
        };
        Ok((CutModel { master, units, rank: self.rank }, self.digest.map(BaseDigest::finish)))
    }
}
