//! `tp_btf/sched_switch`: on-CPU time and context switches per cgroup.
//!
//! At a switch the tracepoint runs in the context of `prev` (current is still `prev`), so
//! `bpf_get_current_cgroup_id` names the cgroup whose thread just ran; the time since the
//! previous switch on this CPU is its on-CPU slice.

use aya_ebpf::{
    Global,
    helpers::{bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{btf_tracepoint, map},
    maps::{PerCpuArray, PerCpuHashMap},
    programs::BtfTracePointContext,
};
use probe_common::{
    DEFAULT_MAX_WORKERS,
    cpu::{CpuStats, LastSwitch},
    drops::{DROP_CPU_STATS, DROP_SLOTS},
};

/// cgroup id → what its threads did on this CPU.
#[map]
static CPU_STATS: PerCpuHashMap<u64, CpuStats> =
    PerCpuHashMap::with_max_entries(DEFAULT_MAX_WORKERS, 0);

/// Slot 0: this CPU's last switch (all zero before the first one).
#[map]
static LAST_SWITCH: PerCpuArray<LastSwitch> = PerCpuArray::with_max_entries(1, 0);

/// Failed inserts, one slot per map (see `probe_common::drops`).
#[map]
pub(crate) static DROPS: PerCpuArray<u64> = PerCpuArray::with_max_entries(DROP_SLOTS, 0);

/// `offsetof(struct task_struct, se.sum_exec_runtime)`, set by the loader from the kernel's BTF.
#[unsafe(no_mangle)]
static TASK_SUM_EXEC_RUNTIME_OFFSET: Global<u32> = Global::new(0);
/// `offsetof(struct task_struct, pid)`, set by the loader.
#[unsafe(no_mangle)]
static TASK_PID_OFFSET: Global<u32> = Global::new(0);

/// The scheduler starts charging a task when it picks it, a little before the tracepoint.
const MAX_PICK_LEAD_NS: u64 = 1_000_000;

/// `BPF_NOEXIST`: insert only if the key is absent.
const BPF_NOEXIST: u64 = 1;

/// Adds one to a drop counter.
#[inline(always)]
pub(crate) fn count_drop(slot: u32) {
    if let Some(drops) = DROPS.get_ptr_mut(slot) {
        // SAFETY: per-CPU slot, only this CPU writes it while this program runs.
        unsafe { *drops += 1 };
    }
}

/// `sched_switch(bool preempt, struct task_struct *prev, struct task_struct *next,
/// unsigned int prev_state)`.
#[btf_tracepoint(function = "sched_switch")]
pub fn sched_switch(ctx: BtfTracePointContext) -> u32 {
    let now_ns = unsafe { bpf_ktime_get_ns() };
    let Some(last) = LAST_SWITCH.get_ptr_mut(0) else {
        return 0;
    };
    let prev: *const u8 = ctx.arg(1);
    let next: *const u8 = ctx.arg(2);
    // The scheduler charged prev's runtime (sum_exec_runtime) just before this tracepoint, and
    // next's is current since it was not running. The offset comes from the kernel's BTF.
    let sum_offset = TASK_SUM_EXEC_RUNTIME_OFFSET.load() as usize;
    // SAFETY: prev and next are the tracepoint's task pointers (PTR_TO_BTF_ID); the verifier
    // checks each load against the kernel's BTF.
    let (prev_sum_ns, next_sum_ns, next_tid) = unsafe {
        (
            core::ptr::read_volatile(prev.add(sum_offset) as *const u64),
            core::ptr::read_volatile(next.add(sum_offset) as *const u64),
            core::ptr::read_volatile(next.add(TASK_PID_OFFSET.load() as usize) as *const u32),
        )
    };
    // SAFETY: per-CPU slot; preemption is off inside the tracepoint.
    let since = unsafe { *last };
    unsafe {
        *last = LastSwitch {
            at_ns: now_ns,
            next_sum_exec_runtime_ns: next_sum_ns,
            switch_count: since.switch_count + 1,
            next_tid,
            reserved: 0,
        }
    };
    // The first switch seen on a CPU has no start; the idle task (pid 0) is node idle.
    if since.at_ns == 0 || bpf_get_current_pid_tgid() as u32 == 0 {
        return 0;
    }
    // prev is the task that was `next` at this CPU's previous switch: what the kernel charged
    // it since then is its slice, exactly as cpu.stat counts it (stolen time left out). A
    // figure beyond the wall-clock slice means a baseline we cannot trust (a CPU that went
    // offline in between): use the wall-clock slice.
    let wall_slice_ns = now_ns - since.at_ns;
    let run_ns = prev_sum_ns.wrapping_sub(since.next_sum_exec_runtime_ns);
    let slice_ns = if run_ns <= wall_slice_ns + MAX_PICK_LEAD_NS {
        run_ns
    } else {
        wall_slice_ns
    };
    let preempt: u64 = ctx.arg(0);
    let prev_state: u64 = ctx.arg(3);
    // As the kernel counts nvcsw: a switch is voluntary when the thread left the run queue.
    let voluntary = (preempt & 1) == 0 && (prev_state & 0xffff_ffff) != 0;
    let cgroup_id = unsafe { bpf_get_current_cgroup_id() };

    if let Some(stats) = CPU_STATS.get_ptr_mut(cgroup_id) {
        // SAFETY: per-CPU value of this CPU; no other writer while we run.
        unsafe { add_slice(&mut *stats, slice_ns, voluntary) };
        return 0;
    }
    insert_first_slice(cgroup_id, slice_ns, voluntary);
    0
}

#[inline(always)]
fn add_slice(stats: &mut CpuStats, slice_ns: u64, voluntary: bool) {
    stats.on_cpu_ns += slice_ns;
    if voluntary {
        stats.voluntary_switches += 1;
    } else {
        stats.involuntary_switches += 1;
    }
}

/// Rare path: the first slice of a cgroup (on this node since load).
#[inline(never)]
fn insert_first_slice(cgroup_id: u64, slice_ns: u64, voluntary: bool) {
    let mut first = CpuStats::default();
    add_slice(&mut first, slice_ns, voluntary);
    if CPU_STATS.insert(cgroup_id, first, BPF_NOEXIST).is_ok() {
        return;
    }
    // Another CPU may have inserted the same cgroup a moment ago.
    if let Some(stats) = CPU_STATS.get_ptr_mut(cgroup_id) {
        // SAFETY: as above.
        unsafe { add_slice(&mut *stats, slice_ns, voluntary) };
    } else {
        count_drop(DROP_CPU_STATS);
    }
}
