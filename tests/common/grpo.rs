//! A GRPO run that samples its completions (`data.kind = "prompts"`), for the sinks'
//! tests: the suite's tiny random Qwen2 and six prompt rows (tests/support/grpo_sampling.py).

use std::path::{Path, PathBuf};

use super::{fixture, hf::s};

/// The policy and `prompts.jsonl`, copied into `dir`.
pub fn prompts_fixture(dir: &Path) -> PathBuf {
    fixture::copy("grpo_sampling.py", &["make", fixture::OUT, "5"], dir)
}

/// A one-thread CPU run's arguments on `d`'s prompts: 2 steps of 8 completions (two
/// prompts, four each), scored by a `length` reward named `len`, the `completions`
/// record at every step, with `plugins` and `extra` settings.
pub fn prompts_run(d: &Path, plugins: &str, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = ["--device", "cpu", "--plugins", plugins].map(String::from).into();
    let sets = [
        "data.batch_size=8".to_string(),
        "train.steps=2".into(),
        "grpo.num_generations=4".into(),
        "grpo.max_completion_length=6".into(),
        "grpo.log_completions_every=1".into(),
        "grpo.rewards=[{name = \"len\", kind = \"length\", target = 4}]".into(),
    ];
    let base = sampling_on(d);
    for set in base.iter().chain(&sets).map(String::as_str).chain(extra.iter().copied()) {
        a.extend(["--set".to_string(), set.to_string()]);
    }
    a
}

/// The settings every sampled GRPO test run starts from: one thread, the fixture's
/// policy in `d` and its prompts, no held-out split.
pub fn sampling_on(d: &Path) -> [String; 6] {
    [
        "run.threads=1".to_string(),
        "model.kind=llama".into(),
        format!("model.init_from={}", s(&d.join("policy"))),
        "data.kind=prompts".into(),
        format!("data.path={}", s(&d.join("prompts.jsonl"))),
        "data.val_fraction=0".into(),
    ]
}
