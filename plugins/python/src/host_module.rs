//! The `ptrain` module a Python plugin imports to talk to the run: ask it to stop
//! (as done, or as failed) and log through ptrain's log.

use std::sync::Mutex;

use ptrain_plugin_api::{HostApi, LogLevel};
use pyo3::{prelude::*, types::PyModule};

/// The run's host, set when the plugin is created (one plugin per process).
static HOST: Mutex<Option<HostApi>> = Mutex::new(None);

pub const PLUGIN: &str = "python";

pub fn set_host(host: HostApi) {
    *HOST.lock().unwrap_or_else(|e| e.into_inner()) = Some(host);
}

fn with_host(f: impl FnOnce(&HostApi)) {
    if let Some(host) = HOST.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
        f(host);
    }
}

/// Ends the run after the current step, as done (exit 0): an early stop.
#[pyfunction]
fn request_stop(reason: &str) {
    with_host(|host| host.request_stop(PLUGIN, reason));
}

/// Ends the run after the current step as failed (an emergency checkpoint, exit 1).
#[pyfunction]
fn request_failure_stop(reason: &str) {
    with_host(|host| host.request_failure_stop(PLUGIN, reason));
}

/// Logs `message` in ptrain's log: level `debug`, `info`, `warn` or `error`.
#[pyfunction]
#[pyo3(signature = (message, level = "info"))]
fn log(message: &str, level: &str) -> PyResult<()> {
    let level = match level {
        "debug" => LogLevel::Debug,
        "info" => LogLevel::Info,
        "warn" | "warning" => LogLevel::Warn,
        "error" => LogLevel::Error,
        other => return Err(pyo3::exceptions::PyValueError::new_err(format!("level `{other}`: debug, info, warn or error"))),
    };
    with_host(|host| host.log(level, PLUGIN, message));
    Ok(())
}

/// Registers `ptrain` in `sys.modules`, so `import ptrain` finds it.
pub fn install(py: Python<'_>) -> PyResult<()> {
    let module = PyModule::new(py, "ptrain")?;
    module.add_function(wrap_pyfunction!(request_stop, &module)?)?;
    module.add_function(wrap_pyfunction!(request_failure_stop, &module)?)?;
    module.add_function(wrap_pyfunction!(log, &module)?)?;
    py.import("sys")?.getattr("modules")?.set_item("ptrain", module)
}
