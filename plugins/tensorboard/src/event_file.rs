//! One TensorBoard event file: a buffered stream of framed `Event` records.
//! Writing appends to a buffer; the only I/O is the buffer draining and explicit
//! flushes, so a record costs the same at the start of a run and after millions.

use std::{
    fs::{File, OpenOptions},
    io::{self, BufWriter, Write},
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
};

use prost::Message;

use crate::{proto::Event, tfrecord};

const BUFFER: usize = 256 * 1024;

pub struct EventFile<W: Write> {
    out: BufWriter<W>,
    encoded: Vec<u8>,
    records: u64,
    bytes: u64,
}

impl<W: Write> EventFile<W> {
    /// Starts a file on `inner` with the `file_version` record readers look for.
    pub fn new(inner: W, wall_time: f64) -> io::Result<EventFile<W>> {
        let mut file = EventFile { out: BufWriter::with_capacity(BUFFER, inner), encoded: Vec::with_capacity(4096), records: 0, bytes: 0 };
        file.write(&Event::file_version(wall_time))?;
        Ok(file)
    }

    pub fn write(&mut self, event: &Event) -> io::Result<()> {
        self.encoded.clear();
        event.encode(&mut self.encoded).expect("a Vec grows as needed");
        tfrecord::write_record(&mut self.out, &self.encoded)?;
        self.records += 1;
        self.bytes += (self.encoded.len() + tfrecord::OVERHEAD) as u64;
        Ok(())
    }

    /// Hands buffered records to the OS (no fsync: its cost grows with the file).
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    pub fn records(&self) -> u64 {
        self.records
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

/// Distinguishes files one process starts in the same second.
static FILE_COUNTER: AtomicU64 = AtomicU64::new(0);

/// `events.out.tfevents.<unix time>.<host>.<pid>.<n>`, the name TensorFlow and
/// PyTorch's SummaryWriter use; readers only look for `tfevents` in it.
pub fn file_name(wall_time: f64) -> String {
    let n = FILE_COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("events.out.tfevents.{:010}.{}.{}.{n}", wall_time as u64, hostname(), std::process::id())
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates on success.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name = if ok { String::from_utf8_lossy(&buf[..end]).into_owned() } else { String::new() };
    // The host name becomes part of a file name.
    let clean: String = name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '.' { c } else { '_' }).collect();
    if clean.is_empty() {
        "localhost".into()
    } else {
        clean
    }
}

/// Creates a new event file in `dir` (and `dir` itself), never overwriting one.
pub fn create(dir: &Path, wall_time: f64) -> io::Result<(EventFile<File>, PathBuf)> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(file_name(wall_time));
    let file = OpenOptions::new().write(true).create_new(true).open(&path)?;
    Ok((EventFile::new(file, wall_time)?, path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{Value, What};

    #[test]
    fn the_first_record_is_the_file_version() {
        let mut bytes = Vec::new();
        let mut file = EventFile::new(&mut bytes, 1.5).unwrap();
        file.write(&Event::summary(2.0, 7, vec![Value::scalar("train/loss", 0.25)])).unwrap();
        assert_eq!(file.records(), 2);
        let written = file.bytes();
        file.flush().unwrap();
        drop(file);
        assert_eq!(written, bytes.len() as u64);
        let records = tfrecord::read_records(&bytes[..]).unwrap();
        let first = Event::decode(&records[0][..]).unwrap();
        assert_eq!(first.what, Some(What::FileVersion("brain.Event:2".into())));
        assert_eq!(first.wall_time, 1.5);
        let second = Event::decode(&records[1][..]).unwrap();
        assert_eq!(second.step, 7);
    }

    #[test]
    fn names_follow_the_tensorflow_pattern_and_are_unique() {
        let (a, b) = (file_name(1_700_000_000.7), file_name(1_700_000_000.7));
        assert_ne!(a, b);
        let parts: Vec<&str> = a.split('.').collect();
        assert_eq!(&parts[..4], &["events", "out", "tfevents", "1700000000"]);
        assert_eq!(parts[parts.len() - 2], std::process::id().to_string());
    }

    #[test]
    fn create_never_overwrites_and_makes_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let nested = dir.path().join("a/b");
        let (_, one) = create(&nested, 1.0).unwrap();
        let (_, two) = create(&nested, 1.0).unwrap();
        assert_ne!(one, two);
        assert!(one.exists() && two.exists());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_full_disk_is_an_error_not_a_panic() {
        // /dev/full accepts opens and fails every write with ENOSPC.
        let full = OpenOptions::new().write(true).open("/dev/full").expect("/dev/full exists on Linux");
        let mut file = EventFile::new(full, 1.0).unwrap(); // still in the buffer
        let event = Event::summary(1.0, 1, vec![Value::scalar("x", 1.0)]);
        let mut result = Ok(());
        for _ in 0..BUFFER {
            result = file.write(&event);
            if result.is_err() {
                break;
            }
        }
        let error = result.and_then(|()| file.flush()).expect_err("writes to /dev/full fail");
        assert_eq!(error.raw_os_error(), Some(libc::ENOSPC));
    }
}
