//! `ptrain launch`: a one-node data-parallel job without torchrun.

use std::{ffi::OsString, process::ExitCode, time::Duration};

use clap::Args;
use ptrain_core::{ConfigError, Error};
use ptrain_dist::launch::{launch, LaunchSpec};

/// How long the other ranks get to exit after one failed, before SIGKILL.
const GRACE: Duration = Duration::from_secs(15);

#[derive(Debug, Args)]
pub struct LaunchArgs {
    /// Ranks to start on this machine (each uses CUDA device LOCAL_RANK).
    #[arg(long, alias = "nproc-per-node", value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    nproc: u32,
    /// Rendezvous address (rank 0 serves it).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1")]
    master_addr: String,
    /// Rendezvous port [default: a free port].
    #[arg(long, value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    master_port: Option<u16>,
    /// Pass the ranks' output through as it is, without `[rank<r>]` line prefixes.
    #[arg(long)]
    no_prefix: bool,
    /// What each rank runs: e.g. `run --config configs/tiny-gpt.toml` (everything from the
    /// first word that is not an option of launch's, with or without `--` before it).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 1.., required = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

pub fn run(args: LaunchArgs) -> anyhow::Result<ExitCode> {
    if args.command.first().is_some_and(|c| c == "launch") {
        return Err(Error::Config(ConfigError {
            origin: "ptrain launch".into(),
            key: String::new(),
            message: "the ranks cannot run `launch` themselves".into(),
        })
        .into());
    }
    let spec = LaunchSpec {
        program: std::env::current_exe()?,
        args: args.command,
        nproc: args.nproc,
        master_addr: args.master_addr,
        master_port: args.master_port,
        prefix: !args.no_prefix,
        grace: GRACE,
    };
    let code = match launch(&spec) {
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            let message = format!("{e} (another program listens there: choose another port, or leave --master-port out for a free one)");
            return Err(Error::Config(ConfigError { origin: "ptrain launch".into(), key: "--master-port".into(), message }).into());
        }
        other => other?,
    };
    Ok(ExitCode::from(code.clamp(0, 255) as u8))
}
