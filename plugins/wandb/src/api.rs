//! The two W&B HTTP calls a run needs, as the official client makes them:
//! GraphQL `UpsertBucket` to create the run, and `file_stream` POSTs of history
//! lines. Basic auth with user `api` and the API key.

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
        let timeout = self.deadline.map_or(REQUEST_TIMEOUT, |d| d.saturating_duration_since(Instant::now()).min(REQUEST_TIMEOUT));
        let response = self
            .agent
            .post(&url)
            .timeout(timeout)
            .set("Authorization", &self.auth)
            .set("Content-Type", "application/json")
            .send_string(&body.to_string());
        match response {
            Ok(r) => {
                let text = r.into_string().map_err(|e| Failure::Retry(format!("{url}: reading the response: {e}")))?;
                Ok(serde_json::from_str(&text).unwrap_or(serde_json::Value::Null))
            }
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

    /// Appends `lines` to the run's history at `offset`; the last call says `complete`.
    pub fn file_stream(&self, run: &RunPath, offset: u64, lines: &[String], summary: Option<&str>, exit_code: Option<i32>) -> Result<(), Failure> {
        let mut files = serde_json::Map::new();
        if !lines.is_empty() {
            files.insert("wandb-history.jsonl".into(), json!({ "offset": offset, "content": lines }));
        }
        if let Some(summary) = summary {
            files.insert("wandb-summary.json".into(), json!({ "offset": 0, "content": [summary] }));
        }
        let mut body = json!({ "files": files });
        if let Some(code) = exit_code {
            body["complete"] = json!(true);
            body["exitcode"] = json!(code);
        }
        self.post(&format!("/files/{}/{}/{}/file_stream", run.entity, run.project, run.id), &body).map(|_| ())
    }
}
