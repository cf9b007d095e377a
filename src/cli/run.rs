//! `ptrain run`.

use std::{path::PathBuf, process::ExitCode};

use clap::Args;
use ptrain_core::{config::DeviceChoice, Config, ConfigBuilder, Resume, Trainer};

/// The exit codes of `ptrain run`, for `--help`.
const EXIT_CODES: &str = "Exit codes:
  0        the run completed, or a plugin ended it early as done (request_stop: early-stop)
  1        training failed (or stopped: non-finite losses, a save error with on_save_error = \"stop\", a plugin's
           request_failure_stop)
  2        refused before training: bad configuration, missing file, unknown or incompatible plugin, bad plugin options
  3        the run completed, but a plugin failed and --strict-plugins (run.strict_plugins) is set
  130/143  interrupted by SIGINT/SIGTERM after saving an emergency checkpoint";

#[derive(Debug, Args)]
#[command(after_help = EXIT_CODES)]
pub struct RunArgs {
    /// TOML file layered over the embedded default (`ptrain config --default` shows it).
    /// Repeat to layer several, in order: a later file's keys win, tables merge key by key.
    #[arg(short, long, value_name = "FILE")]
    config: Vec<PathBuf>,
    /// Plugins to load, by name or .so path (replaces `run.plugins`).
    #[arg(short, long, value_delimiter = ',', value_name = "A,B")]
    plugins: Option<Vec<String>>,
    /// Override one key, e.g. `--set optim.lr=3e-4` or `--set plugins.flops.every=500`.
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
    /// Resume from a checkpoint directory, or from the newest valid checkpoint of a run directory.
    #[arg(long, value_name = "PATH", conflicts_with = "auto_resume")]
    resume: Option<PathBuf>,
    /// Resume from the newest valid checkpoint in --run-dir, if there is one.
    #[arg(long)]
    auto_resume: bool,
    /// Print only warnings, errors and the final summary line: no progress bar,
    /// progress lines or evaluation lines (`PTRAIN_LOG` overrides the log level).
    #[arg(long)]
    pub quiet: bool,
    /// A plugin failure (a plugin disabled after an error or a panic) makes a run that
    /// otherwise completed exit 3, after finishing and writing its summary
    /// (`run.strict_plugins`). For CI.
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

pub fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let config = ConfigBuilder::layered(&args.config, &args.set)?.build_with(|c| args.apply(c))?;
    let resume = match (&args.resume, args.auto_resume) {
        (Some(path), _) => Some(Resume::Path(path.clone())),
        (None, true) => Some(Resume::Auto),
        _ => None,
    };
    // One rank of several (torchrun, Slurm, `ptrain launch`): join the process group.
    let dist = ptrain_dist::from_env(&config)?;
    let rank = dist.as_ref().map_or(0, |d| d.rank());
    let mut trainer = Trainer::new(config).resume(resume).handle_signals(true).progress(!args.quiet);
    if let Some(dist) = dist {
        trainer = trainer.data_parallel(dist);
    }
    let outcome = trainer.run()?;
    let s = &outcome.summary;
    let loss = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.4}"));
    println!(
        "{}: {} steps in {:.2}s ({:.2} steps/s, {:.0} tokens/s) on {}; loss {} -> {}, eval {}",
        s.status,
        s.steps,
        s.wall_s,
        s.steps_per_s,
        s.tokens_per_s,
        s.device,
        loss(s.first_loss),
        loss(s.final_loss),
        loss(s.final_eval_loss)
    );
    for failure in &s.plugin_failures {
        println!("plugin {} failed in {} at step {}: {}", failure.plugin, failure.hook, failure.step, failure.error);
    }
    if outcome.exit_code == ptrain_core::trainer::EXIT_PLUGIN_FAILED {
        println!("exit {}: a plugin failed, and run.strict_plugins is set", outcome.exit_code);
    }
    if rank == 0 {
        println!("summary: {}", outcome.run_dir.join("summary.json").display());
    }
    Ok(ExitCode::from(outcome.exit_code as u8))
}
