//! On-line RL's rollout stage (`data.kind = "prompts"`), before the step's core: the
//! step's micro-batches of prompts ([`crate::data::prompts`]) are sampled with the
//! policy on the key/value cache ([`sampler`], [`processors`]), scored by the rewards
//! ([`rewards`]) and collated into scored rollouts, the advantages in their payload,
//! as [`crate::data::rollouts`] collates rollouts read from a file: the core and the
//! objective ([`crate::objective::Grpo`]) see no difference.
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
pub mod rewards;
pub mod sampler;

use std::{collections::HashMap, path::Path, time::Instant};

use tch::{Device, Tensor};
use tokenizers::Tokenizer;

use self::{processors::Processors, record::CompletionLog, rewards::Reward, sampler::Sampled};
use crate::{
    config::{Config, DataKind},
    data::{
        prompts::Prompts,
        rollouts::{collate, rows::Group, Scoring},
        text, Batch, Payload,
    },
    error::{Error, Result},
    model::Model,
};

/// The name of the stage's own statistic, after the rollouts' ones in the payload.
pub const SAMPLING_S: &str = "timing/sampling_s";

pub struct RolloutStage {
    processors: Processors,
    max_new: usize,
    generations: usize,
    seed: u64,
    scoring: Scoring,
    rewards: Vec<Reward>,
    tokenizer: Tokenizer,
    device: Device,
    iterations: u64,
    /// The completions of the generation being trained on, by slot, while it has
    /// iterations left.
    kept: HashMap<u64, Vec<Group>>,
    log: Option<CompletionLog>,
}

impl RolloutStage {
    /// The stage, when the run samples (`data.kind = "prompts"`).
    pub fn from_config(config: &Config, run_dir: &Path, rank: u32, device: Device) -> Result<Option<RolloutStage>> {
        if config.data.kind != DataKind::Prompts {
            return Ok(None);
        }
        let (encoder, _) = text::encoder(config)?;
        let eos = collate::eos_id(&encoder, Path::new(&config.data.path))?;
        let grpo = &config.grpo;
        let log = match (grpo.log_completions_every, rank) {
            (every, 0) if every > 0 => Some(CompletionLog::open(&run_dir.join("completions.jsonl"), every)?),
            _ => None,
        };
        Ok(Some(RolloutStage {
            processors: Processors::from_config(grpo),
            max_new: grpo.max_completion_length as usize,
            generations: grpo.num_generations as usize,
            seed: config.run.seed,
            scoring: Scoring::from_config(config, eos),
            rewards: grpo.rewards.iter().map(Reward::new).collect::<Result<_>>()?,
            tokenizer: encoder.tokenizer,
            device,
            iterations: grpo.num_iterations.max(1) as u64,
            kept: HashMap::new(),
            log,
        }))
    }

    /// The step's micro-batches of prompts as scored rollouts, on the device.
    pub fn roll_out(&mut self, step: u64, model: &mut dyn Model, prompts: Vec<Batch>) -> Result<Vec<Batch>> {
        let started = Instant::now();
        let mut generations = Vec::with_capacity(prompts.len());
        for batch in prompts {
            let Payload::Prompts(p) = batch.payload else {
                return Err(Error::Other("the rollout stage reads batches of prompts (data.kind = \"prompts\")".into()));
            };
            let groups = match self.kept.get(&p.slot) {
                Some(kept) if p.iteration > 0 => kept.clone(),
                _ => self.sample(step, model, &p)?,
            };
            match p.iteration + 1 >= self.iterations {
                true => self.kept.remove(&p.slot),
                false => self.kept.insert(p.slot, groups.clone()),
            };
            generations.push((groups, p.slot, p.iteration));
        }
        // Every micro-batch carries the step's sampling time: their weighted mean is it.
        let sampling_s = Tensor::f_from_slice(&[started.elapsed().as_secs_f32()])?;
        generations
            .into_iter()
            .map(|(groups, slot, iteration)| {
                let picks: Vec<&Group> = groups.iter().collect();
                let mut batch = collate::collate(&picks, &self.scoring, slot, iteration)?;
                if let Payload::Rollouts(r) = &mut batch.payload {
                    r.stats = Tensor::f_cat(&[&r.stats, &sampling_s], 0)?;
                }
                Ok(batch.to_device(self.device, false))
            })
            .collect()
    }

    /// Samples each prompt `grpo.num_generations` times (the prompts of one length in
    /// one batch) and scores the completions.
    fn sample(&mut self, step: u64, model: &mut dyn Model, p: &Prompts) -> Result<Vec<Group>> {
        tch::manual_seed(self.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(p.slot) as i64);
        let g = self.generations;
        let mut by_length: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
        for (i, row) in p.rows.iter().enumerate() {
            by_length.entry(row.ids.len()).or_default().push(i);
        }
        let mut sampled: Vec<Vec<Sampled>> = vec![Vec::new(); p.rows.len()];
        for indices in by_length.values() {
            let prompts: Vec<&[u32]> = indices.iter().flat_map(|&i| std::iter::repeat_n(&p.rows[i].ids[..], g)).collect();
            let out = sampler::sample(model, &prompts, &self.processors, self.max_new, self.scoring.eos, self.device)?;
            for (&i, completions) in indices.iter().zip(out.chunks(g)) {
                sampled[i] = completions.to_vec();
            }
        }
        let mut groups = Vec::with_capacity(p.rows.len());
        for (row, completions) in p.rows.iter().zip(sampled) {
            let texts: Vec<String> = completions
                .iter()
                .map(|c| self.tokenizer.decode(&c.ids, true).map_err(|e| Error::Other(format!("decoding a completion: {e}"))))
                .collect::<Result<_>>()?;
            let rewards: Vec<Vec<f64>> = self.rewards.iter().map(|r| texts.iter().map(|t| r.score(t, &row.columns)).collect()).collect();
            if let Some(log) = &self.log {
                log.record(step, row, &completions, &texts, &self.rewards, &rewards);
            }
            groups.push(Group { prompt: row.ids.clone(), completions: completions.into_iter().map(|c| c.ids).collect(), rewards });
        }
        Ok(groups)
    }
}
