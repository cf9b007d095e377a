//! Where this process sits in the job, from the launcher's environment.
//!
//! torchrun's contract first: `WORLD_SIZE`, `RANK`, `LOCAL_RANK`, `MASTER_ADDR`,
//! `MASTER_PORT` (what `ptrain launch` sets too). Without `WORLD_SIZE`, Slurm's
//! `SLURM_NTASKS`, `SLURM_PROCID`, `SLURM_LOCALID`, where `MASTER_ADDR` defaults to
//! 127.0.0.1 on a one-node job or else to the first host of the job's node list,
//! and `MASTER_PORT` to 29500 + `SLURM_JOB_ID` mod 1000. A world of one (or no
//! such variables) is plain single-process training.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub rank: u32,
    pub world_size: u32,
    pub local_rank: u32,
    pub master_addr: String,
    pub master_port: u16,
}

/// A bad or missing variable; nothing has been contacted yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvError {
    pub key: &'static str,
    pub message: String,
}

impl fmt::Display for EnvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, self.message)
    }
}

impl std::error::Error for EnvError {}

fn err(key: &'static str, message: impl Into<String>) -> EnvError {
    EnvError { key, message: message.into() }
}

/// Reads the process environment.
pub fn placement() -> Result<Option<Placement>, EnvError> {
    placement_from(|k| std::env::var(k).ok())
}

/// [`placement`] over any variable source (tests pass a map).
pub fn placement_from(var: impl Fn(&str) -> Option<String>) -> Result<Option<Placement>, EnvError> {
    let get = |k: &str| var(k).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
    let number = |key: &'static str| -> Result<Option<u32>, EnvError> {
        get(key).map(|v| v.parse::<u32>().map_err(|_| err(key, format!("`{v}` is not a non-negative integer")))).transpose()
    };
    let slurm = get("WORLD_SIZE").is_none() && get("SLURM_NTASKS").is_some();
    let (world_key, rank_key, local_key) =
        if slurm { ("SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID") } else { ("WORLD_SIZE", "RANK", "LOCAL_RANK") };
    let Some(world_size) = number(world_key)? else { return Ok(None) };
    if world_size == 0 {
        return Err(err(world_key, "must be at least 1"));
    }
    if world_size == 1 {
        return Ok(None);
    }
    let rank = number(rank_key)?.ok_or_else(|| err(rank_key, format!("not set, but {world_key}={world_size}")))?;
    if rank >= world_size {
        return Err(err(rank_key, format!("{rank_key}={rank} must be below {world_key}={world_size}")));
    }
    // A hand-written single-node launch may leave LOCAL_RANK out: it is then RANK.
    let local_rank = number(local_key)?.unwrap_or(rank);
    if let Some(local_world) = number("LOCAL_WORLD_SIZE")? {
        if local_rank >= local_world {
            return Err(err(local_key, format!("{local_key}={local_rank} must be below LOCAL_WORLD_SIZE={local_world}")));
        }
    }
    let master_addr = match get("MASTER_ADDR") {
        Some(addr) => addr,
        None if slurm => slurm_master(&get).ok_or_else(|| err("MASTER_ADDR", "not set, and the Slurm job's node list does not name a first host"))?,
        None => return Err(err("MASTER_ADDR", format!("not set, but {world_key}={world_size}: the address of rank 0's host"))),
    };
    let master_port = match get("MASTER_PORT") {
        Some(p) => match p.parse::<u16>() {
            Ok(port) if port > 0 => port,
            _ => return Err(err("MASTER_PORT", format!("`{p}` is not a port number (1-65535)"))),
        },
        None if slurm => match get("SLURM_JOB_ID").and_then(|id| id.parse::<u64>().ok()) {
            Some(job) => 29_500 + (job % 1000) as u16,
            None => return Err(err("MASTER_PORT", "not set, and SLURM_JOB_ID is not there to derive it from")),
        },
        None => return Err(err("MASTER_PORT", format!("not set, but {world_key}={world_size}: a free TCP port on rank 0's host"))),
    };
    Ok(Some(Placement { rank, world_size, local_rank, master_addr, master_port }))
}

/// torchrun's agent serves the store itself and tells workers so; they keep their
/// keys under the restart attempt, as torch.distributed does.
/// Set by `ptrain launch` for rank 0: the descriptor of the socket it listens on at
/// MASTER_PORT, which rank 0's store serves on.
pub const MASTER_LISTEN_FD: &str = "PTRAIN_MASTER_LISTEN_FD";

pub fn master_listen_fd() -> Option<i32> {
    std::env::var(MASTER_LISTEN_FD).ok()?.parse().ok().filter(|fd: &i32| *fd >= 0)
}

pub fn agent_store_prefix() -> Option<String> {
    let var = |k: &str| std::env::var(k).ok();
    (var("TORCHELASTIC_USE_AGENT_STORE").as_deref() == Some("True"))
        .then(|| format!("/worker/attempt_{}", var("TORCHELASTIC_RESTART_COUNT").unwrap_or_else(|| "0".into())))
}

fn slurm_master(get: &impl Fn(&str) -> Option<String>) -> Option<String> {
    let nodes = get("SLURM_JOB_NUM_NODES").or_else(|| get("SLURM_NNODES"));
    if nodes.as_deref() == Some("1") {
        return Some("127.0.0.1".into());
    }
    first_host(&get("SLURM_JOB_NODELIST").or_else(|| get("SLURM_NODELIST"))?)
}

/// The first host of a Slurm node list: `gpu[07-09,12],cpu1` → `gpu07`.
pub fn first_host(list: &str) -> Option<String> {
    let list = list.trim();
    let end = list.find([',', '[']).unwrap_or(list.len());
    let prefix = &list[..end];
    if list[end..].starts_with('[') {
        let inner = &list[end + 1..];
        let first = inner.split([',', '-', ']']).next()?;
        if first.is_empty() {
            return None;
        }
        return Some(format!("{prefix}{first}"));
    }
    (!prefix.is_empty()).then(|| prefix.to_string())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn with(vars: &[(&str, &str)]) -> Result<Option<Placement>, EnvError> {
        let map: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        placement_from(|k| map.get(k).cloned())
    }

    const TORCHRUN: &[(&str, &str)] =
        &[("RANK", "1"), ("LOCAL_RANK", "1"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "10.0.0.5"), ("MASTER_PORT", "29400")];

    #[test]
    fn torchrun_variables_place_the_process() {
        let p = with(TORCHRUN).unwrap().unwrap();
        assert_eq!(p, Placement { rank: 1, world_size: 2, local_rank: 1, master_addr: "10.0.0.5".into(), master_port: 29400 });
    }

    #[test]
    fn no_world_or_a_world_of_one_is_single_process() {
        assert_eq!(with(&[]).unwrap(), None);
        assert_eq!(with(&[("WORLD_SIZE", "1"), ("RANK", "0")]).unwrap(), None);
        assert_eq!(with(&[("SLURM_NTASKS", "1"), ("SLURM_PROCID", "0")]).unwrap(), None);
    }

    #[test]
    fn bad_values_name_the_variable() {
        let mut vars = TORCHRUN.to_vec();
        vars[0] = ("RANK", "2");
        assert_eq!(with(&vars).unwrap_err().key, "RANK");
        vars[0] = ("RANK", "one");
        assert_eq!(with(&vars).unwrap_err().key, "RANK");
        let no_addr: Vec<_> = TORCHRUN.iter().filter(|(k, _)| *k != "MASTER_ADDR").copied().collect();
        assert_eq!(with(&no_addr).unwrap_err().key, "MASTER_ADDR");
        let mut bad_port = TORCHRUN.to_vec();
        bad_port[4] = ("MASTER_PORT", "70000");
        assert_eq!(with(&bad_port).unwrap_err().key, "MASTER_PORT");
        assert_eq!(with(&[("WORLD_SIZE", "0")]).unwrap_err().key, "WORLD_SIZE");
        let mut local = TORCHRUN.to_vec();
        local.push(("LOCAL_WORLD_SIZE", "1"));
        assert_eq!(with(&local).unwrap_err().key, "LOCAL_RANK");
    }

    #[test]
    fn slurm_is_the_fallback_and_derives_the_master() {
        let slurm =
            [("SLURM_NTASKS", "4"), ("SLURM_PROCID", "3"), ("SLURM_LOCALID", "1"), ("SLURM_JOB_NODELIST", "gpu[07-08]"), ("SLURM_JOB_ID", "123456")];
        let p = with(&slurm).unwrap().unwrap();
        assert_eq!(p, Placement { rank: 3, world_size: 4, local_rank: 1, master_addr: "gpu07".into(), master_port: 29_956 });
        let mut one_node = slurm.to_vec();
        one_node.push(("SLURM_JOB_NUM_NODES", "1"));
        assert_eq!(with(&one_node).unwrap().unwrap().master_addr, "127.0.0.1");
        // torchrun inside a Slurm job wins.
        let mut both = slurm.to_vec();
        both.extend_from_slice(TORCHRUN);
        assert_eq!(with(&both).unwrap().unwrap().world_size, 2);
    }

    #[test]
    fn first_host_of_node_lists() {
        assert_eq!(first_host("node1").as_deref(), Some("node1"));
        assert_eq!(first_host("a1,a2").as_deref(), Some("a1"));
        assert_eq!(first_host("gpu[07-09,12],cpu1").as_deref(), Some("gpu07"));
        assert_eq!(first_host("gpu-[3,5]").as_deref(), Some("gpu-3"));
        assert_eq!(first_host(""), None);
    }
}
