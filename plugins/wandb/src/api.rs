//! The W&B HTTP calls a run needs, as the official client makes them: GraphQL
//! `UpsertBucket` to create the run, `file_stream` POSTs of history lines, and for a
//! logged file (a table) GraphQL `CreateRunFiles` for its upload URL, then a PUT of
//! its bytes there. Basic auth with user `api` and the API key, except on the PUT: an
//! upload URL is signed (a cloud bucket's), and the key never goes to the bucket.

use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::json;

use crate::meta::RunMeta;

/// Why a call failed: worth retrying (network, 429, 5xx) or not (auth, bad request).
#[derive(Debug)]
pub enum Failure {
    Retry(String),
    Fatal(String),
}

pub struct Api {
    agent: ureq::Agent,
    base_url: String,
    auth: String,
    /// Requests are cut off here (the end of the run's upload time).
    deadline: Option<Instant>,
}

/// The longest a request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

const UPSERT_BUCKET: &str = "mutation UpsertBucket($id: String, $name: String, $project: String, $entity: String, \
$groupName: String, $notes: String, $displayName: String, $config: JSONString, $host: String, $jobType: String, $tags: [String!]) {
  upsertBucket(input: {id: $id, name: $name, groupName: $groupName, modelName: $project, entityName: $entity, notes: $notes, \
displayName: $displayName, config: $config, host: $host, jobType: $jobType, tags: $tags}) {
    bucket { id name displayName project { id name entity { id name } } }
    inserted
  }
}";

const RUN_RESUME_STATUS: &str = "query RunResumeStatus($project: String, $entity: String, $name: String!) {
  model(name: $project, entityName: $entity) {
    id name entity { id name }
    bucket(name: $name, missingOk: true) { id name historyLineCount }
  }
}";

const CREATE_RUN_FILES: &str = "mutation CreateRunFiles($entity: String!, $project: String!, $run: String!, $files: [String!]!) {
  createRunFiles(input: {entityName: $entity, projectName: $project, runName: $run, files: $files}) {
    runID
    uploadHeaders
    files { name uploadUrl }
  }
}";

/// Where to PUT one file's bytes, with the headers the server asks the PUT to carry.
#[derive(Debug, Clone, PartialEq)]
pub struct UploadUrl {
    pub url: String,
    pub headers: Vec<(String, String)>,
}

/// Where the run's files live: `<entity>/<project>/<run id>`.
#[derive(Debug, Clone, PartialEq)]
pub struct RunPath {
    pub entity: String,
    pub project: String,
    pub id: String,
}

impl Api {
    pub fn new(base_url: &str, api_key: &str) -> Api {
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(10))
            .timeout(REQUEST_TIMEOUT)
            .try_proxy_from_env(true)
            .user_agent(concat!("ptrain-plugin-wandb/", env!("CARGO_PKG_VERSION")))
            .build();
        let auth = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("api:{api_key}")));
        Api { agent, base_url: base_url.to_string(), auth, deadline: None }
    }

    /// Cuts every later request off at `deadline`: the plugin's worker thread, which
    /// makes them, must not outlast the time the end of the run gives the upload.
    pub fn set_deadline(&mut self, deadline: Option<Instant>) {
        self.deadline = deadline;
    }

    fn post(&self, path: &str, body: &serde_json::Value) -> Result<serde_json::Value, Failure> {
        let url = format!("{}{path}", self.base_url);
        let request = self.agent.post(&url).set("Authorization", &self.auth).set("Content-Type", "application/json");
        let text = self.send(request, &url, body.to_string().as_bytes())?;
        Ok(serde_json::from_str(&text).unwrap_or(serde_json::Value::Null))
    }

    /// Sends `request` with `body` within the deadline; answers the response's text.
    fn send(&self, request: ureq::Request, url: &str, body: &[u8]) -> Result<String, Failure> {
        let timeout = self.deadline.map_or(REQUEST_TIMEOUT, |d| d.saturating_duration_since(Instant::now()).min(REQUEST_TIMEOUT));
        match request.timeout(timeout).send_bytes(body) {
            Ok(r) => r.into_string().map_err(|e| Failure::Retry(format!("{url}: reading the response: {e}"))),
            Err(ureq::Error::Status(code, r)) => {
                let detail: String = r.into_string().unwrap_or_default().chars().take(200).collect();
                let message = format!("{url}: HTTP {code} {detail}");
                if code == 429 || code == 408 || code >= 500 {
                    Err(Failure::Retry(message))
                } else {
                    Err(Failure::Fatal(message))
                }
            }
            Err(ureq::Error::Transport(t)) => Err(Failure::Retry(format!("{url}: {t}"))),
        }
    }

    /// Creates (or updates) the run with its config; answers where it lives.
    pub fn upsert_run(&self, meta: &RunMeta) -> Result<RunPath, Failure> {
        // W&B stores config values wrapped: `{"key": {"value": ...}}`.
        let config: serde_json::Map<String, serde_json::Value> = meta.config.iter().map(|(k, v)| (k.clone(), json!({ "value": v }))).collect();
        let variables = json!({
            "name": meta.id,
            "project": meta.project,
            "entity": meta.entity,
            "groupName": meta.group,
            "notes": meta.notes,
            "displayName": meta.display_name,
            "config": serde_json::Value::Object(config).to_string(),
            "host": meta.host,
            "jobType": meta.job_type,
            "tags": meta.tags,
        });
        let answer = self.post("/graphql", &json!({ "query": UPSERT_BUCKET, "variables": variables }))?;
        if let Some(errors) = answer.get("errors").filter(|e| !e.is_null()) {
            return Err(Failure::Fatal(format!("UpsertBucket: {errors}")));
        }
        let project = &answer["data"]["upsertBucket"]["bucket"]["project"];
        let (Some(project_name), Some(entity)) = (project["name"].as_str(), project["entity"]["name"].as_str()) else {
            return Err(Failure::Fatal(format!("UpsertBucket: unexpected answer {answer}")));
        };
        Ok(RunPath { entity: entity.to_string(), project: project_name.to_string(), id: meta.id.clone() })
    }

    /// How many history lines the server already has for this run (0 for none),
    /// so that a resumed run appends after them.
    pub fn history_line_count(&self, meta: &RunMeta) -> Result<u64, Failure> {
        let variables = json!({ "project": meta.project, "entity": meta.entity, "name": meta.id });
        let answer = self.post("/graphql", &json!({ "query": RUN_RESUME_STATUS, "variables": variables }))?;
        if let Some(errors) = answer.get("errors").filter(|e| !e.is_null()) {
            return Err(Failure::Fatal(format!("RunResumeStatus: {errors}")));
        }
        Ok(answer["data"]["model"]["bucket"]["historyLineCount"].as_u64().unwrap_or(0))
    }

    /// Asks where to upload the run's file `name` (a path under the run's files, such
    /// as `media/table/...`). A refusal in the answer is fatal for this file.
    pub fn create_run_file(&self, run: &RunPath, name: &str) -> Result<UploadUrl, Failure> {
        let variables = json!({ "entity": run.entity, "project": run.project, "run": run.id, "files": [name] });
        let answer = self.post("/graphql", &json!({ "query": CREATE_RUN_FILES, "variables": variables }))?;
        if let Some(errors) = answer.get("errors").filter(|e| !e.is_null()) {
            return Err(Failure::Fatal(format!("CreateRunFiles {name}: {errors}")));
        }
        let created = &answer["data"]["createRunFiles"];
        let file = created["files"].as_array().and_then(|files| files.iter().find(|f| f["name"] == name));
        let Some(url) = file.and_then(|f| f["uploadUrl"].as_str()) else {
            return Err(Failure::Fatal(format!("CreateRunFiles {name}: no upload URL in {answer}")));
        };
        // The headers come as "Name:value" strings, as the official client reads them.
        let headers = created["uploadHeaders"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|h| h.as_str()?.split_once(':'))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect();
        Ok(UploadUrl { url: url.to_string(), headers })
    }

    /// PUTs a file's `bytes` to its upload URL.
    pub fn put_file(&self, upload: &UploadUrl, bytes: &[u8]) -> Result<(), Failure> {
        let request = upload.headers.iter().fold(self.agent.put(&upload.url), |r, (k, v)| r.set(k, v));
        self.send(request, &upload.url, bytes).map(|_| ())
    }

    /// Appends `lines` to the run's history at `offset`, and tells the server which of
    /// the run's files were `uploaded` since the last call (as the official client
    /// does); the last call says `complete`.
    pub fn file_stream(
        &self,
        run: &RunPath,
        offset: u64,
        lines: &[String],
        summary: Option<&str>,
        uploaded: &[String],
        exit_code: Option<i32>,
    ) -> Result<(), Failure> {
        let mut files = serde_json::Map::new();
        if !lines.is_empty() {
            files.insert("wandb-history.jsonl".into(), json!({ "offset": offset, "content": lines }));
        }
        if let Some(summary) = summary {
            files.insert("wandb-summary.json".into(), json!({ "offset": 0, "content": [summary] }));
        }
        let mut body = json!({ "files": files });
        if !uploaded.is_empty() {
            body["uploaded"] = json!(uploaded);
        }
        if let Some(code) = exit_code {
            body["complete"] = json!(true);
            body["exitcode"] = json!(code);
        }
        self.post(&format!("/files/{}/{}/{}/file_stream", run.entity, run.project, run.id), &body).map(|_| ())
    }
}
