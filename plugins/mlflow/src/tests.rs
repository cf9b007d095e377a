//! The plugin driven through its hooks as the host would, with no server to talk to
//! (tests/mlflow.rs runs it against a real `mlflow server`): everything must end up
//! in pending.jsonl, in order, and the run's identity in run.json.

use std::{io::Read, net::TcpListener, path::Path};

use abi_stable::std_types::{RSlice, RVec};
use ptrain_mlflow::state::StateDir;
use ptrain_plugin_api::{testing, Metric, MetricBatch, RunEnd};

use super::*;

/// A port nothing listens on: reserved and never bound, so no other test listens there.
fn closed_port() -> u16 {
    ptrain_test_ports::reserve()
}

fn plugin(uri: &str, extra: serde_json::Value) -> Mlflow {
    let mut options = json!({ "uri": uri, "retry_secs": 0, "timeout_secs": 1, "end_timeout_secs": 5 });
    options.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    Mlflow::new(options, HostApi::standalone()).unwrap()
}

fn start(p: &mut Mlflow, run_dir: &Path, start_step: u64) {
    std::fs::write(run_dir.join("config.toml"), "[optim]\nlr = 0.0006\n").unwrap();
    let dir = run_dir.to_str().unwrap();
    let info = RunInfo {
        run_dir: dir.into(),
        run_name: "tiny".into(),
        config_toml: "[optim]\nlr = 0.0006\n[model]\nkind = \"gpt\"\n".into(),
        start_step,
        total_steps: 100,
        start_time: 1_700_000_000.0,
        ..testing::run_info()
    };
    p.on_run_start(&info).unwrap();
}

fn batch(step: u64, loss: f64) -> MetricBatch {
    let metrics = vec![Metric::scalar("train/loss", loss), Metric::scalar("dataset/a,b/loss", 1.0), Metric::text("note", "skipped")];
    MetricBatch { step, wall_time: 1_700_000_000.0 + step as f64, elapsed_s: step as f64, metrics: RVec::from(metrics) }
}

fn end(p: &mut Mlflow, exit_code: i32) -> serde_json::Value {
    p.on_run_end(&RunEnd { step: 30, exit_code, wall_s: 1.0, scalars: RSlice::EMPTY }).unwrap().unwrap()
}

fn pending(run_dir: &Path) -> Vec<Item> {
    StateDir::of_run_dir(run_dir).pending_from(0).unwrap().into_iter().map(|(item, _)| item).collect()
}

fn steps(items: &[Item]) -> Vec<u64> {
    items.iter().filter_map(|i| if let Item::Metrics(m) = i { Some(m.iter().map(|p| p.step)) } else { None }).flatten().collect()
}

#[test]
fn an_unreachable_server_leaves_everything_in_pending_jsonl() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = plugin(&format!("http://127.0.0.1:{}", closed_port()), json!({}));
    start(&mut p, dir.path(), 0);
    for step in [10, 20, 30] {
        p.on_metrics(&batch(step, 1.0 / step as f64)).unwrap();
    }
    let fragment = end(&mut p, 143);
    drop(p);
    let items = pending(dir.path());
    assert!(matches!(&items[0], Item::Params(ps) if ps.contains(&KeyValue::new("optim.lr", "0.0006"))), "{items:?}");
    assert!(items.iter().any(|i| matches!(i, Item::Tags(ts) if ts.contains(&KeyValue::new("ptrain.model", "gpt")))));
    assert!(items.contains(&Item::Artifact { path: "config.toml".into() }));
    assert_eq!(steps(&items), vec![10, 10, 20, 20, 30, 30]);
    let keys: Vec<&str> = items.iter().filter_map(|i| if let Item::Metrics(m) = i { Some(m[1].key.as_str()) } else { None }).collect();
    assert_eq!(keys, vec!["dataset/a_b/loss"; 3], "names the server refuses are made acceptable; text is not a metric");
    let status = items.iter().position(|i| matches!(i, Item::Status { status: RunStatus::Killed, end_time: Some(_) })).expect("a KILLED status");
    assert!(status > items.iter().rposition(|i| matches!(i, Item::Metrics(_))).unwrap(), "the status comes after the metrics");
    assert_eq!(items.last(), Some(&Item::Artifact { path: "summary.json".into() }), "summary.json is left for the sync");
    assert_eq!(fragment["status"], "KILLED");
    assert_eq!(fragment["pending_items"].as_u64().unwrap() as usize, items.len() - 1);
    assert!(fragment["sync_command"].as_str().unwrap().starts_with("ptrain sync mlflow "));
    let record = StateDir::of_run_dir(dir.path()).read_record().unwrap().unwrap();
    assert_eq!((record.run_id, record.start_time), (None, 1_700_000_000_000));
    assert_eq!(record.run_name, dir.path().file_name().unwrap().to_str().unwrap(), "named as the run directory");
}

#[test]
fn a_uri_that_is_not_a_server_goes_straight_to_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = plugin("file:///tmp/mlruns", json!({ "experiment": "exp", "run_name": "named" }));
    start(&mut p, dir.path(), 0);
    p.on_metrics(&batch(10, 0.5)).unwrap();
    assert_eq!(end(&mut p, 0)["status"], "FINISHED");
    let items = pending(dir.path());
    assert_eq!(steps(&items), vec![10, 10]);
    assert!(items.iter().any(|i| matches!(i, Item::Status { status: RunStatus::Finished, end_time: Some(_) })), "{items:?}");
    let record = StateDir::of_run_dir(dir.path()).read_record().unwrap().unwrap();
    assert_eq!((record.tracking_uri.as_str(), record.experiment_name.as_str(), record.run_name.as_str()), ("file:///tmp/mlruns", "exp", "named"));
}

#[test]
fn the_run_id_travels_in_checkpoints_and_a_resumed_run_keeps_its_pending_items() {
    let dir = tempfile::tempdir().unwrap();
    let uri = format!("http://127.0.0.1:{}", closed_port());
    let mut first = plugin(&uri, json!({}));
    start(&mut first, dir.path(), 0);
    first.on_metrics(&batch(10, 0.5)).unwrap();
    assert!(first.save_state().unwrap().is_empty(), "no run id before the server made one");
    end(&mut first, 143);
    drop(first);
    // The part before the interruption reached the server as run `abc` (say), as its checkpoint records.
    let mut resumed = plugin(&uri, json!({}));
    resumed.load_state(br#"{"run_id":"abc"}"#).unwrap();
    start(&mut resumed, dir.path(), 10);
    assert_eq!(resumed.save_state().unwrap(), br#"{"run_id":"abc"}"#);
    resumed.on_metrics(&batch(20, 0.4)).unwrap();
    end(&mut resumed, 0);
    drop(resumed);
    let record = StateDir::of_run_dir(dir.path()).read_record().unwrap().unwrap();
    assert_eq!(record.run_id.as_deref(), Some("abc"));
    assert_eq!(steps(&pending(dir.path())), vec![10, 10, 20, 20], "both parts wait for one sync into one run");
    assert!(pending(dir.path()).iter().any(|i| matches!(i, Item::Tags(ts) if ts.contains(&KeyValue::new("ptrain.resumed_from_step", "10")))));
}

#[test]
fn a_new_run_moves_an_unsent_earlier_one_aside() {
    let dir = tempfile::tempdir().unwrap();
    let uri = format!("http://127.0.0.1:{}", closed_port());
    let mut first = plugin(&uri, json!({}));
    start(&mut first, dir.path(), 0);
    end(&mut first, 0);
    drop(first);
    let mut second = plugin(&uri, json!({}));
    start(&mut second, dir.path(), 0);
    end(&mut second, 0);
    drop(second);
    let aside: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("mlflow.unsent-"))
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert!(StateDir::locate(&dir.path().join(&aside[0])).unwrap().unsynced_bytes().unwrap() > 0);
    let statuses = pending(dir.path()).iter().filter(|i| matches!(i, Item::Status { .. })).count();
    assert_eq!(statuses, 1, "the new state holds only the new run");
}

#[test]
fn the_end_of_the_run_does_not_wait_for_a_server_that_never_answers() {
    // Accepts connections and never answers: every request runs into its timeout.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for mut stream in listener.incoming().flatten() {
            let mut buf = [0u8; 1024];
            let _ = stream.read(&mut buf);
            held.push(stream);
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let mut p = plugin(&format!("http://127.0.0.1:{port}"), json!({ "timeout_secs": 300, "retry_secs": 600, "end_timeout_secs": 0.5 }));
    start(&mut p, dir.path(), 0);
    p.on_metrics(&batch(10, 0.5)).unwrap();
    let ending = std::time::Instant::now();
    let fragment = end(&mut p, 0);
    drop(p);
    // The end waits end_timeout_secs (0.5 s), not a request's 300 s: the bound is
    // far from both, so a loaded machine does not fail it and a wait for the
    // server does.
    let took = ending.elapsed();
    assert!(took < std::time::Duration::from_secs(60), "the end of the run waited {took:?} for a server that never answers");
    assert!(fragment["pending_items"].as_u64().unwrap() > 0);
    assert_eq!(steps(&pending(dir.path())), vec![10, 10], "the queue and the request under way are in the file");
}

/// A server that answers every request with 503; the count of requests it got.
fn failing_server() -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::{io::Write, sync::atomic::Ordering};
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = count.clone();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let _ = stream.read(&mut buf);
            seen.fetch_add(1, Ordering::SeqCst);
            let _ = stream.write_all(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        }
    });
    (port, count)
}

#[test]
fn a_failing_request_is_retried_on_later_ticks_never_inside_one() {
    use std::sync::atomic::Ordering;
    let (port, requests) = failing_server();
    let dir = tempfile::tempdir().unwrap();
    let mut p = plugin(&format!("http://127.0.0.1:{port}"), json!({ "retry_secs": 600, "end_timeout_secs": 0 }));
    start(&mut p, dir.path(), 0);
    p.on_timer().unwrap();
    assert_eq!(requests.load(Ordering::SeqCst), 1, "one attempt per tick");
    p.on_timer().unwrap();
    assert_eq!(requests.load(Ordering::SeqCst), 1, "a tick inside the backoff makes no request");
    assert!(pending(dir.path()).is_empty(), "a request within retry_secs is not given up");
    // The first backoff is 0.5 s: a tick after it tries again.
    std::thread::sleep(std::time::Duration::from_millis(600));
    p.on_timer().unwrap();
    assert_eq!(requests.load(Ordering::SeqCst), 2);
    end(&mut p, 0);
    drop(p);
    assert!(!pending(dir.path()).is_empty(), "what the end could not send is in the file");

    // Without retries the first failure sends everything to the file, at the tick.
    let dir = tempfile::tempdir().unwrap();
    let mut p = plugin(&format!("http://127.0.0.1:{port}"), json!({ "retry_secs": 0 }));
    start(&mut p, dir.path(), 0);
    p.on_timer().unwrap();
    assert!(pending(dir.path()).iter().any(|i| matches!(i, Item::Params(_))), "given up at once: the queue is in the file");
    end(&mut p, 0);
}

#[test]
fn unknown_options_and_missing_servers_are_refused_at_creation() {
    let err = Mlflow::new(json!({ "uri": "http://x", "flush": 1 }), HostApi::standalone()).err().unwrap();
    assert!(err.message().contains("flush"), "{err}");
}
