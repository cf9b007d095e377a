//! `ptrain plugins list|info|new`.

use std::{path::PathBuf, process::ExitCode};

use clap::Subcommand;
use ptrain_core::host::{available, loader, resolve, search_dirs};

#[derive(Debug, Subcommand)]
pub enum PluginsCommand {
    /// Every plugin in the search path: name, version, hooks, default cadences, path.
    List,
    /// One plugin, by name or path.
    Info { name: String },
    /// Write a new plugin crate, ready for `cargo build --release`: an inline plugin that
    /// reads gradients every 20 steps and emits a metric, with --sink a worker that
    /// writes every metrics batch to a CSV file, or with --reward a GRPO reward function
    /// (`[[grpo.rewards]] kind = "plugin"`, docs/rl.md); each with a unit test. It depends on this
    /// ptrain's plugin-api by path and builds in the plugin build cache shared by your
    /// plugins ($PTRAIN_HOME/plugin-build, default ~/.cache/ptrain/plugin-build; nothing is
    /// written into ptrain's checkout), which the first inline plugin seeds from ptrain's own
    /// build: torch-sys (libtorch's bindings) is not compiled again.
    New {
        /// The plugin's name (lowercase letters, digits, inner dashes): `--plugins <NAME>` loads it.
        name: String,
        /// A sink (worker thread, metrics batches to a file) instead of an inline plugin reading tensors.
        #[arg(long, conflicts_with = "reward")]
        sink: bool,
        /// A GRPO reward (worker thread, scores sampled completions: TRL's reward_len as
        /// written), named by `[[grpo.rewards]] kind = "plugin", plugin = "<NAME>"`.
        #[arg(long, conflicts_with = "python")]
        reward: bool,
        /// Where to write the crate (default `./<NAME>`); must be missing or empty.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
        /// Depend on ptrain-plugin-api by this version (from a registry) instead of by path
        /// into this machine's ptrain checkout: for a ptrain installed without its source.
        #[arg(long, value_name = "VERSION", conflicts_with = "python")]
        api_version: Option<String>,
        /// A Python module for the `python` plugin and its tests instead of a crate
        /// (docs/python-plugins.md): nothing to build.
        #[arg(long, conflicts_with = "sink")]
        python: bool,
    },
}

fn describe(lib: &loader::PluginLibrary, path: &std::path::Path) -> String {
    let d = &lib.descriptor;
    let mut out = format!(
        "{} {} ({})\n  {}\n  path: {}\n",
        d.name,
        d.version,
        if d.threading == ptrain_plugin_api::Threading::Inline { "inline" } else { "worker thread" },
        d.description,
        path.display()
    );
    if d.critical {
        out.push_str("  critical: its error, panic or stall fails the run (`critical = false` in its [plugins.<name>] table turns it off)\n");
    }
    if d.reward {
        out.push_str("  reward: scores GRPO's completions ([[grpo.rewards]] kind = \"plugin\", plugin = \"<name>\"), on its worker thread\n");
    }
    for a in d.attachments.iter() {
        let cadence = match a.hook {
            h if h.is_scheduled() => a.cadence.to_string(),
            h if h.is_lifecycle() => "ignored (run start and end reach every plugin)".to_string(),
            _ => "at every evaluation".to_string(),
        };
        out.push_str(&format!("  {:<12} hook {:<14} {}\n", a.name.as_str(), a.hook.name(), cadence));
    }
    out
}

pub fn run(cmd: PluginsCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        PluginsCommand::List => {
            outln!("this ptrain loads plugins built against ptrain-plugin-api {}", ptrain_plugin_api::API_VERSION);
            let found = available();
            if found.is_empty() {
                let dirs: Vec<String> = search_dirs().iter().map(|d| d.display().to_string()).collect();
                outln!("no plugins found in {}", dirs.join(", "));
            }
            for (name, path) in found {
                match loader::load(&path) {
                    Ok(lib) => out!("{}", describe(&lib, &path)),
                    Err(e) => outln!("{name}: cannot load: {e}"),
                }
            }
        }
        PluginsCommand::Info { name } => {
            let path = resolve(&name)?;
            let lib = loader::load(&path)?;
            out!("{}", describe(&lib, &path));
        }
        PluginsCommand::New { name, python: true, dir, .. } => super::scaffold_python::run(&name, dir)?,
        PluginsCommand::New { name, sink, reward, dir, api_version, .. } => {
            let kind = match (sink, reward) {
                (_, true) => super::scaffold::Kind::Reward,
                (true, _) => super::scaffold::Kind::Sink,
                _ => super::scaffold::Kind::Inline,
            };
            super::scaffold::run(&name, kind, dir, api_version)?
        }
    }
    Ok(ExitCode::SUCCESS)
}
