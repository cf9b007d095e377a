//! The plugin's own thread: writes each window's trace (libtorch's Chrome trace
//! export, the slow part) and memory snapshot, so the training thread only stops
//! the profiler and hands the result over.

use std::{
    path::PathBuf,
    sync::mpsc::{channel, Sender},
    thread::JoinHandle,
};

use ptrain_plugin_api::{HostApi, LogLevel};
use ptrain_torch_ext::trace::Recorded;

use crate::NAME;

pub struct Job {
    pub trace: Recorded,
    pub path: PathBuf,
    /// The CUDA caching allocator's pickled snapshot, and where it goes.
    pub snapshot: Option<(Vec<u8>, PathBuf)>,
}

/// What the thread wrote, for the summary.
#[derive(Debug, Default)]
pub struct Written {
    pub files: Vec<String>,
    pub failed: u64,
}

pub struct Writer {
    jobs: Option<Sender<Job>>,
    thread: Option<JoinHandle<Written>>,
}

fn write(job: Job) -> Result<Vec<PathBuf>, String> {
    if let Some(dir) = job.path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    job.trace.save(&job.path).map_err(|e| format!("{}: {e}", job.path.display()))?;
    let mut paths = vec![job.path];
    if let Some((bytes, path)) = job.snapshot {
        std::fs::write(&path, bytes).map_err(|e| format!("{}: {e}", path.display()))?;
        paths.push(path);
    }
    Ok(paths)
}

impl Writer {
    pub fn spawn(host: HostApi) -> std::io::Result<Writer> {
        let (jobs, queue) = channel::<Job>();
        let thread = std::thread::Builder::new().name("ptrain-trace".into()).spawn(move || {
            let mut written = Written::default();
            for job in queue {
                match write(job) {
                    Ok(paths) => written.files.extend(paths.iter().map(|p| p.display().to_string())),
                    Err(e) => {
                        written.failed += 1;
                        host.log(LogLevel::Error, NAME, &format!("could not write a trace: {e}"));
                    }
                }
            }
            written
        })?;
        Ok(Writer { jobs: Some(jobs), thread: Some(thread) })
    }

    pub fn send(&self, job: Job) {
        if let Some(jobs) = &self.jobs {
            // The thread only ends when `finish` drops the sender.
            let _ = jobs.send(job);
        }
    }

    /// Waits for every queued trace to be written.
    pub fn finish(&mut self) -> Written {
        self.jobs = None;
        self.thread.take().and_then(|t| t.join().ok()).unwrap_or_default()
    }
}
