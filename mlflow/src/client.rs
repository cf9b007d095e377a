//! The calls of MLflow's tracking REST API (`/api/2.0/mlflow/...`) a training run
//! needs, and artifact uploads through the server's proxy (`mlflow-artifacts:`).

use std::{
    collections::BTreeMap,
    path::PathBuf,
    time::{Duration, Instant},
};

use serde_json::{json, Value};

use crate::{
    auth::Auth,
    item::{KeyValue, MetricPoint, RunStatus},
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// No answer: connection refused, DNS, timeout. Worth retrying.
    Unreachable,
    /// HTTP 5xx, 408 or 429. Worth retrying.
    Server,
    /// HTTP 401 or 403: the credentials are wrong or lack permission.
    Auth,
    /// `RESOURCE_DOES_NOT_EXIST`.
    NotFound,
    /// `RESOURCE_ALREADY_EXISTS`.
    AlreadyExists,
    /// Any other refusal (HTTP 400 with `INVALID_PARAMETER_VALUE`, ...): sending it again
    /// will not help.
    Rejected,
}

#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
}

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error { kind, message: message.into() }
    }

    /// Network trouble or a failing server: retry later.
    pub fn is_transient(&self) -> bool {
        matches!(self.kind, ErrorKind::Unreachable | ErrorKind::Server)
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// A run as the server knows it.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRef {
    pub run_id: String,
    pub experiment_id: String,
    pub artifact_uri: String,
}

/// What `runs/get` says about a run.
#[derive(Debug, Clone)]
pub struct RunData {
    pub run: RunRef,
    pub status: String,
    pub params: BTreeMap<String, String>,
}

pub struct Client {
    agent: ureq::Agent,
    uri: String,
    auth: Auth,
    timeout: Duration,
    /// No request runs past this (the end of a run's bounded wait).
    deadline: Option<Instant>,
}

impl Client {
    /// `uri` as [`crate::auth::check_uri`] returns it; `timeout` bounds each call.
    pub fn new(uri: &str, auth: Auth, timeout: Duration) -> Client {
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(timeout.min(Duration::from_secs(10)))
            .timeout(timeout)
            .try_proxy_from_env(true)
            .user_agent(concat!("ptrain-mlflow/", env!("CARGO_PKG_VERSION")))
            .build();
        Client { agent, uri: uri.trim_end_matches('/').to_string(), auth, timeout, deadline: None }
    }

    /// Cuts every later request off at `deadline`: the plugin's worker thread, which
    /// makes them, must not outlast the time the end of the run gives the upload.
    pub fn set_deadline(&mut self, deadline: Option<Instant>) {
        self.deadline = deadline;
    }

    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// Where people look at the run: the server's UI.
    pub fn run_url(&self, run: &RunRef) -> String {
        format!("{}/#/experiments/{}/runs/{}", self.uri, run.experiment_id, run.run_id)
    }

    fn request(&self, method: &str, url: &str) -> ureq::Request {
        // A passed deadline leaves a millisecond: the request fails at once as timed out.
        let left = self.deadline.map(|d| d.saturating_duration_since(Instant::now()).max(Duration::from_millis(1)));
        let request = self.agent.request(method, url).timeout(left.map_or(self.timeout, |l| l.min(self.timeout)));
        match self.auth.header() {
            Some(header) => request.set("Authorization", &header),
            None => request,
        }
    }

    /// One call of the tracking API; the answer's JSON.
    pub fn call(&self, method: &str, endpoint: &str, query: &[(&str, &str)], body: Option<&Value>) -> Result<Value> {
        let url = format!("{}/api/2.0/mlflow/{endpoint}", self.uri);
        let mut request = self.request(method, &url);
        for (k, v) in query {
            request = request.query(k, v);
        }
        let response = match body {
            Some(body) => request.set("Content-Type", "application/json").send_string(&body.to_string()),
            None => request.call(),
        };
        let text = self.answer(method, &url, response)?;
        Ok(serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    fn answer(&self, method: &str, url: &str, response: std::result::Result<ureq::Response, ureq::Error>) -> Result<String> {
        match response {
            Ok(r) => r.into_string().map_err(|e| Error::new(ErrorKind::Unreachable, format!("{method} {url}: reading the answer: {e}"))),
            Err(ureq::Error::Status(code, r)) => {
                let text = r.into_string().unwrap_or_default();
                let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                let error_code = body["error_code"].as_str().unwrap_or("");
                let detail = body["message"].as_str().map(str::to_string).unwrap_or_else(|| text.trim().chars().take(200).collect());
                let kind = match (code, error_code) {
                    (401 | 403, _) => ErrorKind::Auth,
                    (408 | 429, _) | (500.., _) => ErrorKind::Server,
                    (_, "RESOURCE_DOES_NOT_EXIST") | (404, _) => ErrorKind::NotFound,
                    (_, "RESOURCE_ALREADY_EXISTS") => ErrorKind::AlreadyExists,
                    _ => ErrorKind::Rejected,
                };
                let detail: String = detail.chars().take(300).collect();
                let message = if kind == ErrorKind::Auth {
                    format!("{} refused the credentials (HTTP {code} on {method} {url}: {detail}); {}", self.uri, self.auth.hint())
                } else {
                    format!("{method} {url}: HTTP {code} {error_code}: {detail}")
                };
                Err(Error::new(kind, message))
            }
            Err(ureq::Error::Transport(t)) => {
                // ureq's own text repeats the URL; the kind and the cause say it all.
                let cause = std::error::Error::source(&t).map(|c| c.to_string()).or_else(|| t.message().map(str::to_string)).unwrap_or_default();
                Err(Error::new(ErrorKind::Unreachable, format!("{method} {url}: {}: {cause}", t.kind())))
            }
        }
    }

    /// The id of experiment `name`, created when missing.
    pub fn experiment_id(&self, name: &str) -> Result<String> {
        let get = || self.call("GET", "experiments/get-by-name", &[("experiment_name", name)], None);
        let answer = match get() {
            Err(e) if e.kind == ErrorKind::NotFound => match self.call("POST", "experiments/create", &[], Some(&json!({ "name": name }))) {
                Ok(created) => created,
                // Another client created it between our two calls.
                Err(e) if e.kind == ErrorKind::AlreadyExists => get()?,
                Err(e) => return Err(e),
            },
            other => other?,
        };
        let id = answer["experiment_id"].as_str().or_else(|| answer["experiment"]["experiment_id"].as_str());
        id.map(str::to_string).ok_or_else(|| Error::new(ErrorKind::Rejected, format!("{}: no experiment id in {answer}", self.uri)))
    }

    pub fn create_run(&self, experiment_id: &str, run_name: &str, start_time_ms: i64) -> Result<RunRef> {
        let body = json!({ "experiment_id": experiment_id, "run_name": run_name, "start_time": start_time_ms });
        let answer = self.call("POST", "runs/create", &[], Some(&body))?;
        run_ref(&answer["run"]["info"]).ok_or_else(|| Error::new(ErrorKind::Rejected, format!("runs/create: unexpected answer {answer}")))
    }

    pub fn get_run(&self, run_id: &str) -> Result<RunData> {
        let answer = self.call("GET", "runs/get", &[("run_id", run_id)], None)?;
        let run = &answer["run"];
        let Some(info) = run_ref(&run["info"]) else {
            return Err(Error::new(ErrorKind::Rejected, format!("runs/get: unexpected answer {answer}")));
        };
        let params = run["data"]["params"]
            .as_array()
            .map(|ps| ps.iter().filter_map(|p| Some((p["key"].as_str()?.to_string(), p["value"].as_str().unwrap_or("").to_string()))).collect())
            .unwrap_or_default();
        Ok(RunData { run: info, status: run["info"]["status"].as_str().unwrap_or("").to_string(), params })
    }

    pub fn update_run(&self, run_id: &str, status: RunStatus, end_time_ms: Option<i64>) -> Result<()> {
        let mut body = json!({ "run_id": run_id, "status": status.as_str() });
        if let Some(end) = end_time_ms {
            body["end_time"] = json!(end);
        }
        self.call("POST", "runs/update", &[], Some(&body)).map(|_| ())
    }

    /// At most the server's limits of each (see [`crate::item`]).
    pub fn log_batch(&self, run_id: &str, metrics: &[MetricPoint], params: &[KeyValue], tags: &[KeyValue]) -> Result<()> {
        let body = json!({ "run_id": run_id, "metrics": metrics, "params": params, "tags": tags });
        self.call("POST", "runs/log-batch", &[], Some(&body)).map(|_| ())
    }

    /// Every stored value of metric `key` of the run.
    pub fn metric_history(&self, run_id: &str, key: &str) -> Result<Vec<MetricPoint>> {
        let mut points = Vec::new();
        let mut token = String::new();
        loop {
            let mut query = vec![("run_id", run_id), ("metric_key", key), ("max_results", "25000")];
            if !token.is_empty() {
                query.push(("page_token", token.as_str()));
            }
            let answer = self.call("GET", "metrics/get-history", &query, None)?;
            if let Some(metrics) = answer.get("metrics") {
                let page: Vec<MetricPoint> =
                    serde_json::from_value(metrics.clone()).map_err(|e| Error::new(ErrorKind::Rejected, format!("metrics/get-history: {e}")))?;
                points.extend(page);
            }
            match answer["next_page_token"].as_str() {
                Some(next) if !next.is_empty() => token = next.to_string(),
                _ => return Ok(points),
            }
        }
    }

    /// Stores `data` as the artifact `name` at the top of the run's artifacts.
    pub fn upload_artifact(&self, artifact_uri: &str, name: &str, data: &[u8]) -> Result<()> {
        match artifact_target(artifact_uri, &self.uri, name)? {
            Target::Http(url) => {
                let response = self.request("PUT", &url).set("Content-Type", content_type(name)).send_bytes(data);
                self.answer("PUT", &url, response).map(|_| ())
            }
            Target::Local(path) => {
                let write = || -> std::io::Result<()> {
                    std::fs::create_dir_all(path.parent().unwrap_or(&path))?;
                    std::fs::write(&path, data)
                };
                write().map_err(|e| Error::new(ErrorKind::Rejected, format!("cannot write the artifact {}: {e}", path.display())))
            }
        }
    }
}

fn run_ref(info: &Value) -> Option<RunRef> {
    Some(RunRef {
        run_id: info["run_id"].as_str().or_else(|| info["run_uuid"].as_str())?.to_string(),
        experiment_id: info["experiment_id"].as_str().unwrap_or("").to_string(),
        artifact_uri: info["artifact_uri"].as_str().unwrap_or("").to_string(),
    })
}

fn content_type(name: &str) -> &'static str {
    match name.rsplit('.').next() {
        Some("json") => "application/json",
        Some("toml") | Some("txt") | Some("log") => "text/plain",
        _ => "application/octet-stream",
    }
}

#[derive(Debug, PartialEq)]
pub enum Target {
    Http(String),
    Local(PathBuf),
}

/// Where the artifact `name` of a run whose artifact root is `artifact_uri` goes, as the
/// Python client resolves it: `mlflow-artifacts:` through the tracking server's proxy,
/// `http(s)://` directly, `file:` and plain paths on this machine.
pub fn artifact_target(artifact_uri: &str, tracking_uri: &str, name: &str) -> Result<Target> {
    if let Some(rest) = artifact_uri.strip_prefix("mlflow-artifacts:") {
        let (authority, path) = match rest.strip_prefix("//") {
            Some(r) => r.split_at(r.find('/').unwrap_or(r.len())),
            None => ("", rest),
        };
        let (scheme, tracking_rest) = tracking_uri.split_once("://").unwrap_or(("http", tracking_uri));
        let (tracking_host, prefix) = tracking_rest.split_at(tracking_rest.find('/').unwrap_or(tracking_rest.len()));
        let host = if authority.is_empty() { tracking_host } else { authority };
        let full = format!("{prefix}/api/2.0/mlflow-artifacts/artifacts/{path}/{name}");
        return Ok(Target::Http(format!("{scheme}://{host}{}", collapse_slashes(&full))));
    }
    if artifact_uri.starts_with("http://") || artifact_uri.starts_with("https://") {
        return Ok(Target::Http(format!("{}/{name}", artifact_uri.trim_end_matches('/'))));
    }
    let local = artifact_uri.strip_prefix("file://").or_else(|| artifact_uri.strip_prefix("file:")).unwrap_or(artifact_uri);
    if local.starts_with('/') {
        return Ok(Target::Local(PathBuf::from(local).join(name)));
    }
    Err(Error::new(
        ErrorKind::Rejected,
        format!(
            "the run's artifact store {artifact_uri:?} is not reachable from ptrain: start the server with --serve-artifacts \
             (mlflow-artifacts:), or use an http(s) or local artifact root"
        ),
    ))
}

fn collapse_slashes(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for c in path.chars() {
        if !(c == '/' && out.ends_with('/')) {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn artifact_uris_resolve_as_the_python_client_does() {
        let t = |uri: &str, tracking: &str| artifact_target(uri, tracking, "summary.json").unwrap();
        assert_eq!(
            t("mlflow-artifacts:/1/abc/artifacts", "http://127.0.0.1:5000"),
            Target::Http("http://127.0.0.1:5000/api/2.0/mlflow-artifacts/artifacts/1/abc/artifacts/summary.json".into())
        );
        assert_eq!(
            t("mlflow-artifacts://other:8080/1/abc/artifacts", "https://mlflow.corp/prefix"),
            Target::Http("https://other:8080/prefix/api/2.0/mlflow-artifacts/artifacts/1/abc/artifacts/summary.json".into())
        );
        assert_eq!(t("http://store/x/", "http://s"), Target::Http("http://store/x/summary.json".into()));
        assert_eq!(t("file:///tmp/art/1/abc/artifacts", "http://s"), Target::Local("/tmp/art/1/abc/artifacts/summary.json".into()));
        assert_eq!(t("/tmp/art/0/abc/artifacts", "http://s"), Target::Local("/tmp/art/0/abc/artifacts/summary.json".into()));
        let err = artifact_target("s3://bucket/x", "http://s", "a").unwrap_err();
        assert_eq!(err.kind, ErrorKind::Rejected);
        assert!(err.message.contains("s3://bucket/x"), "{}", err.message);
    }

    #[test]
    fn a_closed_port_is_unreachable_not_a_refusal() {
        // Reserved and never bound: closed, and no other test listens there.
        let port = ptrain_test_ports::reserve();
        let client = Client::new(&format!("http://127.0.0.1:{port}"), Auth::None, Duration::from_secs(2));
        let err = client.experiment_id("x").unwrap_err();
        assert_eq!(err.kind, ErrorKind::Unreachable, "{err}");
        assert!(err.is_transient());
        assert!(err.message.contains(&port.to_string()), "{err}");
    }
}
