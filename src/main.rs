use std::process::ExitCode;

mod cli;

// Rust's allocations (not libtorch's, which has its own allocator): `ptrain tokenize`
// spent 30% of its instructions in glibc's malloc and free, the tokenizer allocating a
// string per pre-token. Plugins keep their own allocator; what crosses to them is
// abi_stable types, which free with the allocator that made them.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let args = <cli::Cli as clap::Parser>::parse();
    cli::run(args).unwrap_or_else(|err| {
        eprintln!("error: {}", cli::chain(&err));
        cli::exit_code(&err)
    })
}
