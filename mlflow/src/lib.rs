//! MLflow for ptrain without the Python client: the tracking server's REST API, the
//! items a run sends, and `<run-dir>/mlflow/` (the run id and what is still to send).
//!
//! The `mlflow` plugin (plugins/mlflow) sends items from its own thread and appends
//! what the server does not take to `pending.jsonl`; `ptrain sync mlflow` sends that
//! file later with [`sync::sync`]. Neither needs the other: the binary never loads the
//! plugin to sync.

pub mod auth;
pub mod client;
pub mod item;
pub mod send;
pub mod state;
pub mod sync;

pub use auth::{check_uri, Auth};
pub use client::{Client, Error, ErrorKind, RunRef};
pub use item::{Item, KeyValue, MetricPoint, RunStatus};
pub use state::{RunRecord, StateDir};
