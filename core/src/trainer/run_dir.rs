//! The run directory is the user's record of a run, so a run guards it: one run
//! writes it at a time (a lock file naming the holder's pid and host), and a run
//! never starts over in a directory that holds an earlier run's checkpoints or
//! records unless told to (`--auto-resume` or `--resume` continue it, `--overwrite`
//! moves the old checkpoints and logs aside).

use std::{
    io::Write,
    path::{Path, PathBuf},
};

use super::{clock::stamp, Resume};
use crate::{
    config::Config,
    error::{Error, Result},
};

/// `<run-dir>/ptrain.lock`: `pid = N` and `host = NAME` of the run holding it.
pub const LOCK_FILE: &str = "ptrain.lock";

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown".into())
}

/// Who holds a lock.
#[derive(Debug, PartialEq, Eq)]
struct Holder {
    pid: u32,
    host: String,
}

impl Holder {
    fn me() -> Holder {
        Holder { pid: std::process::id(), host: host_name() }
    }

    fn text(&self) -> String {
        format!("pid = {}\nhost = \"{}\"\n", self.pid, self.host)
    }

    /// `None` for a lock that is unreadable or still being written.
    fn read(path: &Path) -> Option<Holder> {
        let table: toml::Table = std::fs::read_to_string(path).ok()?.parse().ok()?;
        let pid = u32::try_from(table.get("pid")?.as_integer()?).ok()?;
        Some(Holder { pid, host: table.get("host")?.as_str()?.to_string() })
    }

    /// A process of this host that no longer exists (Linux: no `/proc/<pid>`).
    fn is_dead_here(&self) -> bool {
        self.host == host_name() && Path::new("/proc/self").exists() && !Path::new("/proc").join(self.pid.to_string()).exists()
    }
}

/// The run directory's lock, released when dropped (a completed, failed,
/// interrupted or panicking run drops it alike).
pub struct RunLock {
    path: PathBuf,
    dir: PathBuf,
    /// The directory did not exist before: removed again if the run left nothing.
    created_dir: bool,
}

impl RunLock {
    /// Takes `dir`'s lock: refused (exit 2) while another live run holds it; a lock
    /// left by a dead process of this host is taken over with a warning.
    pub fn acquire(dir: &Path) -> Result<RunLock> {
        let created_dir = !dir.exists();
        std::fs::create_dir_all(dir).map_err(Error::writing(dir))?;
        Self::lock(dir, created_dir)
    }

    /// A new directory `base`, or `base-2`, `base-3`, ... when that exists (two runs
    /// started in the same second both named `runs/<name>-<time>`), created here
    /// and locked: for run directories named by default.
    pub fn acquire_new(base: &Path) -> Result<(PathBuf, RunLock)> {
        if let Some(parent) = base.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(Error::writing(parent))?;
        }
        let name = base.file_name().map_or_else(|| "run".into(), |n| n.to_string_lossy().into_owned());
        for n in 1..1000 {
            let dir = if n == 1 { base.to_owned() } else { base.with_file_name(format!("{name}-{n}")) };
            match std::fs::create_dir(&dir) {
                Ok(()) => return Ok((dir.clone(), Self::lock(&dir, true)?)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(source) => return Err(Error::Write { path: dir, source }),
            }
        }
        Err(Error::RunDir { path: base.to_owned(), message: "999 run directories of this name and second exist: set --run-dir".into() })
    }

    fn lock(dir: &Path, created_dir: bool) -> Result<RunLock> {
        let path = dir.join(LOCK_FILE);
        let me = Holder::me();
        for _ in 0..3 {
            match std::fs::OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(mut file) => {
                    file.write_all(me.text().as_bytes()).and_then(|()| file.sync_all()).map_err(Error::writing(&path))?;
                    return Ok(RunLock { path, dir: dir.to_owned(), created_dir });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => match Holder::read(&path) {
                    Some(holder) if holder.is_dead_here() => {
                        tracing::warn!(
                            "taking over the stale lock {} of pid {} on {}: that process no longer exists",
                            path.display(),
                            holder.pid,
                            holder.host
                        );
                        // Only the lock read just now: another run may have taken it over since.
                        if Holder::read(&path).as_ref() == Some(&holder) {
                            let _ = std::fs::remove_file(&path);
                        }
                    }
                    Some(holder) => {
                        return Err(in_use(dir, &format!("pid {} on host {}", holder.pid, holder.host), &path));
                    }
                    // Just created by another run, which is writing it now.
                    None => return Err(in_use(dir, "another run (its lock is being written)", &path)),
                },
                Err(source) => return Err(Error::Write { path, source }),
            }
        }
        Err(in_use(dir, "another run", &path))
    }
}

fn in_use(dir: &Path, holder: &str, lock: &Path) -> Error {
    Error::RunDir {
        path: dir.to_owned(),
        message: format!(
            "in use by {holder} (lock file {}): one run writes a run directory at a time; wait for that run to end or use \
             another --run-dir (a lock left by a run that died on another host is removed by hand)",
            lock.display()
        ),
    }
}

impl Drop for RunLock {
    fn drop(&mut self) {
        if Holder::read(&self.path).is_some_and(|h| h.pid == std::process::id()) {
            let _ = std::fs::remove_file(&self.path);
        }
        if self.created_dir {
            // Fails, as it should, unless the run left nothing behind.
            let _ = std::fs::remove_dir(&self.dir);
        }
    }
}

/// Where the run's checkpoints are: the checkpoint plugin's `dir` when its table
/// sets one (the run's recorded `config.toml` keeps it, absolute), else
/// `<run-dir>/checkpoints`. Resuming looks there, and a fresh start is refused there.
pub fn checkpoints_of(config: &Config, run_dir: &Path) -> PathBuf {
    let dir = config.plugins.get("checkpoint").and_then(|t| t.get("dir")).and_then(toml::Value::as_str).filter(|d| !d.is_empty());
    dir.map_or_else(|| ptrain_checkpoint::checkpoints_dir(run_dir), PathBuf::from)
}

/// Files every run leaves in its directory: `config.toml` when it starts,
/// `summary.json` when it ends.
const RECORDS: &[&str] = &["config.toml", "summary.json"];

/// Refuses (exit 2) a fresh run into a directory that holds an earlier run's
/// checkpoints or records (no checkpoint, but its `config.toml` or `summary.json`):
/// that would mix two runs' checkpoints, metrics and summaries. `--resume` and
/// `--auto-resume` continue the run; with `overwrite`, rank 0 (`lead`) moves
/// everything there aside first, into a sibling `<dir>.old-<UTC stamp>`, and says where.
///
/// Every rank checks before rank 0 writes this run's `config.toml`: setup sums the
/// ranks' refusals right after, a collective between the two. `checkpoints`: where
/// this run writes them ([`checkpoints_of`]); a directory of its own
/// (`plugins.checkpoint.dir`) holding another run's is refused, and moved aside by
/// `overwrite`, as the run directory is: its retention would delete them.
pub fn guard(dir: &Path, checkpoints_dir: &Path, resume: Option<&Resume>, overwrite: bool, lead: bool) -> Result<()> {
    if resume.is_some() {
        return Ok(());
    }
    let checkpoints = ptrain_checkpoint::list(checkpoints_dir);
    let outside = !checkpoints_dir.starts_with(dir);
    if !overwrite {
        let refuse = |message: String| Error::RunDir { path: dir.to_owned(), message };
        if let Some((step, _)) = checkpoints.last() {
            let whose = if outside { format!("its checkpoints directory {} holds", checkpoints_dir.display()) } else { "holds".into() };
            return Err(refuse(format!(
                "{whose} checkpoints of an earlier run (the newest at step {step}): pass --auto-resume to continue it, \
                 --overwrite to start over (its checkpoints and logs are moved aside), or another --run-dir{}",
                if outside { " and plugins.checkpoint.dir" } else { "" }
            )));
        }
        let held: Vec<String> = entries(dir).iter().filter_map(|p| p.file_name()?.to_str().map(str::to_string)).collect();
        // Only files are records: a directory in the way of one fails when it is written.
        if held.iter().any(|name| RECORDS.contains(&name.as_str()) && dir.join(name).is_file()) {
            return Err(refuse(format!(
                "holds an earlier run's records ({}) and no checkpoint: a new run would mix its metrics and summary with them; \
                 pass --overwrite to start over (they are moved aside), another --run-dir, or --auto-resume to train from step 0 \
                 beside them",
                held.join(", ")
            )));
        }
        return Ok(());
    }
    if !lead {
        return Ok(());
    }
    if outside && !checkpoints.is_empty() {
        let aside = aside(checkpoints_dir);
        std::fs::rename(checkpoints_dir, &aside).map_err(Error::writing(checkpoints_dir))?;
        tracing::warn!("--overwrite: moved {} ({} checkpoint(s)) to {}", checkpoints_dir.display(), checkpoints.len(), aside.display());
    }
    let entries = entries(dir);
    if entries.is_empty() {
        return Ok(());
    }
    let aside = aside(dir);
    std::fs::create_dir_all(&aside).map_err(Error::writing(&aside))?;
    for entry in &entries {
        let to = aside.join(entry.file_name().unwrap_or_default());
        std::fs::rename(entry, &to).map_err(Error::writing(entry))?;
    }
    tracing::warn!(
        "--overwrite: moved what {} held ({} checkpoint(s), logs, summary) to {}; delete that directory when you no longer need it",
        dir.display(),
        checkpoints.len(),
        aside.display()
    );
    Ok(())
}

/// `<dir>.old-<UTC stamp>`, beside `dir`: where `--overwrite` moves it.
fn aside(dir: &Path) -> PathBuf {
    let name = dir.file_name().map_or_else(|| "run".into(), |n| n.to_string_lossy().into_owned());
    dir.with_file_name(format!("{name}.old-{}", stamp()))
}

/// What `dir` holds, but this run's lock, sorted.
fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut entries: Vec<PathBuf> =
        std::fs::read_dir(dir).into_iter().flatten().filter_map(|e| e.ok()).filter(|e| e.file_name() != LOCK_FILE).map(|e| e.path()).collect();
    entries.sort();
    entries
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_lock_is_refused_and_released_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("run");
        let lock = RunLock::acquire(&run).unwrap();
        let again = RunLock::acquire(&run).err().expect("held");
        assert!(again.to_string().contains(&format!("pid {}", std::process::id())), "{again}");
        drop(lock);
        assert!(!run.exists(), "an empty directory the lock created goes with it");
    }

    #[test]
    fn default_names_taken_in_the_same_second_get_a_suffix() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("runs/default-20260101-000000");
        let (first, _a) = RunLock::acquire_new(&base).unwrap();
        let (second, _b) = RunLock::acquire_new(&base).unwrap();
        assert_eq!((first, second), (base.clone(), dir.path().join("runs/default-20260101-000000-2")));
    }

    #[test]
    fn a_dead_processs_lock_is_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        // Pids above /proc/sys/kernel/pid_max (at most 2^22) never run.
        std::fs::write(dir.path().join(LOCK_FILE), Holder { pid: 4_999_999, host: host_name() }.text()).unwrap();
        let lock = RunLock::acquire(dir.path()).unwrap();
        assert_eq!(Holder::read(&dir.path().join(LOCK_FILE)), Some(Holder::me()));
        drop(lock);
        assert!(!dir.path().join(LOCK_FILE).exists());
    }
}
