//! What the tests' Python helpers make (tiny random models that transformers builds and
//! saves, tokenizers trained by `tokenizers`, texts, token files, chat rows, preference
//! pairs), made once and shared by every test process of the suite, instead of once per
//! test.
//!
//! A fixture is the directory `target/tmp/fixtures/<script>-<command>-<key>`, where the
//! key is a SHA-256 of what decides its contents: the helper command and its arguments
//! (an argument naming an existing file or directory by its contents, not its path), the
//! text of the helper script and of the tests/support modules it imports, and the venv's
//! Python and installed packages. A changed helper, argument or package is another key,
//! so nothing is ever stale; `cargo clean` removes them all. The first test that needs a
//! fixture makes it under an exclusive file lock (tests that need it meanwhile wait),
//! into a temporary directory renamed into place when the helper succeeded: a half-made
//! fixture is never seen, and a failed one is made again by the next test.
//!
//! A fixture is read only. A test that writes into it, renames it or needs paths of its
//! own takes a copy ([`copy`]); [`shared`] checks on each call that no file of the
//! fixture changed since it was made, so a test that wrote into one fails the next test
//! that reads it, naming the fixture.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::SystemTime,
};

use sha2::{Digest, Sha256};

use super::{py, python, repo};

/// The placeholder argument (or argument prefix, `{out}/file`) for the fixture's directory.
pub const OUT: &str = "{out}";

/// `tests/support/SCRIPT ARGS...` made once for its key (see the module's text), `{out}`
/// in ARGS standing for the fixture's directory; returns that directory, which must not
/// be written to (take a [`copy`] for that).
pub fn shared(script: &str, args: &[&str]) -> PathBuf {
    let dir = made(script, args);
    check_unchanged(&dir);
    dir
}

/// A copy of the fixture `shared(script, args)` at `to` (created with its parents):
/// the test's own, to write into, rename or move.
pub fn copy(script: &str, args: &[&str], to: &Path) -> PathBuf {
    let dir = shared(script, args);
    copy_tree(&dir, to);
    to.to_path_buf()
}

/// The one file that `shared(script, args)` holds (its arguments name it `{out}/NAME`),
/// copied to `to`.
pub fn file(script: &str, args: &[&str], to: &Path) -> PathBuf {
    let dir = shared(script, args);
    let made = files(&dir);
    assert_eq!(made.len(), 1, "{script} {args:?} made one file: {made:?}");
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    let from = made.values().next().unwrap();
    std::fs::copy(from, to).unwrap_or_else(|e| panic!("copying {} to {}: {e}", from.display(), to.display()));
    to.to_path_buf()
}

fn root() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fixtures");
    std::fs::create_dir_all(&root).unwrap_or_else(|e| panic!("{}: {e}", root.display()));
    root
}

/// The fixture's directory, made now if it is not there yet.
fn made(script: &str, args: &[&str]) -> PathBuf {
    let command = args.first().copied().unwrap_or("run");
    let stem = script.trim_end_matches(".py");
    let dir = root().join(format!("{stem}-{command}-{}", key(script, args)));
    if dir.is_dir() {
        return dir;
    }
    let locks = root().join(".locks");
    std::fs::create_dir_all(&locks).unwrap();
    let lock_path = locks.join(dir.file_name().unwrap());
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .unwrap_or_else(|e| panic!("{}: {e}", lock_path.display()));
    // Held until this function returns (or the process dies, which releases it).
    py::lock_exclusive(&lock).unwrap_or_else(|e| panic!("locking {}: {e}", lock_path.display()));
    if dir.is_dir() {
        return dir;
    }
    let partial = dir.with_extension(format!("partial-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&partial);
    std::fs::create_dir_all(&partial).unwrap();
    let out = partial.display().to_string();
    let argv: Vec<String> = std::iter::once(format!("tests/support/{script}")).chain(args.iter().map(|a| a.replace(OUT, &out))).collect();
    let output = py::output(&argv);
    if !output.status.success() {
        let _ = std::fs::remove_dir_all(&partial);
        panic!("making the fixture {script} {args:?} failed ({}):\n{}", output.status, String::from_utf8_lossy(&output.stderr));
    }
    std::fs::write(partial.join(MANIFEST), manifest_text(&files(&partial))).unwrap();
    std::fs::rename(&partial, &dir).unwrap_or_else(|e| panic!("renaming {} to {}: {e}", partial.display(), dir.display()));
    dir
}

/// The key of `script ARGS`: see the module's text.
fn key(script: &str, args: &[&str]) -> String {
    let mut h = Sha256::new();
    let mut field = |bytes: &[u8]| {
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    field(script.as_bytes());
    for module in modules(script) {
        field(module.as_bytes());
        field(&std::fs::read(repo().join("tests/support").join(&module)).unwrap_or_else(|e| panic!("tests/support/{module}: {e}")));
    }
    for arg in args {
        let path = Path::new(arg);
        if !arg.contains(OUT) && path.is_absolute() && path.exists() {
            field(b"contents of");
            for (name, file) in files(path) {
                field(name.as_bytes());
                field(&std::fs::read(&file).unwrap());
            }
        } else {
            field(arg.as_bytes());
        }
    }
    let python = PathBuf::from(python().get_program());
    field(python.as_os_str().as_encoded_bytes());
    field(py::installed_packages(&python).as_bytes());
    h.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// `script` and the tests/support modules it imports, directly or not.
fn modules(script: &str) -> Vec<String> {
    let mut seen = vec![script.to_string()];
    let mut i = 0;
    while i < seen.len() {
        let text = std::fs::read_to_string(repo().join("tests/support").join(&seen[i])).unwrap_or_default();
        for line in text.lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            let name = match words.as_slice() {
                ["import", name, ..] | ["from", name, "import", ..] => name.trim_end_matches(','),
                _ => continue,
            };
            let file = format!("{name}.py");
            if repo().join("tests/support").join(&file).is_file() && !seen.contains(&file) {
                seen.push(file);
            }
        }
        i += 1;
    }
    seen
}

const MANIFEST: &str = ".fixture-manifest";

/// Every file under `path` (or `path` itself), by its path relative to `path`, sorted.
fn files(path: &Path) -> BTreeMap<String, PathBuf> {
    let mut out = BTreeMap::new();
    if path.is_file() {
        out.insert(String::new(), path.to_path_buf());
        return out;
    }
    let mut todo = vec![path.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).map(Result::unwrap) {
            let p = entry.path();
            if p.is_dir() {
                todo.push(p);
            } else {
                let rel = p.strip_prefix(path).unwrap().display().to_string();
                if rel != MANIFEST {
                    out.insert(rel, p);
                }
            }
        }
    }
    out
}

fn manifest_text(files: &BTreeMap<String, PathBuf>) -> String {
    files
        .iter()
        .map(|(rel, p)| {
            let meta = std::fs::metadata(p).unwrap();
            let modified = meta.modified().unwrap().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_nanos();
            format!("{rel}\t{}\t{modified}\n", meta.len())
        })
        .collect()
}

fn check_unchanged(dir: &Path) {
    let recorded = std::fs::read_to_string(dir.join(MANIFEST)).unwrap_or_default();
    let now = manifest_text(&files(dir));
    if now != recorded {
        let before: Vec<&str> = recorded.lines().collect();
        let changed: Vec<&str> = now.lines().filter(|l| !before.contains(l)).chain(before.iter().copied().filter(|l| !now.contains(l))).collect();
        panic!(
            "the shared fixture {} changed since it was made ({changed:?}): a test wrote into it; tests copy a fixture they modify \
             (common::fixture::copy). `rm -r` it to make it again.",
            dir.display()
        );
    }
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap_or_else(|e| panic!("{}: {e}", to.display()));
    for (rel, file) in files(from) {
        let dest = to.join(&rel);
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::copy(&file, &dest).unwrap_or_else(|e| panic!("copying {} to {}: {e}", file.display(), dest.display()));
    }
}
