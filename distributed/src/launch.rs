//! A one-node launcher in the manner of torchrun: starts `nproc` copies of a
//! program with the torchrun environment, forwards their output line by line
//! (prefixed with the rank), forwards SIGINT/SIGTERM/SIGHUP, and when one copy
//! fails stops the others (SIGTERM, then SIGKILL after a grace period) and exits
//! with that copy's exit code.

use std::{
    ffi::OsString,
    io::{self, BufRead, BufReader, Read, Write},
    net::TcpListener,
    os::{
        fd::AsRawFd,
        unix::process::{CommandExt, ExitStatusExt},
    },
    path::PathBuf,
    process::{Child, Command, ExitStatus, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};

use crate::env::MASTER_LISTEN_FD;

#[derive(Debug, Clone)]
pub struct LaunchSpec {
    pub program: PathBuf,
    pub args: Vec<OsString>,
    pub nproc: u32,
    pub master_addr: String,
    /// `None`: a free port on this host.
    pub master_port: Option<u16>,
    /// Prefix every output line with `[rank<r>] `.
    pub prefix: bool,
    /// How long the others get to exit after SIGTERM before SIGKILL.
    pub grace: Duration,
}

/// The rendezvous's listening socket, on `port` (0: any free port). The launcher
/// holds it for the whole job and rank 0's store serves on it (torchrun's agent
/// store does the same), so no other program can take the port between choosing
/// it and rank 0 listening, as binding a free port and releasing it would allow.
fn listen(port: u16) -> io::Result<TcpListener> {
    // All interfaces, as a TCPStore server listens.
    TcpListener::bind(("0.0.0.0", port)).map_err(|e| io::Error::new(e.kind(), format!("cannot listen on the master port {port}: {e}")))
}

/// The exit code a shell would report for `status`.
pub fn exit_code(status: ExitStatus) -> i32 {
    status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

enum Event {
    Exited(u32, ExitStatus),
    Signal(i32),
}

fn send_signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) on a child we started and have not yet seen exit.
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

/// Copies a rank's output to ours, each line prefixed with its rank.
fn forward(rank: u32, input: impl Read + Send + 'static, to_stderr: bool) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let mut reader = BufReader::new(input);
        let mut line = Vec::new();
        let tag = format!("[rank{rank}] ");
        while matches!(reader.read_until(b'\n', &mut line), Ok(n) if n > 0) {
            if !line.ends_with(b"\n") {
                line.push(b'\n');
            }
            // One write per line, so lines of different ranks never interleave.
            let mut out = Vec::with_capacity(line.len() + tag.len());
            out.extend_from_slice(tag.as_bytes());
            out.extend_from_slice(&line);
            let _ = if to_stderr { io::stderr().lock().write_all(&out) } else { io::stdout().lock().write_all(&out) };
            line.clear();
        }
    })
}

fn spawn_rank(spec: &LaunchSpec, rank: u32, store: &TcpListener, threads: Option<&str>) -> io::Result<Child> {
    let port = store.local_addr()?.port();
    let store_fd = (rank == 0).then(|| store.as_raw_fd());
    let mut cmd = Command::new(&spec.program);
    cmd.args(&spec.args)
        .env("RANK", rank.to_string())
        .env("LOCAL_RANK", rank.to_string())
        .env("GROUP_RANK", "0")
        .env("WORLD_SIZE", spec.nproc.to_string())
        .env("LOCAL_WORLD_SIZE", spec.nproc.to_string())
        .env("MASTER_ADDR", &spec.master_addr)
        .env("MASTER_PORT", port.to_string())
        // How long a rank has after SIGTERM before SIGKILL: its end fits its summary in it.
        .env(ptrain_core::trainer::GRACE_ENV, spec.grace.as_secs_f64().to_string())
        // Its own process group: a terminal's Ctrl-C reaches the launcher only,
        // which forwards it once (a second SIGINT makes ptrain exit at once).
        .process_group(0);
    if let Some(n) = threads {
        cmd.env("OMP_NUM_THREADS", n);
    }
    if let Some(fd) = store_fd {
        cmd.env(MASTER_LISTEN_FD, fd.to_string());
    }
    if spec.prefix {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    }
    let parent = std::process::id();
    // SAFETY: prctl, getppid and fcntl are async-signal-safe; `store_fd` is the
    // listener's descriptor, open in the child as in the launcher.
    unsafe {
        cmd.pre_exec(move || {
            // Ranks must not outlive a launcher that was killed outright.
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            if libc::getppid() as u32 != parent {
                libc::_exit(143);
            }
            // Rank 0 keeps the store's socket across exec (Rust opens it close-on-exec).
            if let Some(fd) = store_fd {
                if libc::fcntl(fd, libc::F_SETFD, 0) == -1 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    cmd.spawn()
}

/// Runs the job and returns the launcher's exit code: 0 when every rank exited 0,
/// otherwise the exit code of the first rank that failed.
pub fn launch(spec: &LaunchSpec) -> io::Result<i32> {
    assert!(spec.nproc > 0, "nproc must be positive");
    let store = listen(spec.master_port.unwrap_or(0))?;
    let (events, inbox) = mpsc::channel();
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])?;
    let signal_handle = signals.handle();
    {
        let events = events.clone();
        thread::spawn(move || {
            for sig in signals.forever() {
                if events.send(Event::Signal(sig)).is_err() {
                    break;
                }
            }
        });
    }
    // N ranks each using every core would oversubscribe the CPU: like torchrun,
    // give each its share unless the user chose (run.threads still overrides).
    let threads = std::env::var_os("OMP_NUM_THREADS").is_none().then(|| {
        let cores = thread::available_parallelism().map_or(1, |n| n.get());
        (cores / spec.nproc as usize).max(1).to_string()
    });
    let mut pids = Vec::new();
    let mut pipes = Vec::new();
    let mut spawned = Ok(());
    for rank in 0..spec.nproc {
        match spawn_rank(spec, rank, &store, threads.as_deref()) {
            Ok(mut child) => {
                pids.push(Some(child.id()));
                if let Some(out) = child.stdout.take() {
                    pipes.push(forward(rank, out, false));
                }
                if let Some(err) = child.stderr.take() {
                    pipes.push(forward(rank, err, true));
                }
                let events = events.clone();
                thread::spawn(move || {
                    if let Ok(status) = child.wait() {
                        let _ = events.send(Event::Exited(rank, status));
                    }
                });
            }
            Err(e) => {
                spawned = Err(io::Error::new(e.kind(), format!("cannot start {}: {e}", spec.program.display())));
                break;
            }
        }
    }
    drop(events);

    let mut code = 0;
    let mut deadline: Option<Instant> = None;
    let stop_all = |pids: &[Option<u32>], sig: i32| pids.iter().flatten().for_each(|&pid| send_signal(pid, sig));
    if spawned.is_err() {
        stop_all(&pids, libc::SIGTERM);
        deadline = Some(Instant::now() + spec.grace);
    }
    while pids.iter().any(Option::is_some) {
        let event = match deadline {
            Some(d) => match inbox.recv_timeout(d.saturating_duration_since(Instant::now())) {
                Ok(e) => e,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    eprintln!("ptrain launch: ranks still running {} s after SIGTERM: killing them", spec.grace.as_secs());
                    stop_all(&pids, libc::SIGKILL);
                    deadline = None;
                    continue;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            },
            None => match inbox.recv() {
                Ok(e) => e,
                Err(_) => break,
            },
        };
        match event {
            Event::Exited(rank, status) => {
                pids[rank as usize] = None;
                if !status.success() && code == 0 {
                    code = exit_code(status);
                    let alive = pids.iter().flatten().count();
                    eprintln!("ptrain launch: rank {rank} failed ({status}); stopping the {alive} other rank(s)");
                    stop_all(&pids, libc::SIGTERM);
                    deadline = Some(Instant::now() + spec.grace);
                }
            }
            Event::Signal(sig) => {
                // No SIGKILL deadline: the ranks finish their step and save; a
                // second signal, forwarded too, makes them exit at once.
                stop_all(&pids, sig);
                if code == 0 {
                    code = 128 + sig;
                }
            }
        }
    }
    signal_handle.close();
    for pipe in pipes {
        let _ = pipe.join();
    }
    spawned?;
    // Held until every rank is gone: rank 0 serves on its copy.
    drop(store);
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str, dir: &std::path::Path, nproc: u32) -> LaunchSpec {
        LaunchSpec {
            program: "/bin/sh".into(),
            // `sh -c SCRIPT DIR`: the script sees DIR as $0.
            args: vec!["-c".into(), script.into(), dir.as_os_str().to_owned()],
            nproc,
            master_addr: "127.0.0.1".into(),
            master_port: None,
            prefix: false,
            grace: Duration::from_secs(30),
        }
    }

    #[test]
    fn ranks_get_the_torchrun_environment() {
        let dir = tempfile::tempdir().unwrap();
        let script = r#"echo "$RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $MASTER_ADDR" > "$0/env-$RANK"; echo "$MASTER_PORT" > "$0/port-$RANK"; [ "$OMP_NUM_THREADS" -ge 1 ]
            if [ -n "$PTRAIN_MASTER_LISTEN_FD" ]; then readlink "/proc/$$/fd/$PTRAIN_MASTER_LISTEN_FD" > "$0/store-$RANK"; fi"#;
        assert_eq!(launch(&sh(script, dir.path(), 3)).unwrap(), 0);
        let read = |name: String| std::fs::read_to_string(dir.path().join(name)).unwrap().trim().to_string();
        for rank in 0..3 {
            assert_eq!(read(format!("env-{rank}")), format!("{rank} {rank} 3 3 127.0.0.1"));
        }
        let port = read("port-0".into());
        assert!(port.parse::<u16>().is_ok_and(|p| p > 0), "{port}");
        assert_eq!(read("port-1".into()), port);
        // Rank 0 (only) inherited the launcher's listening socket for its store.
        assert!(read("store-0".into()).starts_with("socket:"), "{}", read("store-0".into()));
        assert!(!dir.path().join("store-1").exists());
    }

    #[test]
    fn a_failing_rank_stops_the_others_and_its_exit_code_is_returned() {
        let dir = tempfile::tempdir().unwrap();
        // Rank 1 fails once rank 0 is up and waiting; rank 0 records the SIGTERM it gets.
        let script = r#"
            if [ "$RANK" = 1 ]; then
                while [ ! -e "$0/ready-0" ]; do sleep 0.05; done
                exit 3
            fi
            trap 'echo terminated > "$0/term-$RANK"; exit 143' TERM
            touch "$0/ready-$RANK"
            while :; do sleep 0.05; done
        "#;
        assert_eq!(launch(&sh(script, dir.path(), 2)).unwrap(), 3);
        let term = std::fs::read_to_string(dir.path().join("term-0")).expect("rank 0 was sent SIGTERM");
        assert_eq!(term.trim(), "terminated");
    }

    #[test]
    fn a_rank_killed_by_a_signal_gives_128_plus_the_signal() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(launch(&sh(r#"kill -9 $$"#, dir.path(), 1)).unwrap(), 137);
    }
}
