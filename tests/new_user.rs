//! What a new user trips on (issue 30), through the built binary: mismatches refused
//! before anything runs, typos answered with the key meant, `launch` without `--`.

mod common;

use common::*;

#[test]
fn a_sequence_longer_than_the_models_context_is_refused_naming_both_values() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_expect(ptrain().args(tiny_gpt(1)).args(["--set", "data.max_seq_len=64", "--run-dir"]).arg(dir.path().join("r")), 2);
    let err = stderr(&out);
    assert!(err.contains("data.max_seq_len") && err.contains("64 is above the model's context, model.block_size = 32"), "{err}");
    assert!(!dir.path().join("r").exists(), "nothing ran");
    // At the context it runs.
    run_expect(ptrain().args(tiny_gpt(1)).args(["--set", "data.max_seq_len=32", "--run-dir"]).arg(dir.path().join("ok")), 0);
}

#[test]
fn a_misspelt_key_is_answered_with_the_nearest_one() {
    let out = run_expect(ptrain().args(["config", "--set", "optim.minlr=1e-5"]), 2);
    let err = stderr(&out);
    assert!(err.contains("optim.minlr") && err.contains("did you mean `min_lr`?"), "{err}");
}

#[test]
fn launch_takes_the_command_with_or_without_a_double_dash() {
    let dir = tempfile::tempdir().unwrap();
    for (name, dash) in [("plain", false), ("dashed", true)] {
        let run_dir = dir.path().join(name);
        let mut cmd = common::ranks::single();
        cmd.args(["launch", "--nproc", "1"]);
        if dash {
            cmd.arg("--");
        }
        cmd.args(tiny_gpt(2)).arg("--run-dir").arg(&run_dir);
        run_expect(&mut cmd, 0);
        assert_eq!(summary(&run_dir)["steps"], 2, "{name}");
    }
}
