use std::process::ExitCode;

mod cli;

fn main() -> ExitCode {
    let args = <cli::Cli as clap::Parser>::parse();
    cli::run(args).unwrap_or_else(|err| {
        eprintln!("error: {}", cli::chain(&err));
        cli::exit_code(&err)
    })
}
