//! `train/loss` is the mean step loss since the last emission, and the progress
//! line shows it from rank 0 only, averaged over the ranks (issue 30, items 14, 15).

mod common;

use std::path::Path;

use common::*;

fn losses(run_dir: &Path) -> Vec<(u64, f64)> {
    read_jsonl(&run_dir.join("metrics.jsonl")).iter().filter_map(|row| Some((row["step"].as_u64()?, row["train/loss"].as_f64()?))).collect()
}

fn logged(steps: u64, every: u64, run_dir: &Path) -> Vec<String> {
    let mut args = tiny_gpt(steps);
    args.extend([
        "--plugins".to_string(),
        "jsonl".into(),
        "--set".into(),
        format!("plugins.jsonl.every={every}"),
        "--set".into(),
        "model.dropout=0.0".into(),
    ]);
    args.extend(["--run-dir".to_string(), run_dir.display().to_string()]);
    args
}

#[test]
fn train_loss_is_the_mean_of_the_step_losses_since_the_last_log() {
    let dir = tempfile::tempdir().unwrap();
    let (each, pairs) = (dir.path().join("each"), dir.path().join("pairs"));
    run_expect(ptrain().args(logged(6, 1, &each)), 0);
    run_expect(ptrain().args(logged(6, 2, &pairs)), 0);
    let s = summary(&each);
    let (each, pairs) = (losses(&each), losses(&pairs));
    assert_eq!(each.len(), 6);
    // Logged every step, the mean is that step's loss: the first and the last are
    // the summary's, which are read from the steps themselves.
    for (logged, key) in [(each[0].1, "first_loss"), (each[5].1, "final_loss")] {
        assert!((logged - s[key].as_f64().unwrap()).abs() <= 1e-6, "{key}: {logged} vs {s}");
    }
    assert_eq!(pairs.iter().map(|p| p.0).collect::<Vec<_>>(), [2, 4, 6]);
    for (i, (step, mean)) in pairs.iter().enumerate() {
        let expected = (each[2 * i].1 + each[2 * i + 1].1) / 2.0;
        assert!((mean - expected).abs() <= 1e-6, "step {step}: train/loss {mean}, the mean of its two steps {expected}");
    }
    assert!((each[0].1 - pairs[0].1).abs() > 1e-6, "the mean is not the last step's loss alone");
}

#[test]
fn under_launch_only_rank_0_shows_progress_with_the_mean_over_ranks() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = logged(4, 2, dir.path());
    args.retain(|a| a != "--quiet");
    args.extend(["--set", "run.log_every=2"].map(String::from));
    let out = run_expect(common::ranks::launch(2).env("PTRAIN_LOG", "info").args(&args), 0);
    let text = format!("{}{}", stdout(&out), stderr(&out));
    let progress: Vec<&str> = text.lines().filter(|l| l.contains("step 2/4") || l.contains("step 4/4")).collect();
    assert_eq!(progress.len(), 2, "one line per logged step:\n{text}");
    assert!(progress.iter().all(|l| l.contains("[rank0]")), "{progress:?}");
    for (line, (step, loss)) in progress.iter().zip(losses(dir.path())) {
        assert!(line.contains(&format!("step {step}/4  loss {loss:.4}")), "the mean over ranks, as train/loss: {line} vs {loss}");
    }
}
