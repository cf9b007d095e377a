//! `ptrain plugins new`: writes a plugin crate, anywhere, that builds at once on this
//! machine's ptrain: its plugin-api by path, its Cargo.lock (the same dependency
//! versions), and a `.cargo/config.toml` that builds in the plugin build cache
//! ([`super::plugin_cache`]), seeded from ptrain's build so torch-sys (libtorch's C++
//! bindings) is not compiled again. Nothing is written into ptrain's checkout.

use std::path::{Path, PathBuf};

use anyhow::Context;
use ptrain_core::Error;

use super::plugin_cache::{self, has_torch_sys};

/// The tch ptrain builds with (pinned by a test to the workspace's).
const TCH_REQUIREMENT: &str = "=0.24.0";

const CARGO_TOML: &str = include_str!("templates/Cargo.toml.in");
const CARGO_CONFIG: &str = include_str!("templates/cargo-config.toml.in");
const README: &str = include_str!("templates/README.md.in");
const INLINE: &str = include_str!("templates/inline.rs");
const SINK: &str = include_str!("templates/sink.rs");
const REWARD: &str = include_str!("templates/reward.rs");

/// Where this ptrain was built from and with, as far as this machine shows it.
struct Origin {
    /// The checkout holding `plugin-api/` and `Cargo.lock`.
    checkout: PathBuf,
    /// The cargo build directory holding ptrain's compiled torch-sys (only read).
    build_dir: Option<PathBuf>,
    /// The plugin build cache the crate builds in.
    cache: Option<PathBuf>,
    /// libtorch's directory in the venv's torch.
    torch_lib: Option<PathBuf>,
}

impl Origin {
    fn find() -> anyhow::Result<Origin> {
        // The checkout this binary was built from, else the one scripts/env.sh names.
        let candidates = [Some(PathBuf::from(env!("CARGO_MANIFEST_DIR"))), std::env::var_os("PTRAIN_ROOT").map(PathBuf::from)];
        let checkout = candidates.iter().flatten().find(|dir| dir.join("plugin-api/Cargo.toml").is_file()).cloned().ok_or_else(|| Error::Plugin {
            name: "plugin-api".into(),
            message: format!(
                "ptrain-plugin-api's source is not at {}/plugin-api (where this ptrain was built), and PTRAIN_ROOT names no \
                     checkout: source a ptrain checkout's scripts/env.sh, or depend on ptrain-plugin-api by git (docs/plugins.md)",
                env!("CARGO_MANIFEST_DIR")
            ),
        })?;
        // The binary's own target directory (target/release/ptrain), else the checkout's.
        let beside_binary = std::env::current_exe().ok().and_then(|exe| Some(exe.parent()?.parent()?.to_path_buf()));
        let build_dir = [beside_binary, Some(checkout.join("target"))].into_iter().flatten().find(|dir| has_torch_sys(dir));
        let torch_lib = option_env!("PTRAIN_BUILD_LIBTORCH_LIB")
            .map(PathBuf::from)
            .filter(|dir| dir.is_dir())
            .or_else(|| std::env::var_os("PTRAIN_TORCH_LIB").map(PathBuf::from).filter(|dir| dir.is_dir()));
        let canonical = |p: PathBuf| p.canonicalize().unwrap_or(p);
        Ok(Origin { checkout: canonical(checkout), build_dir: build_dir.map(canonical), cache: plugin_cache::dir(), torch_lib })
    }

    /// A ptrain installed without its checkout: no plugin-api source or Cargo.lock to
    /// take (the crate depends on plugin-api by version), a build beside the binary if any.
    fn installed() -> Origin {
        let exe_dir = std::env::current_exe().ok().and_then(|exe| Some(exe.parent()?.to_path_buf())).unwrap_or_default();
        let build_dir = exe_dir.parent().map(Path::to_path_buf).filter(|dir| has_torch_sys(dir));
        let torch_lib = std::env::var_os("PTRAIN_TORCH_LIB").map(PathBuf::from).filter(|dir| dir.is_dir());
        Origin { checkout: exe_dir, build_dir, cache: plugin_cache::dir(), torch_lib }
    }
}

/// `gradwatch` or `grad-watch`: lowercase letters, digits and inner dashes.
pub(super) fn check_name(name: &str) -> Result<(), Error> {
    let ok = name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.ends_with('-')
        && !name.contains("--");
    if ok {
        Ok(())
    } else {
        Err(Error::Plugin {
            name: name.into(),
            message: "invalid name: use lowercase letters, digits and single inner dashes, starting with a letter (`grad-watch`)".into(),
        })
    }
}

/// `grad-watch` -> `GradWatch`.
fn type_name(name: &str) -> String {
    name.split('-').map(|part| part[..1].to_ascii_uppercase() + &part[1..]).collect()
}

fn toml_string(path: &Path) -> String {
    path.display().to_string().replace('\\', "\\\\").replace('"', "\\\"")
}

/// What `ptrain plugins new` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Inline, on the training thread, reading tensors (links libtorch).
    Inline,
    /// A worker thread writing metrics batches (`--sink`).
    Sink,
    /// A GRPO reward function on a worker thread (`--reward`).
    Reward,
}

/// The files of the crate, by path relative to its directory.
fn files(name: &str, kind: Kind, origin: &Origin) -> Vec<(&'static str, String)> {
    // A sink and a reward plugin need no libtorch: they never see tensors.
    let sink = kind != Kind::Inline;
    let lib = name.replace('-', "_");
    let fill = |template: &str| {
        template.replace("{{name}}", name).replace("{{lib}}", &lib).replace("{{Type}}", &type_name(name)).replace(
            "{{sink_flag}}",
            match kind {
                Kind::Inline => "",
                Kind::Sink => " --sink",
                Kind::Reward => " --reward",
            },
        )
    };
    let (api_features, tch) = if sink {
        ("", String::new())
    } else {
        (r#", features = ["tch"]"#, format!("# The tch of ptrain: the plugin shares the host's libtorch.\ntch = \"{TCH_REQUIREMENT}\"\n"))
    };
    let cargo_toml = fill(CARGO_TOML)
        .replace("{{api_path}}", &toml_string(&origin.checkout.join("plugin-api")))
        .replace("{{api_features}}", api_features)
        .replace("{{tch_dependency}}", &tch);
    let build_dir = match &origin.cache {
        Some(cache) => format!(
            "\n# Intermediate artifacts go to ptrain's plugin build cache, outside ptrain's checkout and\n\
             # shared by every plugin `ptrain plugins new` writes here ($PTRAIN_HOME/plugin-build, by\n\
             # default ~/.cache/ptrain/plugin-build); the plugin library itself lands in ./target/release/.\n\
             # torch-sys (libtorch's C++ bindings, minutes to compile) is found there Fresh\n\
             # (`cargo build --release -v` says so): `ptrain plugins new` seeds the cache from ptrain's\n\
             # own build. CAREFUL: `cargo clean` here would empty the cache too; use\n\
             # `cargo clean -p ptrain-plugin-{name}`.\n[build]\nbuild-dir = \"{}\"\n",
            toml_string(cache)
        ),
        None => "\n# No cache directory was found ($PTRAIN_HOME, $XDG_CACHE_HOME and $HOME are unset): the\n\
                 # plugin builds in ./target alone, and its first build compiles libtorch's bindings\n\
                 # (torch-sys), minutes. To share one build between plugins, add\n\
                 #   [build]\n#   build-dir = \"<a directory of yours>\"\n"
            .to_string(),
    };
    let mut config = CARGO_CONFIG.replace("{{build_dir_section}}", &build_dir);
    match (&origin.torch_lib, sink) {
        // A sink does not link libtorch: ptrain's profile is all it needs.
        (_, true) => config = keep_sections(&config, &["[build]", "[profile.release]"]),
        (Some(torch_lib), false) => {
            let venv = torch_lib.ancestors().nth(5).filter(|v| v.join("bin/python").exists()).unwrap_or(torch_lib);
            config = config.replace("{{venv}}", &toml_string(venv)).replace("{{torch_lib}}", &toml_string(torch_lib));
        }
        (None, false) => {
            config = keep_sections(&config, &["[build]", "[profile.release]"])
                + "\n# libtorch was not found: build and test with ptrain's scripts/env.sh sourced.\n"
        }
    }
    let source = match kind {
        Kind::Inline => INLINE,
        Kind::Sink => SINK,
        Kind::Reward => REWARD,
    };
    vec![
        ("Cargo.toml", cargo_toml),
        (".cargo/config.toml", config),
        ("src/lib.rs", fill(source)),
        (
            "README.md",
            fill(README).replace("{{docs}}", &origin.checkout.join("docs/plugins.md").display().to_string()).replace("{{ptrain}}", &ptrain_exe()),
        ),
        (".gitignore", "/target\n".to_string()),
    ]
}

/// `text` without the TOML sections (a header line, its comment block above, its
/// keys below) whose headers are not in `keep`.
fn keep_sections(text: &str, keep: &[&str]) -> String {
    let mut out: Vec<&str> = Vec::new();
    let mut pending_comments: Vec<&str> = Vec::new();
    let mut keeping = true;
    for line in text.lines() {
        if line.starts_with('[') {
            keeping = keep.iter().any(|k| line.starts_with(k));
            if keeping {
                out.append(&mut pending_comments);
            }
            pending_comments.clear();
            if keeping {
                out.push(line);
            }
        } else if line.starts_with('#') || line.is_empty() {
            pending_comments.push(line);
        } else if keeping {
            out.append(&mut pending_comments);
            out.push(line);
        } else {
            pending_comments.clear();
        }
    }
    out.append(&mut pending_comments);
    out.join("\n") + "\n"
}

/// This ptrain binary, as the crate's README and the "next:" lines call it.
fn ptrain_exe() -> String {
    std::env::current_exe().map(|exe| exe.display().to_string()).unwrap_or_else(|_| "ptrain".into())
}

/// Seeds the plugin build cache for an inline plugin, or says why there is nothing to do.
fn prepare_cache(origin: &Origin, sink: bool) {
    let Some(cache) = &origin.cache else {
        return outln!("  builds in ./target alone: the first build compiles libtorch's bindings (minutes)");
    };
    let lock = origin.checkout.join("Cargo.lock");
    match &origin.build_dir {
        _ if sink => outln!("  builds in the plugin build cache {} (a sink needs no libtorch)", cache.display()),
        _ if has_torch_sys(cache) => outln!("  builds in the plugin build cache {}, which has torch-sys", cache.display()),
        Some(build) => match plugin_cache::seed(build, cache, &lock) {
            Ok(bytes) => outln!(
                "  builds in the plugin build cache {}, seeded from ptrain's build in {} ({} MB): torch-sys is not compiled again",
                cache.display(),
                build.display(),
                bytes >> 20
            ),
            // The crate is written: a cache that could not be seeded only makes the first build slower.
            Err(e) => eprintln!("warning: could not seed the plugin build cache {}: {e:#}; the first build compiles torch-sys (minutes)", cache.display()),
        },
        None => outln!(
            "  builds in the plugin build cache {}; no ptrain build was found to seed it from: the first build compiles libtorch's bindings (minutes)",
            cache.display()
        ),
    }
}

pub fn run(name: &str, kind: Kind, dir: Option<PathBuf>, api_version: Option<String>) -> anyhow::Result<()> {
    check_name(name)?;
    if let Some(version) = &api_version {
        super::scaffold_version::check(version)?;
    }
    let dir = dir.unwrap_or_else(|| PathBuf::from(name));
    if dir.exists() && std::fs::read_dir(&dir).map(|mut d| d.next().is_some()).unwrap_or(true) {
        return Err(Error::Plugin { name: name.into(), message: format!("{} exists and is not empty", dir.display()) }.into());
    }
    // An installed ptrain without its checkout still writes a crate by --api-version.
    let origin = match (Origin::find(), &api_version) {
        (Ok(origin), _) => origin,
        (Err(_), Some(_)) => Origin::installed(),
        (Err(e), None) => return Err(e),
    };
    for (path, mut text) in files(name, kind, &origin) {
        if let (Some(version), "Cargo.toml") = (&api_version, path) {
            text = super::scaffold_version::by_version(&text, version);
        }
        let path = dir.join(path);
        std::fs::create_dir_all(path.parent().expect("a file in the crate")).with_context(|| format!("creating {}", dir.display()))?;
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    // The checkout's lock: the same versions as ptrain's build, so they are found built.
    let lock = origin.checkout.join("Cargo.lock");
    if lock.is_file() {
        std::fs::copy(&lock, dir.join("Cargo.lock")).with_context(|| format!("copying {}", lock.display()))?;
    }
    let what = match kind {
        Kind::Inline => "inline: reads gradients every 20 steps",
        Kind::Sink => "a sink (worker thread): metrics batches to CSV",
        Kind::Reward => "a GRPO reward (worker thread): -abs(20 - characters) per completion",
    };
    outln!("created plugin `{name}` in {}, {what}", dir.display());
    match &api_version {
        Some(version) => outln!("  plugin-api: ptrain-plugin-api {version}, from your registry"),
        None => outln!("  plugin-api: {}", origin.checkout.join("plugin-api").display()),
    }
    prepare_cache(&origin, kind != Kind::Inline);
    outln!("next:\n  cd {} && cargo build --release && cargo test --release", dir.display());
    match kind {
        Kind::Reward => outln!(
            "  PTRAIN_PLUGIN_PATH=$PWD/target/release {} run --config grpo.toml, whose [[grpo.rewards]] has kind = \"plugin\", plugin = \"{name}\" (src/lib.rs shows it)",
            ptrain_exe()
        ),
        _ => outln!("  PTRAIN_PLUGIN_PATH=$PWD/target/release {} run --plugins {name}", ptrain_exe()),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_and_typed() {
        assert!(check_name("grad-watch").is_ok() && check_name("csv2").is_ok());
        for bad in ["Grad", "2x", "grad_watch", "grad-", "a--b", ""] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
        assert_eq!(type_name("grad-watch"), "GradWatch");
        assert_eq!(type_name("csv"), "Csv");
    }

    #[test]
    fn the_tch_requirement_is_the_workspaces() {
        let manifest: toml::Table = include_str!("../../Cargo.toml").parse().unwrap();
        assert_eq!(manifest["workspace"]["dependencies"]["tch"].as_str(), Some(TCH_REQUIREMENT));
    }

    #[test]
    fn every_placeholder_is_filled() {
        let origin = Origin {
            checkout: "/p".into(),
            build_dir: Some("/p/target".into()),
            cache: Some("/home/a/.cache/ptrain/plugin-build".into()),
            torch_lib: Some("/v/lib/python3.11/site-packages/torch/lib".into()),
        };
        for kind in [Kind::Inline, Kind::Sink, Kind::Reward] {
            for (path, text) in files("grad-watch", kind, &origin) {
                assert!(!text.contains("{{"), "{path} ({kind:?}):\n{text}");
            }
        }
        let reward = files("len", Kind::Reward, &origin);
        let lib = &reward.iter().find(|(p, _)| *p == "src/lib.rs").unwrap().1;
        assert!(lib.contains(".reward()") && lib.contains("fn score("), "{lib}");
        let sink = files("csv", Kind::Sink, &origin);
        let config = &sink.iter().find(|(p, _)| *p == ".cargo/config.toml").unwrap().1;
        assert!(config.contains("build-dir = \"/home/a/.cache/ptrain/plugin-build\"") && config.contains("[profile.release]"), "{config}");
        assert!(!config.contains("/p/target"), "nothing builds in ptrain's checkout:\n{config}");
        assert!(!config.contains("[env]") && !config.contains("runner"), "a sink needs no libtorch:\n{config}");
        let inline = files("grad", Kind::Inline, &Origin { cache: None, ..origin });
        let config = &inline.iter().find(|(p, _)| *p == ".cargo/config.toml").unwrap().1;
        assert!(config.contains("LD_LIBRARY_PATH=/v/lib/python3.11/site-packages/torch/lib") && !config.contains("\nbuild-dir"), "{config}");
    }
}
