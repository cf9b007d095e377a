//! Finding plugin libraries and loading them with every check abi_stable offers,
//! turning each failure into one message that names the file.

use std::path::{Path, PathBuf};

use abi_stable::{
    library::{abi_header_from_raw_library, LibraryError, RawLibrary},
    sabi_types::{VersionNumber, VersionStrings},
};
use ptrain_plugin_api::{Descriptor, PluginModRef, API_VERSION, ROOT_MODULE_NAME};

use crate::error::Error;

/// A loaded plugin library. Libraries are never unloaded.
#[derive(Clone, Copy)]
pub struct PluginLibrary {
    pub module: PluginModRef,
    pub descriptor: Descriptor,
}

pub const FILE_PREFIX: &str = "libptrain_plugin_";

/// `$PTRAIN_PLUGIN_PATH` (colon-separated), then the executable's directory and its
/// `plugins/` subdirectory.
pub fn search_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> =
        std::env::var_os("PTRAIN_PLUGIN_PATH").map(|p| std::env::split_paths(&p).filter(|d| !d.as_os_str().is_empty()).collect()).unwrap_or_default();
    if let Some(exe_dir) = std::env::current_exe().ok().and_then(|e| e.parent().map(Path::to_path_buf)) {
        dirs.push(exe_dir.join("plugins"));
        dirs.insert(dirs.len() - 1, exe_dir);
    }
    dirs
}

pub fn file_name(name: &str) -> String {
    format!("{FILE_PREFIX}{}.so", name.replace('-', "_"))
}

/// Plugins visible in the search path: (name, path), first occurrence wins.
pub fn available() -> Vec<(String, PathBuf)> {
    let mut found: Vec<(String, PathBuf)> = Vec::new();
    for dir in search_dirs() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        let mut here: Vec<(String, PathBuf)> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let file = e.file_name().into_string().ok()?;
                let stem = file.strip_prefix(FILE_PREFIX)?.strip_suffix(".so")?;
                Some((stem.replace('_', "-"), e.path()))
            })
            .collect();
        here.sort();
        for (name, path) in here {
            if !found.iter().any(|(n, _)| *n == name) {
                found.push((name, path));
            }
        }
    }
    found
}

/// Resolves a name (`wandb`) or a path (`./libfoo.so`) to a library file.
pub fn resolve(request: &str) -> Result<PathBuf, Error> {
    if request.contains('/') || request.ends_with(".so") {
        let path = PathBuf::from(request);
        return if path.is_file() { Ok(path) } else { Err(Error::MissingFile { what: "plugin library", path }) };
    }
    let file = file_name(request);
    for dir in search_dirs() {
        let candidate = dir.join(&file);
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    let names: Vec<String> = available().into_iter().map(|(n, _)| n).collect();
    Err(Error::Plugin {
        name: request.into(),
        message: format!(
            "unknown plugin (no {file} in {}); available: {}",
            search_dirs().iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", "),
            if names.is_empty() { "none".to_string() } else { names.join(", ") }
        ),
    })
}

/// Whether two requests (names or paths) are the same library file: a plugin named in
/// one place and given by its path in another is one plugin.
pub fn same_library(a: &str, b: &str) -> bool {
    let file = |request: &str| resolve(request).ok().and_then(|path| path.canonicalize().ok());
    matches!((file(a), file(b)), (Some(x), Some(y)) if x == y)
}

/// The versions whose plugins a host of version `ours` loads (as abi_stable reads them).
fn compatible_range(ours: VersionNumber) -> String {
    if ours.major == 0 {
        format!("0.{}.x", ours.minor)
    } else {
        format!("{}.x", ours.major)
    }
}

/// The first difference abi_stable found, in the innermost type that holds it, with
/// the fields that lead there from the root module. The report compares the types
/// level by level, each level opening with `N error(s)` and the fields walked so far,
/// then the layouts compared (`Layout of expected type:`); the differences
/// (`Error:`) follow the level that holds them, the last one before them.
fn layout_difference(report: &str) -> String {
    tracing::debug!("abi_stable's layout report:\n{report}");
    let lines: Vec<&str> = report.lines().map(str::trim).collect();
    let Some(at) = lines.iter().position(|l| l.starts_with("Error:")) else {
        return "PTRAIN_LOG=debug shows abi_stable's report".into();
    };
    let what = lines[at].trim_start_matches("Error:").trim();
    let values = lines[at + 1..].iter().take_while(|l| !l.is_empty() && !l.starts_with("Error:")).copied().collect::<Vec<_>>().join(" ");
    let values = values.replace("Expected:", "expected").replace(" Found:", ", found");
    let level = lines[..at].iter().rposition(|l| l.contains(" error(s)")).map_or(&lines[..0], |start| &lines[start..at]);
    let layout = level.iter().position(|l| *l == "Layout of expected type:").unwrap_or(level.len());
    let in_type = level[layout..].iter().find_map(|l| l.strip_prefix("type:")).map(type_name);
    // The fields walked, less abi_stable's own plumbing (a trait object's vtable, a
    // reference's pointee, a function's parameters and result).
    let plumbing = |f: &str| f.parse::<u32>().is_ok() || f.starts_with("param_") || f.starts_with('_') || ["field_0", "obj", "vtable"].contains(&f);
    let path: Vec<&str> = level[..layout].iter().filter_map(|l| l.strip_prefix("field_name:")).filter(|f| !plumbing(f)).collect();
    let mut difference = match (in_type, path.is_empty()) {
        (Some(ty), true) => format!("{what} in `{ty}`: {values}"),
        (Some(ty), false) => format!("{what} in `{ty}`, reached through {}: {values}", path.join(" -> ")),
        (None, _) => format!("{what}: {values}"),
    };
    if difference.len() > 300 {
        let cut = (0..=300).rev().find(|&i| difference.is_char_boundary(i)).unwrap_or(0);
        difference.truncate(cut);
        difference.push_str("...");
    }
    difference
}

/// `RunEnd` for abi_stable's `RunEnd<'a>`, `&'a  RunEnd<'a> ` or `PrefixRef<'a, PluginMod>`.
fn type_name(layout_type: &str) -> String {
    let t = layout_type.trim().trim_start_matches('&').trim_start_matches("'a").trim();
    let t = t.strip_prefix("PrefixRef<'a, ").map_or(t, |inner| inner.trim_end_matches('>'));
    t.split('<').next().unwrap_or(t).trim().to_string()
}

fn first_line(text: impl ToString) -> String {
    text.to_string().trim().lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(" ")
}

/// Loads and checks the library at `path`: a loadable shared object, an abi_stable
/// library, a ptrain plugin, built against a compatible plugin-api with the same
/// type layouts.
pub fn load(path: &Path) -> Result<PluginLibrary, Error> {
    let refuse = |message: String| Error::Plugin { name: path.display().to_string(), message };
    let raw = RawLibrary::load_at(path).map_err(|e| match e {
        LibraryError::OpenError { err, .. } => refuse(format!("not a loadable shared library: {}", first_line(err))),
        other => refuse(first_line(other)),
    })?;
    // Leaked: plugins are never unloaded, so their code and statics stay valid.
    let raw: &'static RawLibrary = Box::leak(Box::new(raw));
    // SAFETY: reads the abi_stable header symbol; its layout is checked below.
    let header =
        unsafe { abi_header_from_raw_library(raw) }.map_err(|_| refuse("not a ptrain plugin: it exports no abi_stable root module".into()))?;
    let header = header.upgrade().map_err(|_| refuse("not a ptrain plugin: built with an incompatible abi_stable version".into()))?;
    let root_name = header.root_mod_consts().name().as_str();
    if root_name != ROOT_MODULE_NAME {
        return Err(refuse(format!("not a ptrain plugin: it is an abi_stable library of `{root_name}`")));
    }
    // The version first, so that a plugin of another version is refused for that,
    // whether or not its types changed (abi_stable lets a newer 0.x minor version
    // through to the layout check, which would then blame the types). The rule: the
    // same 0.minor, any patch (plugin-api's Cargo.toml says when each is bumped).
    let built = header.version_strings();
    let ours = VersionNumber::new(VersionStrings::new(API_VERSION)).expect("plugin-api's own version parses");
    let theirs = VersionNumber::new(built).map_err(|e| refuse(format!("not a ptrain plugin: unreadable plugin-api version: {e}")))?;
    if !ours.is_loosely_compatible(theirs) {
        return Err(refuse(format!(
            "built against ptrain-plugin-api {theirs}, but this ptrain uses ptrain-plugin-api {API_VERSION} and loads only plugins built \
             against {}: the versions are incompatible (each minor release changes types the host and plugins share); rebuild the \
             plugin against ptrain-plugin-api {API_VERSION}",
            compatible_range(ours)
        )));
    }
    let module = header.init_root_module::<PluginModRef>().map_err(|e| match e {
        LibraryError::AbiInstability(details) => refuse(format!(
            "built against ptrain-plugin-api {theirs}, {}, but the layout of its types differs from this ptrain's ({}): it was \
             built from a modified plugin-api; rebuild the plugin against this ptrain's ptrain-plugin-api {API_VERSION}",
            if theirs == ours { "the version this ptrain uses".to_string() } else { format!("compatible with this ptrain's {API_VERSION}") },
            layout_difference(&details.to_string())
        )),
        LibraryError::IncompatibleVersionNumber { expected_version, actual_version, .. } => refuse(format!(
            "built against ptrain-plugin-api {actual_version}, but this ptrain uses ptrain-plugin-api {expected_version}; rebuild the plugin"
        )),
        other => refuse(first_line(other)),
    })?;
    let descriptor = module.descriptor()().into_result().map_err(|e| refuse(format!("failed to describe itself: {e}")))?;
    Ok(PluginLibrary { module, descriptor })
}

/// Checks, before anything costly (tokenizing, loading weights), that every
/// requested plugin loads and that every `[plugins.<name>]` table names a loaded
/// or installed plugin (`ptrain config` checks the same).
pub fn check_tables(requests: &[String], tables: &std::collections::BTreeMap<String, toml::Table>) -> Result<(), Error> {
    let libraries = requests
        .iter()
        .map(|request| {
            let path = resolve(request)?;
            Ok((request, load(&path)?, path))
        })
        .collect::<Result<Vec<_>, Error>>()?;
    claim_tables(&libraries, tables)
}

/// Every `[plugins.<name>]` table claimed by a loaded library (by its name or the
/// name or path it was requested as) or naming an installed plugin.
pub(super) fn claim_tables(
    libraries: &[(&String, PluginLibrary, std::path::PathBuf)],
    tables: &std::collections::BTreeMap<String, toml::Table>,
) -> Result<(), Error> {
    let claimed: Vec<&str> = libraries.iter().flat_map(|(request, lib, _)| [lib.descriptor.name.as_str(), request.as_str()]).collect();
    let installed: Vec<String> = available().into_iter().map(|(name, _)| name).collect();
    crate::config::check_tables_claimed(tables, &claimed, &installed)
}

#[cfg(test)]
mod tests {
    use super::layout_difference;

    /// abi_stable's report of a plugin whose `RunEnd` has one more field, cut to its
    /// structure: two levels without differences, then the one that holds them.
    const REPORT: &str = "Compared <this>:
    --- Type Layout ---
    type:PrefixRef<'a, PluginMod>
0 error(s).
0 error(s)inside:
    <other>
    field_name:0
    type:PluginMod
Layout of expected type:
    --- Type Layout ---
    type:PluginMod
5 error(s)inside:
    <other>
    field_name:0
    type:PluginMod
    field_name:create
    type:AFunctionPointer
    field_name:__returns
    field_name:field_0
    field_name:obj
    field_name:vtable
    field_name:0
    type:VTable
    field_name:on_run_end
    field_name:param_1
    type:&'a  RunEnd<'a>
    field_name:0
    type:RunEnd<'a>
Layout of expected type:
    --- Type Layout ---
    type:RunEnd<'a>
    size:40 align:8
Layout of found type:
    --- Type Layout ---
    type:RunEnd<'a>
    size:48 align:8

Error:incompatible type size
Expected:
    40
Found:
    48

Error:too many fields
";

    #[test]
    fn a_layout_difference_names_the_innermost_type_and_the_way_there() {
        assert_eq!(layout_difference(REPORT), "incompatible type size in `RunEnd`, reached through create -> on_run_end: expected 40, found 48");
        assert_eq!(layout_difference("no errors here"), "PTRAIN_LOG=debug shows abi_stable's report");
    }
}
