//! Process workers (`watch --processes`): `tp_btf/sched_process_fork` tells of each new
//! process, `tp_btf/sched_process_exec` of each program started with its command line, and
//! the sched_switch programs, at a dead thread's last switch-out, of its final totals, read
//! from the kernel's own per-thread accounting. With `PROCESSES_ON` at 0 the verifier reduces
//! the first two to a return and drops the check from the switch programs.
//!
//! Not `sched_process_free`: on the 6.18 host, a free run from a softirq over some tasks
//! never reached the attached program (neither run nor counted as a miss), losing 1 thread
//! in 200.

use core::ffi::c_void;

use aya_ebpf::{
    Global,
    helpers::{
        bpf_ktime_get_ns,
        generated::{bpf_probe_read_kernel, bpf_probe_read_user},
    },
    macros::{btf_tracepoint, map},
    maps::{PerCpuArray, PerCpuHashMap, RingBuf},
    programs::BtfTracePointContext,
};
use probe_common::{
    drops::DROP_PROCESS_EVENTS,
    process::{
        ARGS_BYTES, PROCESS_CPU_ENTRIES, PROCESS_EVENTS_BYTES, PROCESS_EXECED, PROCESS_EXITING,
        PROCESS_FORKED, ProcessBytes, ProcessExec, ProcessExiting, ProcessFork, RSS_BLOCK_BYTES,
        RSS_COUNTERS, RSS_HIGHEST, THREAD_ENDED, ThreadEnd,
    },
};

use crate::{
    sched::{BPF_F_NO_PREALLOC, count_drop},
    task::{self, field},
};

/// Process events, oldest first.
#[map]
static PROCESS_EVENTS: RingBuf = RingBuf::with_byte_size(PROCESS_EVENTS_BYTES, 0);

/// pid → CPU time of its threads on this CPU (process workers' per-CPU split). Not an LRU
/// map: its lookups cost a third more per context switch (bpf_stats); user space frees each
/// process's entry at its end.
#[map]
static PROCESS_CPU: PerCpuHashMap<u32, u64> =
    PerCpuHashMap::with_max_entries(PROCESS_CPU_ENTRIES, BPF_F_NO_PREALLOC);

/// Adds a slice of `pid`'s on this CPU (called by the sched_switch programs).
#[inline(always)]
pub(crate) fn add_cpu(pid: u32, slice_ns: u64) {
    if let Some(total) = PROCESS_CPU.get_ptr_mut(pid) {
        // SAFETY: this CPU's value; no other writer while we run.
        unsafe { *total += slice_ns };
    } else {
        let _ = PROCESS_CPU.insert(pid, slice_ns, 0);
    }
}

/// pid → its threads' socket payload so far on this CPU, for a running tree's live bytes
/// (the final figures come with each thread's end).
#[map]
static PROCESS_NET: PerCpuHashMap<u32, ProcessBytes> =
    PerCpuHashMap::with_max_entries(PROCESS_CPU_ENTRIES, BPF_F_NO_PREALLOC);

/// A new process's first entry: from read-only data, not zeroed on the stack (see `zero`).
static ZERO_BYTES: ProcessBytes = ProcessBytes {
    sent_bytes: 0,
    received_bytes: 0,
};

/// Adds a socket call's bytes to `pid`'s on this CPU (called by the socket programs).
#[inline(always)]
pub(crate) fn add_bytes(pid: u32, bytes: u64, sent: bool) {
    let counted = match PROCESS_NET.get_ptr_mut(pid) {
        Some(counted) => counted,
        None => {
            // By reference: no copy on the stack.
            #[allow(clippy::needless_borrows_for_generic_args)]
            let _ = PROCESS_NET.insert(pid, &ZERO_BYTES, 0);
            let Some(counted) = PROCESS_NET.get_ptr_mut(pid) else {
                return;
            };
            counted
        }
    };
    // SAFETY: this CPU's value; a racing call on this CPU may lose an update, as the
    // cgroup counters may (the final figures come from the threads' own tallies).
    unsafe {
        if sent {
            (*counted).sent_bytes += bytes;
        } else {
            (*counted).received_bytes += bytes;
        }
    }
}

/// 1 when process events are wanted (set by the loader; read-only).
#[unsafe(no_mangle)]
pub(crate) static PROCESSES_ON: Global<u32> = Global::new(0);

#[unsafe(no_mangle)]
static TASK_START_TIME_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static TASK_EXIT_CODE_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static TASK_NVCSW_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static TASK_NIVCSW_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static TASK_COMM_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static TASK_MM_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static MM_ARG_START_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static MM_ARG_END_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static SIGNAL_LIVE_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static SIGNAL_NR_THREADS_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static MM_RSS_STAT_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static RSS_COUNTER_STRIDE: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static RSS_COUNTER_COUNT_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static RSS_COUNTER_PERCPU_OFFSET: Global<u32> = Global::new(0);

/// Whether process events are wanted.
#[inline(always)]
pub(crate) fn on() -> bool {
    PROCESSES_ON.load() != 0
}

/// Adds an ended sleep to the thread's own tally by the reason it slept for, for its
/// process's summary.
#[inline(always)]
pub(crate) fn add_wait(state: &mut task::TaskState, slept_ns: u64) {
    let reason = state.reason as usize & (probe_common::wait::WAIT_REASONS - 1);
    state.own_wait_ns[reason] += slept_ns;
}

/// CLOCK_MONOTONIC ns.
#[inline(always)]
#[allow(unused_unsafe)]
fn now_ns() -> u64 {
    // SAFETY: reads a clock.
    unsafe { bpf_ktime_get_ns() }
}

/// `sched_process_fork(struct task_struct *parent, struct task_struct *child)`.
#[btf_tracepoint(function = "sched_process_fork")]
pub fn proc_fork(ctx: BtfTracePointContext) -> u32 {
    if !on() {
        return 0;
    }
    let parent: task::Task = ctx.arg(0);
    let child: task::Task = ctx.arg(1);
    // A new thread of an existing process is not a new process.
    if task::tid(child) != task::tgid(child) {
        return 0;
    }
    let Some(mut entry) = PROCESS_EVENTS.reserve::<ProcessFork>(0) else {
        count_drop(DROP_PROCESS_EVENTS);
        return 0;
    };
    entry.write(ProcessFork {
        kind: PROCESS_FORKED,
        pid: task::tgid(child),
        parent_pid: task::tgid(parent),
        pad: 0,
        at_ns: now_ns(),
    });
    entry.submit(0);
    0
}

/// `sched_process_exec(struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm)`:
/// `p` is the current task, its new program's arguments already on its stack.
#[btf_tracepoint(function = "sched_process_exec")]
pub fn proc_exec(ctx: BtfTracePointContext) -> u32 {
    if !on() {
        return 0;
    }
    let process: task::Task = ctx.arg(0);
    let Some(mut entry) = PROCESS_EVENTS.reserve::<ProcessExec>(0) else {
        count_drop(DROP_PROCESS_EVENTS);
        return 0;
    };
    let event = entry.as_mut_ptr();
    // SAFETY: `event` points to a reserved, writable ProcessExec; the loads are BTF-checked
    // (a fault yields 0) and the user read is bounded by the buffer.
    unsafe {
        (*event).kind = PROCESS_EXECED;
        (*event).pid = task::tgid(process);
        (*event).at_ns = bpf_ktime_get_ns();
        (*event).pad = 0;
        let mm: *const u8 = field(process, TASK_MM_OFFSET.load());
        let (start, end): (u64, u64) = if mm.is_null() {
            (0, 0)
        } else {
            (
                field(mm, MM_ARG_START_OFFSET.load()),
                field(mm, MM_ARG_END_OFFSET.load()),
            )
        };
        let wanted = end.saturating_sub(start).min(ARGS_BYTES as u64 - 1) as u32;
        // The mask only tells the verifier what the min above already ensures.
        let len = wanted & (ARGS_BYTES as u32 - 1);
        let read = if len == 0 {
            -1
        } else {
            bpf_probe_read_user(
                (*event).args.as_mut_ptr() as *mut c_void,
                len,
                start as *const c_void,
            )
        };
        (*event).args_len = if read == 0 { len } else { 0 };
    }
    entry.submit(0);
    0
}

/// `sched_process_exit(struct task_struct *p, bool group_dead)`, on kernels that call it
/// before the exiting thread lets go of its memory (those that pass `group_dead`; the loader
/// attaches it only there): the last thread of a process to exit tells the resident set the
/// process ends with, which is gone by its last switch-out.
#[btf_tracepoint(function = "sched_process_exit")]
pub fn proc_exit_rss(ctx: BtfTracePointContext) -> u32 {
    if !on() || ctx.arg::<u64>(1) & 0xff == 0 {
        return 0;
    }
    let process: task::Task = ctx.arg(0);
    // The shared values alone, as the kernel's high-water mark (`maxrss`, the peak it is
    // shown beside) counts them: with the per-CPU parts the end could read above the peak.
    let Some(rss_pages) = rss_pages(process, crate::rstat::EXIT_SLOT, false) else {
        // A kernel thread.
        return 0;
    };
    let Some(mut entry) = PROCESS_EVENTS.reserve::<ProcessExiting>(0) else {
        count_drop(DROP_PROCESS_EVENTS);
        return 0;
    };
    entry.write(ProcessExiting {
        kind: PROCESS_EXITING,
        pid: task::tgid(process),
        rss_pages,
    });
    entry.submit(0);
    0
}

/// Per CPU, one for each slot of `rstat::ADDRESS_SLOT`: a process's resident-page counters,
/// copied in one read.
#[map]
static RSS_BLOCK: PerCpuArray<[u64; RSS_BLOCK_WORDS]> =
    PerCpuArray::with_max_entries(crate::rstat::ADDRESS_SLOTS, 0);

/// Words of [`RSS_BLOCK`]'s values, a power of two.
const RSS_BLOCK_WORDS: usize = RSS_BLOCK_BYTES as usize / 8;
const _: () = assert!(RSS_BLOCK_WORDS.is_power_of_two());

/// One CPU's per-CPU parts of counters 0 to [`RSS_HIGHEST`], side by side.
type RssParts = [i32; RSS_HIGHEST as usize + 1];

/// The resident pages of the task's process, as /proc/PID/statm reads them: its mm's counters,
/// each below 0 read as 0, with (`per_cpu_parts`) their per-CPU parts where the loader found
/// them (since 6.16 /proc sums them too; before, the shared value alone is off by up to a
/// batch per CPU). `None` without an mm (a kernel thread, or a leader that exited before its
/// other threads). `slot`: the caller's slot of `rstat::ADDRESS_SLOT`.
///
/// The counters are copied in one read and, where their per-CPU parts lie side by side (one
/// allocation for all of them, as later kernels make it), each CPU's parts in one read more:
/// the process walk does this for every process on the node at every sample.
#[inline(always)]
pub(crate) fn rss_pages(task: task::Task, slot: u32, per_cpu_parts: bool) -> Option<u64> {
    // SAFETY: BTF-checked loads through the task pointer and its mm (a fault yields 0).
    let mm: *const u8 = unsafe { field(task, TASK_MM_OFFSET.load()) };
    if mm.is_null() {
        return None;
    }
    // Read through the address as a number: 6.1's verifier cannot follow a load into the
    // array of `atomic_long_t` (a typedef of a struct) that holds the counters there.
    let mm = crate::rstat::as_number(mm as u64, slot)?;
    let block = RSS_BLOCK.get_ptr_mut(slot)?;
    let stride = RSS_COUNTER_STRIDE.load();
    // The loader checked that it fits; the check here is for the verifier.
    let bytes = (RSS_HIGHEST + 1) * stride;
    if bytes == 0 || bytes > RSS_BLOCK_BYTES {
        return None;
    }
    // SAFETY: `bytes` fit in this CPU's value of the slot, which no other program on this CPU
    // uses (see `rstat::ADDRESS_SLOT`); the helper faults safely.
    let read = unsafe {
        bpf_probe_read_kernel(
            block as *mut c_void,
            bytes,
            mm.wrapping_add(u64::from(MM_RSS_STAT_OFFSET.load())) as *const c_void,
        )
    };
    if read != 0 {
        return Some(0);
    }
    // The word at `offset` bytes into the block (the loader checked the offsets are 8-byte
    // aligned and within it).
    let word = |offset: u32| -> u64 {
        // SAFETY: this CPU's value, index masked into it.
        unsafe { (*block)[(offset / 8) as usize & (RSS_BLOCK_WORDS - 1)] }
    };
    let count = RSS_COUNTER_COUNT_OFFSET.load();
    let mut counters = RSS_COUNTERS.map(|index| word(index * stride + count) as i64);
    let per_cpu = RSS_COUNTER_PERCPU_OFFSET.load();
    if per_cpu_parts && per_cpu != 0 {
        let pointers = RSS_COUNTERS.map(|index| word(index * stride + per_cpu));
        // Where counter 0's part would be if they lie side by side, as `s32`s.
        let first = pointers[0].wrapping_sub(4 * u64::from(RSS_COUNTERS[0]));
        let side_by_side = pointers[0] != 0
            && RSS_COUNTERS
                .iter()
                .zip(pointers)
                .all(|(&index, pointer)| pointer == first.wrapping_add(4 * u64::from(index)));
        crate::rstat::for_each_cpu_offset(slot, |_, cpu_offset| {
            if side_by_side {
                let parts = read_parts(first.wrapping_add(cpu_offset));
                for (value, index) in counters.iter_mut().zip(RSS_COUNTERS) {
                    *value += i64::from(parts.get(index as usize).copied().unwrap_or(0));
                }
            } else {
                for (value, pointer) in counters.iter_mut().zip(pointers) {
                    if pointer != 0 {
                        *value += i64::from(read_s32(pointer.wrapping_add(cpu_offset)));
                    }
                }
            }
        });
    }
    Some(counters.iter().map(|value| (*value).max(0) as u64).sum())
}

/// The per-CPU parts of counters 0 to [`RSS_HIGHEST`] on one CPU, side by side at `address`;
/// zeros if they cannot be read.
#[inline(always)]
fn read_parts(address: u64) -> RssParts {
    // SAFETY: bpf_probe_read_kernel faults safely.
    unsafe { aya_ebpf::helpers::bpf_probe_read_kernel(address as *const RssParts) }
        .unwrap_or([0; RSS_HIGHEST as usize + 1])
}

/// The `i32` at `address` in kernel memory, 0 if it cannot be read.
#[inline(always)]
fn read_s32(address: u64) -> i32 {
    // SAFETY: bpf_probe_read_kernel faults safely.
    unsafe { aya_ebpf::helpers::bpf_probe_read_kernel(address as *const i32) }.unwrap_or(0)
}

/// `TASK_DEAD` in `prev_state`: the outgoing thread has exited and leaves its CPU for good.
pub(crate) const TASK_DEAD: u64 = 0x80;

/// A thread's last switch-out (called by the sched_switch programs when `prev_state` is
/// `TASK_DEAD`): the scheduler has just charged its last slice, so every counter is final.
/// Written field by field into the ring: a `ThreadEnd` built on the stack would not fit
/// beside the switch program's own.
#[inline(never)]
pub(crate) fn thread_end(thread: task::Task, state: Option<&task::TaskState>) {
    let Some(mut entry) = PROCESS_EVENTS.reserve::<ThreadEnd>(0) else {
        count_drop(DROP_PROCESS_EVENTS);
        return;
    };
    let (utime_ns, stime_ns) = task::utime_stime_ns(thread);
    let end = entry.as_mut_ptr();
    // SAFETY: `end` points to a reserved, writable ThreadEnd; the loads are BTF-checked
    // through the task pointer (a fault yields 0).
    unsafe {
        (*end).kind = THREAD_ENDED;
        (*end).tid = task::tid(thread);
        (*end).pid = task::tgid(thread);
        (*end).exit_code = field(thread, TASK_EXIT_CODE_OFFSET.load());
        let signal = task::signal(thread);
        (*end).live_threads = field(signal, SIGNAL_LIVE_OFFSET.load());
        (*end).unreleased_threads = field(signal, SIGNAL_NR_THREADS_OFFSET.load());
        (*end).cgroup_id = task::cgroup_id(thread);
        (*end).started_ns = field(thread, TASK_START_TIME_OFFSET.load());
        (*end).exited_ns = now_ns();
        (*end).runtime_ns = task::sum_exec_runtime_ns(thread);
        (*end).utime_ns = utime_ns;
        (*end).stime_ns = stime_ns;
        (*end).run_delay_ns = task::run_delay_ns(thread);
        (*end).voluntary_switches = field(thread, TASK_NVCSW_OFFSET.load());
        (*end).involuntary_switches = field(thread, TASK_NIVCSW_OFFSET.load());
        (*end).max_rss_pages = task::max_rss_pages(thread);
        // Told even when the thread has no state (its bytes and sleeps then 0): a lost end
        // would keep its process from ever ending.
        match state {
            Some(state) => {
                (*end).sent_bytes = state.sent_bytes;
                (*end).received_bytes = state.received_bytes;
                (*end).wait_ns = state.own_wait_ns;
            }
            None => {
                crate::zero::clear(&mut (*end).sent_bytes);
                crate::zero::clear(&mut (*end).received_bytes);
                crate::zero::zero(&mut (*end).wait_ns);
            }
        }
        (*end).comm = field(thread, TASK_COMM_OFFSET.load());
    }
    entry.submit(0);
}
