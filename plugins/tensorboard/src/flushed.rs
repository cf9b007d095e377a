//! The plugin's event file and its path, flushed by the plugin's timer every
//! `flush_secs` (the host calls it on the plugin's worker thread), so what was
//! logged reaches TensorBoard even while training stalls between writes (a long
//! evaluation, a slow data loader), as TensorFlow's writer does.

use std::{
    fs::File,
    io,
    path::{Path, PathBuf},
};

use crate::{event_file::EventFile, proto::Event};

pub struct FlushedWriter {
    file: EventFile<File>,
    path: PathBuf,
    /// Set once an I/O error was reported: nothing more is written, not even on drop.
    failed: bool,
}

/// What a closed writer wrote.
pub struct Written {
    pub records: u64,
    pub bytes: u64,
}

impl FlushedWriter {
    pub fn new(file: EventFile<File>, path: PathBuf) -> FlushedWriter {
        FlushedWriter { file, path, failed: false }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn write(&mut self, event: &Event) -> Result<(), String> {
        let result = self.file.write(event);
        self.check(result)
    }

    /// Hands the buffered records to the OS (the timer's work).
    pub fn flush(&mut self) -> Result<(), String> {
        let result = self.file.flush();
        self.check(result)
    }

    /// Flushes what is left.
    pub fn close(mut self) -> Result<Written, String> {
        self.flush()?;
        Ok(Written { records: self.file.records(), bytes: self.file.bytes() })
    }

    fn check(&mut self, result: io::Result<()>) -> Result<(), String> {
        result.map_err(|e| {
            self.failed = true;
            format!("cannot write {}: {e}", self.path.display())
        })
    }
}

impl Drop for FlushedWriter {
    /// A writer dropped without `close` (the run is being torn down): keep what can
    /// be kept, without reporting again.
    fn drop(&mut self) {
        if !self.failed {
            let _ = self.file.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{event_file, proto::Value, tfrecord};

    fn records(path: &Path) -> usize {
        tfrecord::read_records(&std::fs::read(path).unwrap()[..]).unwrap().len()
    }

    #[test]
    fn records_reach_the_file_at_a_flush_and_at_close_not_before() {
        let dir = tempfile::tempdir().unwrap();
        let (file, path) = event_file::create(dir.path(), 1.0).unwrap();
        let mut writer = FlushedWriter::new(file, path.clone());
        writer.write(&Event::summary(1.0, 1, vec![Value::scalar("x", 1.0)])).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0, "nothing written before a flush");
        writer.flush().unwrap();
        assert_eq!(records(&path), 2, "the file version and the scalar");
        for step in 2..=100 {
            writer.write(&Event::summary(1.0, step, vec![Value::scalar("x", step as f64)])).unwrap();
        }
        let written = writer.close().unwrap();
        assert_eq!((written.records, records(&path)), (101, 101));
        assert_eq!(written.bytes, std::fs::metadata(&path).unwrap().len());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_failed_flush_is_reported_naming_the_file() {
        // /dev/full accepts writes into the buffer and fails the flush with ENOSPC.
        let full = std::fs::OpenOptions::new().write(true).open("/dev/full").expect("/dev/full exists on Linux");
        let mut writer = FlushedWriter::new(EventFile::new(full, 1.0).unwrap(), PathBuf::from("/dev/full"));
        writer.write(&Event::summary(1.0, 1, vec![Value::scalar("x", 1.0)])).unwrap();
        let error = writer.flush().unwrap_err();
        assert!(error.starts_with("cannot write /dev/full:"), "{error}");
        assert!(error.contains("No space left"), "{error}");
    }
}
