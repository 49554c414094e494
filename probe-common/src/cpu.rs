//! On-CPU time and context switches per cgroup, written by the `sched_switch` program.

use crate::wait::WAIT_REASONS;

/// Name of the per-CPU hash map: cgroup id (`u64`) → [`CpuStats`] of that cgroup on each CPU.
pub const CPU_STATS_MAP: &str = "CPU_STATS";

/// Name of the array (`u64`, 0 or 1) saying whether a program ever made an entry in
/// [`CPU_STATS_MAP`] (index [`HASHED_CPU`]) or the `NET_STATS` map (index [`HASHED_NET`]):
/// workers beyond the slots are rare, and until one comes user space skips reading those
/// hashes (a batch read of an empty hash still scans every bucket).
pub const HASHES_USED_MAP: &str = "HASHES_USED";
/// [`HASHES_USED_MAP`]'s index for [`CPU_STATS_MAP`].
pub const HASHED_CPU: u32 = 0;
/// [`HASHES_USED_MAP`]'s index for the `NET_STATS` map.
pub const HASHED_NET: u32 = 1;

/// Name of the per-CPU array of [`SlotCounters`]: the fast path for the first workers, one slot
/// each, indexed by a slot number the programs keep with each thread (an array update instead
/// of a hash lookup). Workers beyond its slots use [`CPU_STATS_MAP`] and the `NET_STATS` map.
pub const CPU_SLOTS_MAP: &str = "CPU_SLOTS";

/// Name of the hash map: cgroup id (`u64`) → its slot in [`CPU_SLOTS_MAP`] (`u64`).
pub const SLOT_OF_MAP: &str = "SLOT_OF";

/// Name of the stack of free slots (`u32`): the programs take one for a new worker, user space
/// gives it back when the worker's summary is taken.
pub const FREE_SLOTS_MAP: &str = "FREE_SLOTS";

/// Kernel memory the slot array may take, all CPUs together: it is allocated whole at load
/// (a hash entry only per worker), so the number of slots shrinks as CPUs grow.
pub const SLOT_MEMORY_BYTES: usize = 8 << 20;

/// Slots of the per-CPU slot array for `possible_cpus`: within [`SLOT_MEMORY_BYTES`], at least
/// 64, at most `max_workers`.
pub fn fast_slots(possible_cpus: usize, max_workers: u32) -> u32 {
    crate::slots_within(
        SLOT_MEMORY_BYTES,
        core::mem::size_of::<SlotCounters>(),
        possible_cpus,
        max_workers,
    )
}

/// One slot of [`CPU_SLOTS_MAP`] on one CPU: whose counters these are, and the counters.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotCounters {
    /// The cgroup that owns the slot on this CPU (0: unused here). Written when the slot is
    /// first used on this CPU, zeroed with the counters when the slot is given back.
    pub cgroup_id: u64,
    /// Its CPU counters on this CPU.
    pub stats: CpuStats,
    /// Its socket traffic on this CPU (the socket programs use the slot too).
    pub net: crate::net::NetStats,
}

#[cfg(feature = "user")]
// SAFETY: plain `#[repr(C)]` integers, no padding, every bit pattern valid.
unsafe impl aya::Pod for SlotCounters {}

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
    /// Nanoseconds the cgroup's threads were runnable but waiting for a CPU (from wakeup or
    /// preemption to the next switch-in). Counted when the wait ends.
    pub runqueue_wait_ns: u64,
    /// Nanoseconds in uninterruptible sleep (D state: disk and some network file system
    /// waits), from switch-out to wakeup. Counted when the sleep ends.
    pub blocked_io_ns: u64,
    /// Nanoseconds in other sleeps (S state: sockets, locks, timers, idle waits).
    pub sleep_ns: u64,
    /// Wakeups of the cgroup's threads from either kind of sleep.
    pub wakeups: u64,
    /// Run-queue waits by length: bucket 0 is under 1 µs, bucket `b` is [2^(b-1), 2^b) µs, the
    /// last one everything from 2^(RUNQ_BUCKETS-2) µs up.
    pub runqueue_wait_hist: [u64; RUNQ_BUCKETS],
    /// Blocked-I/O plus sleep nanoseconds by wait reason (`crate::wait::WAIT_*`); they sum to
    /// `blocked_io_ns + sleep_ns`. Counted when the sleep ends.
    pub wait_ns: [u64; WAIT_REASONS],
    /// Sleeps by wait reason.
    pub waits: [u64; WAIT_REASONS],
    /// User-mode time the kernel's tick sampling charged the threads (`task_struct.utime`
    /// deltas): the user/system split of `on_cpu_ns`, not a time of its own.
    pub user_tick_ns: u64,
    /// Kernel-mode time by tick sampling (`task_struct.stime` deltas).
    pub system_tick_ns: u64,
}

impl CpuStats {
    /// Adds `other`'s counters to these (user space sums a subtree's workers).
    pub fn add(&mut self, other: &CpuStats) {
        self.on_cpu_ns += other.on_cpu_ns;
        self.voluntary_switches += other.voluntary_switches;
        self.involuntary_switches += other.involuntary_switches;
        self.runqueue_wait_ns += other.runqueue_wait_ns;
        self.blocked_io_ns += other.blocked_io_ns;
        self.sleep_ns += other.sleep_ns;
        self.wakeups += other.wakeups;
        for (sum, add) in self
            .runqueue_wait_hist
            .iter_mut()
            .zip(other.runqueue_wait_hist)
        {
            *sum += add;
        }
        for (sum, add) in self.wait_ns.iter_mut().zip(other.wait_ns) {
            *sum += add;
        }
        for (sum, add) in self.waits.iter_mut().zip(other.waits) {
            *sum += add;
        }
        self.user_tick_ns += other.user_tick_ns;
        self.system_tick_ns += other.system_tick_ns;
    }
}

/// Buckets of the run-queue wait histogram: a power of two, so the programs can bound an
/// index with a mask the verifier understands. The last starts at 2^30 µs (18 minutes).
pub const RUNQ_BUCKETS: usize = 32;

/// The histogram bucket of a wait.
#[inline(always)]
pub fn runq_bucket(wait_ns: u64) -> usize {
    let wait_us = wait_ns / 1_000;
    let bucket = (u64::BITS - wait_us.leading_zeros()) as usize;
    if bucket < RUNQ_BUCKETS {
        bucket
    } else {
        RUNQ_BUCKETS - 1
    }
}

/// Upper edge of a bucket in nanoseconds (`u64::MAX` for the last, open one).
pub fn runq_bucket_upper_ns(bucket: usize) -> u64 {
    if bucket + 1 >= RUNQ_BUCKETS {
        u64::MAX
    } else {
        (1u64 << bucket) * 1_000
    }
}

const _: () =
    assert!(core::mem::size_of::<CpuStats>() == 8 * (9 + RUNQ_BUCKETS + 2 * WAIT_REASONS));

#[cfg(feature = "user")]
// SAFETY: plain `#[repr(C)]` integers, no padding, every bit pattern valid.
unsafe impl aya::Pod for CpuStats {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_log2_microseconds() {
        assert_eq!(runq_bucket(0), 0);
        assert_eq!(runq_bucket(999), 0);
        assert_eq!(runq_bucket(1_000), 1);
        assert_eq!(runq_bucket(1_999), 1);
        assert_eq!(runq_bucket(2_000), 2);
        assert_eq!(runq_bucket(1_000_000), 10); // 1 ms = 1000 µs in [512, 1024)
        assert_eq!(runq_bucket(u64::MAX), RUNQ_BUCKETS - 1);
        assert_eq!(runq_bucket_upper_ns(0), 1_000);
        assert_eq!(runq_bucket_upper_ns(10), 1_024_000);
        assert_eq!(runq_bucket_upper_ns(RUNQ_BUCKETS - 1), u64::MAX);
        // Every wait lands below its bucket's upper edge.
        for wait_ns in [0, 1, 999, 1_000, 5_000, 123_456_789, 60_000_000_000] {
            assert!(wait_ns < runq_bucket_upper_ns(runq_bucket(wait_ns)));
        }
    }

    #[test]
    fn slots_fit_the_memory_budget_within_their_bounds() {
        let slot_bytes = core::mem::size_of::<SlotCounters>();
        assert_eq!(slot_bytes, 8 + 456 + 128);
        // 2 CPUs: as many as 8 MiB holds.
        let two_cpus = fast_slots(2, 16_384);
        assert_eq!(two_cpus as usize, SLOT_MEMORY_BYTES / (2 * slot_bytes));
        assert!(two_cpus as usize * 2 * slot_bytes <= SLOT_MEMORY_BYTES);
        // Many CPUs: never fewer than 64; few workers asked for: never more than asked.
        assert_eq!(fast_slots(4_096, 16_384), 64);
        assert_eq!(fast_slots(2, 100), 100);
        assert_eq!(fast_slots(0, 16_384), fast_slots(1, 16_384));
    }
}
