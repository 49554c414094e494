//! `tp_btf/sched_switch`: on-CPU time and context switches per cgroup.
//!
//! A slice is what the kernel charged the outgoing task (`se.sum_exec_runtime`) since we last
//! accounted for it, so the figures agree with `cpu.stat` and do not depend on seeing every
//! switch (some kernels hide a few tasks' switches from tracing).

use aya_ebpf::{
    macros::{btf_tracepoint, map},
    maps::{PerCpuArray, PerCpuHashMap},
    programs::BtfTracePointContext,
};
use probe_common::{
    DEFAULT_MAX_WORKERS,
    cpu::{CpuStats, LastSwitch},
    drops::{DROP_CPU_STATS, DROP_SLOTS, DROP_TASK_STATE},
};

use crate::task::{self, Task};

/// cgroup id → what its threads did on this CPU. Allocated per worker, not up front.
#[map]
static CPU_STATS: PerCpuHashMap<u64, CpuStats> =
    PerCpuHashMap::with_max_entries(DEFAULT_MAX_WORKERS, BPF_F_NO_PREALLOC);

/// Slot 0: this CPU's last switch, read by user space to add the slice still running.
#[map]
static LAST_SWITCH: PerCpuArray<LastSwitch> = PerCpuArray::with_max_entries(1, 0);

/// Failed inserts, one slot per map (see `probe_common::drops`).
#[map]
pub(crate) static DROPS: PerCpuArray<u64> = PerCpuArray::with_max_entries(DROP_SLOTS, 0);

/// `BPF_NOEXIST`: insert only if the key is absent.
pub(crate) const BPF_NOEXIST: u64 = 1;
/// `BPF_F_NO_PREALLOC`: allocate entries on insert.
pub(crate) const BPF_F_NO_PREALLOC: u32 = 1;

/// Adds one to a drop counter.
#[inline(always)]
pub(crate) fn count_drop(slot: u32) {
    if let Some(drops) = DROPS.get_ptr_mut(slot) {
        // SAFETY: per-CPU slot, only this CPU writes it while this program runs.
        unsafe { *drops += 1 };
    }
}

/// An empty program on sched_switch: the floor the benchmarks measure the others against.
#[btf_tracepoint(function = "sched_switch")]
pub fn switch_floor(_ctx: BtfTracePointContext) -> u32 {
    0
}

/// CPU accounting only, on `sched_switch(bool preempt, struct task_struct *prev,
/// struct task_struct *next, unsigned int prev_state)`.
#[btf_tracepoint(function = "sched_switch")]
pub fn switch_cpu(ctx: BtfTracePointContext) -> u32 {
    let prev: Task = ctx.arg(1);
    let next: Task = ctx.arg(2);

    // The incoming task: remember where its accounting stands, for user space's view of the
    // running slice. A task seen for the first time starts its account now.
    let next_accounted_ns = match task::state(next) {
        Some(state) => {
            if state.flags & task::SEEN == 0 {
                state.accounted_runtime_ns = task::sum_exec_runtime_ns(next);
                state.flags |= task::SEEN;
            }
            state.accounted_runtime_ns
        }
        None => {
            count_drop(DROP_TASK_STATE);
            task::sum_exec_runtime_ns(next)
        }
    };
    if let Some(last) = LAST_SWITCH.get_ptr_mut(0) {
        // SAFETY: per-CPU slot; preemption is off inside the tracepoint.
        unsafe {
            *last = LastSwitch {
                next_task: next as u64,
                next_accounted_runtime_ns: next_accounted_ns,
                switch_count: (*last).switch_count + 1,
                next_tid: task::tid(next),
                reserved: 0,
            }
        };
    }

    // The outgoing task. The idle task (tid 0) is node idle, not a worker.
    if task::tid(prev) == 0 {
        return 0;
    }
    let Some(state) = task::state(prev) else {
        count_drop(DROP_TASK_STATE);
        return 0;
    };
    // The scheduler charged prev's runtime just before this tracepoint.
    let runtime_ns = task::sum_exec_runtime_ns(prev);
    if state.flags & task::SEEN == 0 {
        // First sight (it was running when we attached): its account starts now.
        state.accounted_runtime_ns = runtime_ns;
        state.flags |= task::SEEN;
        return 0;
    }
    let slice_ns = runtime_ns.saturating_sub(state.accounted_runtime_ns);
    state.accounted_runtime_ns = runtime_ns;

    let preempt: u64 = ctx.arg(0);
    let prev_state: u64 = ctx.arg(3);
    // As the kernel counts nvcsw: a switch is voluntary when the thread left the run queue.
    let voluntary = (preempt & 1) == 0 && (prev_state & 0xffff_ffff) != 0;
    let cgroup_id = task::cgroup_id(prev);
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
