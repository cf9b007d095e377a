//! Writes a million scalar events and shows that a record costs the same at the
//! end of the file as at the start, plus event-file throughput.
//!
//! `cargo bench -p ptrain-plugin-tensorboard --bench event_writer` (the bench
//! profile is the release profile); after `--`: `--records N` (default 1e6),
//! `--reps N` (default 5), `--dir D` (default the temp dir). Prints; asserts nothing.

use std::{
    fs::File,
    path::Path,
    time::{Duration, Instant},
};

use ptrain_plugin_tensorboard::{
    event_file::{self, EventFile},
    flushed::FlushedWriter,
    proto::{Event, Value},
};

const WINDOWS: usize = 100;

/// Nanoseconds per record in each of `WINDOWS` equal slices of the run.
fn per_window(records: u64, mut write: impl FnMut(u64)) -> Vec<f64> {
    let per = records / WINDOWS as u64;
    (0..WINDOWS as u64)
        .map(|w| {
            let start = Instant::now();
            for i in w * per..(w + 1) * per {
                write(i);
            }
            start.elapsed().as_nanos() as f64 / per as f64
        })
        .collect()
}

fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len() as f64
}

fn report(name: &str, windows: &[f64], bytes: u64, total: Duration, records: u64) {
    let tenth = WINDOWS / 10;
    let (first, last) = (&windows[..tenth], &windows[WINDOWS - tenth..]);
    let (m1, m2) = (median(first), median(last));
    println!("{name}");
    println!("  records {records}, file {:.1} MiB, {:.3} s incl. final flush", bytes as f64 / (1 << 20) as f64, total.as_secs_f64());
    println!("  per record, first 10%: median {m1:.1} ns, mean {:.1} ns", mean(first));
    println!("  per record, last 10%:  median {m2:.1} ns, mean {:.1} ns", mean(last));
    println!(
        "  last vs first (median): {:+.2}%  ({})",
        (m2 / m1 - 1.0) * 100.0,
        if (m2 / m1 - 1.0).abs() <= 0.05 { "within 5%" } else { "NOT within 5%" }
    );
    println!(
        "  throughput: {:.0} records/s, {:.1} MiB/s",
        records as f64 / total.as_secs_f64(),
        bytes as f64 / (1 << 20) as f64 / total.as_secs_f64()
    );
}

fn scalar(i: u64) -> Event {
    Event::summary(1.7e9 + i as f64 * 0.01, i, vec![Value::scalar("train/loss", 1.0 / (1.0 + i as f64))])
}

/// A typical metrics batch: basic and detailed scalars in one event.
fn batch(i: u64) -> Event {
    const TAGS: [&str; 13] = [
        "train/loss",
        "train/lr",
        "train/tokens_per_s",
        "train/samples_per_s",
        "train/epoch",
        "train/grad_norm",
        "time/data_s",
        "time/forward_s",
        "time/backward_s",
        "time/optimizer_s",
        "time/step_s",
        "memory/current_bytes",
        "memory/peak_bytes",
    ];
    Event::summary(1.7e9 + i as f64, i, TAGS.iter().enumerate().map(|(k, t)| Value::scalar(t, (i + k as u64) as f64 * 0.5)).collect())
}

/// One timed pass: per-window ns/record, file bytes, total time including the final flush.
type Pass = (Vec<f64>, u64, Duration);

fn event_file_pass(dir: &Path, records: u64, make: fn(u64) -> Event) -> Pass {
    let (mut file, path): (EventFile<File>, _) = event_file::create(dir, 1.7e9).expect("event file");
    let start = Instant::now();
    let windows = per_window(records, |i| file.write(&make(i)).expect("write"));
    file.flush().expect("flush");
    let total = start.elapsed();
    let bytes = std::fs::metadata(&path).expect("metadata").len();
    assert_eq!(bytes, file.bytes());
    std::fs::remove_file(&path).expect("remove");
    (windows, bytes, total)
}

fn flushed_pass(dir: &Path, records: u64) -> Pass {
    let (file, path) = event_file::create(dir, 1.7e9).expect("event file");
    let mut writer = FlushedWriter::new(file, path.clone());
    let start = Instant::now();
    // The plugin's timer flushes every `flush_secs`; here every 100 ms, checked
    // between records as the worker thread checks it between events.
    let mut next_flush = start + Duration::from_millis(100);
    let windows = per_window(records, |i| {
        writer.write(&scalar(i)).expect("write");
        if Instant::now() >= next_flush {
            writer.flush().expect("flush");
            next_flush = Instant::now() + Duration::from_millis(100);
        }
    });
    let written = writer.close().expect("close");
    let total = start.elapsed();
    std::fs::remove_file(&path).expect("remove");
    (windows, written.bytes, total)
}

/// Each window's fastest time over `reps` passes: other processes on a shared
/// machine only ever add time, so the minimum is the writer's own cost.
fn best_of(reps: usize, mut pass: impl FnMut() -> Pass) -> Pass {
    let (mut best, bytes, mut total) = pass();
    for _ in 1..reps {
        let (windows, _, t) = pass();
        for (b, w) in best.iter_mut().zip(windows) {
            *b = b.min(w);
        }
        total = total.min(t);
    }
    (best, bytes, total)
}

fn arg<T: std::str::FromStr>(args: &[String], name: &str) -> Option<T> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let records: u64 = arg(&args, "--records").unwrap_or(1_000_000);
    let reps: usize = arg(&args, "--reps").unwrap_or(5);
    let base: std::path::PathBuf = arg(&args, "--dir").unwrap_or_else(std::env::temp_dir);
    let dir = tempfile::tempdir_in(&base).expect("temp dir");
    println!("{records} records, best of {reps} passes per window, files in {}\n", base.display());

    let (w, bytes, total) = best_of(reps, || event_file_pass(dir.path(), records, scalar));
    report("EventFile: one scalar per event (add_scalar style)", &w, bytes, total, records);

    let (w, bytes, total) = best_of(reps, || flushed_pass(dir.path(), records));
    report("FlushedWriter (the plugin's writer): one scalar per event, flushed every 100 ms", &w, bytes, total, records);

    let batches = records / 10;
    let (w, bytes, total) = best_of(reps, || event_file_pass(dir.path(), batches, batch));
    report("EventFile: a 13-scalar metrics batch per event", &w, bytes, total, batches);
}
