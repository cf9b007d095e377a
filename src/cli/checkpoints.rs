//! `ptrain checkpoints list|verify`.

use std::{path::PathBuf, process::ExitCode};

use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum CheckpointsCommand {
    /// Checkpoints of a run directory, newest last, with their validity.
    List { run_dir: PathBuf },
    /// Which checkpoint --auto-resume would use; exit 1 if none is valid.
    Verify { run_dir: PathBuf },
}

pub fn run(cmd: CheckpointsCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        CheckpointsCommand::List { run_dir } => {
            let dir = ptrain_core::checkpoint::checkpoints_in(&run_dir);
            let latest = ptrain_core::checkpoint::read_latest(&dir);
            for (step, path) in ptrain_core::checkpoint::list(&dir) {
                let status = match ptrain_core::checkpoint::validate(&path) {
                    Ok(m) => format!("valid ({})", m.reason),
                    Err(e) => format!("INVALID: {e}"),
                };
                let mark = if latest.as_deref() == path.file_name().and_then(|n| n.to_str()) { " <- latest" } else { "" };
                outln!("step {step:>8}  {}  {status}{mark}", path.display());
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
