//! `ptrain config`.

use std::{path::PathBuf, process::ExitCode};

use clap::Args;
use ptrain_core::ConfigBuilder;

#[derive(Debug, Args)]
pub struct ConfigArgs {
    /// Print the commented default configuration instead.
    #[arg(long)]
    default: bool,
    /// TOML file layered over the default; repeat to layer several, in order (a later
    /// file's keys win).
    #[arg(short, long, value_name = "FILE")]
    config: Vec<PathBuf>,
    /// Override one key.
    #[arg(short, long = "set", value_name = "SECTION.KEY=VALUE")]
    set: Vec<String>,
}

pub fn run(args: ConfigArgs) -> anyhow::Result<ExitCode> {
    if args.default {
        out!("{}", ptrain_core::config::DEFAULT_TOML);
    } else {
        let config = ConfigBuilder::layered(&args.config, &args.set)?.build()?;
        // As `ptrain run` would: every [plugins.<name>] table names a plugin there is.
        ptrain_core::host::loader::check_tables(&config.plugins_to_load(), &config.plugins)?;
        out!("{}", config.to_toml());
    }
    Ok(ExitCode::SUCCESS)
}
