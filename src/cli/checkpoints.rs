//! `ptrain checkpoints list|verify`.

use std::{path::PathBuf, process::ExitCode};

use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum CheckpointsCommand {
    /// Checkpoints of a run directory, newest last, with their validity; `latest` marks
    /// the newest valid one (what --auto-resume, verify and export take), `best` the
    /// best by the checkpoint plugin's metric.
    List { run_dir: PathBuf },
    /// Which checkpoint --auto-resume would use; exit 1 if none is valid.
    Verify { run_dir: PathBuf },
}

pub fn run(cmd: CheckpointsCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        CheckpointsCommand::List { run_dir } => {
            let dir = ptrain_core::checkpoint::checkpoints_in(&run_dir);
            let (latest, _) = ptrain_core::checkpoint::find_resumable(&dir);
            let best = ptrain_core::checkpoint::read_best(&dir).map(|n| dir.join(n));
            for (step, path) in ptrain_core::checkpoint::list(&dir) {
                let status = match ptrain_core::checkpoint::validate(&path) {
                    Ok(m) => format!("valid ({})", m.reason),
                    Err(e) => format!("INVALID: {e}"),
                };
                let mark = if latest.as_ref() == Some(&path) { " <- latest" } else { "" };
                let best_mark = if best.as_ref() == Some(&path) { " <- best" } else { "" };
                outln!("step {step:>8}  {}  {status}{mark}{best_mark}", path.display());
            }
            Ok(ExitCode::SUCCESS)
        }
        CheckpointsCommand::Verify { run_dir } => {
            let (found, warnings) = ptrain_core::checkpoint::find_resumable(&ptrain_core::checkpoint::checkpoints_in(&run_dir));
            for w in warnings {
                eprintln!("warning: {w}");
            }
            match found {
                Some(path) => {
                    outln!("{}", path.display());
                    Ok(ExitCode::SUCCESS)
                }
                None => {
                    eprintln!("no valid checkpoint under {}", run_dir.display());
                    Ok(ExitCode::FAILURE)
                }
            }
        }
    }
}
