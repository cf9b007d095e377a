//! Mixing instruction datasets and seeing what is trained, through the built binary:
//! `data.weight_by = "tokens"` gives each source its weight's share of an epoch's
//! trained tokens (by rows, a source of long answers dominates); `ptrain tokenize`
//! and `summary.json` report each source's rows, tokens and trained tokens (equal to
//! what its cache file holds); `ptrain tokenize --show N` takes `run`'s flags and
//! prints rows with their trained text marked, naming a row with nothing trained.

mod common;

use std::path::Path;

use common::{
    hf::{s, support_py},
    *,
};

const WORDS: &[&str] = &["the", "cat", "sat", "on", "a", "mat", "why", "is", "sky", "blue", "light", "models", "learn", "to", "stop"];

/// `rows` conversations whose answers have `answer` words.
fn conversations(rows: usize, answer: usize) -> String {
    (0..rows)
        .map(|r| {
            let words = |n: usize, k: usize| (0..n).map(|i| WORDS[(r * 7 + i * 3 + k) % WORDS.len()]).collect::<Vec<_>>().join(" ");
            let row = serde_json::json!({"messages": [{"role": "user", "content": words(4, 1)}, {"role": "assistant", "content": words(answer, 2)}]});
            format!("{row}\n")
        })
        .collect()
}

fn mix_config(dir: &Path, model: &Path, weight_by: &str) -> std::path::PathBuf {
    let (short, long) = (dir.join("short.jsonl"), dir.join("long.jsonl"));
    std::fs::write(&short, conversations(40, 2)).unwrap();
    std::fs::write(&long, conversations(40, 40)).unwrap();
    let config = dir.join(format!("mix-{weight_by}.toml"));
    let toml = format!(
        "[model]\nkind = \"llama\"\ninit_from = \"{}\"\n[run]\nthreads = 1\n[train]\neval_batches = 1\n\
         [data]\nkind = \"chat\"\npath = \"\"\nweight_by = \"{weight_by}\"\ntokens_cache = \"{}\"\n\
         [[data.datasets]]\nname = \"short\"\npath = \"{}\"\n[[data.datasets]]\nname = \"long\"\npath = \"{}\"\n",
        s(model),
        s(&dir.join("cache")),
        s(&short),
        s(&long)
    );
    std::fs::write(&config, toml).unwrap();
    config
}

fn lines(out: &std::process::Output) -> Vec<serde_json::Value> {
    stdout(out).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn weights_by_tokens_share_the_trained_tokens_and_every_source_is_counted() {
    let dir = tempfile::tempdir().unwrap();
    // Any chat model (its tokenizer and template): the suite's shared one (tests/lora.rs's).
    let model = fixture::copy("chat.py", &["make", fixture::OUT, "40", "3"], &dir.path().join("model"));
    let mut shares = Vec::new();
    for by in ["rows", "tokens"] {
        let config = mix_config(dir.path(), &model, by);
        let out = run_expect(ptrain().args(["tokenize", "--json", "--config"]).arg(&config), 0);
        let reports = lines(&out);
        let counts = &reports.last().unwrap()["counts"]["sources"];
        for (i, name) in ["short", "long"].iter().enumerate() {
            let source = &reports[i];
            assert_eq!(source["source"], *name, "{source}");
            // The trained tokens reported are those in the cache file.
            let cached = support_py("chat.py", &[&"runs", &source["file"].as_str().unwrap()]);
            assert_eq!(source["trained_tokens"], cached["trained"], "{name}: {source}");
            assert_eq!(counts[i]["rows"], 40, "{counts}");
        }
        shares.push((counts[0]["epoch_trained_share"].as_f64().unwrap(), counts[1]["epoch_trained_share"].as_f64().unwrap()));
        if by == "tokens" {
            // summary.json says the same after a run.
            let run_dir = dir.path().join("run");
            run_expect(
                ptrain().args(["run", "--quiet", "--device", "cpu", "--steps", "1", "--config"]).arg(&config).arg("--run-dir").arg(&run_dir),
                0,
            );
            let summary = summary(&run_dir);
            assert_eq!(&summary["data_rows"]["sources"], counts, "{summary}");
        }
    }
    let (by_rows, by_tokens) = (shares[0], shares[1]);
    assert!(by_rows.1 > 0.75, "by rows, the long answers dominate the trained tokens: {by_rows:?}");
    assert!((by_tokens.0 - 0.5).abs() < 0.05 && (by_tokens.1 - 0.5).abs() < 0.05, "equal weights by tokens: half each: {by_tokens:?}");
}

#[test]
fn show_prints_rows_as_the_model_sees_them_with_run_flags() {
    let dir = tempfile::tempdir().unwrap();
    let model = fixture::copy("chat.py", &["make", fixture::OUT, "40", "3"], &dir.path().join("model"));
    let data = model.join("chat.jsonl");
    let first: serde_json::Value = serde_json::from_str(std::fs::read_to_string(&data).unwrap().lines().next().unwrap()).unwrap();
    let answer = first["messages"].as_array().unwrap().iter().find(|m| m["role"] == "assistant").unwrap()["content"].as_str().unwrap().to_string();
    let sets = |model: &Path| {
        let mut a: Vec<String> = ["--device", "cpu", "--steps", "3"].map(String::from).into();
        a.extend(["--run-dir".into(), s(&dir.path().join("run"))]);
        for set in [
            "model.kind=llama".to_string(),
            format!("model.init_from={}", s(model)),
            "data.kind=chat".into(),
            format!("data.path={}", s(&data)),
            format!("data.tokens_cache={}", s(&dir.path().join("cache"))),
        ] {
            a.extend(["--set".to_string(), set]);
        }
        a
    };
    // Not a terminal: trained text between [[ and ]], each row's counts.
    let out = run_expect(ptrain().args(["tokenize", "--show", "2"]).args(sets(&model)), 0);
    let text = stdout(&out);
    assert!(text.starts_with("(trained text is between [[ and ]])"), "{text}");
    assert_eq!(text.matches("--- ").count(), 2, "{text}");
    assert!(text.contains(&format!("{} line 1: ", s(&data))) && text.contains(" trained"), "{text}");
    assert!(text.contains(&format!("[[{answer}<|im_end|>]]")), "the first answer and its end-of-turn token are trained:\n{text}");

    // A template that writes no generation prompt: nothing can be told apart, the row is named.
    let bare = dir.path().join("bare");
    std::fs::create_dir(&bare).unwrap();
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(model.join(f), bare.join(f)).unwrap();
    }
    let template = "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}";
    let config = serde_json::json!({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "chat_template": template});
    std::fs::write(bare.join("tokenizer_config.json"), config.to_string()).unwrap();
    let out = run_expect(ptrain().args(["tokenize", "--show", "1"]).args(sets(&bare)), 0);
    assert!(
        stdout(&out).contains("!!! nothing is trained in this row (it is left out): the chat template writes nothing for add_generation_prompt"),
        "{}",
        stdout(&out)
    );
    let out = run_expect(ptrain().arg("run").arg("--quiet").args(sets(&bare)), 2);
    let err = stderr(&out);
    assert!(
        err.contains("no row is left to train on") && err.contains("line 1: the chat template writes nothing for add_generation_prompt"),
        "{err}"
    );
}
