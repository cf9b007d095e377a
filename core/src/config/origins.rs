//! Where each configuration key was set: the file or `--set` that set it last, so
//! that errors found after the layers are merged (a plugin refusing its options) can
//! still name the file, as errors found while layering do.

use std::collections::BTreeMap;

use crate::error::ConfigError;

/// Dotted key path -> the layer that set it last (`configs/a.toml`, `--set k=v`).
///
/// Not part of the configuration's value: two configurations with the same values are
/// equal wherever their keys came from (a recorded `config.toml` read back on resume
/// has no origins at all).
#[derive(Debug, Clone, Default)]
pub struct KeyOrigins(BTreeMap<String, String>);

impl PartialEq for KeyOrigins {
    fn eq(&self, _: &KeyOrigins) -> bool {
        true
    }
}

impl KeyOrigins {
    pub fn new(origins: BTreeMap<String, String>) -> KeyOrigins {
        KeyOrigins(origins)
    }

    /// The key paths set at `key` or inside it (`plugins.x` holds `plugins.x.every`).
    pub fn keys_under(&self, key: &str) -> Vec<&str> {
        self.0.keys().map(String::as_str).filter(|k| is_under(k, key)).collect()
    }

    /// The layers that set `key` or a key inside it, each once.
    pub fn of(&self, key: &str) -> Vec<&str> {
        let mut layers: Vec<&str> = Vec::new();
        for (_, layer) in self.0.iter().filter(|(k, _)| is_under(k, key)) {
            if !layers.contains(&layer.as_str()) {
                layers.push(layer);
            }
        }
        layers
    }

    /// `error` with its origin replaced by the one layer that set its key, if one did.
    pub fn locate(&self, mut error: ConfigError) -> ConfigError {
        if let [layer] = self.of(&error.key)[..] {
            error.origin = layer.to_string();
        }
        error
    }
}

fn is_under(path: &str, key: &str) -> bool {
    path.strip_prefix(key).is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_traced_to_the_layers_that_set_it_or_keys_inside_it() {
        let origins = KeyOrigins::new(
            [("plugins.x.every", "a.toml"), ("plugins.x.every_secs", "b.toml"), ("plugins.x.grads.every", "--set plugins.x.grads.every=3")]
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .into(),
        );
        assert_eq!(origins.of("plugins.x.every"), ["a.toml"]);
        assert_eq!(origins.of("plugins.x.grads"), ["--set plugins.x.grads.every=3"]);
        assert_eq!(origins.of("plugins.x"), ["a.toml", "b.toml", "--set plugins.x.grads.every=3"]);
        assert!(origins.of("plugins.y").is_empty());
        let error = ConfigError { origin: "[plugins.x]".into(), key: "plugins.x.every_secs".into(), message: "m".into() };
        assert_eq!(origins.locate(error).origin, "b.toml");
    }
}
