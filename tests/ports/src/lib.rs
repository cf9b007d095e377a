//! Loopback ports for tests that start servers and ranks.
//!
//! Binding port 0 and closing the socket before the child binds the port leaves a
//! window in which another test (or any program's outgoing connection) can take
//! it. Instead a port is reserved: it is taken from below the kernel's ephemeral
//! range (which bind(0) and outgoing connections draw from, so the kernel never
//! hands it out), and held by an exclusive lock on
//! `$TMPDIR/ptrain-test-ports/<port>.lock` until the test process exits. Every
//! test of every checkout on the machine reserves through these locks, so no two
//! tests get one port, at once or across a server's restart.

use std::{
    fs::{File, OpenOptions},
    net::TcpListener,
    path::PathBuf,
};

/// The ports handed out: below the ephemeral range (32768 on Linux by default).
const FIRST: u16 = 20_000;

fn ephemeral_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok().and_then(|t| t.split_whitespace().next()?.parse().ok()).unwrap_or(32_768)
}

fn lock_dir() -> PathBuf {
    let dir = std::env::temp_dir().join("ptrain-test-ports");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    dir
}

/// A port of 127.0.0.1 that nothing listens on and no other test will be given
/// while this process lives. Panics when every port of the range is taken.
pub fn reserve() -> u16 {
    let end = ephemeral_start();
    assert!(end > FIRST + 100, "the ephemeral port range starts at {end}: no room below it for test ports");
    let dir = lock_dir();
    let span = u32::from(end - FIRST);
    // Start somewhere else in each process, so tests rarely try the same locks.
    let offset = std::process::id() % span;
    for i in 0..span {
        let port = FIRST + ((offset + i) % span) as u16;
        let path = dir.join(format!("{port}.lock"));
        let Ok(file) = OpenOptions::new().create(true).truncate(false).write(true).open(&path) else { continue };
        if file.try_lock().is_err() {
            continue;
        }
        // Something that does not reserve (another program) may listen there.
        if TcpListener::bind(("127.0.0.1", port)).is_err() {
            continue;
        }
        keep(file);
        return port;
    }
    panic!("no free test port in {FIRST}..{end} (locks in {})", dir.display());
}

/// Holds the lock until the process exits (which releases it).
fn keep(file: File) {
    std::mem::forget(file);
}

/// Whether the socket listening on TCP `port` belongs to a process of process
/// group `pgid` (a server a test started with `process_group(0)` has its pid as
/// its group): the server answering is the test's own, not whatever else took
/// the port. Read from /proc; `false` where nothing listens.
pub fn listener_in_group(port: u16, pgid: u32) -> bool {
    let inodes = listening_inodes(port);
    if inodes.is_empty() {
        return false;
    }
    let Ok(procs) = std::fs::read_dir("/proc") else { return false };
    for entry in procs.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        if process_group(pid) != Some(pgid) {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { continue };
        for fd in fds.flatten() {
            let Ok(target) = std::fs::read_link(fd.path()) else { continue };
            let target = target.to_string_lossy();
            if inodes.iter().any(|inode| target == format!("socket:[{inode}]")) {
                return true;
            }
        }
    }
    false
}

/// Socket inodes in state LISTEN on `port` (IPv4 and IPv6).
fn listening_inodes(port: u16) -> Vec<String> {
    let wanted = format!(":{port:04X}");
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else { continue };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // sl, local_address, rem_address, st, queues, tr, retrnsmt, uid, timeout, inode
            if fields.len() > 9 && fields[1].ends_with(&wanted) && fields[3] == "0A" {
                inodes.push(fields[9].to_string());
            }
        }
    }
    inodes
}

/// The process group of `pid` (the fifth field of /proc/<pid>/stat, after the
/// parenthesised command name, which may itself hold spaces).
fn process_group(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(2)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_ports_differ_and_are_outside_the_ephemeral_range() {
        let (a, b) = (reserve(), reserve());
        assert_ne!(a, b, "a port reserved in this process is not given again");
        assert!(a >= FIRST && a < ephemeral_start() && b < ephemeral_start());
        // A port another process reserved is not given while it lives.
        let path = lock_dir().join(format!("{a}.lock"));
        let again = OpenOptions::new().write(true).open(&path).unwrap();
        assert!(again.try_lock().is_err(), "{} is not locked", path.display());
    }

    #[test]
    fn the_listener_is_found_in_its_own_group_only() {
        let port = reserve();
        let listener = TcpListener::bind(("127.0.0.1", port)).unwrap();
        // SAFETY: getpgrp(2) has no preconditions; declared here to avoid a libc dependency.
        let own = unsafe { getpgrp() } as u32;
        assert!(listener_in_group(port, own));
        assert!(!listener_in_group(port, own + 1));
        drop(listener);
        assert!(!listener_in_group(port, own), "nothing listens any more");
    }

    extern "C" {
        fn getpgrp() -> i32;
    }
}
