//! On-line RL's rollout stage (`data.kind = "prompts"`), before the step's core: the
//! step's micro-batches of prompts ([`crate::data::prompts`]) are sampled with the
//! policy on the key/value cache ([`sampler`], [`processors`]), scored by the rewards
//! ([`reward`]: each micro-batch handed to the reward commands and plugins as soon as
//! it is sampled, their answers collected once the step's last is) and collated into
//! scored rollouts, the advantages in their payload, as [`crate::data::rollouts`]
//! collates rollouts read from a file: the core and the objective
//! ([`crate::objective::Grpo`]) see no difference.
//!
//! A generation's `grpo.num_iterations` steps train on the completions sampled on its
//! first (kept here by slot); GRPO keeps their old log-probabilities. The sampler's
//! random numbers are drawn from torch's generator seeded from `run.seed` and the
//! micro-batch's slot before each micro-batch is sampled: a resumed run samples what
//! the uninterrupted one sampled from the same weights, with no state to save. A run
//! resumed inside a generation has no completions kept: it samples that generation's
//! prompts again with its current weights (on-policy).

pub mod processors;
pub mod record;
pub mod reward;
pub mod sampler;

use std::{collections::HashMap, path::Path, sync::Arc, time::Instant};

use tch::{Device, Tensor};
use tokenizers::Tokenizer;

use self::{
    processors::Processors,
    record::{CompletionLog, Peers},
    reward::{Rewards, ScoreBatch},
    sampler::Sampled,
};
use crate::{
    config::{Config, DataKind, Precision},
    data::{
        prompts::{PromptRow, Prompts},
        rollouts::{advantages, collate, rows::Group, Scoring},
        text, Batch, Payload,
    },
    dist::DataParallel,
    error::{Error, Result},
    host::PluginHost,
    model::Model,
};

/// The names of the stage's own statistics, after the rollouts' ones in the payload:
/// the seconds of the step in the stage, and of those, the seconds spent scoring
/// (the built-in rewards, and waiting for the commands' answers).
pub const SAMPLING_S: &str = "timing/sampling_s";
pub const REWARDS_S: &str = "timing/rewards_s";
/// The seconds of the step outside the stage (the step's core: forward, backward, the
/// update), a step metric the trainer adds ([`RolloutStage::step_s`]).
pub const LEARNING_S: &str = "timing/learning_s";

/// A micro-batch's completions, sampled and handed to the rewards, not yet scored.
struct Unscored {
    rows: Vec<Arc<PromptRow>>,
    completions: Vec<Vec<Sampled>>,
    batch: Arc<ScoreBatch>,
}

/// A micro-batch's completions on their way to the step: kept from the generation's
/// first step, or sampled now.
enum Rolled {
    Kept(Vec<Group>),
    Sampled(Unscored),
}

pub struct RolloutStage {
    processors: Processors,
    max_new: usize,
    generations: usize,
    seed: u64,
    scoring: Scoring,
    rewards: Rewards,
    tokenizer: Tokenizer,
    device: Device,
    /// `train.precision = "bf16"`: sampling runs under bf16 autocast as learning's
    /// forward does (`Some(true)` on CUDA), as TRL generates under accelerate's autocast.
    autocast: Option<bool>,
    iterations: u64,
    /// The completions of the generation being trained on, by slot, while it has
    /// iterations left.
    kept: HashMap<u64, Vec<Group>>,
    log: Option<CompletionLog>,
    /// The seconds the last step spent in the stage.
    pub step_s: f64,
}

impl RolloutStage {
    /// The stage, when the run samples (`data.kind = "prompts"`).
    pub fn from_config(config: &Config, run_dir: &Path, dist: &dyn DataParallel, device: Device, host: &PluginHost) -> Result<Option<RolloutStage>> {
        if config.data.kind != DataKind::Prompts {
            return Ok(None);
        }
        let (encoder, _) = text::encoder(config)?;
        let eos = collate::eos_id(&encoder, Path::new(&config.data.path))?;
        let grpo = &config.grpo;
        // The commands first: one that cannot start ends set-up before any file is made.
        let rewards = Rewards::from_config(&grpo.rewards, host)?;
        let log = match grpo.log_completions_every {
            0 => None,
            every => {
                let (rank, world) = (dist.rank(), dist.world_size());
                let file = (rank == 0).then(|| run_dir.join("completions.jsonl"));
                let peers = (world > 1).then(|| Peers { collectives: dist.collectives(), world, device });
                Some(CompletionLog::open(file.as_deref(), every, rank, peers)?)
            }
        };
        Ok(Some(RolloutStage {
            processors: Processors::from_config(grpo),
            max_new: grpo.max_completion_length as usize,
            generations: grpo.num_generations as usize,
            seed: config.run.seed,
            scoring: Scoring::from_config(config, eos),
            rewards,
            tokenizer: encoder.tokenizer,
            device,
            autocast: (config.train.precision == Precision::Bf16).then_some(device.is_cuda()),
            iterations: grpo.num_iterations.max(1) as u64,
            kept: HashMap::new(),
            log,
            step_s: 0.0,
        }))
    }

    /// The step's micro-batches of prompts as scored rollouts, on the device.
    pub fn roll_out(&mut self, step: u64, model: &mut dyn Model, prompts: Vec<Batch>) -> Result<Vec<Batch>> {
        let started = Instant::now();
        let mut rolled = Vec::with_capacity(prompts.len());
        for batch in prompts {
            let Payload::Prompts(p) = batch.payload else {
                return Err(Error::Other("the rollout stage reads batches of prompts (data.kind = \"prompts\")".into()));
            };
            let completions = match self.kept.get(&p.slot) {
                Some(kept) if p.iteration > 0 => Rolled::Kept(kept.clone()),
                _ => Rolled::Sampled(self.sample(step, model, &p)?),
            };
            rolled.push((completions, p.slot, p.iteration));
        }
        // The commands have scored while the later micro-batches sampled: what is left
        // of their work is waited for here, bounded by each one's timeout_s.
        let scoring = Instant::now();
        let mut generations = Vec::with_capacity(rolled.len());
        for (completions, slot, iteration) in rolled {
            let groups = match completions {
                Rolled::Kept(groups) => groups,
                Rolled::Sampled(unscored) => self.score(step, unscored)?,
            };
            match iteration + 1 >= self.iterations {
                true => self.kept.remove(&slot),
                false => self.kept.insert(slot, groups.clone()),
            };
            generations.push((groups, slot, iteration));
        }
        // Every micro-batch carries the step's times: their weighted mean is them.
        self.step_s = started.elapsed().as_secs_f64();
        let times = Tensor::f_from_slice(&[self.step_s as f32, scoring.elapsed().as_secs_f32()])?;
        generations
            .into_iter()
            .map(|(groups, slot, iteration)| {
                let picks: Vec<&Group> = groups.iter().collect();
                let mut batch = collate::collate(&picks, &self.scoring, slot, iteration)?;
                if let Payload::Rollouts(r) = &mut batch.payload {
                    r.stats = Tensor::f_cat(&[&r.stats, &times], 0)?;
                }
                Ok(batch.to_device(self.device, false))
            })
            .collect()
    }

    /// The step's `completions` record for the sinks (a JSON table,
    /// [`record::COMPLETIONS`]), at the steps `grpo.log_completions_every` records:
    /// every rank's completions, gathered (a collective at those steps only).
    pub fn take_completions(&mut self) -> Result<Option<String>> {
        match self.log.as_mut() {
            Some(log) => log.take_table(&self.rewards.names),
            None => Ok(None),
        }
    }

    /// Samples each prompt `grpo.num_generations` times (the micro-batch in one
    /// left-padded batch, under bf16 autocast when the run learns in bf16), decodes the
    /// completions and hands them to the rewards.
    fn sample(&mut self, step: u64, model: &mut dyn Model, p: &Prompts) -> Result<Unscored> {
        tch::manual_seed(self.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(p.slot) as i64);
        let g = self.generations;
        let prompts: Vec<&[u32]> = p.rows.iter().map(|row| &row.ids[..]).collect();
        let mut run = || sampler::sample(model, &prompts, g, &self.processors, self.max_new, self.scoring.eos, self.device);
        let out = match self.autocast {
            None => run()?,
            Some(cuda) => ptrain_torch_ext::autocast_bf16(cuda, run).map_err(|e| Error::Other(format!("autocast: {e}")))??,
        };
        let sampled: Vec<Vec<Sampled>> = out.chunks(g).map(<[Sampled]>::to_vec).collect();
        let decode = |c: &Sampled| self.tokenizer.decode(&c.ids, true).map_err(|e| Error::Other(format!("decoding a completion: {e}")));
        let texts: Vec<Vec<String>> = sampled.iter().map(|group| group.iter().map(decode).collect::<Result<_>>()).collect::<Result<_>>()?;
        let ids = sampled.iter().map(|group| group.iter().map(|c| c.ids.clone()).collect()).collect();
        let batch = Arc::new(ScoreBatch::new(step, &p.rows, texts, ids));
        self.rewards.submit(&batch);
        Ok(Unscored { rows: p.rows.clone(), completions: sampled, batch })
    }

    /// The rewards' scores of a sampled micro-batch, as one group per prompt.
    fn score(&mut self, step: u64, unscored: Unscored) -> Result<Vec<Group>> {
        let Unscored { rows, completions, batch } = unscored;
        let scores = self.rewards.collect(&batch)?;
        if let Some(log) = self.log.as_mut().filter(|log| log.due(step)) {
            // The advantages the collated batch will carry (the same host arithmetic),
            // computed only at the record's steps.
            let s = &self.scoring;
            let advantages = advantages::score(&scores, &s.weights, s.generations, s.scale).advantages;
            log.record(step, &rows, &completions, &batch.texts, &self.rewards.names, &scores, &advantages);
        }
        let mut groups = Vec::with_capacity(rows.len());
        let mut first = 0;
        for (row, sampled) in rows.iter().zip(completions) {
            let range = first..first + sampled.len();
            first = range.end;
            let rewards: Vec<Vec<f64>> = scores.iter().map(|s| s[range.clone()].to_vec()).collect();
            groups.push(Group { prompt: row.ids.clone(), completions: sampled.into_iter().map(|c| c.ids).collect(), rewards });
        }
        Ok(groups)
    }
}
