//! A W&B run directory as the SDK leaves it in offline mode, for `wandb sync`:
//! `wandb/offline-run-<YYYYMMDD_HHMMSS>-<id>/run-<id>.wandb` with `files/`,
//! `logs/` and `tmp/` beside it. The `.wandb` file is buffered: a record costs an
//! encode and a memcpy, and the buffer reaches the disk every few seconds.

use std::{
    fs::{File, OpenOptions},
    io::{self, BufWriter},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use prost::Message;

use crate::{
    history::Row,
    leveldb::LogWriter,
    meta::RunMeta,
    proto::{
        ConfigRecord, FilesItem, FilesRecord, HeaderRecord, HistoryRecord, HistoryStep, Item, Record, RecordType, RunExitRecord, RunRecord,
        SummaryRecord, Timestamp, VersionInfo,
    },
};

const FLUSH_EVERY: Duration = Duration::from_secs(5);

pub struct OfflineRun {
    dir: PathBuf,
    file: PathBuf,
    log: LogWriter<BufWriter<File>>,
    num: i64,
    encoded: Vec<u8>,
    last_flush: Instant,
}

/// The offline directories of run `id` beside `dir` (itself included), in start
/// order: the parts of a run resumed from checkpoints.
pub fn parts_of(dir: &Path, id: &str) -> Vec<PathBuf> {
    let suffix = format!("-{id}");
    let mut parts: Vec<PathBuf> = dir
        .parent()
        .and_then(|wandb| std::fs::read_dir(wandb).ok())
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path())
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("offline-run-") && n.ends_with(&suffix)))
        .collect();
    if !parts.contains(&dir.to_path_buf()) {
        parts.push(dir.to_path_buf());
    }
    // The stamp (YYYYMMDD_HHMMSS) follows the same prefix, so names sort by start.
    parts.sort();
    parts
}

impl OfflineRun {
    /// Creates `<root>/wandb/<prefix>-<stamp>-<id>/`; `prefix` is `offline-run`, or
    /// `run` for the local copy of an online run, as the SDK names them.
    pub fn create(root: &Path, prefix: &str, stamp: &str, id: &str) -> io::Result<OfflineRun> {
        let wandb = root.join("wandb");
        let dir = wandb.join(format!("{prefix}-{stamp}-{id}"));
        for sub in ["files", "logs", "tmp"] {
            std::fs::create_dir_all(dir.join(sub))?;
        }
        let file = dir.join(format!("run-{id}.wandb"));
        let out = OpenOptions::new().write(true).create_new(true).open(&file)?;
        // `wandb sync` without arguments and people look for `latest-run`; best effort.
        let latest = wandb.join("latest-run");
        let _ = std::fs::remove_file(&latest);
        let _ = std::os::unix::fs::symlink(dir.file_name().expect("a directory name"), &latest);
        let mut run = OfflineRun {
            dir,
            file,
            log: LogWriter::new(BufWriter::with_capacity(64 * 1024, out))?,
            num: 0,
            encoded: Vec::with_capacity(4096),
            last_flush: Instant::now(),
        };
        let producer = format!("ptrain-plugin-wandb {}", env!("CARGO_PKG_VERSION"));
        run.write(RecordType::Header(HeaderRecord { version_info: Some(VersionInfo { producer, min_consumer: String::new() }) }))?;
        Ok(run)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn file(&self) -> &Path {
        &self.file
    }

    fn write(&mut self, record: RecordType) -> io::Result<()> {
        self.num += 1;
        let record = Record { num: self.num, record_type: Some(record) };
        self.encoded.clear();
        record.encode(&mut self.encoded).expect("a Vec grows as needed");
        self.log.append(&self.encoded)
    }

    /// Flushes when the last flush is [`FLUSH_EVERY`] old: called by the plugin's
    /// timer, so records reach the file even while no row comes.
    pub fn flush_if_due(&mut self) -> io::Result<()> {
        if self.last_flush.elapsed() >= FLUSH_EVERY {
            self.flush()?;
        }
        Ok(())
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.last_flush = Instant::now();
        self.log.flush()
    }

    pub fn write_run(&mut self, meta: &RunMeta) -> io::Result<()> {
        let config = meta.config.iter().map(|(k, v)| Item::new(k.clone(), v.to_string())).collect();
        self.write(RecordType::Run(Box::new(RunRecord {
            run_id: meta.id.clone(),
            entity: meta.entity.clone().unwrap_or_default(),
            project: meta.project.clone(),
            config: Some(ConfigRecord { update: config }),
            run_group: meta.group.clone().unwrap_or_default(),
            job_type: meta.job_type.clone().unwrap_or_default(),
            display_name: meta.display_name.clone(),
            notes: meta.notes.clone().unwrap_or_default(),
            tags: meta.tags.clone(),
            host: meta.host.clone(),
            starting_step: meta.starting_step as i64,
            start_time: Some(Timestamp::from_unix(meta.start_time)),
            resume: meta.resume,
        })))
    }

    /// Where the run's files are (`files/`: logged tables).
    pub fn files_dir(&self) -> PathBuf {
        self.dir.join("files")
    }

    /// Names files written under [`OfflineRun::files_dir`] for `wandb sync` to upload.
    pub fn write_files(&mut self, paths: Vec<String>) -> io::Result<()> {
        self.write(RecordType::Files(FilesRecord { files: paths.into_iter().map(|path| FilesItem { path }).collect() }))
    }

    pub fn write_history(&mut self, row: &Row) -> io::Result<()> {
        let item = row.items.iter().map(|(k, v)| Item::new(k.clone(), v.clone())).collect();
        self.write(RecordType::History(HistoryRecord { item, step: Some(HistoryStep { num: row.step as i64 }) }))
    }

    pub fn write_summary(&mut self, items: &[(String, String)]) -> io::Result<()> {
        let update = items.iter().map(|(k, v)| Item::new(k.clone(), v.clone())).collect();
        self.write(RecordType::Summary(SummaryRecord { update }))
    }

    /// The last record: without it `wandb sync` marks the run as crashed.
    pub fn write_exit(&mut self, exit_code: i32, runtime_s: f64) -> io::Result<()> {
        self.write(RecordType::Exit(RunExitRecord { exit_code, runtime: runtime_s.max(0.0) as i32 }))?;
        self.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::leveldb::read_log;

    fn meta() -> RunMeta {
        RunMeta {
            id: "abc123".into(),
            project: "p".into(),
            entity: None,
            display_name: "name".into(),
            tags: vec!["t".into()],
            group: None,
            job_type: None,
            notes: None,
            host: "h".into(),
            config: crate::meta::config_from_toml("[run]\nseed = 3\n").unwrap(),
            start_time: 1_700_000_000.25,
            starting_step: 0,
            resume: false,
        }
    }

    fn records(path: &Path) -> Vec<Record> {
        read_log(&std::fs::read(path).unwrap()).unwrap().iter().map(|r| Record::decode(&r[..]).unwrap()).collect()
    }

    #[test]
    fn the_directory_has_the_sdk_layout_and_the_records_their_order() {
        let root = tempfile::tempdir().unwrap();
        let mut run = OfflineRun::create(root.path(), "offline-run", "20240102_030405", "abc123").unwrap();
        let dir = root.path().join("wandb/offline-run-20240102_030405-abc123");
        assert_eq!(run.dir(), dir);
        assert_eq!(run.file(), dir.join("run-abc123.wandb"));
        for sub in ["files", "logs", "tmp"] {
            assert!(dir.join(sub).is_dir(), "{sub}/");
        }
        assert_eq!(std::fs::read_link(root.path().join("wandb/latest-run")).unwrap(), PathBuf::from("offline-run-20240102_030405-abc123"));

        run.write_run(&meta()).unwrap();
        run.write_history(&Row { step: 10, items: vec![("loss".into(), "0.5".into()), ("_step".into(), "10".into())] }).unwrap();
        run.write_summary(&[("loss".into(), "0.5".into())]).unwrap();
        run.write_exit(130, 2.7).unwrap();

        let records = records(run.file());
        let nums: Vec<i64> = records.iter().map(|r| r.num).collect();
        assert_eq!(nums, vec![1, 2, 3, 4, 5]);
        let types: Vec<&RecordType> = records.iter().map(|r| r.record_type.as_ref().unwrap()).collect();
        assert!(matches!(types[0], RecordType::Header(_)));
        match types[1] {
            RecordType::Run(r) => {
                assert_eq!((r.run_id.as_str(), r.project.as_str(), r.display_name.as_str()), ("abc123", "p", "name"));
                assert_eq!(r.config.as_ref().unwrap().update, vec![Item::new("run", "{\"seed\":3}")]);
                assert_eq!(r.start_time, Some(Timestamp { seconds: 1_700_000_000, nanos: 250_000_000 }));
            }
            other => panic!("{other:?}"),
        }
        match types[2] {
            RecordType::History(h) => {
                assert_eq!(h.step, Some(HistoryStep { num: 10 }));
                assert_eq!(h.item[0], Item::new("loss", "0.5"));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(types[3], RecordType::Summary(_)));
        assert_eq!(types[4], &RecordType::Exit(RunExitRecord { exit_code: 130, runtime: 2 }));
    }

    #[test]
    fn the_parts_of_a_resumed_run_are_found_in_start_order() {
        let root = tempfile::tempdir().unwrap();
        for (stamp, id) in [("20240102_030407", "same"), ("20240102_030405", "same"), ("20240102_030406", "other")] {
            OfflineRun::create(root.path(), "offline-run", stamp, id).unwrap();
        }
        let wandb = root.path().join("wandb");
        let parts = parts_of(&wandb.join("offline-run-20240102_030407-same"), "same");
        assert_eq!(parts, [wandb.join("offline-run-20240102_030405-same"), wandb.join("offline-run-20240102_030407-same")]);
    }

    #[test]
    fn an_existing_run_file_is_never_overwritten() {
        let root = tempfile::tempdir().unwrap();
        let _first = OfflineRun::create(root.path(), "offline-run", "20240102_030405", "same").unwrap();
        let err = OfflineRun::create(root.path(), "offline-run", "20240102_030405", "same").err().expect("refused");
        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
    }
}
