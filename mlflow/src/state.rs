//! `<run-dir>/mlflow/`: what the plugin leaves for `ptrain sync mlflow`.
//!
//! - `run.json`: the tracking server, experiment and run name, and the MLflow run id
//!   once the server has created the run ([`RunRecord`]);
//! - `pending.jsonl`: items the server did not take, one JSON [`Item`] per line,
//!   only ever appended to;
//! - `synced.json`: how many bytes of `pending.jsonl` `ptrain sync mlflow` has sent,
//!   so that a second sync sends nothing twice.

use std::{
    fs::{File, OpenOptions},
    io::{self, BufRead, BufReader, Seek, SeekFrom, Write},
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use crate::item::Item;

pub const DIR_NAME: &str = "mlflow";
const RECORD: &str = "run.json";
const PENDING: &str = "pending.jsonl";
const SYNCED: &str = "synced.json";

/// `run.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    pub tracking_uri: String,
    pub experiment_name: String,
    pub run_name: String,
    /// Unix milliseconds, the run's `start_time` in MLflow.
    pub start_time: i64,
    /// None until the server has created the run.
    #[serde(default)]
    pub run_id: Option<String>,
    #[serde(default)]
    pub experiment_id: Option<String>,
    #[serde(default)]
    pub artifact_uri: Option<String>,
}

#[derive(Debug, Clone)]
pub struct StateDir {
    dir: PathBuf,
}

#[derive(Serialize, Deserialize, Default)]
struct Synced {
    bytes: u64,
}

/// Writes `data` to `path` through a temporary file and a rename, so a reader
/// never sees half of it.
fn write_atomic(path: &Path, data: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension("json.tmp");
    let mut file = File::create(&tmp)?;
    file.write_all(data)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}

impl StateDir {
    /// `<run_dir>/mlflow`.
    pub fn of_run_dir(run_dir: &Path) -> StateDir {
        StateDir { dir: run_dir.join(DIR_NAME) }
    }

    /// `path` itself when it holds a `run.json`, else `path/mlflow`.
    pub fn locate(path: &Path) -> Option<StateDir> {
        [path.to_path_buf(), path.join(DIR_NAME)].into_iter().find(|d| d.join(RECORD).is_file()).map(|dir| StateDir { dir })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The run directory: artifact paths in items are relative to it.
    pub fn run_dir(&self) -> PathBuf {
        self.dir.parent().map(Path::to_path_buf).unwrap_or_default()
    }

    pub fn pending_path(&self) -> PathBuf {
        self.dir.join(PENDING)
    }

    pub fn create(&self) -> io::Result<()> {
        std::fs::create_dir_all(&self.dir)
    }

    pub fn read_record(&self) -> io::Result<Option<RunRecord>> {
        match std::fs::read(self.dir.join(RECORD)) {
            Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub fn write_record(&self, record: &RunRecord) -> io::Result<()> {
        let json = serde_json::to_vec_pretty(record).map_err(io::Error::other)?;
        write_atomic(&self.dir.join(RECORD), &json)
    }

    /// Bytes of `pending.jsonl` already sent by a sync.
    pub fn synced_bytes(&self) -> io::Result<u64> {
        match std::fs::read(self.dir.join(SYNCED)) {
            Ok(bytes) => Ok(serde_json::from_slice::<Synced>(&bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?.bytes),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(e),
        }
    }

    pub fn set_synced_bytes(&self, bytes: u64) -> io::Result<()> {
        write_atomic(&self.dir.join(SYNCED), &serde_json::to_vec(&Synced { bytes }).map_err(io::Error::other)?)
    }

    /// Bytes of `pending.jsonl` no sync has sent yet.
    pub fn unsynced_bytes(&self) -> io::Result<u64> {
        let len = match std::fs::metadata(self.pending_path()) {
            Ok(m) => m.len(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
            Err(e) => return Err(e),
        };
        Ok(len.saturating_sub(self.synced_bytes()?))
    }

    /// Items of `pending.jsonl` from byte `offset` on, each with the offset just past
    /// its line. A last line without its newline (a write cut short) is left for later.
    pub fn pending_from(&self, offset: u64) -> io::Result<Vec<(Item, u64)>> {
        let mut file = match File::open(self.pending_path()) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        file.seek(SeekFrom::Start(offset))?;
        let mut reader = BufReader::new(file);
        let (mut items, mut at, mut line) = (Vec::new(), offset, String::new());
        loop {
            line.clear();
            let n = reader.read_line(&mut line)?;
            if n == 0 || !line.ends_with('\n') {
                return Ok(items);
            }
            at += n as u64;
            if line.trim().is_empty() {
                continue;
            }
            let item = serde_json::from_str(line.trim_end()).map_err(|e| {
                io::Error::new(io::ErrorKind::InvalidData, format!("{} at byte {}: {e}", self.pending_path().display(), at - n as u64))
            })?;
            items.push((item, at));
        }
    }

    /// Moves this directory aside (to `mlflow.<what>-<unix seconds>` next to it) and
    /// answers where it went: for the state of an earlier MLflow run that still has
    /// items to sync when a new run starts in the same run directory.
    pub fn move_aside(&self, what: &str) -> io::Result<PathBuf> {
        let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let name = format!("{DIR_NAME}.{what}-{secs}");
        let to = self.dir.with_file_name(name);
        std::fs::rename(&self.dir, &to)?;
        Ok(to)
    }

    /// Forgets pending items that were all synced (a new run starts here).
    pub fn clear_pending(&self) -> io::Result<()> {
        for name in [PENDING, SYNCED] {
            match std::fs::remove_file(self.dir.join(name)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        Ok(())
    }

    pub fn pending_writer(&self) -> PendingWriter {
        PendingWriter { path: self.pending_path(), file: None }
    }
}

/// Appends items to `pending.jsonl`, each call one write of whole lines.
pub struct PendingWriter {
    path: PathBuf,
    file: Option<File>,
}

impl PendingWriter {
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn append(&mut self, items: &[Item]) -> io::Result<()> {
        if items.is_empty() {
            return Ok(());
        }
        let mut buf = Vec::with_capacity(128 * items.len());
        for item in items {
            serde_json::to_writer(&mut buf, item).map_err(io::Error::other)?;
            buf.push(b'\n');
        }
        if self.file.is_none() {
            self.file = Some(OpenOptions::new().create(true).append(true).open(&self.path)?);
        }
        let file = self.file.as_mut().expect("opened above");
        file.write_all(&buf)?;
        file.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::item::{KeyValue, RunStatus};

    fn record() -> RunRecord {
        RunRecord {
            tracking_uri: "http://127.0.0.1:5000".into(),
            experiment_name: "Default".into(),
            run_name: "r".into(),
            start_time: 1,
            run_id: None,
            experiment_id: None,
            artifact_uri: None,
        }
    }

    #[test]
    fn the_record_round_trips_and_is_found_from_the_run_dir() {
        let run_dir = tempfile::tempdir().unwrap();
        let state = StateDir::of_run_dir(run_dir.path());
        assert!(StateDir::locate(run_dir.path()).is_none());
        state.create().unwrap();
        assert_eq!(state.read_record().unwrap(), None);
        let mut r = record();
        state.write_record(&r).unwrap();
        r.run_id = Some("abc".into());
        state.write_record(&r).unwrap();
        let found = StateDir::locate(run_dir.path()).unwrap();
        assert_eq!(found.read_record().unwrap(), Some(r));
        assert_eq!(found.run_dir(), run_dir.path());
        assert_eq!(StateDir::locate(state.dir()).unwrap().dir(), state.dir());
        assert!(!state.dir().join("run.json.tmp").exists());
    }

    #[test]
    fn pending_items_are_read_from_an_offset_and_a_torn_line_waits() {
        let run_dir = tempfile::tempdir().unwrap();
        let state = StateDir::of_run_dir(run_dir.path());
        state.create().unwrap();
        assert!(state.pending_from(0).unwrap().is_empty());
        let mut w = state.pending_writer();
        let a = Item::Params(vec![KeyValue::new("optim.lr", "0.1")]);
        let b = Item::Status { status: RunStatus::Finished, end_time: Some(9) };
        w.append(&[a.clone(), b.clone()]).unwrap();
        let all = state.pending_from(0).unwrap();
        assert_eq!(all.iter().map(|(i, _)| i.clone()).collect::<Vec<_>>(), vec![a, b.clone()]);
        let after_first = all[0].1;
        assert_eq!(state.pending_from(after_first).unwrap(), vec![(b, all[1].1)]);
        assert_eq!(state.unsynced_bytes().unwrap(), all[1].1);
        state.set_synced_bytes(after_first).unwrap();
        assert_eq!(state.synced_bytes().unwrap(), after_first);
        assert_eq!(state.unsynced_bytes().unwrap(), all[1].1 - after_first);
        // A line whose write was cut short is not read until it is whole.
        std::fs::OpenOptions::new().append(true).open(state.pending_path()).unwrap().write_all(b"{\"artifact\":{\"pa").unwrap();
        assert_eq!(state.pending_from(all[1].1).unwrap(), vec![]);
        std::fs::OpenOptions::new().append(true).open(state.pending_path()).unwrap().write_all(b"not json\n").unwrap();
        assert!(state.pending_from(all[1].1).unwrap_err().to_string().contains("pending.jsonl"));
    }

    #[test]
    fn an_unsynced_state_moves_aside_and_a_synced_one_is_cleared() {
        let run_dir = tempfile::tempdir().unwrap();
        let state = StateDir::of_run_dir(run_dir.path());
        state.create().unwrap();
        state.write_record(&record()).unwrap();
        state.pending_writer().append(&[Item::Artifact { path: "x".into() }]).unwrap();
        let moved = state.move_aside("abc").unwrap();
        assert!(moved.file_name().unwrap().to_str().unwrap().starts_with("mlflow.abc-"));
        assert_eq!(StateDir::locate(&moved).unwrap().pending_from(0).unwrap().len(), 1);
        assert!(!state.dir().exists());
        state.create().unwrap();
        state.pending_writer().append(&[Item::Artifact { path: "x".into() }]).unwrap();
        state.set_synced_bytes(5).unwrap();
        state.clear_pending().unwrap();
        assert_eq!(state.unsynced_bytes().unwrap(), 0);
        assert!(!state.pending_path().exists());
    }
}
