//! The subset of `wandb_internal.proto` (wandb 0.31) that an offline run needs,
//! written out by hand so the crate builds without `protoc`. Field numbers are
//! W&B's; `wandb sync` ignores what is not written.

use prost::{Message, Oneof};

#[derive(Clone, PartialEq, Message)]
pub struct Record {
    #[prost(int64, tag = "1")]
    pub num: i64,
    #[prost(oneof = "RecordType", tags = "2, 3, 5, 6, 17, 18, 21")]
    pub record_type: Option<RecordType>,
}

#[derive(Clone, PartialEq, Oneof)]
pub enum RecordType {
    #[prost(message, tag = "2")]
    History(HistoryRecord),
    #[prost(message, tag = "3")]
    Summary(SummaryRecord),
    #[prost(message, tag = "5")]
    Config(ConfigRecord),
    #[prost(message, tag = "6")]
    Files(FilesRecord),
    // Boxed: a run record is written once, history records thousands of times.
    #[prost(message, tag = "17")]
    Run(Box<RunRecord>),
    #[prost(message, tag = "18")]
    Exit(RunExitRecord),
    #[prost(message, tag = "21")]
    Header(HeaderRecord),
}

/// History, summary and config items share this shape: a key (or a path of keys)
/// and a JSON-encoded value.
#[derive(Clone, PartialEq, Message)]
pub struct Item {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(string, repeated, tag = "2")]
    pub nested_key: Vec<String>,
    #[prost(string, tag = "16")]
    pub value_json: String,
}

impl Item {
    pub fn new(key: impl Into<String>, value_json: impl Into<String>) -> Item {
        Item { key: key.into(), nested_key: Vec::new(), value_json: value_json.into() }
    }

    pub fn nested(path: &[&str], value_json: impl Into<String>) -> Item {
        Item { key: String::new(), nested_key: path.iter().map(|s| s.to_string()).collect(), value_json: value_json.into() }
    }
}

#[derive(Clone, PartialEq, Message)]
pub struct HistoryRecord {
    #[prost(message, repeated, tag = "1")]
    pub item: Vec<Item>,
    #[prost(message, optional, tag = "2")]
    pub step: Option<HistoryStep>,
}

#[derive(Clone, PartialEq, Message)]
pub struct HistoryStep {
    #[prost(int64, tag = "1")]
    pub num: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct SummaryRecord {
    #[prost(message, repeated, tag = "1")]
    pub update: Vec<Item>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ConfigRecord {
    #[prost(message, repeated, tag = "1")]
    pub update: Vec<Item>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Timestamp {
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

impl Timestamp {
    pub fn from_unix(secs: f64) -> Timestamp {
        let whole = secs.floor();
        Timestamp { seconds: whole as i64, nanos: ((secs - whole) * 1e9) as i32 }
    }
}

#[derive(Clone, PartialEq, Message)]
pub struct RunRecord {
    #[prost(string, tag = "1")]
    pub run_id: String,
    #[prost(string, tag = "2")]
    pub entity: String,
    #[prost(string, tag = "3")]
    pub project: String,
    #[prost(message, optional, tag = "4")]
    pub config: Option<ConfigRecord>,
    #[prost(string, tag = "6")]
    pub run_group: String,
    #[prost(string, tag = "7")]
    pub job_type: String,
    #[prost(string, tag = "8")]
    pub display_name: String,
    #[prost(string, tag = "9")]
    pub notes: String,
    #[prost(string, repeated, tag = "10")]
    pub tags: Vec<String>,
    #[prost(string, tag = "13")]
    pub host: String,
    #[prost(int64, tag = "14")]
    pub starting_step: i64,
    #[prost(message, optional, tag = "17")]
    pub start_time: Option<Timestamp>,
    /// Continue an existing run: `wandb sync` then asks the server how many history
    /// lines it has and appends after them instead of overwriting from line 0.
    #[prost(bool, tag = "24")]
    pub resume: bool,
}

#[derive(Clone, PartialEq, Message)]
pub struct RunExitRecord {
    #[prost(int32, tag = "1")]
    pub exit_code: i32,
    #[prost(int32, tag = "2")]
    pub runtime: i32,
}

#[derive(Clone, PartialEq, Message)]
pub struct HeaderRecord {
    #[prost(message, optional, tag = "1")]
    pub version_info: Option<VersionInfo>,
}

#[derive(Clone, PartialEq, Message)]
pub struct VersionInfo {
    #[prost(string, tag = "1")]
    pub producer: String,
    #[prost(string, tag = "2")]
    pub min_consumer: String,
}

/// Files of the run directory's `files/` for `wandb sync` to upload (a logged table's).
#[derive(Clone, PartialEq, Message)]
pub struct FilesRecord {
    #[prost(message, repeated, tag = "1")]
    pub files: Vec<FilesItem>,
}

/// A file by its path under `files/`; its policy is left at 0, `NOW` (upload it now).
#[derive(Clone, PartialEq, Message)]
pub struct FilesItem {
    #[prost(string, tag = "1")]
    pub path: String,
}
