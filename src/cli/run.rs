//! `ptrain run`.

use std::{path::PathBuf, process::ExitCode};

use clap::Args;
use ptrain_core::{config::DeviceChoice, Config, ConfigBuilder, Resume, Trainer};

/// The exit codes of `ptrain run`, for `--help`.
const EXIT_CODES: &str = "Exit codes:
  0        the run completed, or a plugin ended it early as done (request_stop: early-stop)
  1        training failed (an error, a panic, out of memory, a data worker's death, an error after the last
           step: summary.json has status \"failed\" and the error; the sinks are drained, the newest checkpoint
           is kept), its summary.json could not be written (a full disk: its essentials go to stderr), or stopped
           (non-finite losses, a save error with on_save_error = \"stop\", a plugin's request_failure_stop,
           a failure or stall of a plugin set critical = true)
  2        refused before training: bad configuration, missing file, unknown or incompatible plugin, bad plugin
           options, a checkpoint given to --resume that cannot be used (of another model: the differing key is named;
           LoRA adapters trained on another base model: the base weights' hashes differ; another global batch
           without --allow-batch-change),
           a run directory another run holds, or one holding checkpoints without --auto-resume/--resume/--overwrite
  3        the run completed, but a plugin failed (or was given up on at the end) and --strict-plugins
           (run.strict_plugins) is set
  130/143  interrupted by SIGINT/SIGTERM after saving an emergency checkpoint";

#[derive(Debug, Args)]
#[command(after_help = EXIT_CODES)]
pub struct RunArgs {
    /// TOML file layered over the embedded default (`ptrain config --default` shows it).
    /// Repeat to layer several, in order: a later file's keys win, tables merge key by key.
    /// Relative paths in a file are relative to that file's folder. With --auto-resume
    /// and no --config: the run directory's own config.toml.
    #[arg(short, long, value_name = "FILE")]
    config: Vec<PathBuf>,
    /// Plugins to load, by name or .so path (replaces `run.plugins`).
    #[arg(short, long, value_delimiter = ',', value_name = "A,B")]
    plugins: Option<Vec<String>>,
    /// Override one key, e.g. `--set optim.lr=3e-4` or `--set plugins.flops.every=500`
    /// (a relative path is relative to the working directory). `--set lora.rank=8` trains
    /// LoRA adapters on a frozen base (the [lora] table: rank, alpha, dropout, targets;
    /// see docs/memory.md).
    #[arg(short, long = "set", value_name = "SECTION.KEY=VALUE")]
    set: Vec<String>,
    /// Optimizer steps (`train.steps`).
    #[arg(long, value_name = "N")]
    steps: Option<u64>,
    /// Device (`run.device`).
    #[arg(long, value_enum)]
    device: Option<DeviceChoice>,
    /// Output directory (`run.run_dir`).
    #[arg(long, value_name = "DIR")]
    run_dir: Option<PathBuf>,
    /// Random seed (`run.seed`).
    #[arg(long, value_name = "N")]
    seed: Option<u64>,
    /// The base model's directory, where it is now (`--set model.init_from=DIR`, after
    /// the other layers): for resuming a run whose base moved since it recorded it (a
    /// LoRA run's base is checked against the digest it recorded).
    #[arg(long, value_name = "DIR")]
    base: Option<PathBuf>,
    /// Resume from a checkpoint directory, or from the newest valid checkpoint of a run directory.
    #[arg(long, value_name = "PATH", conflicts_with = "auto_resume")]
    resume: Option<PathBuf>,
    /// Resume from the newest valid checkpoint in --run-dir, if there is one.
    #[arg(long)]
    auto_resume: bool,
    /// Start over in a --run-dir that holds an earlier run's checkpoints or records
    /// (config.toml, summary.json): what it holds is moved aside to
    /// <run-dir>.old-<UTC time> first (without this, or a resume flag, such a run is refused).
    #[arg(long, conflicts_with_all = ["resume", "auto_resume"])]
    overwrite: bool,
    /// Print only warnings, errors and the final summary line: no progress bar,
    /// progress lines or evaluation lines (`PTRAIN_LOG` overrides the log level).
    #[arg(long)]
    pub quiet: bool,
    /// Resume a checkpoint whose global batch (data.batch_size x optim.accum_steps x ranks)
    /// differs from this run's (refused without it: a step would train on other samples).
    #[arg(long)]
    allow_batch_change: bool,
    /// A plugin failure (a plugin disabled after an error or a panic, or one given up on
    /// at the end) makes a run that otherwise completed exit 3, after finishing and
    /// writing its summary (`run.strict_plugins`). For CI.
    #[arg(long)]
    strict_plugins: bool,
}

impl RunArgs {
    /// The flags that name a configuration key, over the file and `--set` layers.
    fn apply(&self, config: &mut Config) {
        if let Some(plugins) = &self.plugins {
            config.run.plugins = plugins.iter().filter(|p| !p.is_empty()).cloned().collect();
        }
        if let Some(steps) = self.steps {
            config.train.steps = steps;
        }
        if let Some(device) = self.device {
            config.run.device = device;
        }
        if let Some(dir) = &self.run_dir {
            config.run.run_dir = dir.display().to_string();
        }
        if let Some(seed) = self.seed {
            config.run.seed = seed;
        }
        if self.strict_plugins {
            config.run.strict_plugins = true;
        }
    }
}

impl RunArgs {
    /// The configuration this command runs with: the files and `--set` layers (with
    /// --auto-resume and no --config, the run directory's own), then the flags.
    /// `ptrain tokenize` takes the same flags and reads the data through it.
    pub fn config(&self) -> anyhow::Result<Config> {
        let own = self.run_dir.as_ref().map(|d| d.join("config.toml")).filter(|p| self.auto_resume && self.config.is_empty() && p.is_file());
        // The checkpoint the weights will come from, if any: model.init_from is then not needed.
        let from = match (&self.resume, self.auto_resume, &self.run_dir) {
            (Some(path), _, _) => ptrain_core::checkpoint::resolve(path).0,
            (None, true, Some(dir)) => ptrain_core::checkpoint::resolve(dir).0,
            _ => None,
        };
        let sets = with_base(&self.set, self.base.as_deref())?;
        let builder = match own {
            Some(own) => {
                tracing::info!("--auto-resume without --config: the run's own {}", own.display());
                sets.iter()
                    .try_fold(ConfigBuilder::default().recorded(&recorded_without_debug(&own)?, &own.display().to_string())?, |b, s| b.set(s))?
            }
            None => ConfigBuilder::layered(&self.config, &sets)?,
        };
        let builder = builder.weights_from(from.as_deref().map(ptrain_core::config::run_dir_of));
        Ok(builder.build_with(|c| self.apply(c))?)
    }
}

pub fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let config = args.config()?;
    let resume = match (&args.resume, args.auto_resume) {
        (Some(path), _) => Some(Resume::Path(path.clone())),
        (None, true) => Some(Resume::Auto),
        _ => None,
    };
    // One rank of several (torchrun, Slurm, `ptrain launch`) joins the process
    // group; without one, the single-rank run.
    let dist = ptrain_dist::from_env(&config)?;
    let rank = dist.rank();
    let trainer = Trainer::new(config)
        .resume(resume)
        .overwrite(args.overwrite)
        .allow_batch_change(args.allow_batch_change)
        .handle_signals(true)
        .progress(!args.quiet)
        .data_parallel(dist);
    let outcome = trainer.run()?;
    let s = &outcome.summary;
    if let Some(error) = &s.error {
        eprintln!("error: {error}");
    }
    let line = closing_line(s);
    reportln!("{line}");
    if let Some(why) = &outcome.summary_error {
        // The record is lost with the file: stderr gets what it said, whatever stdout is.
        eprintln!("error: {why}: the run's summary exists only here");
        eprintln!("{line}");
        eprintln!("summary: {}", s.essentials());
    }
    for failure in &s.plugin_failures {
        reportln!("plugin {} failed in {} at step {}: {}", failure.plugin, failure.hook, failure.step, failure.error);
    }
    if outcome.exit_code == ptrain_core::trainer::EXIT_PLUGIN_FAILED {
        reportln!("exit {}: a plugin failed or was given up on, and run.strict_plugins is set", outcome.exit_code);
    }
    if rank == 0 && outcome.summary_error.is_none() {
        reportln!("summary: {}", outcome.run_dir.join("summary.json").display());
    }
    if rank == 0 && s.status == "interrupted" {
        resume_lines(s, &outcome.run_dir);
    }
    Ok(ExitCode::from(outcome.exit_code as u8))
}

/// `sets`, then `--base DIR` as `model.init_from`, absolute (a run records absolute paths).
pub fn with_base(sets: &[String], base: Option<&std::path::Path>) -> anyhow::Result<Vec<String>> {
    let mut sets = sets.to_vec();
    if let Some(base) = base {
        let base = std::path::absolute(base)?;
        sets.push(format!("model.init_from={:?}", base.display().to_string()));
    }
    Ok(sets)
}

/// The closing line: how the run ended, its figures, and what went wrong on the way.
fn closing_line(s: &ptrain_core::Summary) -> String {
    let loss = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.4}"));
    let problems = problems(s);
    let but = if problems.is_empty() { String::new() } else { format!("; but {}", problems.join("; ")) };
    if s.steps == 0 && s.error.is_none() && s.start_step >= s.total_steps {
        // A finished run resumed with no more steps than it has: nothing ran, and
        // "0 steps, loss - -> -" would not say why.
        let relation = if s.start_step > s.total_steps { "past" } else { "at" };
        format!(
            "{}: nothing to train: the run is already at step {}, {relation} train.steps = {} (steps count from the run's start, \
             not from the checkpoint: --steps {} trains {} more){but}",
            s.status,
            s.start_step,
            s.total_steps,
            s.start_step + s.total_steps,
            s.total_steps
        )
    } else {
        // Rows cut to fit are trained only in part: said here, as --quiet prints no INFO line.
        let cut = match &s.data_rows {
            Some(rows) if rows.truncated > 0 => format!("; {} of {} rows truncated to data.max_seq_len", rows.truncated, rows.rows),
            _ => String::new(),
        };
        format!(
            "{}: {} steps in {:.2}s ({:.2} steps/s, {:.0} tokens/s) on {}; loss {} -> {}, eval {}{cut}{but}",
            s.status,
            s.steps,
            s.wall_s,
            s.steps_per_s,
            s.tokens_per_s,
            s.device,
            loss(s.first_loss),
            loss(s.final_loss),
            loss(s.final_eval_loss),
        )
    }
}

/// A run's recorded `config.toml` (absolute paths) less its `[debug]` table: the
/// failures a test injected are not injected again into the run that resumes it.
fn recorded_without_debug(path: &std::path::Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path).map_err(|source| ptrain_core::Error::Io { path: path.to_owned(), source })?;
    let mut table: toml::Table = text.parse().map_err(|e: toml::de::Error| anyhow::anyhow!("{}: {e}", path.display()))?;
    table.remove("debug");
    Ok(table.to_string())
}

/// After Ctrl-C: the checkpoint saved, and the command that resumes, each on a line.
fn resume_lines(s: &ptrain_core::Summary, run_dir: &std::path::Path) {
    // The newest checkpoint as the disk holds it (a save given up on is not there).
    let loaded = s.plugins_loaded.iter().any(|p| p.name == "checkpoint");
    match (&s.checkpoint, loaded) {
        (Some(c), _) => reportln!("checkpoint: {}", c.path.display()),
        (None, true) => reportln!("checkpoint: none written yet (the run starts over from its beginning)"),
        (None, false) => reportln!("checkpoint: none (load the checkpoint plugin, --plugins checkpoint, to resume interrupted runs)"),
    }
    // Several ranks resume as several ranks: the same global batch, the same data stream.
    match s.world_size {
        1 => reportln!("resume: ptrain run --run-dir {} --auto-resume", run_dir.display()),
        n if std::env::var_os("TORCHELASTIC_RUN_ID").is_some() => {
            reportln!("resume: the same torchrun command ({n} ranks) with `ptrain run --run-dir {} --auto-resume`", run_dir.display())
        }
        n => reportln!("resume: ptrain launch --nproc {n} run --run-dir {} --auto-resume", run_dir.display()),
    }
}

/// What went wrong along the way that a user must know though the run went on:
/// failed saves (and how old the newest checkpoint is), plugins disabled, detached
/// or given up on, metrics batches dropped from full queues.
fn problems(s: &ptrain_core::Summary) -> Vec<String> {
    let mut out = Vec::new();
    for (name, report) in &s.plugins {
        let failed = report.get("failed").and_then(|v| v.as_u64()).unwrap_or(0);
        if failed == 0 {
            continue;
        }
        // A checkpoint plugin lists the checkpoints it kept; others only count. The
        // newest is the one on disk at the end, when there is one.
        let kept = report.get("kept").and_then(|k| k.as_array());
        let newest = s.checkpoint.as_ref().map(|c| c.step).or_else(|| kept.and_then(|k| k.iter().filter_map(|v| v.as_u64()).max()));
        out.push(match (kept, newest) {
            (_, Some(step)) => {
                format!("{failed} {name} save(s) failed, the newest checkpoint is step {step} ({} steps old)", s.last_step.saturating_sub(step))
            }
            (Some(_), None) => format!("{failed} {name} save(s) failed, and there is no checkpoint"),
            (None, _) => format!("{failed} {name} write(s) failed"),
        });
    }
    for f in &s.plugin_failures {
        out.push(format!("plugin {} disabled (failed in {} at step {})", f.plugin, f.hook, f.step));
    }
    for (name, why) in &s.detached_plugins {
        out.push(format!("plugin {name} left the schedule ({why})"));
    }
    for (name, lost) in &s.abandoned_plugins {
        // A checkpoint writer given up on: which checkpoint the run can resume from.
        let newest = match (&s.checkpoint, s.plugins_loaded.iter().any(|p| &p.name == name && name == "checkpoint")) {
            (Some(c), true) => format!(", the newest checkpoint is step {} ({} steps old)", c.step, s.last_step.saturating_sub(c.step)),
            (None, true) => ", and there is no checkpoint".into(),
            (_, false) => String::new(),
        };
        out.push(format!("plugin {name} abandoned with {lost} event(s) unhandled{newest}"));
    }
    for (name, stall) in &s.plugin_stalls {
        out.push(format!(
            "plugin {name} stalled {} time(s), the longest {} in {} at step {}",
            stall.count,
            ptrain_core::host::seconds(stall.seconds),
            stall.hook,
            stall.step
        ));
    }
    for (name, dropped) in s.queue_drops.iter().filter(|(_, n)| **n > 0) {
        out.push(format!("plugin {name} dropped {dropped} metrics batch(es) from its full queue"));
    }
    out
}
