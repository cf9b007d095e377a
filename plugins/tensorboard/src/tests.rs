//! The plugin driven through its hooks as the host would, read back with our own
//! strict record reader (the upstream reader is checked in tests/tensorboard.rs).

use abi_stable::std_types::{RSlice, RVec};
use prost::Message;
use ptrain_plugin_api::{testing, Histogram, Metric, MetricBatch, RunEnd, RunInfo};

use super::*;
use crate::proto::{Kind, What};

fn with_run<R>(run_dir: &str, start_step: u64, f: impl FnOnce(&RunInfo<'_>) -> R) -> R {
    f(&RunInfo {
        run_dir: run_dir.into(),
        config_toml: "[run]\nseed = 1\n".into(),
        seed: 1,
        start_step,
        total_steps: 100,
        start_time: 1_700_000_000.0,
        ..testing::run_info()
    })
}

fn end(step: u64) -> RunEnd<'static> {
    RunEnd { step, exit_code: 0, wall_s: 1.0, scalars: RSlice::EMPTY }
}

fn plugin(options: serde_json::Value) -> PluginResult<TensorBoard> {
    TensorBoard::new(options, HostApi::standalone())
}

fn events(dir: &std::path::Path) -> Vec<Event> {
    let files: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let bytes = std::fs::read(&files[0]).unwrap();
    tfrecord::read_records(&bytes[..]).unwrap().iter().map(|r| Event::decode(&r[..]).unwrap()).collect()
}

fn values(event: &Event) -> &[Value] {
    match &event.what {
        Some(What::Summary(s)) => &s.value,
        other => panic!("not a summary: {other:?}"),
    }
}

#[test]
fn unknown_options_and_bad_flush_periods_are_refused() {
    let err = |v: serde_json::Value| plugin(v).err().expect("refused").to_string();
    assert!(err(serde_json::json!({ "flush_sec": 5 })).contains("flush_sec"));
    assert!(err(serde_json::json!({ "flush_secs": 0 })).contains("flush_secs"));
    assert!(plugin(serde_json::json!({ "flush_secs": 0.5, "logdir": "x" })).is_ok());
}

#[test]
fn writes_config_scalars_and_histograms_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let mut tb = plugin(serde_json::json!({})).unwrap();
    with_run(dir.path().to_str().unwrap(), 0, |run| tb.on_run_start(run)).unwrap();
    let h = Histogram::from_values(&[1.0, 2.0, 2.0, 4.0], 3);
    let batch = MetricBatch {
        step: 10,
        wall_time: 1_700_000_010.0,
        elapsed_s: 10.0,
        metrics: RVec::from(vec![
            Metric::scalar("train/loss", 2.5),
            Metric::histogram("params/w", h.clone()),
            Metric::histogram("grads/empty", Histogram::default()),
        ]),
    };
    tb.on_metrics(&batch).unwrap();
    let summary = tb.on_run_end(&end(10)).unwrap().unwrap();
    assert_eq!(summary["records"], 3);

    let events = events(&dir.path().join("tensorboard"));
    assert_eq!(events.len(), 3);
    assert_eq!(events[0].what, Some(What::FileVersion("brain.Event:2".into())));
    let config = &values(&events[1])[0];
    assert_eq!(config.tag, "config");
    match &config.kind {
        Some(Kind::Tensor(t)) => assert_eq!(t.string_val, vec![b"```toml\n[run]\nseed = 1\n```".to_vec()]),
        other => panic!("config is not a text tensor: {other:?}"),
    }
    assert_eq!((events[2].step, events[2].wall_time), (10, 1_700_000_010.0));
    let v = values(&events[2]);
    assert_eq!(v.len(), 2, "the empty histogram is skipped");
    assert_eq!(v[0].kind, Some(Kind::SimpleValue(2.5)));
    match &v[1].kind {
        Some(Kind::Histo(p)) => {
            assert_eq!((p.min, p.max, p.num, p.sum, p.sum_squares), (h.min, h.max, h.num, h.sum, h.sum_squares));
            assert_eq!(p.bucket_limit, h.bucket_limits.to_vec());
            assert_eq!(p.bucket, h.bucket_counts.to_vec());
        }
        other => panic!("not a histogram: {other:?}"),
    }
}

#[test]
fn a_resumed_run_starts_a_new_file_that_purges_redone_steps() {
    let dir = tempfile::tempdir().unwrap();
    let logdir = dir.path().join("tb");
    let mut tb = plugin(serde_json::json!({ "logdir": logdir })).unwrap();
    with_run("/nonexistent", 40, |run| tb.on_run_start(run)).unwrap();
    tb.on_run_end(&end(40)).unwrap();
    let events = events(&logdir);
    assert_eq!(events[1].what, Some(What::SessionLog(proto::SessionLog { status: proto::SESSION_START })));
    assert_eq!(events[1].step, 41);
}

#[test]
fn a_blocked_log_directory_is_one_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tensorboard"), "a file where the directory should be").unwrap();
    let mut tb = plugin(serde_json::json!({})).unwrap();
    let err = with_run(dir.path().to_str().unwrap(), 0, |run| tb.on_run_start(run)).expect_err("refused");
    assert!(err.to_string().contains("tensorboard"), "{err}");
    // A plugin that never started writes nothing and does not fail again.
    assert!(tb.on_run_end(&end(1)).unwrap().is_none());
}

#[test]
fn the_timer_comes_every_flush_secs_and_flushes_what_was_logged() {
    let dir = tempfile::tempdir().unwrap();
    let mut tb = plugin(serde_json::json!({ "flush_secs": 0.25 })).unwrap();
    assert_eq!(tb.timer_interval().unwrap(), Some(Duration::from_millis(250)));
    // A tick before the run started (or after the writer failed) has nothing to do.
    tb.on_timer().unwrap();
    with_run(dir.path().to_str().unwrap(), 0, |run| tb.on_run_start(run)).unwrap();
    tb.on_metrics(&testing::metric_batch(10, vec![Metric::scalar("train/loss", 2.5)])).unwrap();
    let logdir = dir.path().join("tensorboard");
    let file = std::fs::read_dir(&logdir).unwrap().next().unwrap().unwrap().path();
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 0, "buffered until the timer");
    tb.on_timer().unwrap();
    let flushed = events(&logdir);
    assert_eq!(flushed.len(), 3, "the file version, the config and the scalar");
    assert_eq!(flushed[2].step, 10);
    tb.on_run_end(&end(10)).unwrap();
}
