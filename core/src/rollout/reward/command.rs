//! `kind = "command"`: a reward computed by a process of the user's (a reward model, a
//! sandbox, any language), started once at set-up and kept for the run. Each scored
//! micro-batch is one JSON line on its stdin ([`ScoreBatch`]); it answers one JSON line
//! on its stdout: a list of one number (or `null`, TRL's `None`) per completion, or an
//! object whose `rewards` is that list. Its stderr is ptrain's.
//!
//! The pipes are this reward's own thread's: the training thread hands it the batch
//! (`submit`, right after sampling, so the process scores while the next micro-batch
//! samples) and waits for the answer (`collect`) at most `timeout_s`, since the
//! advantages need it. A process that ends, hangs, or answers a wrong count or
//! something other than numbers fails the run (exit 1, summary.json naming the reward
//! and what happened), as a raising reward function fails TRL's.

use std::{
    io::{BufRead, BufReader, Write},
    os::unix::process::CommandExt,
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
    sync::{
        mpsc::{channel, Receiver, RecvTimeoutError, Sender},
        Arc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use super::ScoreBatch;
use crate::error::{ConfigError, Error, Result};

/// Why an answer did not come.
enum Failure {
    /// The pipes closed: the process ended (its status is read on the training thread).
    Ended(String),
    /// An answer that is not one score per completion.
    Bad(String),
}

pub struct CommandReward {
    name: String,
    shown: String,
    child: Child,
    timeout: Duration,
    requests: Option<Sender<Arc<ScoreBatch>>>,
    replies: Receiver<std::result::Result<Vec<f64>, Failure>>,
    pipes: Option<JoinHandle<()>>,
}

impl CommandReward {
    /// Starts `argv` (its program found on `PATH` as a shell would, or a path). A
    /// program that cannot be started is a configuration mistake (exit 2).
    pub fn start(name: &str, argv: &[String], timeout_s: f64) -> Result<CommandReward> {
        let shown = argv.join(" ");
        let (program, args) = argv.split_first().ok_or_else(|| bad(name, "command is empty".into()))?;
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            // Its own process group: Ctrl-C in the terminal stops ptrain at a step's end,
            // not the reward in the middle of one; it ends when its stdin closes.
            .process_group(0)
            .spawn()
            .map_err(|e| bad(name, format!("cannot start `{shown}`: {e}")))?;
        let (stdin, stdout) = (child.stdin.take(), child.stdout.take());
        let (Some(stdin), Some(stdout)) = (stdin, stdout) else {
            return Err(Error::Other(format!("[[grpo.rewards]] {name:?}: `{shown}` has no pipes")));
        };
        let (requests, received) = channel();
        let (answered, replies) = channel();
        let pipes = std::thread::Builder::new()
            .name(format!("ptrain-reward-{name}"))
            .spawn(move || serve(stdin, BufReader::new(stdout), received, answered))
            .map_err(|e| Error::Other(format!("starting reward {name:?}'s thread: {e}")))?;
        let timeout = Duration::from_secs_f64(timeout_s);
        Ok(CommandReward { name: name.into(), shown, child, timeout, requests: Some(requests), replies, pipes: Some(pipes) })
    }

    /// Hands `batch` to the process (its thread writes it).
    pub fn submit(&self, batch: &Arc<ScoreBatch>) {
        if let Some(requests) = &self.requests {
            // A closed channel means the thread ended: `collect` says why.
            let _ = requests.send(batch.clone());
        }
    }

    /// The answer to the oldest batch submitted, waited for at most `timeout_s`.
    pub fn collect(&mut self) -> Result<Vec<f64>> {
        let started = Instant::now();
        match self.replies.recv_timeout(self.timeout) {
            Ok(Ok(scores)) => Ok(scores),
            Ok(Err(Failure::Bad(what))) => Err(self.failed(what)),
            Ok(Err(Failure::Ended(what))) => {
                let ended = self.ended();
                Err(self.failed(format!("{what}: {ended}")))
            }
            Err(RecvTimeoutError::Disconnected) => {
                let ended = self.ended();
                Err(self.failed(ended))
            }
            Err(RecvTimeoutError::Timeout) => {
                let waited = started.elapsed().as_secs_f64();
                Err(self.failed(format!("no answer within timeout_s = {} s (waited {waited:.1} s)", self.timeout.as_secs_f64())))
            }
        }
    }

    fn failed(&self, what: String) -> Error {
        Error::Other(format!("[[grpo.rewards]] {:?} (command `{}`): {what}", self.name, self.shown))
    }

    /// How the process ended, once it has (waited for briefly: its pipes closed first).
    fn ended(&mut self) -> String {
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            match self.child.try_wait() {
                Ok(Some(status)) => return format!("the process ended ({status})"),
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(e) => return format!("the process cannot be waited for: {e}"),
            }
        }
        "the process closed its output and is still running".into()
    }
}

impl Drop for CommandReward {
    /// Stops the command's whole process group (it leads its own, see `start`): a
    /// process it started and did not exec (a shell's child) holds the output pipe too,
    /// and the pipes' thread, blocked reading it, would never end. Then ends the thread.
    fn drop(&mut self) {
        self.requests = None;
        if let Ok(group) = i32::try_from(self.child.id()) {
            // SAFETY: killpg(2) with a plain process-group id and a signal number; it
            // touches no memory of ours. The group is the child's own (`process_group(0)`),
            // which stays ours until the child is waited for below.
            unsafe { libc::killpg(group, libc::SIGKILL) };
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(pipes) = self.pipes.take() {
            let _ = pipes.join();
        }
    }
}

/// The reward's thread: writes each request, reads its answer, in order, until the
/// training thread closes the channel or the process its pipes.
fn serve(
    mut stdin: ChildStdin,
    mut stdout: BufReader<ChildStdout>,
    requests: Receiver<Arc<ScoreBatch>>,
    replies: Sender<std::result::Result<Vec<f64>, Failure>>,
) {
    for batch in requests {
        let written = serde_json::to_writer(&mut stdin, &*batch).map_err(std::io::Error::from).and_then(|_| {
            stdin.write_all(b"\n")?;
            stdin.flush()
        });
        let reply = match written {
            Err(e) => Err(Failure::Ended(format!("writing the request: {e}"))),
            Ok(()) => read_answer(&mut stdout, batch.completions.len()),
        };
        let ended = matches!(reply, Err(Failure::Ended(_)));
        if replies.send(reply).is_err() || ended {
            return;
        }
    }
}

fn read_answer(stdout: &mut BufReader<ChildStdout>, expected: usize) -> std::result::Result<Vec<f64>, Failure> {
    let mut line = String::new();
    match stdout.read_line(&mut line) {
        Err(e) => Err(Failure::Ended(format!("reading the answer: {e}"))),
        Ok(0) => Err(Failure::Ended("no answer, its output closed".into())),
        Ok(_) => scores(&line, expected).map_err(Failure::Bad),
    }
}

/// One score per completion from an answer line: numbers, `null` as NaN (no reward).
pub(super) fn scores(line: &str, expected: usize) -> std::result::Result<Vec<f64>, String> {
    let shown = || line.trim().chars().take(200).collect::<String>();
    let value: serde_json::Value = serde_json::from_str(line).map_err(|e| format!("the answer is not JSON ({e}): {}", shown()))?;
    let list = match &value {
        serde_json::Value::Object(o) => o.get("rewards"),
        _ => Some(&value),
    };
    let Some(serde_json::Value::Array(list)) = list else {
        return Err(format!("the answer is not a list of scores (or {{\"rewards\": [...]}}): {}", shown()));
    };
    if list.len() != expected {
        return Err(format!("{} scores for {expected} completions", list.len()));
    }
    list.iter()
        .enumerate()
        .map(|(i, v)| match v {
            serde_json::Value::Null => Ok(f64::NAN),
            serde_json::Value::Number(n) => n.as_f64().ok_or_else(|| format!("score {i} is {n}")),
            other => Err(format!("score {i} is {other}, not a number or null")),
        })
        .collect()
}

fn bad(name: &str, message: String) -> Error {
    ConfigError { origin: "configuration".into(), key: "grpo.rewards.command".into(), message: format!("{name:?}: {message}") }.into()
}

#[cfg(test)]
mod tests {
    use super::scores;

    #[test]
    fn answers_are_one_number_or_null_per_completion() {
        assert_eq!(scores("[1, 0.5]\n", 2).unwrap(), [1.0, 0.5]);
        assert_eq!(scores(r#"{"rewards": [2]}"#, 1).unwrap(), [2.0]);
        assert!(scores("[null, 1]", 2).unwrap()[0].is_nan(), "null: no reward (TRL's None)");
        assert_eq!(scores("[1, 2, 3]", 2).unwrap_err(), "3 scores for 2 completions");
        assert!(scores(r#"[1, "good"]"#, 2).unwrap_err().contains("score 1 is \"good\""));
        assert!(scores("oops", 1).unwrap_err().contains("not JSON"));
        assert!(scores("{}", 1).unwrap_err().contains("not a list"));
    }
}
