//! `ptrain plugins list|info`.

use std::process::ExitCode;

use clap::Subcommand;
use ptrain_core::host::{available, loader, resolve, search_dirs};

#[derive(Debug, Subcommand)]
pub enum PluginsCommand {
    /// Every plugin in the search path: name, version, hooks, default cadences, path.
    List,
    /// One plugin, by name or path.
    Info { name: String },
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
    for a in d.attachments.iter() {
        let cadence = if a.hook.is_scheduled() { a.cadence.to_string() } else { "on the event".to_string() };
        out.push_str(&format!("  {:<12} hook {:<14} {}\n", a.name.as_str(), a.hook.name(), cadence));
    }
    out
}

pub fn run(cmd: PluginsCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        PluginsCommand::List => {
            let found = available();
            if found.is_empty() {
                let dirs: Vec<String> = search_dirs().iter().map(|d| d.display().to_string()).collect();
                println!("no plugins found in {}", dirs.join(", "));
            }
            for (name, path) in found {
                match loader::load(&path) {
                    Ok(lib) => print!("{}", describe(&lib, &path)),
                    Err(e) => println!("{name}: cannot load: {e}"),
                }
            }
        }
        PluginsCommand::Info { name } => {
            let path = resolve(&name)?;
            let lib = loader::load(&path)?;
            print!("{}", describe(&lib, &path));
        }
    }
    Ok(ExitCode::SUCCESS)
}
