//! The tests' short Python commands (the helpers of tests/support, `python -c` checks)
//! through one fork server, tests/support/pyserver.py: it imports torch, transformers,
//! TRL and the rest once and forks a child per command, which then runs the real helper
//! as `python ARGS...` would, in this process's working directory and environment. A
//! fresh interpreter spends 1.5 to 5 s of CPU importing them; the suite runs a few hundred
//! such commands, in parallel test processes that share the server.
//!
//! The server is started by the first test that needs it (under a file lock, so one
//! starts), listens on a Unix socket in the temporary directory named after what it
//! serves (the venv's Python, this checkout, pyserver.py's text and the venv's
//! installed packages: a changed one starts another server), and exits after five
//! minutes without a command. `PTRAIN_TEST_PYSERVER=0` runs every command in a fresh
//! interpreter instead (as does any failure to start the server, with a warning).

use std::{
    ffi::OsStr,
    io::{Read, Write},
    os::unix::{net::UnixStream, process::CommandExt, process::ExitStatusExt},
    path::{Path, PathBuf},
    process::{ExitStatus, Output, Stdio},
    time::{Duration, Instant},
};

use sha2::{Digest, Sha256};

use super::{python, repo};

/// Seconds the server waits for a command before it exits.
const IDLE_S: u32 = 300;

/// A short `python ARGS...` command (a helper, a `-c` check): [`output`] or [`status`]
/// run it through the fork server, as `python().args(ARGS)` would run it.
///
/// [`output`]: Py::output
/// [`status`]: Py::status
pub fn cmd() -> Py {
    Py { args: Vec::new() }
}

pub struct Py {
    args: Vec<std::ffi::OsString>,
}

impl Py {
    pub fn arg(&mut self, arg: impl AsRef<OsStr>) -> &mut Py {
        self.args.push(arg.as_ref().to_os_string());
        self
    }

    pub fn args<I: IntoIterator<Item = S>, S: AsRef<OsStr>>(&mut self, args: I) -> &mut Py {
        self.args.extend(args.into_iter().map(|a| a.as_ref().to_os_string()));
        self
    }

    pub fn output(&mut self) -> std::io::Result<Output> {
        Ok(output(&self.args))
    }

    /// Its exit status; its output goes to this process's stderr (as a test's would).
    pub fn status(&mut self) -> std::io::Result<ExitStatus> {
        let out = output(&self.args);
        eprint!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        Ok(out.status)
    }
}

/// `python ARGS...` (from the checkout, in this environment), its output collected:
/// what `python().args(args).output()` gives, from a child of the fork server.
pub fn output<S: AsRef<OsStr>>(args: &[S]) -> Output {
    let argv: Vec<String> = args.iter().map(|a| a.as_ref().to_str().expect("UTF-8 arguments").to_string()).collect();
    if std::env::var_os("PTRAIN_TEST_PYSERVER").is_some_and(|v| v == "0") {
        return direct(&argv);
    }
    match served(&argv) {
        Ok(out) => out,
        Err(why) => {
            eprintln!("warning: the Python fork server is not available ({why}): running {argv:?} in a fresh interpreter");
            direct(&argv)
        }
    }
}

fn direct(argv: &[String]) -> Output {
    python().args(argv).output().expect("spawn python")
}

/// What the server's socket is named after: a server of another venv, checkout or
/// pyserver.py is another server.
fn socket_path() -> PathBuf {
    let python = python();
    let exe = PathBuf::from(python.get_program());
    let mut h = Sha256::new();
    h.update(exe.as_os_str().as_encoded_bytes());
    h.update(repo().as_os_str().as_encoded_bytes());
    h.update(std::fs::read(repo().join("tests/support/pyserver.py")).expect("tests/support/pyserver.py"));
    h.update(installed_packages(&exe).as_bytes());
    let key: String = h.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect();
    std::env::temp_dir().join(format!("ptrain-pyserver-{key}.sock"))
}

/// The venv's installed distributions (`name-version.dist-info`), one per line: an
/// upgraded package changes the list.
pub fn installed_packages(python: &Path) -> String {
    let venv = python.parent().and_then(Path::parent).map(Path::to_path_buf).unwrap_or_default();
    let mut names = Vec::new();
    for lib in std::fs::read_dir(venv.join("lib")).into_iter().flatten().flatten() {
        for entry in std::fs::read_dir(lib.path().join("site-packages")).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(".dist-info") {
                names.push(name);
            }
        }
    }
    names.sort();
    names.join("\n")
}

/// A `python` for scripts that take one (gpu/validate.sh's `--python`, gpu/lent.sh's
/// `PTRAIN_PYTHON`): an executable at `dir/python` that runs `python ARGS...` through the
/// fork server (tests/support/pyclient.py hands it its arguments, environment and standard
/// streams), or as the venv's Python where the server is gone. Starts the server now.
pub fn wrapper(dir: &Path) -> PathBuf {
    let python = PathBuf::from(python().get_program());
    let socket = socket_path();
    if std::env::var_os("PTRAIN_TEST_PYSERVER").is_none_or(|v| v != "0") {
        if let Err(why) = UnixStream::connect(&socket).map_err(|e| e.to_string()).or_else(|_| start(&socket)) {
            eprintln!("warning: the Python fork server is not available ({why}): the wrapper runs the venv's Python");
        }
    }
    let quote = |p: &Path| format!("'{}'", p.display().to_string().replace('\'', "'\\''"));
    let script = format!(
        "#!/bin/sh\nexec {} -S -E {} {} {} \"$@\"\n",
        quote(&python),
        quote(&repo().join("tests/support/pyclient.py")),
        quote(&socket),
        quote(&python)
    );
    let path = dir.join("python");
    std::fs::write(&path, script).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

fn served(argv: &[String]) -> Result<Output, String> {
    let socket = socket_path();
    let mut stream = match UnixStream::connect(&socket) {
        Ok(s) => s,
        Err(_) => start(&socket)?,
    };
    let files = tempfile::tempdir().map_err(|e| e.to_string())?;
    let (out, err) = (files.path().join("stdout"), files.path().join("stderr"));
    let env: serde_json::Map<String, serde_json::Value> =
        std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?.into()))).collect();
    let request = serde_json::json!({
        "argv": argv,
        "cwd": repo(),
        "env": env,
        "stdout": out,
        "stderr": err,
    });
    stream.write_all(format!("{request}\n").as_bytes()).map_err(|e| format!("sending the command: {e}"))?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).map_err(|e| format!("reading the exit code: {e}"))?;
    let stdout = std::fs::read(&out).unwrap_or_default();
    let mut stderr = std::fs::read(&err).unwrap_or_default();
    let status = match reply.trim().parse::<i32>() {
        Ok(code) => ExitStatus::from_raw((code & 0xff) << 8),
        Err(_) => {
            stderr.extend_from_slice(b"\n(pyserver: the command died without an exit code, killed by a signal)\n");
            ExitStatus::from_raw(9)
        }
    };
    Ok(Output { status, stdout, stderr })
}

/// Starts the server unless another test did meanwhile; returns a connection to it.
fn start(socket: &Path) -> Result<UnixStream, String> {
    let lock_path = socket.with_extension("lock");
    let lock = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&lock_path).map_err(|e| e.to_string())?;
    lock_exclusive(&lock).map_err(|e| format!("locking {}: {e}", lock_path.display()))?;
    if let Ok(s) = UnixStream::connect(socket) {
        return Ok(s);
    }
    // A socket left by a server that was killed.
    let _ = std::fs::remove_file(socket);
    let log_path = socket.with_extension("log");
    let log = std::fs::File::create(&log_path).map_err(|e| e.to_string())?;
    let mut server = python()
        .arg(repo().join("tests/support/pyserver.py"))
        .arg(socket)
        .arg(IDLE_S.to_string())
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log)
        // Its own process group: a test that ends (or is killed) does not take it along.
        .process_group(0)
        .spawn()
        .map_err(|e| format!("spawning the server: {e}"))?;
    // The imports take a few seconds, more on a loaded machine; the bound only turns a
    // hang into the fallback.
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        if let Ok(s) = UnixStream::connect(socket) {
            return Ok(s);
        }
        if let Ok(Some(status)) = server.try_wait() {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            return Err(format!("the server exited ({status}):\n{log}"));
        }
        if Instant::now() > deadline {
            return Err("the server did not listen within 300 s".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits for an exclusive lock on `file` (flock(2)), held until the file is closed or
/// the process ends: a crashed holder leaves no stale lock.
pub fn lock_exclusive(file: &std::fs::File) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    loop {
        // SAFETY: flock(2) on the descriptor of a file this function borrows, open for its duration.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}
