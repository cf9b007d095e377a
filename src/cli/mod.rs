//! The `ptrain` command line.

/// `println!` for what commands print on stdout. A reader that stopped reading
/// (`ptrain plugins list | head -1`) has what it wanted: a broken pipe ends the
/// process quietly with exit 0 instead of panicking.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::cli::write_stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!`, as [`outln!`].
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::cli::write_stdout(format_args!($($arg)*))
    };
}

/// `println!` for a run's closing lines: a closed stdout loses them (the summary
/// is in `summary.json`) but not the run's exit code.
macro_rules! reportln {
    ($($arg:tt)*) => {{
        use std::io::Write;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

mod checkpoints;
mod config;
mod export;
mod generate;
mod launch;
mod logits;
mod plugin_cache;
mod plugins;
mod run;
mod scaffold;
mod scaffold_python;
mod scaffold_version;
mod sync;
mod tokenize;

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
    /// Send what a sink plugin could not deliver during the run.
    #[command(subcommand)]
    Sync(sync::SyncCommand),
    // Their help texts are the argument structs' doc comments.
    Export(export::ExportArgs),
    Generate(generate::GenerateArgs),
    Tokenize(tokenize::TokenizeArgs),
    Logits(logits::LogitsArgs),
}

pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    init_logging(matches!(&cli.command, Command::Run(args) if args.quiet));
    match cli.command {
        Command::Run(args) => run::run(args),
        Command::Launch(args) => launch::run(args),
        Command::Plugins(cmd) => plugins::run(cmd),
        Command::Config(args) => config::run(args),
        Command::Checkpoints(cmd) => checkpoints::run(cmd),
        Command::Sync(cmd) => sync::run(cmd),
        Command::Export(args) => export::run(args),
        Command::Generate(args) => generate::run(args),
        Command::Tokenize(args) => tokenize::run(args),
        Command::Logits(args) => logits::run(args),
    }
}

/// 2 for what the user asked for (bad configuration, missing files, plugins that
/// cannot load): nothing trained. 1 for failures during training.
pub fn exit_code(err: &anyhow::Error) -> ExitCode {
    let usage = err.chain().any(|cause| cause.downcast_ref::<ptrain_core::Error>().is_some_and(ptrain_core::Error::is_usage));
    ExitCode::from(if usage { 2 } else { 1 })
}

/// An error and its causes, as `{:#}` joins them, less a cause whose text the
/// message already holds (`cannot write X: No space left on device` does not say
/// the OS error twice).
pub fn chain(err: &anyhow::Error) -> String {
    let mut text = err.to_string();
    for cause in err.chain().skip(1) {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
    }
    text
}

/// Log lines on stderr: `info` and up, or with `quiet` (`ptrain run --quiet`) only
/// warnings and errors; `PTRAIN_LOG` (an `EnvFilter`) overrides both. Colour only
/// on a terminal, and never with `NO_COLOR` set (https://no-color.org).
fn init_logging(quiet: bool) {
    use std::io::IsTerminal;
    let default = if quiet { "warn" } else { "info" };
    let filter = tracing_subscriber::EnvFilter::try_from_env("PTRAIN_LOG").unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal() && !no_color)
        .with_target(false)
        .with_timer(tracing_subscriber::fmt::time::uptime())
        .try_init();
}

/// Writes to stdout (see [`outln!`]): exit 0 on a broken pipe, exit 1 with a
/// message on any other write error.
pub fn write_stdout(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout.write_fmt(args).and_then(|()| stdout.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("error: cannot write to stdout: {e}");
        std::process::exit(1);
    }
}
