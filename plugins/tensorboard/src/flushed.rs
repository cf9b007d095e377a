//! An event file shared with a thread that flushes it every `flush_secs`, so what
//! was logged reaches TensorBoard even while training stalls between writes (a
//! long evaluation, a slow data loader), as TensorFlow's writer does.

use std::{
    fs::File,
    io,
    path::{Path, PathBuf},
    sync::{Arc, Condvar, Mutex, MutexGuard},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use crate::{event_file::EventFile, proto::Event};

struct State {
    file: EventFile<File>,
    closing: bool,
    /// The first I/O error, from either thread; reported by the next call.
    error: Option<io::Error>,
}

struct Inner {
    state: Mutex<State>,
    wake: Condvar,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere while holding the lock leaves the file usable.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

pub struct FlushedWriter {
    inner: Arc<Inner>,
    thread: Option<JoinHandle<()>>,
    path: PathBuf,
}

/// What a closed writer wrote.
pub struct Written {
    pub records: u64,
    pub bytes: u64,
}

impl FlushedWriter {
    pub fn start(file: EventFile<File>, path: PathBuf, period: Duration) -> io::Result<FlushedWriter> {
        let inner = Arc::new(Inner { state: Mutex::new(State { file, closing: false, error: None }), wake: Condvar::new() });
        let shared = inner.clone();
        let thread = std::thread::Builder::new().name("ptrain-tensorboard-flush".into()).spawn(move || flush_every(&shared, period))?;
        Ok(FlushedWriter { inner, thread: Some(thread), path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn write(&self, event: &Event) -> Result<(), String> {
        let mut state = self.inner.lock();
        if let Some(e) = state.error.take() {
            return Err(self.describe(&e));
        }
        state.file.write(event).map_err(|e| self.describe(&e))
    }

    /// Stops the flush thread and flushes what is left.
    pub fn close(mut self) -> Result<Written, String> {
        self.stop_thread();
        let mut state = self.inner.lock();
        if let Some(e) = state.error.take() {
            return Err(self.describe(&e));
        }
        state.file.flush().map_err(|e| self.describe(&e))?;
        Ok(Written { records: state.file.records(), bytes: state.file.bytes() })
    }

    fn describe(&self, error: &io::Error) -> String {
        format!("cannot write {}: {error}", self.path.display())
    }

    fn stop_thread(&mut self) {
        self.inner.lock().closing = true;
        self.inner.wake.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for FlushedWriter {
    /// A writer dropped without `close` (the plugin failed or the run is being torn
    /// down): keep what can be kept, without reporting again.
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.stop_thread();
            let mut state = self.inner.lock();
            if state.error.is_none() {
                let _ = state.file.flush();
            }
        }
    }
}

fn flush_every(inner: &Inner, period: Duration) {
    let mut state = inner.lock();
    let mut due = Instant::now() + period;
    loop {
        // Checked before waiting too: `close` may have run before this thread started.
        if state.closing || state.error.is_some() {
            return;
        }
        let now = Instant::now();
        if now < due {
            state = inner.wake.wait_timeout(state, due - now).unwrap_or_else(|p| p.into_inner()).0;
            continue;
        }
        if let Err(e) = state.file.flush() {
            state.error = Some(e);
            return;
        }
        due = Instant::now() + period;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{event_file, proto::Value, tfrecord};

    #[test]
    fn the_thread_flushes_without_further_writes() {
        let dir = tempfile::tempdir().unwrap();
        let (file, path) = event_file::create(dir.path(), 1.0).unwrap();
        let writer = FlushedWriter::start(file, path.clone(), Duration::from_millis(10)).unwrap();
        writer.write(&Event::summary(1.0, 1, vec![Value::scalar("x", 1.0)])).unwrap();
        // Polls until the flush thread has written both records, bounded by a deadline.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let bytes = std::fs::read(&path).unwrap();
            if tfrecord::read_records(&bytes[..]).map(|r| r.len()).unwrap_or(0) == 2 {
                break;
            }
            assert!(Instant::now() < deadline, "the flush thread never flushed");
            std::thread::sleep(Duration::from_millis(5));
        }
        let written = writer.close().unwrap();
        assert_eq!(written.records, 2);
        assert_eq!(written.bytes, std::fs::metadata(&path).unwrap().len());
    }

    #[test]
    fn close_flushes_everything_even_with_a_long_period() {
        let dir = tempfile::tempdir().unwrap();
        let (file, path) = event_file::create(dir.path(), 1.0).unwrap();
        let writer = FlushedWriter::start(file, path.clone(), Duration::from_secs(3600)).unwrap();
        for step in 1..=100 {
            writer.write(&Event::summary(1.0, step, vec![Value::scalar("x", step as f64)])).unwrap();
        }
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0, "nothing flushed before close");
        writer.close().unwrap();
        let records = tfrecord::read_records(&std::fs::read(&path).unwrap()[..]).unwrap();
        assert_eq!(records.len(), 101);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_failed_background_flush_is_reported_by_the_next_write() {
        // /dev/full accepts writes into the buffer and fails the flush with ENOSPC.
        let full = std::fs::OpenOptions::new().write(true).open("/dev/full").expect("/dev/full exists on Linux");
        let file = EventFile::new(full, 1.0).unwrap();
        let writer = FlushedWriter::start(file, PathBuf::from("/dev/full"), Duration::from_millis(1)).unwrap();
        let event = Event::summary(1.0, 1, vec![Value::scalar("x", 1.0)]);
        let deadline = Instant::now() + Duration::from_secs(20);
        let error = loop {
            if let Err(e) = writer.write(&event) {
                break e;
            }
            assert!(Instant::now() < deadline, "the failed flush was never reported");
            std::thread::sleep(Duration::from_millis(2));
        };
        assert!(error.starts_with("cannot write /dev/full:"), "{error}");
        assert!(error.contains("No space left"), "{error}");
    }
}
