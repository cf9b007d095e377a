use super::*;

fn write(dir: &tempfile::TempDir, text: &str) -> std::path::PathBuf {
    let path = dir.path().join("c.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn config_error(result: Result<ConfigBuilder, Error>) -> ConfigError {
    match result {
        Err(Error::Config(e)) => e,
        Err(other) => panic!("expected a config error, got {other}"),
        Ok(_) => panic!("expected a config error"),
    }
}

#[test]
fn the_embedded_default_is_complete_and_round_trips() {
    let config = Config::default();
    assert_eq!(config.model.kind, ModelKind::Gpt);
    let again: Config = toml::from_str(&config.to_toml()).unwrap();
    assert_eq!(again, config);
}

#[test]
fn a_file_layers_over_the_default() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "[model]\nn_layer = 5\n[optim]\nlr = 0.5\n");
    let config = ConfigBuilder::default().file(&path).unwrap().build().unwrap();
    assert_eq!((config.model.n_layer, config.optim.lr, config.model.n_head), (5, 0.5, 4));
}

#[test]
fn unknown_keys_name_the_key_path_and_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "[model]\nn_layers = 5\n");
    let e = config_error(ConfigBuilder::default().file(&path));
    assert_eq!(e.key, "model.n_layers");
    assert_eq!(e.origin, path.display().to_string());
    assert!(e.to_string().contains("unknown configuration key `model.n_layers`"), "{e}");

    let e = config_error(ConfigBuilder::default().set("optim.learning_rate=1"));
    assert_eq!(e.key, "optim.learning_rate");
    assert_eq!(e.origin, "--set optim.learning_rate=1");

    let e = config_error(ConfigBuilder::default().set("nosuch.key=1"));
    assert_eq!(e.key, "nosuch");
}

#[test]
fn an_unknown_key_names_the_nearest_one_first() {
    let e = config_error(ConfigBuilder::default().set("optim.minlr=1e-5")).to_string();
    assert!(e.contains("unknown field `minlr`: did you mean `min_lr`? (expected one of `name`, `lr`, `min_lr`"), "{e}");
    let e = config_error(ConfigBuilder::default().set("model.n_layers=5")).to_string();
    assert!(e.contains("did you mean `n_layer`?"), "{e}");
    // Nothing near: serde's list alone.
    let e = config_error(ConfigBuilder::default().set("optim.zzzzzzzz=1")).to_string();
    assert!(!e.contains("did you mean") && e.contains("expected one of"), "{e}");
}

#[test]
fn wrong_types_and_syntax_are_reported_with_their_source() {
    let e = config_error(ConfigBuilder::default().set("train.steps=\"many\""));
    assert_eq!(e.key, "train.steps");
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "[model\n");
    let e = config_error(ConfigBuilder::default().file(&path));
    assert_eq!(e.origin, path.display().to_string());
    assert!(e.to_string().contains("invalid configuration"), "{e}");
}

#[test]
fn set_values_parse_as_toml_or_fall_back_to_strings() {
    let config = ConfigBuilder::default()
        .set("model.mlp.hidden=[64, 32]")
        .unwrap()
        .set("run.name=experiment-1")
        .unwrap()
        .set("plugins.flops.every=500")
        .unwrap()
        .build()
        .unwrap();
    assert_eq!(config.model.mlp.hidden, vec![64, 32]);
    assert_eq!(config.run.name, "experiment-1");
    assert_eq!(config.plugins["flops"]["every"].as_integer(), Some(500));
}

#[test]
fn the_flat_model_keys_of_earlier_versions_are_refused_naming_their_new_name() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(&dir, "[model]\nkind = \"mlp\"\nhidden = [32]\n");
    let e = config_error(ConfigBuilder::default().file(&file));
    assert_eq!((e.key.as_str(), e.origin.as_str()), ("model.hidden", file.display().to_string().as_str()));
    assert!(e.message.contains("model.mlp.hidden"), "{e}");
    let e = config_error(ConfigBuilder::default().set("model.activation=\"gelu_tanh\""));
    assert_eq!((e.key.as_str(), e.origin.as_str()), ("model.activation", "--set model.activation=\"gelu_tanh\""));
    assert!(e.message.contains("model.gpt.activation"), "{e}");
    let e = config_error(ConfigBuilder::default().toml("[model]\npath = \"m.pt\"\n", "text.toml"));
    assert!(e.key == "model.path" && e.message.contains("model.torchscript.path"), "{e}");
}

#[test]
fn a_recorded_configuration_from_before_the_model_tables_reads_into_them() {
    let old =
        "[model]\nkind = \"torchscript\"\npath = \"/abs/m.pt\"\ntask = \"language_model\"\nhidden = [32]\nbias = false\nlayer_norm_eps = 1e-3\n";
    let config = ConfigBuilder::default().recorded(old, "config.toml").unwrap().build_recorded().unwrap();
    let m = &config.model;
    assert_eq!((m.mlp.hidden.as_slice(), m.gpt.bias, m.gpt.layer_norm_eps), (&[32][..], false, 1e-3));
    assert_eq!((m.torchscript.task, m.torchscript.path.as_str()), (TaskKind::LanguageModel, "/abs/m.pt"));
    // Both spellings at once: which one to keep.
    let e = config_error(ConfigBuilder::default().recorded("[model]\nhidden = [8]\n[model.mlp]\nhidden = [16]\n", "both.toml"));
    assert_eq!((e.key.as_str(), e.origin.as_str()), ("model.hidden", "both.toml"));
    assert!(e.message.contains("model.mlp.hidden"), "{e}");
}

#[test]
fn missing_input_files_are_named() {
    let result = ConfigBuilder::default().set("data.kind=\"tokens\"").unwrap().set("data.path=\"/no/such.bin\"").unwrap().build();
    match result {
        Err(Error::MissingFile { path, .. }) => assert_eq!(path, std::path::PathBuf::from("/no/such.bin")),
        other => panic!("{other:?}"),
    }
}

#[test]
fn instruction_reading_keys_need_instruction_data_and_a_glob_need_not_exist_yet() {
    for set in ["data.format=\"parquet\"", "data.ignore_columns=[\"id\"]", "data.weight_by=\"tokens\"", "data.columns.role=\"speaker\""] {
        let key = set.split('=').next().unwrap().split('.').take(2).collect::<Vec<_>>().join(".");
        match ConfigBuilder::default().set(set).unwrap().build() {
            Err(Error::Config(e)) => assert!(e.key == key && e.message.contains("instruction data"), "{set}: {e:?}"),
            other => panic!("{set}: {other:?}"),
        }
    }
    assert_eq!(config_error(ConfigBuilder::default().set("data.columns.rol=\"speaker\"")).key, "data.columns.rol");
    // Shards named by a pattern are found (or said missing) when the data is read.
    let glob = "/no/such/train-*.parquet";
    let chat = ConfigBuilder::default().set("data.kind=\"chat\"").unwrap().set(&format!("data.path=\"{glob}\"")).unwrap();
    assert!(chat.build_recorded().unwrap().input_files().iter().all(|(_, p)| p.to_str() != Some(glob)));
}

#[test]
fn plugin_tables_split_host_keys_from_options() {
    let table: toml::Table = toml::from_str("every = 20\nqueue = 8\non_full = \"block\"\nproject = \"p\"\n[histograms]\nevery = 0\n").unwrap();
    let s = PluginSettings::parse("tensorboard", &table, &["scalars", "histograms"], true, true).unwrap();
    assert_eq!(s.primary.every, Some(20));
    assert_eq!((s.queue, s.on_full), (8, OnFull::Block));
    assert_eq!(s.attachments["histograms"].every, Some(0));
    assert_eq!(s.options, serde_json::json!({"project": "p"}));

    let bad: toml::Table = toml::from_str("[histograms]\nevry = 3\n").unwrap();
    let e = PluginSettings::parse("tensorboard", &bad, &["scalars", "histograms"], true, true).unwrap_err();
    assert_eq!(e.key, "plugins.tensorboard.histograms.evry");

    // An inline plugin has no queue: its table refuses the worker keys.
    for key in ["queue = 8", "on_full = \"block\"", "finish_timeout_s = 5"] {
        let inline: toml::Table = toml::from_str(key).unwrap();
        let e = PluginSettings::parse("health", &inline, &["grads"], true, false).unwrap_err();
        assert!(e.key.starts_with("plugins.health.") && e.message.contains("worker plugins only"), "{key}: {e:?}");
    }
    let critical: toml::Table = toml::from_str("critical = true").unwrap();
    assert!(PluginSettings::parse("health", &critical, &["grads"], true, false).unwrap().critical);
}

#[test]
fn cadence_keys_are_options_of_a_plugin_without_a_scheduled_primary() {
    let table: toml::Table = toml::from_str("every = 500\nactive = 2\n").unwrap();
    let s = PluginSettings::parse("trace", &table, &["start", "step_start"], false, false).unwrap();
    assert!(s.primary.is_empty());
    assert_eq!(s.options, serde_json::json!({"every": 500, "active": 2}));
}

/// A value outside `rule`'s range, as TOML, and one inside.
fn out_and_in(path: &str) -> (String, String) {
    let rule = ranges::RULES.iter().find(|(p, _)| *p == path).map(|(_, r)| format!("{r}")).unwrap();
    // The rendered range says what to try: below its low end, or past 1 for [0, 1).
    let (bad, good) = if rule.contains("in (0, 1)") {
        ("1.0", "0.5")
    } else if rule.contains("in [0, 1)") {
        ("1.0", "0.0")
    } else if rule.contains("in [0, 1]") {
        ("1.5", "1.0")
    } else if rule.contains("in (0, 1]") {
        ("0.0", "1.0")
    } else if rule.starts_with("an integer >= 2") && rule.contains("or 0") {
        ("1", "0")
    } else if rule.starts_with("an integer >= 2") {
        ("1", "2")
    } else if rule.starts_with("an integer >= 1") {
        (if rule.contains("or 0") { "-1" } else { "0" }, "1")
    } else if rule.starts_with("an integer >= 0") {
        ("-1", "0")
    } else if rule.starts_with("a number > 0") {
        (if rule.contains("or 0") { "-0.5" } else { "0.0" }, "0.25")
    } else if rule.starts_with("a number >= 0") {
        ("-0.5", "0.0")
    } else {
        panic!("no test values for the range of {path}: {rule}")
    };
    (bad.to_string(), good.to_string())
}

/// `--set` assignments putting `value` at a rule path (`a.b`, `a.b[]`, `a.b[].c`).
fn assignment(path: &str, value: &str) -> String {
    match path.split_once("[]") {
        None => format!("{path}={value}"),
        Some((head, "")) => format!("{head}=[{value}]"),
        Some((head, key)) => format!("{head}=[{{name = \"a\", {} = {value}}}]", key.trim_start_matches('.')),
    }
}

#[test]
fn every_numeric_key_of_the_default_has_a_range() {
    let rules: Vec<&str> = ranges::RULES.iter().map(|(p, _)| *p).collect();
    for path in ranges::numeric_paths(&default_table()) {
        assert!(rules.contains(&path.as_str()), "{path} has no range in config/ranges.rs");
    }
}

#[test]
fn every_range_refuses_a_value_outside_it_naming_key_value_and_range() {
    for (path, range) in ranges::RULES {
        let (bad, good) = out_and_in(path);
        let set = assignment(path, &bad);
        let e = config_error(ConfigBuilder::default().set(&set));
        let head = path.split("[]").next().unwrap();
        assert!(e.key.starts_with(head), "{set}: names {}", e.key);
        assert_eq!(e.origin, format!("--set {set}"));
        assert!(e.message.contains(&bad) && e.message.contains(&range.to_string()), "{set}: {e}");
        let ok = assignment(path, &good);
        assert!(ConfigBuilder::default().set(&ok).is_ok(), "{ok} is in range");
    }
}

#[test]
fn non_finite_numbers_and_min_lr_above_lr_are_refused() {
    let e = config_error(ConfigBuilder::default().set("optim.lr=nan"));
    assert_eq!(e.key, "optim.lr");
    let e = ConfigBuilder::default().set("optim.lr=1e-5").unwrap().set("optim.min_lr=1e-4").unwrap().build().unwrap_err();
    assert!(e.to_string().contains("optim.min_lr") && e.to_string().contains("must be <= lr"), "{e}");
    // The default floor is a ratio of lr: a lower lr alone is valid.
    let config = ConfigBuilder::default().set("optim.lr=1e-5").unwrap().build().unwrap();
    assert_eq!(config.optim.floor(), 0.1 * 1e-5);
    // Typed overrides skip the layers and are checked at the end.
    let e = ConfigBuilder::default().build_with(|c| c.train.steps = 0).unwrap_err();
    assert!(e.to_string().contains("train.steps"), "{e}");
}

/// A GPT-2 directory as far as configuration goes (the weights are only checked to exist).
fn gpt2_dir(dir: &tempfile::TempDir) -> String {
    let json = r#"{"model_type": "gpt2", "n_layer": 3, "n_head": 2, "n_embd": 48, "vocab_size": 300, "n_positions": 96, "layer_norm_epsilon": 1e-6}"#;
    std::fs::write(dir.path().join("config.json"), json).unwrap();
    std::fs::write(dir.path().join("model.safetensors"), b"").unwrap();
    dir.path().display().to_string()
}

#[test]
fn init_from_fills_the_architecture_keys() {
    let dir = tempfile::tempdir().unwrap();
    let config = ConfigBuilder::default().set(&format!("model.init_from={}", gpt2_dir(&dir))).unwrap().build().unwrap();
    let m = &config.model;
    assert_eq!((m.n_layer, m.n_head, m.n_embd, m.vocab_size, m.block_size), (3, 2, 48, 300, 96));
    assert_eq!((m.gpt.layer_norm_eps, m.gpt.activation), (1e-6, Activation::GeluTanh));
}

#[test]
fn a_key_set_to_another_value_than_init_from_names_both() {
    let dir = tempfile::tempdir().unwrap();
    let init = format!("model.init_from={}", gpt2_dir(&dir));
    // Agreeing explicit keys are fine, wherever they were set.
    let file = write(&dir, "[model]\nn_layer = 3\n[model.gpt]\nactivation = \"gelu_tanh\"\n");
    ConfigBuilder::default().file(&file).unwrap().set(&init).unwrap().build().unwrap();
    let e = config_error(ConfigBuilder::default().set(&init).unwrap().set("model.block_size=64").unwrap().build().map(|_| ConfigBuilder::default()));
    assert_eq!((e.key.as_str(), e.origin.as_str()), ("model.block_size", "--set model.block_size=64"));
    assert!(e.message.contains("64 disagrees with n_positions = 96") && e.message.contains("data.max_seq_len"), "{e}");
    let file = write(&dir, "[model]\nn_layer = 2\n");
    let e = config_error(ConfigBuilder::default().file(&file).unwrap().set(&init).unwrap().build().map(|_| ConfigBuilder::default()));
    assert_eq!(e.origin, file.display().to_string());
    assert!(e.message.contains("2 disagrees with n_layer = 3"), "{e}");
}

#[test]
fn a_recorded_configuration_is_read_as_it_was() {
    let config = Config { model: ModelConfig { init_from: "/gone".into(), ..Config::default().model }, ..Config::default() };
    let again = ConfigBuilder::default().toml(&config.to_toml(), "config.toml").unwrap().build_recorded().unwrap();
    assert_eq!(again, config);
}

#[test]
fn the_embedded_default_is_configs_default_toml() {
    // The copy users read and edit beside the sources; absent when the crate is
    // built on its own (a package), where there is nothing to agree with.
    let readers = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/default.toml");
    if let Ok(text) = std::fs::read_to_string(&readers) {
        assert!(text == DEFAULT_TOML, "core/src/config/default.toml and configs/default.toml differ: edit both alike");
    }
}
