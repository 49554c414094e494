//! Counted drops: every failed map insert in a program adds one to its map's slot here.

/// Name of the per-CPU array of drop counters, indexed by the `DROP_*` constants.
pub const DROPS_MAP: &str = "DROPS";

/// A `CPU_STATS` insert failed (map full): that slice of on-CPU time is lost.
pub const DROP_CPU_STATS: u32 = 0;
/// A `NET_STATS` insert failed (map full): that call's bytes are lost.
pub const DROP_NET_STATS: u32 = 1;
/// A task had no local storage at a switch-out, none could be made (the kernel could not
/// allocate, or the storage was busy on that CPU), and nothing tells where its slice began
/// (its switch-in went unreported and it is not of the fair class, which keeps its own
/// record): that slice is lost. Counted nowhere else: without storage at its wakeup or
/// switch-in, or with storage made after a failure, a thread's account starts from its last
/// switch-in (a new thread's from its birth), so nothing is lost; on kernels before 6.2 a busy
/// lookup of storage that exists is counted too, though its slice waits for the next
/// switch-out.
pub const DROP_TASK_STATE: u32 = 2;
/// The lifecycle ring buffer was full: a cgroup made or removed went untold.
pub const DROP_EVENTS: u32 = 3;
/// An `ENDPOINTS` insert failed (map full): that call's per-endpoint figures are lost (the
/// worker's totals are not).
pub const DROP_ENDPOINTS: u32 = 4;
/// A worker had more endpoints than `--max-endpoints-per-worker`: that call went to its
/// `other` endpoint (counted, nothing lost).
pub const DROP_ENDPOINT_OVERFLOW: u32 = 5;
/// A `PROCESS_PEAKS` insert failed (map full): that process's peak memory is lost.
pub const DROP_PROCESS_PEAKS: u32 = 6;
/// The process ring buffer was full: a process made, a program started or a thread's totals
/// went untold.
pub const DROP_PROCESS_EVENTS: u32 = 7;
/// A `FINAL_CPU` insert failed (map full): a removed worker's CPU time on that CPU is lost
/// from its summary.
pub const DROP_FINAL_CPU: u32 = 8;
/// A `CPU_NOW` insert failed (map full): a worker's CPU time on that CPU is not shown until
/// a removed worker's entries are freed.
pub const DROP_CPU_NOW: u32 = 9;
/// A `MEMORY_NOW` insert failed (map full): that worker's memory is read from its files
/// instead (nothing lost, a little more of the agent's CPU).
pub const DROP_MEMORY_NOW: u32 = 10;
/// Number of drop slots (room for the programs to come).
pub const DROP_SLOTS: u32 = 16;
/// Names of the used slots, in order, as reported to users.
pub const DROP_NAMES: [&str; 11] = [
    "cpu_stats",
    "net_stats",
    "task_state",
    "cgroup_events",
    "endpoints",
    "endpoint_overflow",
    "process_peaks",
    "process_events",
    "final_cpu",
    "cpu_now",
    "memory_now",
];
