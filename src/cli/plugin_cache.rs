//! The plugin build cache: one cargo build directory (`[build] build-dir`) that every
//! plugin crate `ptrain plugins new` writes shares, outside ptrain's checkout:
//! `$PTRAIN_HOME/plugin-build`, by default `~/.cache/ptrain/plugin-build`. A plugin's own
//! library still lands in its `./target/release`.
//!
//! What keeps a first tensor-reading plugin build cheap is torch-sys (libtorch's C++
//! bindings, minutes of C++ compiling) found already built. So the cache is seeded once,
//! when an inline plugin is scaffolded and the cache has no torch-sys yet, with a copy
//! of the units ptrain's own build compiled for what plugin-api depends on (torch-sys,
//! tch, serde, abi_stable and their dependencies, per ptrain's Cargo.lock), file times
//! kept so cargo finds them Fresh. Nothing is written into ptrain's build directory,
//! then or later: it is only read, once.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

use anyhow::Context;

/// The cache directory: `$PTRAIN_HOME/plugin-build`, else
/// `$XDG_CACHE_HOME/ptrain/plugin-build`, else `$HOME/.cache/ptrain/plugin-build`.
pub fn dir() -> Option<PathBuf> {
    let absolute = |var: &str| std::env::var_os(var).map(PathBuf::from).filter(|p| p.is_absolute());
    if let Some(home) = absolute("PTRAIN_HOME") {
        return Some(home.join("plugin-build"));
    }
    let cache = absolute("XDG_CACHE_HOME").or_else(|| absolute("HOME").map(|home| home.join(".cache")))?;
    Some(cache.join("ptrain/plugin-build"))
}

/// Whether the cargo build directory `build` holds a compiled torch-sys.
pub fn has_torch_sys(build: &Path) -> bool {
    std::fs::read_dir(build.join("release/build"))
        .map(|entries| entries.filter_map(|e| e.ok()).any(|e| e.file_name().to_string_lossy().starts_with("torch-sys-")))
        .unwrap_or(false)
}

/// The registry packages `root` depends on, directly or not (build and proc-macro
/// dependencies included), by name, as `Cargo.lock` lists them.
fn dependencies_of(lock: &str, root: &str) -> anyhow::Result<BTreeSet<String>> {
    let lock: toml::Table = lock.parse().context("parsing Cargo.lock")?;
    let packages = lock.get("package").and_then(|p| p.as_array()).map(Vec::as_slice).unwrap_or_default();
    let field = |p: &toml::Value, key: &str| p.get(key).and_then(|v| v.as_str()).map(str::to_string);
    let mut seen = BTreeSet::new();
    let mut todo = vec![root.to_string()];
    while let Some(name) = todo.pop() {
        if !seen.insert(name.clone()) {
            continue;
        }
        // Every version of the name: a superset, which only costs a little copying.
        for package in packages.iter().filter(|p| field(p, "name").as_deref() == Some(name.as_str())) {
            let deps = package.get("dependencies").and_then(|d| d.as_array()).map(Vec::as_slice).unwrap_or_default();
            // "name", "name version" or "name version (source)".
            todo.extend(deps.iter().filter_map(|d| d.as_str()?.split(' ').next().map(str::to_string)));
        }
    }
    // Path packages (ptrain's own) are compiled for the plugin's graph anyway.
    let registry: BTreeSet<String> = packages.iter().filter(|p| p.get("source").is_some()).filter_map(|p| field(p, "name")).collect();
    Ok(seen.intersection(&registry).cloned().collect())
}

/// `name-0123456789abcdef` -> (`name`, `0123456789abcdef`).
fn unit(file_name: &str) -> Option<(&str, &str)> {
    let stem = file_name.split('.').next()?;
    let (name, hash) = stem.rsplit_once('-')?;
    (hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit())).then_some((name, hash))
}

/// Copies `from` to `to` (a file, a symlink or a directory tree), keeping each file's
/// modification time: cargo decides what is Fresh by comparing them. Written under a
/// temporary name and renamed into place, so an interrupted copy leaves no half unit.
fn copy_entry(from: &Path, to: &Path) -> anyhow::Result<u64> {
    let partial = PathBuf::from(format!("{}.seeding-{}", to.display(), std::process::id()));
    let bytes = copy_tree(from, &partial).with_context(|| format!("copying {} to {}", from.display(), partial.display()))?;
    std::fs::rename(&partial, to).with_context(|| format!("renaming {} to {}", partial.display(), to.display()))?;
    Ok(bytes)
}

fn copy_tree(from: &Path, to: &Path) -> std::io::Result<u64> {
    let meta = std::fs::symlink_metadata(from)?;
    if meta.file_type().is_symlink() {
        std::os::unix::fs::symlink(std::fs::read_link(from)?, to)?;
        return Ok(0);
    }
    if meta.is_dir() {
        std::fs::create_dir_all(to)?;
        let mut bytes = 0;
        for entry in std::fs::read_dir(from)? {
            let entry = entry?;
            bytes += copy_tree(&entry.path(), &to.join(entry.file_name()))?;
        }
        return Ok(bytes);
    }
    let bytes = std::fs::copy(from, to)?;
    std::fs::File::options().write(true).open(to)?.set_modified(meta.modified()?)?;
    Ok(bytes)
}

/// Copies the units of ptrain's build directory `from` that a plugin reuses (see the
/// module's comment) into the cache `to`, skipping any the cache has. `lock` is the
/// Cargo.lock ptrain was built with. Returns the bytes copied.
pub fn seed(from: &Path, to: &Path, lock: &Path) -> anyhow::Result<u64> {
    let text = std::fs::read_to_string(lock).with_context(|| format!("reading {}", lock.display()))?;
    let packages = dependencies_of(&text, "ptrain-plugin-api")?;
    let names = |dir: &Path| -> anyhow::Result<Vec<String>> {
        let entries = std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
        Ok(entries.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
    };
    let (src, dst) = (from.join("release"), to.join("release"));
    let fingerprints: Vec<String> =
        names(&src.join(".fingerprint"))?.into_iter().filter(|f| unit(f).is_some_and(|(name, _)| packages.contains(name))).collect();
    let hashes: BTreeSet<&str> = fingerprints.iter().filter_map(|f| unit(f)).map(|(_, hash)| hash).collect();
    let mut entries: Vec<PathBuf> = names(&src.join("deps"))?
        .into_iter()
        .filter(|f| unit(f).is_some_and(|(_, hash)| hashes.contains(hash)))
        .map(|f| PathBuf::from("deps").join(f))
        .collect();
    entries.extend(names(&src.join("build"))?.into_iter().filter(|f| fingerprints.contains(f)).map(|f| PathBuf::from("build").join(f)));
    // Fingerprints last: a unit is found Fresh only once its outputs are all in place.
    entries.extend(fingerprints.iter().map(|f| PathBuf::from(".fingerprint").join(f)));
    let mut bytes = 0;
    for entry in entries {
        let target = dst.join(&entry);
        if std::fs::symlink_metadata(&target).is_ok() {
            continue;
        }
        std::fs::create_dir_all(target.parent().expect("inside the cache")).with_context(|| format!("creating {}", dst.display()))?;
        bytes += copy_entry(&src.join(&entry), &target)?;
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOCK: &str = r#"
[[package]]
name = "ptrain-plugin-api"
version = "0.1.0"
dependencies = ["serde", "tch"]

[[package]]
name = "tch"
version = "0.24.0"
source = "registry+https://github.com/rust-lang/crates.io-index"
dependencies = ["rand 0.8.8", "torch-sys"]

[[package]]
name = "torch-sys"
version = "0.24.0"
source = "registry+https://github.com/rust-lang/crates.io-index"
dependencies = ["cc"]

[[package]]
name = "serde"
version = "1.0.0"
source = "registry+https://github.com/rust-lang/crates.io-index"

[[package]]
name = "cc"
version = "1.2.0"
source = "registry+https://github.com/rust-lang/crates.io-index"

[[package]]
name = "rand"
version = "0.8.8"
source = "registry+https://github.com/rust-lang/crates.io-index"

[[package]]
name = "clap"
version = "4.0.0"
source = "registry+https://github.com/rust-lang/crates.io-index"
"#;

    #[test]
    fn the_seed_is_what_plugin_api_depends_on_from_registries() {
        let packages = dependencies_of(LOCK, "ptrain-plugin-api").unwrap();
        assert_eq!(packages.into_iter().collect::<Vec<_>>(), ["cc", "rand", "serde", "tch", "torch-sys"]);
    }

    #[test]
    fn units_are_named_by_package_and_hash() {
        assert_eq!(unit("torch-sys-6da3ff6dc4890114"), Some(("torch-sys", "6da3ff6dc4890114")));
        assert_eq!(unit("libtorch_sys-6da3ff6dc4890114.rlib"), Some(("libtorch_sys", "6da3ff6dc4890114")));
        assert_eq!(unit("ptrain"), None);
        assert_eq!(unit("build-script-build"), None);
    }

    #[test]
    fn only_the_units_of_those_packages_are_copied_with_their_times() {
        let dir = tempfile::tempdir().unwrap();
        let (from, to, lock) = (dir.path().join("from"), dir.path().join("to"), dir.path().join("Cargo.lock"));
        std::fs::write(&lock, LOCK).unwrap();
        let hash = "0123456789abcdef";
        let other = "fedcba9876543210";
        for (path, text) in [
            (format!(".fingerprint/torch-sys-{hash}/lib-torch_sys"), "f"),
            (format!("build/torch-sys-{hash}/out/libtorch_sys.a"), "archive"),
            (format!("deps/libtorch_sys-{hash}.rlib"), "rlib"),
            (format!("deps/torch_sys-{hash}.d"), "d"),
            (format!(".fingerprint/clap-{other}/lib-clap"), "f"),
            (format!("deps/libclap-{other}.rlib"), "rlib"),
        ] {
            let path = from.join("release").join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, text).unwrap();
        }
        let old = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
        let rlib = format!("release/deps/libtorch_sys-{hash}.rlib");
        std::fs::File::options().write(true).open(from.join(&rlib)).unwrap().set_modified(old).unwrap();
        let bytes = seed(&from, &to, &lock).unwrap();
        assert_eq!(bytes, (1 + 7 + 4 + 1) as u64);
        assert!(has_torch_sys(&to));
        assert_eq!(std::fs::read_to_string(to.join(format!("release/build/torch-sys-{hash}/out/libtorch_sys.a"))).unwrap(), "archive");
        assert_eq!(std::fs::metadata(to.join(&rlib)).unwrap().modified().unwrap(), old, "file times are kept");
        assert!(!to.join(format!("release/deps/libclap-{other}.rlib")).exists() && !to.join(format!("release/.fingerprint/clap-{other}")).exists());
        assert_eq!(seed(&from, &to, &lock).unwrap(), 0, "units already in the cache are left alone");
    }
}
