use ptrain_plugin_api::{CheckpointPayload, CheckpointReason, DType, NamedBlob, TensorBlob};

use super::*;

fn payload(step: u64) -> CheckpointPayload {
    let weights: Vec<u8> = [1.5f32, -2.0, 3.25, 0.0].iter().flat_map(|x| x.to_le_bytes()).collect();
    CheckpointPayload {
        step,
        reason: CheckpointReason::Scheduled,
        model: vec![TensorBlob { name: "layer.weight".into(), dtype: DType::F32, shape: vec![2, 2].into(), data: weights.into() }].into(),
        optimizer: vec![TensorBlob { name: "step".into(), dtype: DType::F32, shape: vec![].into(), data: 7.0f32.to_le_bytes().to_vec().into() }]
            .into(),
        state_json: format!("{{\"step\": {step}}}").into(),
        config_toml: "[run]\nseed = 1\n".into(),
        plugin_states: vec![NamedBlob { name: "jsonl".into(), data: b"state".to_vec().into() }].into(),
    }
}

#[test]
fn a_written_checkpoint_reads_back_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), &payload(12)).unwrap();
    assert_eq!(path.file_name().unwrap(), "step-00000012");
    let ckpt = read(&path).unwrap();
    let w = &ckpt.model["layer.weight"];
    assert_eq!((w.dtype, w.shape.clone()), (DType::F32, vec![2, 2]));
    assert_eq!(&w.data[..4], &1.5f32.to_le_bytes());
    assert_eq!(ckpt.state["step"], 12);
    assert_eq!(ckpt.plugin_states["jsonl"], b"state");
    assert_eq!(ckpt.manifest.reason, "scheduled");
}

#[test]
fn corruption_and_incompleteness_fail_validation() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), &payload(1)).unwrap();
    let model = path.join(MODEL_FILE);
    let mut bytes = std::fs::read(&model).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xFF;
    std::fs::write(&model, bytes).unwrap();
    assert!(validate(&path).unwrap_err().to_string().contains("corrupt"));

    let other = write(dir.path(), &payload(2)).unwrap();
    std::fs::remove_file(other.join(MANIFEST_FILE)).unwrap();
    assert!(validate(&other).unwrap_err().to_string().contains("incomplete"));
}

#[test]
fn find_resumable_skips_invalid_and_temporary_directories() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), &payload(5)).unwrap();
    let newer = write(dir.path(), &payload(10)).unwrap();
    std::fs::remove_file(newer.join(STATE_FILE)).unwrap();
    std::fs::create_dir_all(dir.path().join(".tmp-step-00000020-1")).unwrap();
    let (found, warnings) = find_resumable(dir.path());
    assert_eq!(found.unwrap().file_name().unwrap(), "step-00000005");
    assert_eq!(warnings.len(), 1, "{warnings:?}");
}

#[test]
fn latest_pointer_and_delete() {
    let dir = tempfile::tempdir().unwrap();
    let a = write(dir.path(), &payload(3)).unwrap();
    assert_eq!(read_latest(dir.path()), None);
    commit_latest(dir.path(), "step-00000003").unwrap();
    assert_eq!(read_latest(dir.path()).as_deref(), Some("step-00000003"));
    delete(&a).unwrap();
    assert!(list(dir.path()).is_empty());
}

#[test]
fn rewriting_an_existing_valid_step_keeps_it() {
    let dir = tempfile::tempdir().unwrap();
    let a = write(dir.path(), &payload(4)).unwrap();
    let before = std::fs::metadata(a.join(MANIFEST_FILE)).unwrap().modified().unwrap();
    write(dir.path(), &payload(4)).unwrap();
    assert_eq!(std::fs::metadata(a.join(MANIFEST_FILE)).unwrap().modified().unwrap(), before);
}

fn sharded_payload(step: u64, layout: &ShardLayout, rank: u32) -> CheckpointPayload {
    let [start, end] = layout.ranges[rank as usize];
    let values: Vec<u8> = (start..end).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let mut p = payload(step);
    p.optimizer = vec![
        TensorBlob { name: "exp_avg".into(), dtype: DType::F32, shape: vec![(end - start) as i64].into(), data: values.into() },
        TensorBlob { name: "step".into(), dtype: DType::F32, shape: vec![].into(), data: 7.0f32.to_le_bytes().to_vec().into() },
    ]
    .into();
    p.state_json = serde_json::json!({ "step": step, "shard": layout }).to_string().into();
    if rank != 0 {
        p.model = Vec::new().into();
    }
    p
}

fn layout(save_id: &str) -> ShardLayout {
    ShardLayout { mode: "gradients".into(), world_size: 3, numel: 10, ranges: vec![[0, 4], [4, 8], [8, 10]], save_id: save_id.into(), params: None }
}

#[test]
fn a_sharded_checkpoint_commits_once_every_rank_wrote_its_part() {
    let dir = tempfile::tempdir().unwrap();
    let l = layout("a1");
    assert_eq!(ShardLayout::from_state_json(&sharded_payload(6, &l, 1).state_json), Some(l.clone()));
    let others: Vec<_> = (1..3)
        .map(|rank| {
            let (dir, l) = (dir.path().to_owned(), l.clone());
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(50 * rank as u64));
                write_part(&dir, &sharded_payload(6, &l, rank), &l, rank).unwrap();
            })
        })
        .collect();
    let path = write_sharded(dir.path(), &sharded_payload(6, &l, 0), &l, std::time::Duration::from_secs(10), &crate::Ungated).unwrap().unwrap();
    others.into_iter().for_each(|t| t.join().unwrap());
    let ckpt = read(&path).unwrap();
    assert_eq!(ckpt.manifest.format, SHARDED_FORMAT_VERSION);
    let shards = ckpt.shards.clone().unwrap();
    assert_eq!(shards.parts.iter().map(|p| (p.start, p.end)).collect::<Vec<_>>(), vec![(0, 4), (4, 8), (8, 10)]);
    let mut flat = Vec::new();
    for part in &shards.parts {
        flat.extend_from_slice(&ckpt.read_part(part).unwrap()["exp_avg"].data);
    }
    let expected: Vec<u8> = (0..10).flat_map(|i| (i as f32).to_le_bytes()).collect();
    assert_eq!(flat, expected, "the parts concatenate to the whole flat state");
    let names: Vec<String> = std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert!(!names.iter().any(|n| n.starts_with(".part-")), "markers are gone: {names:?}");
    assert!(std::fs::read_dir(dir.path()).unwrap().all(|e| !e.unwrap().file_name().to_string_lossy().starts_with(".tmp-")));

    // A corrupt part invalidates the checkpoint.
    let part = path.join(part_name(2, 3));
    let mut bytes = std::fs::read(&part).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&part, bytes).unwrap();
    assert!(validate(&path).unwrap_err().to_string().contains("corrupt"));
}

#[test]
fn a_missing_part_commits_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let l = layout("b2");
    write_part(dir.path(), &sharded_payload(3, &l, 1), &l, 1).unwrap();
    // Rank 2 never writes: rank 0 gives up after the wait and leaves no trace.
    let err = write_sharded(dir.path(), &sharded_payload(3, &l, 0), &l, std::time::Duration::from_millis(200), &crate::Ungated).unwrap_err();
    assert!(err.to_string().contains("rank 2's optimizer part did not arrive"), "{err}");
    assert!(list(dir.path()).is_empty());
    assert!(find_resumable(dir.path()).0.is_none());
}

#[test]
fn a_part_for_another_layout_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let l = layout("c3");
    let mut other = l.clone();
    other.ranges = vec![[0, 3], [3, 8], [8, 10]];
    write_part(dir.path(), &sharded_payload(2, &other, 1), &other, 1).unwrap();
    write_part(dir.path(), &sharded_payload(2, &l, 2), &l, 2).unwrap();
    let err = write_sharded(dir.path(), &sharded_payload(2, &l, 0), &l, std::time::Duration::from_secs(5), &crate::Ungated).unwrap_err();
    assert!(err.to_string().contains("expected rank 1 [4, 8)"), "{err}");
    assert!(list(dir.path()).is_empty());
}
