//! How busy the node's machine is, for `nimbus status` and the dashboard:
//! CPU use since the last sample (from `/proc/stat`) and memory in use
//! (`MemTotal - MemAvailable` of `/proc/meminfo`), sent with every
//! heartbeat.

use crate::cluster::HostLoad;

/// Samples the machine's load; keeps the CPU counters of the last sample.
#[derive(Default)]
pub(super) struct HostSampler {
    /// (busy, total) jiffies at the last sample.
    last: Option<(u64, u64)>,
}

impl HostSampler {
    /// The load now; `None` where `/proc` cannot be read (not Linux).
    pub(super) fn sample(&mut self) -> Option<HostLoad> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
        let now = cpu_jiffies(&stat)?;
        let (memory_used, memory_total) = memory(&meminfo)?;
        let cpu_percent = match self.last.replace(now) {
            Some(before) => cpu_percent(before, now),
            None => cpu_percent((0, 0), now),
        };
        Some(HostLoad {
            cpu_percent,
            memory_used,
            memory_total,
        })
    }
}

/// (busy, total) jiffies of all CPUs, from `/proc/stat`'s `cpu` line.
fn cpu_jiffies(stat: &str) -> Option<(u64, u64)> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let values: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guests are in user).
    let total: u64 = values.iter().take(8).sum();
    let idle = values.get(3)? + values.get(4).copied().unwrap_or(0);
    Some((total.saturating_sub(idle), total))
}

/// Percent of CPU time busy between two samples.
fn cpu_percent((busy0, total0): (u64, u64), (busy1, total1): (u64, u64)) -> f64 {
    let total = total1.saturating_sub(total0);
    if total == 0 {
        return 0.0;
    }
    100.0 * busy1.saturating_sub(busy0) as f64 / total as f64
}

/// (used, total) bytes of memory, from `/proc/meminfo`.
fn memory(meminfo: &str) -> Option<(u64, u64)> {
    let field = |name: &str| -> Option<u64> {
        let line = meminfo.lines().find(|l| l.starts_with(name))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    };
    let total = field("MemTotal:")?;
    let available = field("MemAvailable:")?;
    Some((total.saturating_sub(available), total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_and_memory_are_read_from_proc_texts() {
        let before = cpu_jiffies("cpu  100 0 100 700 100 0 0 0 0 0\ncpu0 1 2 3 4\n").unwrap();
        let after = cpu_jiffies("cpu  150 0 150 800 100 0 0 0 0 0\n").unwrap();
        assert_eq!(before, (200, 1000));
        assert_eq!(cpu_percent(before, after), 50.0);
        assert_eq!(cpu_percent(after, after), 0.0);
        let meminfo = "MemTotal:       1000 kB\nMemFree:         100 kB\nMemAvailable:    400 kB\n";
        assert_eq!(memory(meminfo), Some((600 * 1024, 1000 * 1024)));
        assert_eq!(memory("nothing"), None);
    }

    #[test]
    fn this_machine_can_be_sampled() {
        let mut sampler = HostSampler::default();
        let first = sampler.sample().unwrap();
        let second = sampler.sample().unwrap();
        for load in [first, second] {
            assert!((0.0..=100.0).contains(&load.cpu_percent), "{load:?}");
            assert!(load.memory_used > 0 && load.memory_used <= load.memory_total);
        }
    }
}
