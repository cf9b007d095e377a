//! Evaluation over several ranks when the held-out set does not divide into the
//! ranks' batches (issue 61, item 1): under `dist.shard = "parameters"` a forward
//! gathers each block with every other rank, so a rank that ran one forward fewer
//! than the others left them waiting until `dist.timeout_s` (exit 1). Every rank now
//! runs the same forwards, a rank past the end of the set a stand-in row that counts
//! for nothing: the runs end, and their evaluations equal the unsharded runs' over the
//! same rows, for text windows, chat rows and DPO pairs, on 2 and 3 ranks.

mod common;

use std::path::Path;

use common::{hf::s, ranks::launch, *};

/// A timeout that ends a hung collective quickly, so that a regression fails the test
/// within seconds instead of hanging it.
const TIMEOUT: &str = "dist.timeout_s=15";

fn sets(pairs: &[String]) -> Vec<String> {
    pairs.iter().flat_map(|p| ["--set".to_string(), p.clone()]).collect()
}

/// `args` run on `world` ranks unsharded and parameter-sharded, one step and an
/// evaluation at its end: both exit 0, and evaluate `held_out` samples, the sharded
/// run's loss within 1e-5 relative of the unsharded one's (one update reduced in
/// another order moves the weights by a few ulps; a stand-in row that counted, or a
/// row counted twice, moves the mean by a whole row's share, percents here).
fn evaluations_agree(dir: &Path, name: &str, world: u32, batch: u64, held_out: u64, args: &[String]) {
    assert_ne!(held_out % (world as u64 * batch), 0, "{name}: the held-out set must not divide into the ranks' batches");
    let run = |shard: &str| {
        let run_dir = dir.join(format!("{name}-{world}-{shard}"));
        let more = sets(&[format!("dist.shard={shard}"), format!("data.batch_size={batch}"), TIMEOUT.into(), "train.eval_every=0".into()]);
        run_expect(launch(world).args(args).args(more).arg("--run-dir").arg(&run_dir), 0);
        summary(&run_dir)
    };
    let (none, sharded) = (run("none"), run("parameters"));
    assert_eq!(sharded["shard"], "parameters", "{name}: {sharded}");
    let (a, b) = (&none["evals"][0], &sharded["evals"][0]);
    assert_eq!(a["samples"], held_out, "{name} on {world} ranks: each held-out sample once: {none}");
    assert_eq!(b["samples"], held_out, "{name} on {world} ranks, sharded: {sharded}");
    let (x, y) = (a["loss"].as_f64().unwrap(), b["loss"].as_f64().unwrap());
    assert!((x - y).abs() <= 1e-5 * x.abs(), "{name} on {world} ranks: eval loss {y} sharded, {x} unsharded");
}

#[test]
fn text_windows_the_ranks_do_not_divide_are_evaluated_parameter_sharded_on_two_and_three_ranks() {
    let dir = tempfile::tempdir().unwrap();
    // 20 held-out windows of 32 + 1 bytes (each shares its last byte with the next).
    let (train, val) = (dir.path().join("train.txt"), dir.path().join("val.txt"));
    let text: String = (0..400).map(|i| format!("line {i} of the text. ")).collect();
    std::fs::write(&train, &text).unwrap();
    std::fs::write(&val, &text.as_bytes()[..20 * 32 + 1]).unwrap();
    let mut args = tiny_gpt(1);
    args.extend(sets(&[
        "data.kind=text".into(),
        format!("data.path={}", s(&train)),
        format!("data.val_path={}", s(&val)),
        "train.eval_batches=0".into(),
        "model.dropout=0.0".into(),
    ]));
    // 2 x 4: batches of rows 0..8, 8..16, 16..20 (rank 1 has none of the last);
    // 3 x 4: 0..12, 12..20 (rank 2 has none of the last).
    evaluations_agree(dir.path(), "text", 2, 4, 20, &args);
    evaluations_agree(dir.path(), "text", 3, 4, 20, &args);
}

#[test]
fn chat_rows_and_dpo_pairs_the_ranks_do_not_divide_are_evaluated_parameter_sharded() {
    let dir = tempfile::tempdir().unwrap();
    let model = fixture::copy("chat.py", &["make", fixture::OUT, "12", "1"], &dir.path().join("model"));
    let chat = model.join("chat.jsonl");
    let common = |kind: &str, init: &Path, data: &Path| {
        let mut a = vec!["run".to_string(), "--quiet".into(), "--device".into(), "cpu".into(), "--steps".into(), "1".into()];
        a.extend(sets(&[
            "run.threads=1".into(),
            "model.kind=llama".into(),
            format!("model.init_from={}", s(init)),
            format!("data.kind={kind}"),
            format!("data.path={}", s(data)),
            format!("data.val_path={}", s(data)),
            format!("data.tokens_cache={}", s(&dir.path().join(format!("cache-{kind}")))),
            "train.eval_batches=0".into(),
        ]));
        a
    };
    // Every row of the file is held out (data.val_path = data.path): 12 rows, the
    // ones that fit; 2 x 5 leaves rank 1 none of the second batch, 3 x 3 ranks 1 and 2.
    let rows = {
        let run_dir = dir.path().join("count");
        run_expect(ptrain().args(common("chat", &model, &chat)).arg("--run-dir").arg(&run_dir), 0);
        summary(&run_dir)["evals"][0]["samples"].as_u64().unwrap()
    };
    assert!(rows > 10, "{rows} held-out rows");
    evaluations_agree(dir.path(), "chat", 2, 5, rows, &common("chat", &model, &chat));
    evaluations_agree(dir.path(), "chat", 3, 3, rows, &common("chat", &model, &chat));

    // 8 pairs held out: 2 x 3 leaves rank 1 none of the second batch, 3 x 2 ranks 1 and 2.
    let pairs = fixture::copy("dpo.py", &["make", fixture::OUT, "8", "3"], &dir.path().join("dpo"));
    let dpo = common("preference", &pairs.join("policy"), &pairs.join("conv.jsonl"));
    evaluations_agree(dir.path(), "dpo", 2, 3, 8, &dpo);
    evaluations_agree(dir.path(), "dpo", 3, 2, 8, &dpo);
}
