//! The interpreter's side, run on its own thread only: start Python with the
//! `sys.path` of the interpreter the user named, import the module, read what it
//! declares, and run calls, turning arguments into Python objects and answers back.

use std::{path::PathBuf, process::Command};

use ptrain_plugin_api::Cadence;
use pyo3::{
    prelude::*,
    types::{PyDict, PyList, PyModule},
};

use crate::{
    call::{Args, Function, Returned, StepArgs},
    dlpack,
};

/// The module as loaded: its functions, and `torch.from_dlpack` when a hook takes tensors.
pub struct Loaded {
    pub functions: Vec<(Function, Py<PyAny>)>,
    from_dlpack: Option<Py<PyAny>>,
}

/// What the module declares: each scheduled function it defines, with its cadence
/// (`EVERY`, or the function's default).
pub type Declared = Vec<(Function, Cadence)>;

/// The interpreter whose `sys.path` (a venv's site-packages, `.pth` files,
/// `PYTHONPATH`) the embedded one takes: `PTRAIN_PYTHON`, else the one the plugin was built with.
pub fn interpreter() -> PathBuf {
    std::env::var_os("PTRAIN_PYTHON").filter(|p| !p.is_empty()).map_or_else(|| PathBuf::from(env!("PTRAIN_BUILD_PYTHON")), PathBuf::from)
}

/// Asks `python` for its version and `sys.path` (a subprocess: once, at load).
fn search_path(python: &PathBuf) -> Result<(String, Vec<String>), String> {
    let script = "import sys, json; print(json.dumps(['%d.%d' % sys.version_info[:2], sys.path[1:]]))";
    let out = Command::new(python).args(["-c", script]).output().map_err(|e| format!("cannot run {} (PTRAIN_PYTHON): {e}", python.display()))?;
    if !out.status.success() {
        return Err(format!("{} (PTRAIN_PYTHON) failed: {}", python.display(), String::from_utf8_lossy(&out.stderr).trim()));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("{}: unreadable sys.path: {e}", python.display()))
}

/// An exception as one line: its type, message and the module's line that raised it.
fn describe(py: Python<'_>, e: PyErr) -> String {
    let kind = e.get_type(py).name().map_or_else(|_| "Exception".to_string(), |n| n.to_string());
    let traceback = e.traceback(py).and_then(|tb| tb.format().ok()).unwrap_or_default();
    let at = traceback.lines().rev().find(|l| l.trim_start().starts_with("File ")).map(|l| l.trim().to_string());
    let message = format!("{kind}: {}", e.value(py)).replace('\n', " ");
    match at {
        Some(at) => format!("{message} ({at})"),
        None => message,
    }
}

/// Makes libpython's symbols global. The host loads this plugin, and with it libpython,
/// with `RTLD_LOCAL`: extension modules (`_ctypes`, torch's `_C`) then find no `PyTuple_Type`.
/// Opening libpython again with `RTLD_GLOBAL | RTLD_NOLOAD` promotes the loaded copy.
fn share_libpython() -> Result<(), String> {
    let symbol = pyo3::ffi::Py_IsInitialized as *const libc::c_void;
    // SAFETY: `dladdr` only reads the loader's tables; `info` is plain data it fills.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: as above; a return of 0 leaves `info` unset, checked next.
    if unsafe { libc::dladdr(symbol, &mut info) } == 0 || info.dli_fname.is_null() {
        return Err("cannot find the loaded libpython".into());
    }
    // SAFETY: `dli_fname` is the path of a loaded library, NUL-terminated, owned by the
    // loader; RTLD_NOLOAD only changes the flags of that already loaded library.
    let handle = unsafe { libc::dlopen(info.dli_fname, libc::RTLD_NOW | libc::RTLD_GLOBAL | libc::RTLD_NOLOAD) };
    if handle.is_null() {
        return Err("cannot make libpython's symbols global (dlopen RTLD_NOLOAD failed)".into());
    }
    Ok(())
}

/// One entry of `EVERY`: a number of steps, or a dict of the host's cadence keys.
fn cadence(function: Function, value: &Bound<'_, PyAny>) -> Result<Cadence, String> {
    let bad = |what: String| format!("EVERY[\"{}\"]: {what}", function.name());
    if let Ok(steps) = value.extract::<u64>() {
        return Ok(Cadence::every(steps));
    }
    let dict = value.cast::<PyDict>().map_err(|_| bad(format!("{value}: a number of steps or a dict (every, every_secs, first_step, at_end)")))?;
    let mut c = Cadence::NEVER;
    for (key, v) in dict.iter() {
        let key: String = key.extract().map_err(|_| bad("keys are strings".into()))?;
        let flag = || v.extract::<bool>().map_err(|_| bad(format!("{key} = {v}: true or false")));
        match key.as_str() {
            "every" => c.every_steps = v.extract().map_err(|_| bad(format!("every = {v}: a number of steps >= 0")))?,
            "every_secs" => c.every_secs = v.extract().map_err(|_| bad(format!("every_secs = {v}: seconds")))?,
            "first_step" => c.first_step = flag()?,
            "at_eval" => c.at_eval = flag()?,
            "at_checkpoint" => c.at_checkpoint = flag()?,
            "at_end" => c.at_end = flag()?,
            other => return Err(bad(format!("unknown key `{other}`; it takes every, every_secs, first_step, at_eval, at_checkpoint, at_end"))),
        }
    }
    Ok(c)
}

/// A function's cadence when `EVERY` does not name it: sinks like the built-in ones,
/// `on_eval` and `on_checkpoint` when those happen; a step hook has none (every step
/// is a cost the module should choose).
fn default_cadence(function: Function) -> Option<Cadence> {
    match function {
        Function::Metrics => Some(Cadence::every(10).with_end()),
        Function::Eval => Some(Cadence::NEVER.with_eval()),
        Function::Checkpoint => Some(Cadence::NEVER.with_checkpoint()),
        _ => None,
    }
}

/// Starts the interpreter (once per process), makes `ptrain` importable, puts
/// `paths` first on `sys.path` and imports `module`.
pub fn load(module: &str, paths: &[PathBuf]) -> Result<(Loaded, Declared), String> {
    let python = interpreter();
    let (version, sys_path) = search_path(&python)?;
    share_libpython()?;
    Python::initialize();
    Python::attach(|py| {
        let ours = py.version_info();
        if version != format!("{}.{}", ours.major, ours.minor) {
            return Err(format!(
                "{} (PTRAIN_PYTHON) is Python {version}, but this plugin embeds Python {}.{}: point PTRAIN_PYTHON at a {}.{} interpreter, or rebuild the plugin with it (PYO3_PYTHON)",
                python.display(),
                ours.major,
                ours.minor,
                ours.major,
                ours.minor
            ));
        }
        let fail = |e: PyErr| describe(py, e);
        let sys = py.import("sys").map_err(fail)?;
        let path: Bound<'_, PyList> = sys.getattr("path").and_then(|p| p.cast_into().map_err(Into::into)).map_err(fail)?;
        for entry in sys_path.iter().rev() {
            if !path.contains(entry).map_err(fail)? {
                path.insert(0, entry).map_err(fail)?;
            }
        }
        for dir in paths.iter().rev() {
            path.insert(0, dir.display().to_string()).map_err(fail)?;
        }
        sys.setattr("executable", python.display().to_string()).map_err(fail)?;
        crate::host_module::install(py).map_err(fail)?;
        let user = py.import(module).map_err(|e| format!("cannot import `{module}`: {}", describe(py, e)))?;
        declare(py, &user)
    })
}

fn declare(py: Python<'_>, module: &Bound<'_, PyModule>) -> Result<(Loaded, Declared), String> {
    let fail = |e: PyErr| describe(py, e);
    let every = match module.getattr("EVERY") {
        Ok(every) => Some(every.cast_into::<PyDict>().map_err(|_| "EVERY must be a dict: {\"on_step_end\": 50, ...}".to_string())?),
        Err(_) => None,
    };
    let (mut functions, mut declared) = (Vec::new(), Vec::new());
    for function in Function::SCHEDULED.into_iter().chain([Function::RunStart, Function::RunEnd]) {
        let Ok(f) = module.getattr(function.name()) else { continue };
        if !f.is_callable() {
            return Err(format!("`{}` is not a function", function.name()));
        }
        functions.push((function, f.unbind()));
        if !Function::SCHEDULED.contains(&function) {
            continue;
        }
        let given = every.as_ref().map(|e| e.get_item(function.name())).transpose().map_err(fail)?.flatten();
        let cadence = match (given, default_cadence(function)) {
            (Some(value), _) => cadence(function, &value)?,
            (None, Some(default)) => default,
            (None, None) => {
                return Err(format!("`{0}` has no cadence: declare how often it runs, EVERY = {{\"{0}\": 50}} (every 50 steps)", function.name()))
            }
        };
        declared.push((function, cadence));
    }
    if let Some(every) = &every {
        for key in every.keys() {
            let key: String = key.extract().map_err(fail)?;
            if !declared.iter().any(|(f, _)| f.name() == key) {
                return Err(format!("EVERY names `{key}`, which the module does not define (or which takes no cadence)"));
            }
        }
    }
    if functions.is_empty() {
        let names: Vec<&str> = Function::SCHEDULED.iter().chain(&[Function::RunStart, Function::RunEnd]).map(|f| f.name()).collect();
        return Err(format!("the module defines none of the functions the plugin calls: {}", names.join(", ")));
    }
    let from_dlpack = match functions.iter().any(|(f, _)| f.takes_tensors()) {
        true => {
            Some(py.import("torch").and_then(|t| t.getattr("from_dlpack")).map_err(|e| format!("cannot import torch: {}", describe(py, e)))?.unbind())
        }
        false => None,
    };
    Ok((Loaded { functions, from_dlpack }, declared))
}

fn json_to_py<'py>(py: Python<'py>, value: &serde_json::Value) -> PyResult<Bound<'py, PyAny>> {
    use pyo3::IntoPyObjectExt;
    Ok(match value {
        serde_json::Value::Null => py.None().into_bound(py),
        serde_json::Value::Bool(b) => b.into_bound_py_any(py)?,
        serde_json::Value::Number(n) => match n.as_u64() {
            Some(u) => u.into_bound_py_any(py)?,
            None => n.as_f64().unwrap_or(f64::NAN).into_bound_py_any(py)?,
        },
        serde_json::Value::String(s) => s.into_bound_py_any(py)?,
        serde_json::Value::Array(items) => PyList::new(py, items.iter().map(|v| json_to_py(py, v)).collect::<PyResult<Vec<_>>>()?)?.into_any(),
        serde_json::Value::Object(map) => {
            let dict = PyDict::new(py);
            for (k, v) in map {
                dict.set_item(k, json_to_py(py, v)?)?;
            }
            dict.into_any()
        }
    })
}

fn py_to_json(value: &Bound<'_, PyAny>) -> PyResult<serde_json::Value> {
    let json = value.py().import("json")?;
    let text: String = json.call_method1("dumps", (value,))?.extract()?;
    serde_json::from_str(&text).map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))
}

fn step_dict<'py>(py: Python<'py>, loaded: &Loaded, args: StepArgs) -> PyResult<Bound<'py, PyDict>> {
    let ctx = PyDict::new(py);
    ctx.set_item("hook", args.hook)?;
    for (name, value) in args.counters {
        ctx.set_item(name, value)?;
    }
    for (name, value) in args.numbers {
        ctx.set_item(name, value)?;
    }
    let scalars = PyDict::new(py);
    for (name, value) in args.scalars {
        scalars.set_item(name, value)?;
    }
    ctx.set_item("scalars", scalars)?;
    let Some(from_dlpack) = loaded.from_dlpack.as_ref().map(|f| f.bind(py)) else { return Ok(ctx) };
    for (name, tensor) in args.tensors {
        ctx.set_item(name, dlpack::to_torch(py, from_dlpack, tensor)?)?;
    }
    for (key, named) in [("params", args.params), ("grads", args.grads)] {
        if named.is_empty() {
            continue;
        }
        let dict = PyDict::new(py);
        for (name, tensor) in named {
            match tensor {
                Some(tensor) => dict.set_item(name, dlpack::to_torch(py, from_dlpack, tensor)?)?,
                None => dict.set_item(name, py.None())?,
            }
        }
        ctx.set_item(key, dict)?;
    }
    Ok(ctx)
}

/// Runs `function` with `args`; an exception comes back as its type, message and
/// the line of the module that raised it.
pub fn run(loaded: &Loaded, function: Function, args: Args) -> Result<Returned, String> {
    Python::attach(|py| {
        let Some((_, f)) = loaded.functions.iter().find(|(f, _)| *f == function) else { return Ok(Returned::Scalars(Vec::new())) };
        let f = f.bind(py);
        let result = match args {
            Args::Json(value) => json_to_py(py, &value).and_then(|v| f.call1((v,))),
            Args::Step(step) => step_dict(py, loaded, *step).and_then(|ctx| f.call1((ctx,))),
            Args::Metrics { step, scalars, texts } => {
                let metrics = PyDict::new(py);
                let filled = scalars.into_iter().try_for_each(|(k, v)| metrics.set_item(k, v));
                let filled = filled.and_then(|()| texts.into_iter().try_for_each(|(k, v)| metrics.set_item(k, v)));
                filled.and_then(|()| f.call1((step, metrics)))
            }
            Args::Checkpoint { step, reason } => f.call1((step, reason)),
        };
        let returned = result.map_err(|e| describe(py, e))?;
        returned_value(function, &returned).map_err(|e| format!("{}: {}", function.name(), describe(py, e)))
    })
}

/// A step hook's returned dict: scalars to emit; `on_run_end`'s: a summary fragment.
fn returned_value(function: Function, value: &Bound<'_, PyAny>) -> PyResult<Returned> {
    if value.is_none() {
        return Ok(match function {
            Function::RunEnd => Returned::Json(None),
            _ => Returned::Scalars(Vec::new()),
        });
    }
    if function == Function::RunEnd {
        return py_to_json(value).map(|v| Returned::Json(Some(v)));
    }
    let dict = value
        .cast::<PyDict>()
        .map_err(|_| pyo3::exceptions::PyTypeError::new_err(format!("returned {value}: return a dict of metrics {{name: number}} or None")))?;
    let mut scalars = Vec::with_capacity(dict.len());
    for (k, v) in dict.iter() {
        let name: String = k.extract()?;
        let number: f64 = v.extract().map_err(|_| pyo3::exceptions::PyTypeError::new_err(format!("returned {name} = {v}: a number")))?;
        scalars.push((name, number));
    }
    Ok(Returned::Scalars(scalars))
}
