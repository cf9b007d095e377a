//! What a user is told about a `[plugins.<name>]` table the plugin refuses, through the
//! built binary: a misspelt host key or attachment name is named with the key it likely
//! meant, and an option error names the file that set the key.

mod common;

use common::*;

/// The `error:` line of a run refused before training (exit 2).
fn refusal(args: &[&str], config: Option<(&tempfile::TempDir, &str)>) -> (String, String) {
    let mut cmd = ptrain();
    cmd.args(tiny_gpt(3)).args(args);
    let mut file = String::new();
    if let Some((dir, text)) = config {
        let path = dir.path().join("plugins.toml");
        std::fs::write(&path, text).unwrap();
        cmd.arg("--config").arg(&path);
        file = path.display().to_string();
    }
    let out = run_expect(&mut cmd, 2);
    let err = stderr(&out);
    let line = err.lines().find(|l| l.starts_with("error:")).unwrap_or_else(|| panic!("no error line:\n{err}")).to_string();
    (line, file)
}

#[test]
fn a_misspelt_host_key_is_answered_with_the_host_key_and_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let (line, file) = refusal(&["--plugins", "jsonl"], Some((&dir, "[plugins.jsonl]\nevry = 5\n")));
    assert!(line.contains("plugins.jsonl.evry: unknown field `evry`"), "{line}");
    assert!(line.contains(&format!("(in {file})")), "{line}");
    assert!(line.contains("did you mean `every`, a key of the host?"), "{line}");
    assert!(line.contains("every, every_secs, first_step, at_eval, at_checkpoint, at_end, queue, on_full"), "{line}");
    assert!(line.contains("a table per attachment of the plugin (metrics)"), "{line}");

    let (line, _) = refusal(&["--plugins", "jsonl", "--set", "plugins.jsonl.on_ful=\"block\""], None);
    assert!(line.contains("did you mean `on_full`, a key of the host?") && line.contains("(in --set plugins.jsonl.on_ful="), "{line}");
}

#[test]
fn a_misspelt_attachment_name_is_answered_with_the_attachment() {
    let dir = tempfile::tempdir().unwrap();
    let (line, file) = refusal(&["--plugins", "tensorboard"], Some((&dir, "[plugins.tensorboard.histogram]\nevery = 5\n")));
    assert!(line.contains("unknown field `histogram`"), "{line}");
    assert!(line.contains(&format!("(in {file})")), "{line}");
    assert!(line.contains("did you mean `histograms`, the plugin's attachment ([plugins.tensorboard.histograms])?"), "{line}");
    assert!(line.contains("a table per attachment of the plugin (scalars, histograms)"), "{line}");
}

#[test]
fn an_option_error_names_the_file_that_set_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let (line, file) = refusal(&["--plugins", "jsonl"], Some((&dir, "[plugins.jsonl]\nevery = 4\ndetailed = \"oops\"\n")));
    assert!(line.contains("invalid options: plugins.jsonl.detailed: invalid type: string \"oops\", expected a boolean"), "{line}");
    assert!(line.ends_with(&format!("(in {file})")), "{line}");
    // A misspelt option of the plugin's own gets no host hint, but the same list.
    let (line, _) = refusal(&["--plugins", "jsonl"], Some((&dir, "[plugins.jsonl]\ndetaild = true\n")));
    assert!(line.contains("unknown field `detaild`") && !line.contains("did you mean"), "{line}");
    // A host key with a bad value names the file too.
    let (line, file) = refusal(&["--plugins", "jsonl"], Some((&dir, "[plugins.jsonl]\nqueue = 0\n")));
    assert!(line.contains(&format!("invalid configuration key `plugins.jsonl.queue` in {file}: must be an integer >= 1")), "{line}");
}
