//! What the agent itself costs the node: its CPU time and resident memory from the kernel's
//! accounting of this process, and its eBPF programs' runs from their file descriptors.

use std::{collections::HashMap, fs};

use crate::model::{AgentCost, ProgramCost};

/// Reads what the agent costs the node; keeps the names of its eBPF programs by id, learnt
/// once per program.
#[derive(Debug, Default)]
pub struct OwnCostReader {
    by_id: HashMap<u32, String>,
}

impl OwnCostReader {
    /// The agent's CPU time, memory and (where the kernel counts runs) per-program cost now;
    /// `collection_duration_seconds` is the caller's last collection's.
    pub fn read(&mut self, collection_duration_seconds: f64) -> AgentCost {
        let bpf_stats_enabled = read_bpf_stats_enabled();
        AgentCost {
            cpu_seconds: agent_cpu_seconds(),
            resident_memory_bytes: fs::read_to_string("/proc/self/status")
                .ok()
                .and_then(|status| parse_vm_rss_bytes(&status)),
            collection_duration_seconds,
            bpf_stats_enabled,
            programs: if bpf_stats_enabled == Some(true) {
                self.own_program_costs()
            } else {
                Vec::new()
            },
        }
    }

    /// Run counts and times of the programs this process loaded: found from its own file
    /// descriptors, so other agents on the node (e.g. a second workerprobe) are not counted.
    fn own_program_costs(&mut self) -> Vec<ProgramCost> {
        let own = own_programs();
        if own
            .iter()
            .any(|program| !self.by_id.contains_key(&program.id))
        {
            // A program's name is in its kernel info, not in fdinfo: ask once.
            for info in aya::programs::loaded_programs().flatten() {
                if own.iter().any(|program| program.id == info.id()) {
                    let name = info.name_as_str().unwrap_or("").to_string();
                    self.by_id.insert(info.id(), name);
                }
            }
        }
        let mut costs: Vec<ProgramCost> = own
            .into_iter()
            .map(|program| ProgramCost {
                program: match self.by_id.get(&program.id) {
                    Some(name) if !name.is_empty() => name.clone(),
                    _ => format!("id{}", program.id),
                },
                runs: program.runs,
                run_time_ns: program.run_time_ns,
            })
            .collect();
        costs.sort_by(|a, b| a.program.cmp(&b.program));
        costs.dedup_by(|a, b| a.program == b.program);
        costs
    }
}

/// A program as its file descriptor's fdinfo shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FdProgram {
    id: u32,
    runs: u64,
    run_time_ns: u64,
}

/// The eBPF programs this process holds open.
fn own_programs() -> Vec<FdProgram> {
    let Ok(entries) = fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    let mut programs: Vec<FdProgram> = entries
        .flatten()
        .filter(|entry| {
            fs::read_link(entry.path())
                .is_ok_and(|target| target.as_os_str() == "anon_inode:bpf-prog")
        })
        .filter_map(|entry| {
            let fdinfo = fs::read_to_string(
                std::path::Path::new("/proc/self/fdinfo").join(entry.file_name()),
            )
            .ok()?;
            parse_prog_fdinfo(&fdinfo)
        })
        .collect();
    programs.sort_by_key(|program| program.id);
    programs.dedup_by_key(|program| program.id);
    programs
}

/// The id and run statistics in a program's `/proc/<pid>/fdinfo/<fd>`.
fn parse_prog_fdinfo(text: &str) -> Option<FdProgram> {
    let field = |name: &str| {
        text.lines().find_map(|line| {
            let (key, value) = line.split_once(':')?;
            (key.trim() == name).then(|| value.trim().parse::<u64>().ok())?
        })
    };
    Some(FdProgram {
        id: u32::try_from(field("prog_id")?).ok()?,
        runs: field("run_cnt").unwrap_or(0),
        run_time_ns: field("run_time_ns").unwrap_or(0),
    })
}

/// Whether the kernel counts program runs (`kernel.bpf_stats_enabled`).
fn read_bpf_stats_enabled() -> Option<bool> {
    let text = fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled").ok()?;
    Some(text.trim() != "0")
}

/// CPU time of this process so far (user + system), seconds.
fn agent_cpu_seconds() -> f64 {
    // SAFETY: getrusage writes one rusage into the zeroed struct we own.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut usage) != 0 {
            return 0.0;
        }
        usage
    };
    let seconds = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// The resident memory in a `/proc/<pid>/status` text (`VmRSS:  1234 kB`), bytes.
fn parse_vm_rss_bytes(status: &str) -> Option<u64> {
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_fdinfo_and_status() {
        let fdinfo = "pos:\t0\nflags:\t02000002\nmnt_id:\t16\nino:\t2072\nprog_type:\t26\nprog_jited:\t1\nprog_tag:\t3b1b6bbd2e5c1e8f\nmemlock:\t4096\nprog_id:\t1234\nrun_time_ns:\t56789\nrun_cnt:\t42\nrecursion_misses:\t0\nverified_insns:\t300\n";
        assert_eq!(
            parse_prog_fdinfo(fdinfo),
            Some(FdProgram {
                id: 1234,
                runs: 42,
                run_time_ns: 56789
            })
        );
        assert_eq!(parse_prog_fdinfo("pos:\t0\n"), None);
        let status = "Name:\tworkerprobe\nVmPeak:\t  9000 kB\nVmRSS:\t   1536 kB\nThreads:\t4\n";
        assert_eq!(parse_vm_rss_bytes(status), Some(1536 * 1024));
        assert_eq!(parse_vm_rss_bytes("Name:\tx\n"), None);
        assert!(agent_cpu_seconds() >= 0.0);
    }
}
