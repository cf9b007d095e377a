//! What describes the W&B run itself, shared by the offline file and the upload.

use std::hash::{BuildHasher, Hasher};

/// The run as W&B knows it.
#[derive(Debug, Clone)]
pub struct RunMeta {
    pub id: String,
    pub project: String,
    pub entity: Option<String>,
    pub display_name: String,
    pub tags: Vec<String>,
    pub group: Option<String>,
    pub job_type: Option<String>,
    pub notes: Option<String>,
    pub host: String,
    /// Top-level config keys (`run`, `train`, `model`, ...) and their values.
    pub config: serde_json::Map<String, serde_json::Value>,
    pub start_time: f64,
    /// The step a resumed run continues after (0 for a fresh run).
    pub starting_step: u64,
    /// This continues a W&B run an earlier process started (ptrain resumed).
    pub resume: bool,
}

/// The resolved ptrain configuration, as W&B config keys.
pub fn config_from_toml(config_toml: &str) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    let table: toml::Table = toml::from_str(config_toml).map_err(|e| format!("cannot read the run's configuration: {e}"))?;
    match serde_json::to_value(table).map_err(|e| format!("cannot convert the run's configuration: {e}"))? {
        serde_json::Value::Object(map) => Ok(map),
        _ => Err("the run's configuration is not a table".into()),
    }
}

/// An 8-character run id from `[a-z0-9]`, like the SDK's.
pub fn new_run_id() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    // RandomState is seeded from the OS per process; mixing in the time and pid
    // keeps ids distinct across processes started together.
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0));
    hasher.write_u32(std::process::id());
    let mut bits = hasher.finish();
    (0..8)
        .map(|_| {
            let c = ALPHABET[(bits % ALPHABET.len() as u64) as usize] as char;
            bits /= ALPHABET.len() as u64;
            c
        })
        .collect()
}

pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates on success.
    if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } != 0 {
        return String::new();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// `YYYYMMDD_HHMMSS` in local time, as the SDK names run directories.
pub fn local_stamp(unix: f64) -> String {
    let t = unix as libc::time_t;
    // SAFETY: localtime_r writes only into `tm`, which we own.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: localtime_r reads `t` and writes only into `tm`, both ours.
    if unsafe { libc::localtime_r(&t, &mut tm) }.is_null() {
        return format!("{}", unix as u64);
    }
    format!("{:04}{:02}{:02}_{:02}{:02}{:02}", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_are_8_lowercase_alphanumerics_and_differ() {
        let (a, b) = (new_run_id(), new_run_id());
        assert_ne!(a, b);
        for id in [a, b] {
            assert_eq!(id.len(), 8);
            assert!(id.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()), "{id}");
        }
    }

    #[test]
    fn the_config_becomes_nested_json() {
        let config = config_from_toml("[run]\nseed = 3\nname = \"x\"\n[optim]\nlr = 0.001\nbetas = [0.9, 0.95]\n").unwrap();
        assert_eq!(
            serde_json::Value::Object(config),
            serde_json::json!({"run": {"seed": 3, "name": "x"}, "optim": {"lr": 0.001, "betas": [0.9, 0.95]}})
        );
        assert!(config_from_toml("not = [toml").is_err());
    }

    #[test]
    fn the_stamp_has_the_sdk_shape() {
        let stamp = local_stamp(1_700_000_000.0);
        assert_eq!(stamp.len(), 15);
        assert_eq!(&stamp[8..9], "_");
        assert!(stamp.starts_with("2023"), "{stamp}");
    }
}
