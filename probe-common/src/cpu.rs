//! On-CPU time and context switches per cgroup, written by the `sched_switch` program.

/// Name of the per-CPU hash map: cgroup id (`u64`) → [`CpuStats`] of that cgroup on each CPU.
pub const CPU_STATS_MAP: &str = "CPU_STATS";

/// Name of the per-CPU array (one slot) describing each CPU's last switch: [`LastSwitch`].
pub const LAST_SWITCH_MAP: &str = "LAST_SWITCH";

/// A CPU's last context switch: what is running there now, and since when.
///
/// The programs add a slice to [`CpuStats`] only when it ends; user space adds the slice still
/// running from this record, so a thread that never leaves its CPU is still seen.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LastSwitch {
    /// The incoming task's `struct task_struct` address, an opaque key.
    pub next_task: u64,
    /// How much of the incoming thread's `se.sum_exec_runtime` is already in the maps: its
    /// running slice is its runtime now minus this.
    pub next_accounted_runtime_ns: u64,
    /// Switches seen on this CPU: tells a reader whether the record changed under it.
    pub switch_count: u64,
    /// The incoming thread's id (0: the CPU went idle).
    pub next_tid: u32,
    /// Keeps the size a multiple of 8 with no implicit padding.
    pub reserved: u32,
}

const _: () = assert!(core::mem::size_of::<LastSwitch>() == 32);

#[cfg(feature = "user")]
// SAFETY: plain `#[repr(C)]` integers, explicit padding field, every bit pattern valid.
unsafe impl aya::Pod for LastSwitch {}

/// What one cgroup's threads did on one CPU. Counters only grow.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuStats {
    /// Nanoseconds the cgroup's threads ran on this CPU.
    pub on_cpu_ns: u64,
    /// Switches out because the thread blocked or slept (it gave the CPU up).
    pub voluntary_switches: u64,
    /// Switches out while still runnable (preempted or yielded).
    pub involuntary_switches: u64,
}

const _: () = assert!(core::mem::size_of::<CpuStats>() == 24);

#[cfg(feature = "user")]
// SAFETY: plain `#[repr(C)]` integers, no padding, every bit pattern valid.
unsafe impl aya::Pod for CpuStats {}
