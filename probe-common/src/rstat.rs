//! CPU time from the kernel's own per-CPU cgroup accounting (the rstat base stats the scheduler
//! adds every slice to), read by an `iter/cgroup` program at each sample: CPU per worker and per
//! CPU with no program on `sched_switch`.

/// Names of the read-only globals the loader sets from the kernel's BTF.
pub const CGROUP_RSTAT_CPU_OFFSET_GLOBAL: &str = "CGROUP_RSTAT_CPU_OFFSET";
/// Offset of the base stats' `struct task_cputime` inside the per-CPU rstat struct.
pub const RSTAT_CPUTIME_OFFSET_GLOBAL: &str = "RSTAT_CPUTIME_OFFSET";
/// Offsets of `utime`, `stime` and `sum_exec_runtime` in `struct task_cputime`.
pub const CPUTIME_UTIME_OFFSET_GLOBAL: &str = "CPUTIME_UTIME_OFFSET";
/// See [`CPUTIME_UTIME_OFFSET_GLOBAL`].
pub const CPUTIME_STIME_OFFSET_GLOBAL: &str = "CPUTIME_STIME_OFFSET";
/// See [`CPUTIME_UTIME_OFFSET_GLOBAL`].
pub const CPUTIME_RUNTIME_OFFSET_GLOBAL: &str = "CPUTIME_RUNTIME_OFFSET";
/// Offset of `struct bpf_array`'s per-CPU pointers (`pptrs`), to learn each CPU's per-CPU
/// offset from a per-CPU array of our own.
pub const BPF_ARRAY_PPTRS_OFFSET_GLOBAL: &str = "BPF_ARRAY_PPTRS_OFFSET";
/// Possible CPUs: the per-CPU reads go up to this one.
pub const POSSIBLE_CPUS_GLOBAL: &str = "POSSIBLE_CPUS";

/// Most CPUs the programs read per cgroup (a bound the verifier needs).
pub const MAX_CPUS: u32 = 1024;

/// The 8-byte words of `struct task_cputime` (utime, stime, sum_exec_runtime) that the cgroup
/// iterator copies from each CPU in one read; the loader checks that the three fit.
pub const CPUTIME_WORDS: usize = 3;

/// Name of the hash map: [`RstatKey`] of a removed cgroup → its [`RstatCpu`] on that CPU at its
/// removal. User space takes the entries when it finishes the worker.
pub const FINAL_CPU_MAP: &str = "FINAL_CPU";

/// A cgroup on a CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RstatKey {
    /// cgroup v2 id.
    pub cgroup_id: u64,
    /// The CPU.
    pub cpu: u32,
    /// Keeps the size a multiple of 8 with no implicit padding.
    pub reserved: u32,
}

const _: () = assert!(core::mem::size_of::<RstatKey>() == 16);

/// A cgroup's own threads' CPU time on one CPU since the cgroup was made (not its
/// descendants'). Counters only grow.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RstatCpu {
    /// Nanoseconds its threads ran (the scheduler's precise accounting).
    pub runtime_ns: u64,
    /// User-mode time by tick sampling: the split of `runtime_ns`, not a time of its own.
    pub user_tick_ns: u64,
    /// Kernel-mode time by tick sampling.
    pub system_tick_ns: u64,
}

/// Name of the hash map the iterator fills: [`RstatKey`] → [`RstatNow`], for every cgroup and
/// CPU it ran on. (A cgroup iterator's own output holds 8 pages a walk: too few for a node's
/// cgroups times its CPUs.)
pub const CPU_NOW_MAP: &str = "CPU_NOW";

/// Name of the one-entry array holding the id of the last walk that ended.
pub const LAST_WALK_MAP: &str = "LAST_WALK";

/// A cgroup's times on a CPU as the walk that wrote them found them.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RstatNow {
    /// The times.
    pub cpu: RstatCpu,
    /// The walk (the iterator session's id): an entry no later walk rewrote is of a cgroup
    /// that is gone.
    pub walk: u64,
}

#[cfg(feature = "user")]
// SAFETY: plain `#[repr(C)]` integers, explicit padding field, every bit pattern valid.
unsafe impl aya::Pod for RstatKey {}
#[cfg(feature = "user")]
// SAFETY: plain `#[repr(C)]` integers, no padding, every bit pattern valid.
unsafe impl aya::Pod for RstatCpu {}
#[cfg(feature = "user")]
// SAFETY: plain `#[repr(C)]` integers, no padding, every bit pattern valid.
unsafe impl aya::Pod for RstatNow {}
