//! Memory figures, read only when the plugin reports.

/// Resident and peak resident bytes of this process, from `/proc/self/status`.
pub fn host_rss() -> Option<(u64, u64)> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    Some((kib(&status, "VmRSS:")? * 1024, kib(&status, "VmHWM:")? * 1024))
}

fn kib(status: &str, field: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with(field))?;
    line[field.len()..].trim().trim_end_matches("kB").trim().parse().ok()
}

/// The CUDA caching allocator's (allocated, peak allocated, reserved) bytes.
pub fn gpu(device: i32) -> Option<ptrain_torch_ext::cuda::Memory> {
    ptrain_torch_ext::cuda::memory(device).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fields_are_read_in_kib() {
        let status = "Name:\tptrain\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\n";
        assert_eq!(kib(status, "VmRSS:"), Some(1024));
        assert_eq!(kib(status, "VmHWM:"), Some(2048));
        assert_eq!(kib(status, "VmSwap:"), None);
    }

    #[test]
    fn this_process_has_a_resident_set() {
        let (rss, peak) = host_rss().expect("Linux /proc");
        assert!(rss > 0 && peak >= rss, "{rss} {peak}");
    }
}
