//! Starting ranks the way launchers do, and watching them.

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use super::{bin, ptrain, repo};

/// Variables that would place a process in some outer job.
pub const PLACEMENT_VARS: &[&str] = &[
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SLURM_NTASKS",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "TORCHELASTIC_USE_AGENT_STORE",
];

/// A port no other test takes while this one runs (see `ptrain_test_ports`):
/// never one bound to port 0 and released before the child binds it.
pub fn free_port() -> u16 {
    ptrain_test_ports::reserve()
}

/// `ptrain` outside any job.
pub fn single() -> Command {
    let mut cmd = ptrain();
    for var in PLACEMENT_VARS {
        cmd.env_remove(var);
    }
    cmd
}

/// `ptrain launch --nproc NPROC --master-port PORT --` outside any job, on a port no
/// other test holds; the command to launch follows.
pub fn launch(nproc: u32) -> Command {
    let mut cmd = single();
    cmd.args(["launch", "--nproc", &nproc.to_string(), "--master-port", &free_port().to_string(), "--"]);
    cmd
}

/// `ptrain` as rank `rank` of `world`, the way torchrun would start it.
pub fn rank_cmd(rank: u32, world: u32, port: u16) -> Command {
    let mut cmd = single();
    cmd.env("RANK", rank.to_string())
        .env("LOCAL_RANK", rank.to_string())
        .env("WORLD_SIZE", world.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string());
    cmd
}

/// `summary.json`'s per-rank list `key` (one value per rank).
pub fn per_rank(summary: &serde_json::Value, key: &str) -> Vec<u64> {
    serde_json::from_value(summary[key].clone()).unwrap_or_else(|e| panic!("{key}: {e}: {summary}"))
}

/// The tensor names in a safetensors file's JSON header.
pub fn tensor_names(file: &[u8]) -> Vec<String> {
    let len = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&file[8..8 + len]).expect("safetensors header");
    header.as_object().unwrap().keys().filter(|k| *k != "__metadata__").cloned().collect()
}

/// The venv's torchrun.
pub fn torchrun() -> PathBuf {
    let venv_bin = std::env::var_os("PTRAIN_PYTHON")
        .map(PathBuf::from)
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .unwrap_or_else(|| repo().join(".venv/bin"));
    let torchrun = venv_bin.join("torchrun");
    assert!(torchrun.exists(), "no torchrun at {}: run scripts/bootstrap.sh", torchrun.display());
    torchrun
}

/// `torchrun --no-python --nproc-per-node NPROC` on 127.0.0.1 and a port no other
/// test holds, outside any job, starting the built binary; its arguments follow.
pub fn torchrun_ptrain(nproc: u32) -> Command {
    torchrun_binary(nproc, &bin())
}

/// [`torchrun_ptrain`] starting `binary` instead of ptrain.
pub fn torchrun_binary(nproc: u32, binary: &Path) -> Command {
    let mut cmd = Command::new(torchrun());
    for var in PLACEMENT_VARS {
        cmd.env_remove(var);
    }
    cmd.env_remove("PTRAIN_PLUGIN_PATH").env("PTRAIN_LOG", "warn").current_dir(repo());
    cmd.args(["--no-python", "--nproc-per-node", &nproc.to_string(), "--master-addr", "127.0.0.1", "--master-port"])
        .arg(free_port().to_string())
        .arg(binary);
    cmd
}

pub fn signal(pid: u32, sig: &str) {
    let status = Command::new("sh").arg("-c").arg(format!("kill -{sig} {pid}")).status().expect("sh");
    assert!(status.success(), "kill -{sig} {pid}");
}

/// Waits for `child` at most `limit` (and kills it after that).
pub fn wait_within(mut child: Child, limit: Duration) -> Option<ExitStatus> {
    let (tx, rx) = mpsc::channel();
    let pid = child.id();
    thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    let status = rx.recv_timeout(limit).ok().map(|r| r.expect("wait"));
    if status.is_none() {
        signal(pid, "KILL");
    }
    status
}

/// Rank 0's stderr (and stdout, when piped), line by line, from reader threads.
pub fn lines(child: &mut Child) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().map(|s| Box::new(s) as Box<dyn std::io::Read + Send>);
    let stderr = child.stderr.take().map(|s| Box::new(s) as Box<dyn std::io::Read + Send>);
    assert!(stderr.is_some(), "piped stderr");
    for stream in [stderr, stdout].into_iter().flatten() {
        let tx = tx.clone();
        thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
    }
    rx
}

/// Waits until a line matches, for at most a minute (a generous bound for a
/// start-up that takes about a second); false when none came.
pub fn wait_for_line(rx: &mpsc::Receiver<String>, matches: impl Fn(&str) -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(60);
    while let Ok(line) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        if matches(&line) {
            return true;
        }
    }
    false
}
