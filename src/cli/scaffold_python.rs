//! `ptrain plugins new NAME --python`: a Python module for the `python` plugin and
//! its tests (the module's functions under a recording stand-in for `ptrain`, then a
//! real run of this ptrain). Nothing to build.

use std::path::PathBuf;

use anyhow::Context;
use ptrain_core::Error;

const MODULE: &str = include_str!("templates/python_module.py.in");
const TEST: &str = include_str!("templates/python_test.py.in");
const README: &str = include_str!("templates/python_README.md.in");

/// The files, by path relative to the directory `dir`, for plugin `name`.
fn files(name: &str, dir: &std::path::Path, ptrain: &str, python: &str, docs: &str) -> Vec<(String, String)> {
    let module = name.replace('-', "_");
    let fill = |template: &str| {
        template
            .replace("{{name}}", name)
            .replace("{{module}}", &module)
            .replace("{{dir}}", &dir.display().to_string())
            .replace("{{ptrain}}", ptrain)
            .replace("{{python}}", python)
            .replace("{{docs}}", docs)
    };
    vec![
        (format!("{module}.py"), fill(MODULE)),
        (format!("test_{module}.py"), fill(TEST)),
        ("README.md".to_string(), fill(README)),
        (".gitignore".to_string(), "__pycache__/\n".to_string()),
    ]
}

pub fn run(name: &str, dir: Option<PathBuf>) -> anyhow::Result<()> {
    super::scaffold::check_name(name)?;
    let dir = dir.unwrap_or_else(|| PathBuf::from(name));
    if dir.exists() && std::fs::read_dir(&dir).map(|mut d| d.next().is_some()).unwrap_or(true) {
        return Err(Error::Plugin { name: name.into(), message: format!("{} exists and is not empty", dir.display()) }.into());
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let dir = dir.canonicalize().unwrap_or(dir);
    let ptrain = std::env::current_exe().map(|exe| exe.display().to_string()).unwrap_or_else(|_| "ptrain".into());
    let python = std::env::var("PTRAIN_PYTHON").unwrap_or_else(|_| "python3".into());
    let docs = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/python-plugins.md");
    for (path, text) in files(name, &dir, &ptrain, &python, &docs.display().to_string()) {
        let path = dir.join(path);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    let module = name.replace('-', "_");
    outln!("created Python plugin `{name}` in {}: {module}.py (reads gradients every 20 steps) and its tests", dir.display());
    outln!("next:\n  cd {} && {python} -m unittest -v", dir.display());
    outln!("  {ptrain} run --plugins python --set plugins.python.module={module} --set plugins.python.path={}", dir.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_placeholder_is_filled() {
        for (path, text) in super::files("grad-watch", "/w/grad-watch".as_ref(), "/p/ptrain", "/v/bin/python", "/p/docs") {
            assert!(!text.contains("{{"), "{path}:\n{text}");
        }
    }
}
