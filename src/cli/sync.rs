//! `ptrain sync mlflow <run-dir>`: sends what the `mlflow` plugin could not.

use std::{path::PathBuf, process::ExitCode, time::Duration};

use clap::{Args, Subcommand};
use ptrain_mlflow::{
    auth::URI_VAR,
    state::StateDir,
    sync::{sync, SyncSettings},
    Auth,
};

#[derive(Debug, Subcommand)]
pub enum SyncCommand {
    /// Send what the mlflow plugin could not (<run-dir>/mlflow/pending.jsonl) to the tracking server.
    ///
    /// The items go into the run's MLflow run, which is created if the server never saw it.
    /// Progress is recorded after every request (mlflow/synced.json): running it again sends
    /// only what is left, and nothing once everything was sent. Exit code 0 when done, 1 when
    /// the server failed (run it again), 2 when the directory has no MLflow state or no URI is usable.
    Mlflow(MlflowArgs),
}

#[derive(Debug, Args)]
pub struct MlflowArgs {
    /// The run directory (or its mlflow/ directory, or a directory the plugin moved aside).
    run_dir: PathBuf,
    /// Send to this tracking server instead of the one the run used (needed when the run's
    /// URI was not http(s); MLFLOW_TRACKING_URI is used then when set). Credentials come
    /// from MLFLOW_TRACKING_USERNAME/_PASSWORD or MLFLOW_TRACKING_TOKEN.
    #[arg(long, value_name = "URI")]
    uri: Option<String>,
    /// Seconds one HTTP request may take.
    #[arg(long, value_name = "SECS", default_value_t = 30.0)]
    timeout_secs: f64,
    /// Seconds to keep retrying a request on server errors (5xx) and network errors.
    #[arg(long, value_name = "SECS", default_value_t = 60.0)]
    retry_secs: f64,
}

fn secs(name: &str, v: f64) -> anyhow::Result<Duration> {
    anyhow::ensure!(v.is_finite() && v > 0.0, "--{name} must be a positive number of seconds, got {v}");
    Ok(Duration::from_secs_f64(v))
}

pub fn run(cmd: SyncCommand) -> anyhow::Result<ExitCode> {
    let SyncCommand::Mlflow(args) = cmd;
    let Some(state) = StateDir::locate(&args.run_dir) else {
        eprintln!("error: no MLflow state in {} (no run.json there or in its mlflow/ directory)", args.run_dir.display());
        return Ok(ExitCode::from(2));
    };
    let settings = SyncSettings {
        uri: args.uri,
        env_uri: std::env::var(URI_VAR).ok().filter(|u| !u.trim().is_empty()),
        auth: Auth::from_env(),
        timeout: secs("timeout-secs", args.timeout_secs)?,
        retry: secs("retry-secs", args.retry_secs)?,
    };
    match sync(&state, &settings, |note| eprintln!("mlflow: {note}")) {
        Ok(report) => {
            match (&report.run_url, report.items_sent + report.items_refused) {
                (Some(url), n) if n > 0 => {
                    let created = if report.created { " (created now)" } else { "" };
                    outln!("mlflow: sent {} ({n} pending items) to {url}{created}", report.sent);
                }
                _ => outln!("mlflow: nothing to send ({} pending items were sent before)", report.items_before),
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) if e.is_usage() => {
            eprintln!("error: {e}");
            Ok(ExitCode::from(2))
        }
        Err(e) => {
            eprintln!("error: {e}");
            Ok(ExitCode::FAILURE)
        }
    }
}
