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
