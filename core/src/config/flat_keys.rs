//! The `[model]` keys earlier versions had flat (`model.hidden`), now in each kind's
//! table (`model.mlp.hidden`): refused where a user writes them, moved where a run
//! recorded them.

/// The keys earlier versions had flat in `[model]`, with the table each moved to.
const MOVED: &[(&str, &str)] = &[
    ("bias", "gpt"),
    ("activation", "gpt"),
    ("layer_norm_eps", "gpt"),
    ("hidden", "mlp"),
    ("input_dim", "mlp"),
    ("num_classes", "mlp"),
    ("path", "torchscript"),
    ("task", "torchscript"),
];

/// Refuses the flat keys of earlier versions (`model.hidden`) in a configuration a
/// user writes (a file, `--set`): the error names the key's name now
/// (`model.mlp.hidden`).
pub(crate) fn refuse_flat_keys(model: &toml::Table) -> Result<(), (String, String)> {
    match MOVED.iter().find(|(key, _)| model.contains_key(*key)) {
        Some((key, table)) => Err((
            format!("model.{key}"),
            format!("is now model.{table}.{key} (in the [model.{table}] table, or --set model.{table}.{key}=...): rename it"),
        )),
        None => Ok(()),
    }
}

/// Moves the flat keys of earlier versions (`model.hidden`) in a recorded `[model]`
/// (a run's or a checkpoint's `config.toml` written before the kinds' tables) into
/// their tables (`model.mlp.hidden`), so those runs resume and read as they did.
/// Both spellings in one table: an error naming the key to keep.
pub(crate) fn move_flat_keys(model: &mut toml::Table) -> Result<(), (String, String)> {
    for (key, table) in MOVED {
        let Some(value) = model.remove(*key) else { continue };
        let inner = model.entry(table.to_string()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        let Some(inner) = inner.as_table_mut() else {
            return Err((format!("model.{table}"), format!("must be a table ([model.{table}]), holding {key}")));
        };
        if inner.contains_key(*key) {
            return Err((format!("model.{key}"), format!("is also set as model.{table}.{key} (its name now): keep that one")));
        }
        inner.insert(key.to_string(), value);
    }
    Ok(())
}
