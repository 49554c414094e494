//! Raw samples: cumulative counters as read from the maps, per cgroup.

use std::collections::BTreeMap;

use probe_common::{cpu::CpuStats, net::NetStats};

use crate::clock::Timestamp;

/// The kernel's own CPU accounting of a cgroup, from its `cpu.stat` (includes descendants).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CpuStatUsec {
    /// `usage_usec`: all CPU time.
    pub usage_usec: u64,
    /// `user_usec`: time in user mode.
    pub user_usec: u64,
    /// `system_usec`: time in the kernel.
    pub system_usec: u64,
}

/// Every counter of one cgroup at one moment, cumulative since the programs were loaded.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WorkerCounters {
    /// Path relative to the cgroup2 mount (`/` is the root); `None` once the cgroup is gone.
    pub path: Option<std::sync::Arc<str>>,
    /// Who the worker is: what its path says and its container runtime adds; `None` with
    /// the path.
    pub identity: Option<std::sync::Arc<super::identity::Identity>>,
    /// On-CPU nanoseconds per CPU, indexed by CPU number: the one counter kept per CPU.
    pub on_cpu_ns_per_cpu: Vec<u64>,
    /// Every other scheduler counter, summed over CPUs. Its `on_cpu_ns` is not used (left 0):
    /// that time is in `on_cpu_ns_per_cpu`. Summed as they are read, a worker's counters take
    /// the same room on a host of 64 CPUs as of 2. Boxed: a sample's workers are moved into
    /// place each sample, and half a KiB each was most of what was moved.
    pub sched: Box<CpuStats>,
    /// Socket counters summed over CPUs.
    pub net: NetStats,
    /// The cgroup's `cpu.stat`, when it was read.
    pub cpu_stat: Option<CpuStatUsec>,
    /// Its remote endpoints, summed over CPUs (with `--programs endpoints`).
    pub endpoints: Vec<super::endpoints::EndpointDelta>,
    /// The memory peaks the kernel kept to its end; only in a removed worker's final counters.
    pub exit_memory: Option<ExitMemoryPeaks>,
}

/// A worker's memory peaks as the kernel kept them when it ended, read by the programs at the
/// moment each was final (so a worker shorter than a sample has them too).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExitMemoryPeaks {
    /// Its memory cgroup's high-water mark at its removal (`memory.peak`), where it had a
    /// memory controller of its own.
    pub cgroup_peak_bytes: Option<u64>,
    /// The largest resident set any one of its processes reached, as the kernel kept it for
    /// wait4's `ru_maxrss` (the mm's high-water mark), over the processes that exited in it.
    pub largest_process_peak_bytes: Option<u64>,
}

/// Drop counters, summed over CPUs, in `probe_common::drops::DROP_NAMES` order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Drops {
    /// One total per named slot.
    pub by_map: Vec<u64>,
}

/// Which measurements the attached programs make. What is not measured is shown as not
/// measured (null, `n/a`) downstream, never as zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Measured {
    /// On-CPU time per CPU (and its user/system split).
    pub cpu: bool,
    /// Context switches (counted by the sched_switch programs; CPU time read from the
    /// kernel's own per-cgroup accounting has none). Absent in older recordings: they counted
    /// them with CPU time.
    #[serde(default = "counted_before")]
    pub switches: bool,
    /// Run-queue wait, blocked on I/O and sleep.
    pub delays: bool,
    /// Socket bytes and calls.
    pub net: bool,
    /// Workers made and removed (exit summaries as they happen).
    pub lifecycle: bool,
    /// Bytes and network waits per remote endpoint. Absent in older recordings: not measured.
    #[serde(default)]
    pub endpoints: bool,
    /// What each sleep waited on (wait reasons). Absent in older recordings: not measured.
    #[serde(default)]
    pub waits: bool,
    /// Whether the received bytes include those read from sockets with splice() (counted
    /// only where the kernel allows fexit). Absent in older recordings: they did not.
    #[serde(default)]
    pub splice_reads: bool,
    /// Whether process workers' resident sets at their end are read (only where the kernel
    /// tells a process's end before releasing its memory). Absent in older recordings: not.
    #[serde(default)]
    pub exit_rss: bool,
}

/// What a recording made before a field existed measured.
fn counted_before() -> bool {
    true
}

impl Default for Measured {
    /// Everything: what every recording made before this field existed measured.
    fn default() -> Self {
        Self {
            cpu: true,
            switches: true,
            delays: true,
            net: true,
            lifecycle: true,
            endpoints: true,
            waits: true,
            splice_reads: true,
            exit_rss: true,
        }
    }
}

/// All workers' cumulative counters at one moment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sample {
    /// What the counters cover; the rest reads zero but is not measured.
    pub measured: Measured,
    /// When the maps were read.
    pub taken_at: Option<Timestamp>,
    /// Counters per cgroup id.
    pub workers: BTreeMap<u64, WorkerCounters>,
    /// Failed map inserts so far.
    pub drops: Drops,
}

impl WorkerCounters {
    /// On-CPU nanoseconds summed over CPUs.
    pub fn on_cpu_ns(&self) -> u64 {
        self.on_cpu_ns_per_cpu.iter().sum()
    }

    /// Adds `other`'s scheduler counters (on-CPU time CPU by CPU) to these.
    pub fn add_sched(&mut self, other: &WorkerCounters) {
        if self.on_cpu_ns_per_cpu.len() < other.on_cpu_ns_per_cpu.len() {
            self.on_cpu_ns_per_cpu
                .resize(other.on_cpu_ns_per_cpu.len(), 0);
        }
        for (sum, add) in self
            .on_cpu_ns_per_cpu
            .iter_mut()
            .zip(&other.on_cpu_ns_per_cpu)
        {
            *sum += add;
        }
        self.sched.add(&other.sched);
    }

    /// Adds one CPU's scheduler counters (as the programs keep them) to these.
    pub fn add_cpu(&mut self, cpu: usize, counters: &CpuStats) {
        if self.on_cpu_ns_per_cpu.len() <= cpu {
            self.on_cpu_ns_per_cpu.resize(cpu + 1, 0);
        }
        self.on_cpu_ns_per_cpu[cpu] += counters.on_cpu_ns;
        self.sched.add(counters);
        self.sched.on_cpu_ns = 0;
    }
}

/// A cgroup2 directory made or removed, as the kernel told it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LifecycleEvent {
    /// cgroup v2 id.
    pub cgroup_id: u64,
    /// CLOCK_MONOTONIC ns when it happened.
    pub at_monotonic_ns: u64,
    /// Made (true) or removed (false).
    pub made: bool,
    /// Path relative to the cgroup2 mount.
    pub path: String,
    /// Who the worker is (its path's and its runtime's names).
    pub identity: std::sync::Arc<super::identity::Identity>,
}

/// Where a memory figure came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemorySource {
    /// cgroup v2 `memory.current` / `memory.peak`: exact, the kernel's own.
    Cgroup2,
    /// cgroup v2 `memory.current` on a kernel without `memory.peak` (before 5.19): the peak
    /// is the highest reading sampled, so a peak between samples is missed.
    Cgroup2Current,
    /// The v1 memory cgroup holding only the worker's processes.
    Cgroup1,
    /// Summed RSS of the worker's processes, sampled: a peak between samples is missed.
    Rss,
    /// At a worker's exit only: the largest resident set any one of its processes reached, as
    /// the kernel kept it for wait4's `ru_maxrss`, read as each process exited. Exact for one
    /// process; processes alive at the same time may have held more together.
    ProcessMaxRss,
}

/// A worker's memory at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MemoryReading {
    /// Memory in use now.
    pub current_bytes: u64,
    /// Highest use the source knows of (for `Rss`, the current sample).
    pub peak_bytes: u64,
    /// Where the figures came from.
    pub source: MemorySource,
}
