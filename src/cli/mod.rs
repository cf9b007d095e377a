//! The `ptrain` command line.

mod checkpoints;
mod config;
mod launch;
mod plugins;
mod run;
mod scaffold;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Train on libtorch, with monitoring plugins that run only when due.
#[derive(Debug, Parser)]
#[command(name = "ptrain", version, about, long_about = None, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Train a model (no --plugins: fast mode, nothing but the loop).
    Run(run::RunArgs),
    /// Start a data-parallel job on this machine: N ranks of `ptrain <COMMAND>`.
    Launch(launch::LaunchArgs),
    /// List, inspect and create plugins.
    #[command(subcommand)]
    Plugins(plugins::PluginsCommand),
    /// Print the resolved configuration, or the commented default.
    Config(config::ConfigArgs),
    /// Inspect checkpoints.
    #[command(subcommand)]
    Checkpoints(checkpoints::CheckpointsCommand),
}

pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    init_logging();
    match cli.command {
        Command::Run(args) => run::run(args),
        Command::Launch(args) => launch::run(args),
        Command::Plugins(cmd) => plugins::run(cmd),
        Command::Config(args) => config::run(args),
        Command::Checkpoints(cmd) => checkpoints::run(cmd),
    }
}

/// 2 for what the user asked for (bad configuration, missing files, plugins that
/// cannot load): nothing trained. 1 for failures during training.
pub fn exit_code(err: &anyhow::Error) -> ExitCode {
    let usage = err.chain().any(|cause| cause.downcast_ref::<ptrain_core::Error>().is_some_and(ptrain_core::Error::is_usage));
    ExitCode::from(if usage { 2 } else { 1 })
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("PTRAIN_LOG").unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_timer(tracing_subscriber::fmt::time::uptime())
        .try_init();
}
