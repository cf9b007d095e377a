//! Set-up's first stage: where the run writes, claimed before anything is read.
//! The run directory is named (agreed by sharded ranks), locked by rank 0, and
//! checked against starting over in an earlier run's records, every rank refusing
//! when one does; the checkpoint to resume is then found and checked against the
//! configuration, so a bad path or a mismatch fails first.

use std::path::PathBuf;

use super::super::{
    clock::{stamp, stamp_at},
    run_dir::{self, RunLock},
    sharding,
    state::{self},
    Resume,
};
use crate::{
    checkpoint::Checkpoint,
    config::{Config, ShardMode},
    dist::DataParallel,
    error::{Error, Result},
    optim::ShardSpec,
};

/// The run's directory, its lock and how its ranks shard.
pub(in crate::trainer) struct Place {
    pub run_dir: PathBuf,
    /// Rank 0's lock, held for the launch: the other ranks write under it.
    pub lock: Option<RunLock>,
    pub shard: Option<ShardSpec>,
    /// Where the run's checkpoints are ([`run_dir::checkpoints_of`]).
    pub checkpoints: PathBuf,
}

impl Place {
    /// Whether the ranks shard their parameters (`dist.shard = "parameters"` on more than one).
    pub fn shards_params(&self) -> bool {
        self.shard.as_ref().is_some_and(|s| s.mode == ShardMode::Parameters)
    }
}

/// `run.run_dir`, or `runs/<name>-<YYYYmmdd-HHMMSS>` (UTC) when it is empty, at
/// `at` (Unix seconds: rank 0's clock, agreed by sharded ranks that all write
/// there) or now.
fn run_dir(config: &Config, at: Option<u64>) -> PathBuf {
    if config.run.run_dir.is_empty() {
        PathBuf::from("runs").join(format!("{}-{}", config.run.name, at.map_or_else(stamp, stamp_at)))
    } else {
        PathBuf::from(&config.run.run_dir)
    }
}

/// Claims the run directory: named, locked, and guarded against starting over in
/// an earlier run's records.
pub(in crate::trainer) fn claim(config: &Config, dist: &dyn DataParallel, resume: Option<&Resume>, overwrite: bool) -> Result<Place> {
    let (rank, world) = (dist.rank(), dist.world_size());
    let shard = ShardSpec::agree(config.dist.shard, dist)?;
    let run_dir = run_dir(config, shard.as_ref().map(|s| s.launch_secs));
    // A single run named by default takes a name no other run has.
    let (run_dir, lock) = match (rank, world, config.run.run_dir.is_empty()) {
        (0, 1, true) => RunLock::acquire_new(&run_dir).map(|(dir, lock)| (dir, Some(lock)))?,
        (0, _, _) => (run_dir.clone(), Some(RunLock::acquire(&run_dir)?)),
        _ => (run_dir, None),
    };
    let checkpoints = run_dir::checkpoints_of(config, &run_dir);
    let guarded = run_dir::guard(&run_dir, &checkpoints, resume, overwrite, rank == 0);
    if world > 1 {
        // Every rank checks the directory before rank 0 writes its config.toml there:
        // this sum is the collective between the two (parameter sharding has no
        // start-up broadcast), and it makes every rank refuse when one does.
        let mut refused = [f64::from(u8::from(guarded.is_err()))];
        dist.sum_host(&mut refused).map_err(Error::Dist)?;
        if refused[0] > 0.0 && guarded.is_ok() {
            return Err(Error::RunDir { path: run_dir.clone(), message: "another rank refused this run directory (its message says why)".into() });
        }
    }
    guarded?;
    Ok(Place { run_dir, lock, shard, checkpoints })
}

/// The checkpoint to resume, read (without its tensors when parameters are sharded:
/// each rank reads its slices later) and checked against the configuration's model
/// (unless a factory builds the model) and global batch; then the `[plugins.<name>]`
/// tables, so a misspelt one is refused before tokenizing or loading weights.
pub(in crate::trainer) fn checkpoint(
    config: &Config,
    place: &Place,
    resume: Option<&Resume>,
    factory: bool,
    world: u32,
    allow_batch_change: bool,
) -> Result<Option<Checkpoint>> {
    sharding::refuse_unblocked_kind(config, place.shards_params() && !factory)?;
    let located = state::locate(resume, &place.checkpoints, !config.run.run_dir.is_empty())?;
    refuse_foreign(resume, located.as_deref(), &place.checkpoints)?;
    let checkpoint = located.map(|p| state::read(&p, place.shards_params())).transpose()?;
    if let Some(ckpt) = &checkpoint {
        if !factory {
            state::check_model(ckpt, config)?;
        }
        state::check_global_batch(ckpt, config, world, allow_batch_change)?;
    }
    crate::host::loader::check_tables(&config.plugins_to_load(), &config.plugins)?;
    Ok(checkpoint)
}

/// `--resume` from a checkpoint kept elsewhere into a checkpoints directory that holds
/// other checkpoints is refused: the new run's retention would delete them.
fn refuse_foreign(resume: Option<&Resume>, located: Option<&std::path::Path>, checkpoints: &std::path::Path) -> Result<()> {
    let (Some(Resume::Path(_)), Some(from)) = (resume, located) else { return Ok(()) };
    let held = crate::checkpoint::list(checkpoints);
    let (Some((step, _)), false) = (held.last(), from.parent().is_some_and(|p| same_dir(p, checkpoints))) else { return Ok(()) };
    Err(Error::RunDir {
        path: checkpoints.to_owned(),
        message: format!(
            "holds checkpoints of another run (the newest at step {step}) and --resume names {}, which is not among them: \
             the new run's retention would delete them. Resume from one of them, or write elsewhere (another --run-dir, \
             plugins.checkpoint.dir)",
            from.display()
        ),
    })
}

fn same_dir(a: &std::path::Path, b: &std::path::Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}
