//! Process workers (`watch --processes`): the kernel tells of each process made (fork), each
//! program started (exec, with its command line) and each thread's final totals, read from the
//! kernel's own per-thread accounting at its last switch-out, through one ring buffer. No
//! per-event accounting is added for it: a thread's CPU time, run-queue wait and context
//! switches are the kernel's own counters, read once by the sched_switch programs at its last
//! switch-out (one test of `prev_state` per switch, compiled out when off), and the socket
//! programs add each call's bytes to the thread's storage.

/// Name of the ring buffer of process events.
pub const PROCESS_EVENTS_MAP: &str = "PROCESS_EVENTS";
/// Size of the ring: its reader thread empties it on every wake-up; 1 MiB holds about 7,000
/// thread records.
pub const PROCESS_EVENTS_BYTES: u32 = 1024 * 1024;
/// Name of the per-CPU map of each process's CPU time on each CPU (pid → ns), kept by the
/// sched_switch programs for process workers and taken by user space at the process's end.
pub const PROCESS_CPU_MAP: &str = "PROCESS_CPU";
/// Processes `PROCESS_CPU` holds.
pub const PROCESS_CPU_ENTRIES: u32 = 65_536;
/// Name of the per-CPU map of each process's socket bytes so far (pid → [`ProcessBytes`]),
/// kept by the socket programs for process workers so a running tree's bytes can be read
/// live; user space frees each process's entry at its end.
pub const PROCESS_NET_MAP: &str = "PROCESS_NET";

/// One process's socket payload on one CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessBytes {
    /// Bytes its threads sent.
    pub sent_bytes: u64,
    /// Bytes its threads received.
    pub received_bytes: u64,
}

#[cfg(feature = "user")]
// SAFETY: plain `#[repr(C)]` integers, no padding, every bit pattern valid.
unsafe impl aya::Pod for ProcessBytes {}
/// Global: 1 when process events are wanted; read-only, so the verifier drops their code
/// from the programs when it is 0.
pub const PROCESSES_ON_GLOBAL: &str = "PROCESSES_ON";
/// Longest command line carried by an exec event (longer ones are cut).
pub const ARGS_BYTES: usize = 512;

/// [`ProcessFork`]: a process was made.
pub const PROCESS_FORKED: u32 = 1;
/// [`ProcessExec`]: a process started a program.
pub const PROCESS_EXECED: u32 = 2;
/// [`ThreadEnd`]: a thread's final totals.
pub const THREAD_ENDED: u32 = 3;
/// [`ProcessExiting`]: a process's last thread began to exit, its memory not yet released.
pub const PROCESS_EXITING: u32 = 4;

/// A new process (not a thread): `clone` without `CLONE_THREAD`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProcessFork {
    /// [`PROCESS_FORKED`].
    pub kind: u32,
    /// The new process's id.
    pub pid: u32,
    /// The process that made it.
    pub parent_pid: u32,
    /// Padding, zero.
    pub pad: u32,
    /// CLOCK_MONOTONIC ns.
    pub at_ns: u64,
}

const _: () = assert!(core::mem::size_of::<ProcessFork>() == 24);

/// A process started a program (`execve`), with the program's command line.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProcessExec {
    /// [`PROCESS_EXECED`].
    pub kind: u32,
    /// Process id.
    pub pid: u32,
    /// CLOCK_MONOTONIC ns.
    pub at_ns: u64,
    /// Bytes of `args` used: the arguments, each NUL-terminated, as in /proc/PID/cmdline.
    pub args_len: u32,
    /// Padding, zero.
    pub pad: u32,
    /// The command line.
    pub args: [u8; ARGS_BYTES],
}

const _: () = assert!(core::mem::size_of::<ProcessExec>() == 24 + ARGS_BYTES);

/// A process's resident set as it ends: told by its last thread to exit, from
/// `sched_process_exit` on kernels that call it before the memory is released (it then
/// passes `group_dead`), so only there.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProcessExiting {
    /// [`PROCESS_EXITING`].
    pub kind: u32,
    /// Process id.
    pub pid: u32,
    /// Resident pages (file, anonymous and shared memory), as /proc/PID/status's VmRSS
    /// reads them.
    pub rss_pages: u64,
}

const _: () = assert!(core::mem::size_of::<ProcessExiting>() == 16);

/// A thread's final totals, at its last switch-out (its CPU time whole).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ThreadEnd {
    /// [`THREAD_ENDED`].
    pub kind: u32,
    /// Thread id; equal to `pid` for the process's main thread.
    pub tid: u32,
    /// Process id.
    pub pid: u32,
    /// `exit_code` as wait() reports it: `code << 8`, or the signal that ended it.
    pub exit_code: u32,
    /// Threads of the process not yet exiting (`signal->live`).
    pub live_threads: u32,
    /// Threads of the process not yet released (`signal->nr_threads`): an exited thread is
    /// released just before its last switch-out, the main thread only when it is reaped.
    pub unreleased_threads: u32,
    /// cgroup v2 id the thread ended in.
    pub cgroup_id: u64,
    /// CLOCK_MONOTONIC ns when the thread started.
    pub started_ns: u64,
    /// CLOCK_MONOTONIC ns when it exited (0: unknown).
    pub exited_ns: u64,
    /// CPU time (`se.sum_exec_runtime`).
    pub runtime_ns: u64,
    /// Tick-sampled user time.
    pub utime_ns: u64,
    /// Tick-sampled system time.
    pub stime_ns: u64,
    /// Time runnable, waiting for a CPU (`sched_info.run_delay`).
    pub run_delay_ns: u64,
    /// Voluntary context switches.
    pub voluntary_switches: u64,
    /// Involuntary context switches.
    pub involuntary_switches: u64,
    /// The process's largest resident set (`signal->maxrss`, pages).
    pub max_rss_pages: u64,
    /// Socket payload the thread sent.
    pub sent_bytes: u64,
    /// Socket payload the thread received.
    pub received_bytes: u64,
    /// The thread's sleeps by wait reason (`crate::wait::WAIT_*`), ns.
    pub wait_ns: [u64; crate::wait::WAIT_REASONS],
    /// The thread's name (`comm`), NUL-padded.
    pub comm: [u8; 16],
}

const _: () =
    assert!(core::mem::size_of::<ThreadEnd>() == 24 + 12 * 8 + 8 * crate::wait::WAIT_REASONS + 16);

/// Fields the process programs read, resolved from the kernel's BTF.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessOffsets {
    /// `task_struct.start_time`.
    pub task_start_time: u32,
    /// `task_struct.exit_code`.
    pub task_exit_code: u32,
    /// `task_struct.nvcsw`.
    pub task_nvcsw: u32,
    /// `task_struct.nivcsw`.
    pub task_nivcsw: u32,
    /// `task_struct.comm`.
    pub task_comm: u32,
    /// `task_struct.mm`.
    pub task_mm: u32,
    /// `mm_struct.arg_start`.
    pub mm_arg_start: u32,
    /// `mm_struct.arg_end`.
    pub mm_arg_end: u32,
    /// `signal_struct.live`.
    pub signal_live: u32,
    /// `signal_struct.nr_threads`.
    pub signal_nr_threads: u32,
    /// `mm_struct.rss_stat`'s first resident-page counter (0: a layout the agent cannot read).
    pub mm_rss_stat: u32,
    /// Bytes from one counter of `rss_stat` to the next (`sizeof(struct percpu_counter)`, or
    /// of `atomic_long_t` before Linux 6.2).
    pub rss_counter_stride: u32,
    /// `percpu_counter.count` (0 for an atomic): the counter's shared value.
    pub rss_counter_count: u32,
    /// `percpu_counter.counters`: its per-CPU parts (0 for an atomic, which has none).
    pub rss_counter_percpu: u32,
}

/// Globals holding [`ProcessOffsets`], in field order.
pub const PROCESS_OFFSET_GLOBALS: [&str; 14] = [
    "TASK_START_TIME_OFFSET",
    "TASK_EXIT_CODE_OFFSET",
    "TASK_NVCSW_OFFSET",
    "TASK_NIVCSW_OFFSET",
    "TASK_COMM_OFFSET",
    "TASK_MM_OFFSET",
    "MM_ARG_START_OFFSET",
    "MM_ARG_END_OFFSET",
    "SIGNAL_LIVE_OFFSET",
    "SIGNAL_NR_THREADS_OFFSET",
    "MM_RSS_STAT_OFFSET",
    "RSS_COUNTER_STRIDE",
    "RSS_COUNTER_COUNT_OFFSET",
    "RSS_COUNTER_PERCPU_OFFSET",
];

/// `rss_stat` counters that make up the resident set, as /proc's VmRSS adds them:
/// `MM_FILEPAGES`, `MM_ANONPAGES` and `MM_SHMEMPAGES` (not `MM_SWAPENTS`, index 2), in the
/// order of the kernel's anonymous enum in include/linux/mm_types_task.h, which BTF does not
/// name.
pub const RSS_COUNTERS: [u32; 3] = [0, 1, 3];

/// The highest of [`RSS_COUNTERS`]: the programs read the counters up to it.
pub const RSS_HIGHEST: u32 = {
    let mut highest = 0;
    let mut i = 0;
    while i < RSS_COUNTERS.len() {
        if RSS_COUNTERS[i] > highest {
            highest = RSS_COUNTERS[i];
        }
        i += 1;
    }
    highest
};

/// The most the programs copy of `mm_struct.rss_stat` in one read (counters 0 up to the
/// highest of [`RSS_COUNTERS`]); a kernel whose counters take more has its process memory
/// read from /proc instead.
pub const RSS_BLOCK_BYTES: u32 = 1024;

impl ProcessOffsets {
    /// The offsets in the order of [`PROCESS_OFFSET_GLOBALS`].
    pub fn values(&self) -> [u32; 14] {
        [
            self.task_start_time,
            self.task_exit_code,
            self.task_nvcsw,
            self.task_nivcsw,
            self.task_comm,
            self.task_mm,
            self.mm_arg_start,
            self.mm_arg_end,
            self.signal_live,
            self.signal_nr_threads,
            self.mm_rss_stat,
            self.rss_counter_stride,
            self.rss_counter_count,
            self.rss_counter_percpu,
        ]
    }
}
