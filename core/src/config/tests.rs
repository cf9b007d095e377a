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
        .set("model.hidden=[64, 32]")
        .unwrap()
        .set("run.name=experiment-1")
        .unwrap()
        .set("plugins.flops.every=500")
        .unwrap()
        .build()
        .unwrap();
    assert_eq!(config.model.hidden, vec![64, 32]);
    assert_eq!(config.run.name, "experiment-1");
    assert_eq!(config.plugins["flops"]["every"].as_integer(), Some(500));
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
fn plugin_tables_split_host_keys_from_options() {
    let table: toml::Table = toml::from_str("every = 20\nqueue = 8\non_full = \"block\"\nproject = \"p\"\n[histograms]\nevery = 0\n").unwrap();
    let s = PluginSettings::parse("tensorboard", &table, &["scalars", "histograms"], true).unwrap();
    assert_eq!(s.primary.every, Some(20));
    assert_eq!((s.queue, s.on_full), (8, OnFull::Block));
    assert_eq!(s.attachments["histograms"].every, Some(0));
    assert_eq!(s.options, serde_json::json!({"project": "p"}));

    let bad: toml::Table = toml::from_str("[histograms]\nevry = 3\n").unwrap();
    let e = PluginSettings::parse("tensorboard", &bad, &["scalars", "histograms"], true).unwrap_err();
    assert_eq!(e.key, "plugins.tensorboard.histograms.evry");
}

#[test]
fn cadence_keys_are_options_of_a_plugin_without_a_scheduled_primary() {
    let table: toml::Table = toml::from_str("every = 500\nactive = 2\n").unwrap();
    let s = PluginSettings::parse("trace", &table, &["start", "step_start"], false).unwrap();
    assert!(s.primary.is_empty());
    assert_eq!(s.options, serde_json::json!({"every": 500, "active": 2}));
}
