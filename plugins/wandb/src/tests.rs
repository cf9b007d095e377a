//! The plugin driven through its hooks as the host would, its file read back with
//! our strict reader (tests/wandb.rs checks it with the real `wandb sync`).

use abi_stable::std_types::{RSlice, RVec};
use prost::Message;
use ptrain_plugin_api::{testing, Metric, MetricBatch, RunEnd, RunInfo};

use super::*;
use crate::proto::{Record, RecordType};

fn plugin(options: serde_json::Value) -> Wandb {
    let settings = Settings::resolve(serde_json::from_value(options).unwrap(), |_| None).unwrap();
    Wandb { settings, resumed_id: None, active: None }
}

fn start(w: &mut Wandb, run_dir: &Path, start_step: u64) {
    try_start(w, run_dir, start_step).unwrap()
}

fn try_start(w: &mut Wandb, run_dir: &Path, start_step: u64) -> PluginResult {
    let dir = run_dir.to_str().unwrap();
    let info = RunInfo {
        run_dir: dir.into(),
        config_toml: "[run]\nseed = 1\n\n[optim]\nlr = 0.001\n".into(),
        seed: 1,
        start_step,
        total_steps: 100,
        start_time: 1_700_000_000.0,
        ..testing::run_info()
    };

    w.on_run_start(&info)
}

fn batch(step: u64, loss: f64) -> MetricBatch {
    MetricBatch {
        step,
        wall_time: 1_700_000_000.0 + step as f64,
        elapsed_s: step as f64,
        metrics: RVec::from(vec![Metric::scalar("train/loss", loss)]),
    }
}

fn end(exit_code: i32) -> RunEnd<'static> {
    RunEnd { step: 20, exit_code, wall_s: 1.0, scalars: RSlice::EMPTY }
}

/// The one `.wandb` file under `root`, decoded.
fn records(root: &Path) -> (PathBuf, Vec<RecordType>) {
    let wandb = root.join("wandb");
    let dirs: Vec<PathBuf> = std::fs::read_dir(&wandb).unwrap().map(|e| e.unwrap().path()).filter(|p| !p.ends_with("latest-run")).collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    let file = std::fs::read_dir(&dirs[0]).unwrap().map(|e| e.unwrap().path()).find(|p| p.extension().is_some_and(|e| e == "wandb")).unwrap();
    let bytes = std::fs::read(&file).unwrap();
    let records = leveldb::read_log(&bytes).unwrap().iter().map(|r| Record::decode(&r[..]).unwrap().record_type.unwrap()).collect();
    (dirs[0].clone(), records)
}

fn exit_code(records: &[RecordType]) -> i32 {
    match records.last() {
        Some(RecordType::Exit(e)) => e.exit_code,
        other => panic!("the last record is not an exit record: {other:?}"),
    }
}

#[test]
fn a_run_is_header_run_history_summary_exit() {
    let root = tempfile::tempdir().unwrap();
    let mut w = plugin(json!({ "project": "proj", "tags": ["a"] }));
    start(&mut w, root.path(), 0);
    for (step, loss) in [(10, 2.0), (20, 1.5)] {
        w.on_metrics(&batch(step, loss)).unwrap();
    }
    let fragment = w.on_run_end(&end(130)).unwrap().unwrap();
    assert_eq!(fragment["rows"], 2);
    assert!(fragment["sync_command"].as_str().unwrap().starts_with("wandb sync /"));

    let (dir, records) = records(root.path());
    let id = fragment["run_id"].as_str().unwrap();
    assert_eq!(dir.file_name().unwrap().to_str().unwrap(), format!("offline-run-{}-{id}", meta::local_stamp(1_700_000_000.0)));
    assert!(matches!(records[0], RecordType::Header(_)));
    match &records[1] {
        RecordType::Run(r) => {
            assert_eq!((r.run_id.as_str(), r.project.as_str(), r.tags.clone()), (id, "proj", vec!["a".to_string()]));
            assert!(!r.resume, "a fresh run");
            let keys: Vec<&str> = r.config.as_ref().unwrap().update.iter().map(|i| i.key.as_str()).collect();
            assert_eq!(keys, vec!["optim", "run"]);
            assert_eq!(r.display_name, root.path().file_name().unwrap().to_str().unwrap());
        }
        other => panic!("{other:?}"),
    }
    let steps: Vec<i64> = records.iter().filter_map(|r| if let RecordType::History(h) = r { h.step.as_ref().map(|s| s.num) } else { None }).collect();
    assert_eq!(steps, vec![10, 20]);
    match &records[records.len() - 2] {
        RecordType::Summary(s) => {
            let loss = s.update.iter().find(|i| i.key == "train/loss").unwrap();
            assert_eq!(loss.value_json.parse::<f64>().unwrap(), 1.5, "the latest value");
            assert!(s.update.iter().any(|i| i.key == "_step" && i.value_json == "20"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(exit_code(&records), 130);
}

#[test]
fn a_plugin_dropped_without_run_end_still_writes_a_failed_exit_record() {
    let root = tempfile::tempdir().unwrap();
    let mut w = plugin(json!({}));
    start(&mut w, root.path(), 0);
    w.on_metrics(&batch(10, 2.0)).unwrap();
    drop(w);
    let (_, records) = records(root.path());
    assert!(records.iter().any(|r| matches!(r, RecordType::History(_))));
    assert_eq!(exit_code(&records), 1);
}

#[test]
fn disabled_mode_writes_nothing() {
    let root = tempfile::tempdir().unwrap();
    let mut w = plugin(json!({ "mode": "disabled" }));
    start(&mut w, root.path(), 0);
    w.on_metrics(&batch(10, 2.0)).unwrap();
    assert!(w.on_run_end(&end(0)).unwrap().is_none());
    assert!(!root.path().join("wandb").exists());
}

#[test]
fn a_resumed_run_continues_the_saved_run_id_in_the_chosen_dir() {
    let first_root = tempfile::tempdir().unwrap();
    let mut first = plugin(json!({}));
    start(&mut first, first_root.path(), 0);
    let state = first.save_state().unwrap();
    let id = first.active.as_ref().unwrap().meta.id.clone();
    first.on_run_end(&end(143)).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let mut resumed = plugin(json!({ "dir": dir.path() }));
    resumed.load_state(&state).unwrap();
    start(&mut resumed, first_root.path(), 40);
    resumed.on_run_end(&end(0)).unwrap();
    let (run_dir, records) = records(dir.path());
    assert!(run_dir.to_str().unwrap().ends_with(&format!("-{id}")));
    match &records[1] {
        RecordType::Run(r) => assert_eq!((r.run_id.as_str(), r.starting_step, r.resume), (id.as_str(), 40, true)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_unwritable_directory_is_one_error_at_start() {
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("wandb"), "a file where the directory should be").unwrap();
    let mut w = plugin(json!({}));
    let err = try_start(&mut w, root.path(), 0).expect_err("refused").to_string();
    assert!(err.contains(&root.path().join("wandb").display().to_string()), "{err}");
    assert!(w.on_run_end(&end(0)).unwrap().is_none());
}
