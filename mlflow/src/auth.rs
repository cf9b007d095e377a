//! Where the tracking server is and how to log in, read as the Python client reads
//! them: `MLFLOW_TRACKING_URI`; `MLFLOW_TRACKING_USERNAME` + `MLFLOW_TRACKING_PASSWORD`
//! (or `~/.mlflow/credentials`) for basic auth, else `MLFLOW_TRACKING_TOKEN` as a bearer token.

use std::path::Path;

use base64::Engine;

pub const URI_VAR: &str = "MLFLOW_TRACKING_URI";

#[derive(Clone, PartialEq, Eq)]
pub enum Auth {
    None,
    Basic { username: String, password: String },
    Bearer(String),
}

impl std::fmt::Debug for Auth {
    /// Never prints a secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Auth::None => f.write_str("Auth::None"),
            Auth::Basic { username, .. } => write!(f, "Auth::Basic({username}, ***)"),
            Auth::Bearer(_) => f.write_str("Auth::Bearer(***)"),
        }
    }
}

fn non_empty(value: Option<String>) -> Option<String> {
    value.filter(|v| !v.is_empty())
}

impl Auth {
    /// From the environment (`env` looks a variable up) and, for what it lacks, the
    /// credentials file under `home`: username and password win over a token.
    pub fn resolve(env: impl Fn(&str) -> Option<String>, home: Option<&Path>) -> Auth {
        let (file_user, file_password) = home.map(|h| credentials_file(&h.join(".mlflow/credentials"))).unwrap_or_default();
        let username = non_empty(env("MLFLOW_TRACKING_USERNAME")).or(file_user);
        let password = non_empty(env("MLFLOW_TRACKING_PASSWORD")).or(file_password);
        match (username, password, non_empty(env("MLFLOW_TRACKING_TOKEN"))) {
            (Some(username), Some(password), _) => Auth::Basic { username, password },
            (_, _, Some(token)) => Auth::Bearer(token),
            _ => Auth::None,
        }
    }

    /// From this process's environment and `$HOME`.
    pub fn from_env() -> Auth {
        let home = std::env::var_os("HOME").map(std::path::PathBuf::from);
        Auth::resolve(|k| std::env::var(k).ok(), home.as_deref())
    }

    /// The `Authorization` header value.
    pub fn header(&self) -> Option<String> {
        match self {
            Auth::None => None,
            Auth::Basic { username, password } => {
                Some(format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{username}:{password}"))))
            }
            Auth::Bearer(token) => Some(format!("Bearer {token}")),
        }
    }

    /// Which variables to check when the server refuses them.
    pub fn hint(&self) -> &'static str {
        match self {
            Auth::None => "no credentials were sent: set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD, or MLFLOW_TRACKING_TOKEN",
            Auth::Basic { .. } => "check MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or ~/.mlflow/credentials)",
            Auth::Bearer(_) => "check MLFLOW_TRACKING_TOKEN",
        }
    }
}

/// `mlflow_tracking_username` / `mlflow_tracking_password` of the `[mlflow]` section.
fn credentials_file(path: &Path) -> (Option<String>, Option<String>) {
    let Ok(text) = std::fs::read_to_string(path) else { return (None, None) };
    let (mut section, mut user, mut password) = (String::new(), None, None);
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') && line.ends_with(']') {
            section = line[1..line.len() - 1].trim().to_string();
        } else if let (true, Some((key, value))) = (section == "mlflow", line.split_once(['=', ':'])) {
            let value = non_empty(Some(value.trim().to_string()));
            match key.trim().to_lowercase().as_str() {
                "mlflow_tracking_username" => user = value,
                "mlflow_tracking_password" => password = value,
                _ => {}
            }
        }
    }
    (user, password)
}

/// The tracking URI without a trailing slash, or why ptrain cannot talk to it:
/// only an MLflow tracking server (`http://` or `https://`) has the REST API.
pub fn check_uri(uri: &str) -> Result<String, String> {
    let uri = uri.trim().trim_end_matches('/');
    let lower = uri.to_ascii_lowercase();
    let rest = lower.strip_prefix("http://").or_else(|| lower.strip_prefix("https://"));
    match rest {
        Some(host) if !host.is_empty() && !host.starts_with('/') => Ok(uri.to_string()),
        Some(_) => Err(format!("tracking URI {uri:?} has no host")),
        None => Err(format!(
            "tracking URI {uri:?} is not an MLflow tracking server: ptrain logs over the REST API, so it needs http:// or https:// \
             (a local store such as file:, sqlite: or a directory is what `mlflow server --backend-store-uri` takes)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn resolve(vars: &[(&str, &str)], home: Option<&Path>) -> Auth {
        let env: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Auth::resolve(|k| env.get(k).cloned(), home)
    }

    #[test]
    fn basic_auth_wins_over_a_token_as_in_the_python_client() {
        let basic = resolve(&[("MLFLOW_TRACKING_USERNAME", "ann"), ("MLFLOW_TRACKING_PASSWORD", "pw"), ("MLFLOW_TRACKING_TOKEN", "t")], None);
        assert_eq!(basic.header().unwrap(), "Basic YW5uOnB3");
        let bearer = resolve(&[("MLFLOW_TRACKING_USERNAME", "ann"), ("MLFLOW_TRACKING_TOKEN", "t")], None);
        assert_eq!(bearer.header().unwrap(), "Bearer t");
        assert_eq!(resolve(&[("MLFLOW_TRACKING_TOKEN", "")], None), Auth::None);
        assert_eq!(format!("{basic:?} {bearer:?}"), "Auth::Basic(ann, ***) Auth::Bearer(***)", "no secret in debug output");
    }

    #[test]
    fn the_credentials_file_fills_in_what_the_environment_lacks() {
        let home = tempfile::tempdir().unwrap();
        std::fs::create_dir(home.path().join(".mlflow")).unwrap();
        std::fs::write(
            home.path().join(".mlflow/credentials"),
            "[other]\nmlflow_tracking_username = no\n[mlflow]\nmlflow_tracking_username = bob\nmlflow_tracking_password = secret\n",
        )
        .unwrap();
        assert_eq!(resolve(&[], Some(home.path())), Auth::Basic { username: "bob".into(), password: "secret".into() });
        let env_user = resolve(&[("MLFLOW_TRACKING_USERNAME", "ann")], Some(home.path()));
        assert_eq!(env_user, Auth::Basic { username: "ann".into(), password: "secret".into() });
    }

    #[test]
    fn only_http_servers_are_accepted() {
        assert_eq!(check_uri("http://127.0.0.1:5000/").unwrap(), "http://127.0.0.1:5000");
        assert_eq!(check_uri(" HTTPS://mlflow.corp/prefix ").unwrap(), "HTTPS://mlflow.corp/prefix");
        for bad in ["file:///tmp/mlruns", "sqlite:///mlflow.db", "./mlruns", "databricks", "localhost:5000", "http://"] {
            assert!(check_uri(bad).is_err(), "{bad}");
        }
        assert!(check_uri("file:///x").unwrap_err().contains("http://"));
    }
}
