//! Reference programs for the benchmarks, never part of a measurement: the cost of attaching
//! anything to `sched_switch` (the empty floor), and the least a program that accounts CPU time
//! exactly per task must do there. Between them lies what no sched_switch design can save.

use aya_ebpf::{
    macros::{btf_map, btf_tracepoint, map},
    maps::PerCpuArray,
    programs::BtfTracePointContext,
};
use probe_common::cpu::LastSwitch;

use crate::{
    local_storage::{LocalStorage, TASK_STORAGE},
    sched::record_switch,
    task::{self, Task},
};

/// An empty program on sched_switch: the floor the benchmarks measure the others against.
#[btf_tracepoint(function = "sched_switch")]
pub fn switch_floor(_ctx: BtfTracePointContext) -> u32 {
    0
}

/// The outgoing task's baseline for `switch_least`, apart from the agent's own task state.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct LeastState {
    /// How much of the task's `sum_exec_runtime` is already counted.
    accounted_runtime_ns: u64,
    /// Its counters' index in `LEAST_SLOTS` (always 0: one shared slot).
    slot: u32,
    /// Keeps the size a multiple of 8 with no implicit padding.
    reserved: u32,
}

/// `switch_least`'s per-task baselines (its own: it must not move the agent's).
#[btf_map]
static LEAST_STATE: LocalStorage<LeastState, TASK_STORAGE> = LocalStorage::new();

/// `switch_least`'s record of this CPU's last switch.
#[map]
static LEAST_LAST: PerCpuArray<LastSwitch> = PerCpuArray::with_max_entries(1, 0);

/// `switch_least`'s on-CPU ns, in one slot.
#[map]
static LEAST_SLOTS: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// The least exact per-task CPU accounting on sched_switch: this CPU's last-switch record (for
/// the slice still running), the outgoing task's storage (its runtime baseline and slot), and
/// its slice added to that slot. `switch_cpu` does this and also finds the task's cgroup,
/// checks the slot is still its own, and counts switches and user/system ticks.
#[btf_tracepoint(function = "sched_switch")]
pub fn switch_least(ctx: BtfTracePointContext) -> u32 {
    let prev: Task = ctx.arg(1);
    let next: Task = ctx.arg(2);
    let Some(last) = LEAST_LAST.get_ptr_mut(0) else {
        return 0;
    };
    record_switch(last, next);
    if task::tid(prev) == 0 {
        return 0;
    }
    let Some(state) = LEAST_STATE.task_value(prev, true) else {
        return 0;
    };
    let runtime_ns = task::sum_exec_runtime_ns(prev);
    let slice_ns = runtime_ns.saturating_sub(state.accounted_runtime_ns);
    state.accounted_runtime_ns = runtime_ns;
    if let Some(slot) = LEAST_SLOTS.get_ptr_mut(state.slot) {
        // SAFETY: this CPU's value; no other writer while we run.
        unsafe { *slot += slice_ns };
    }
    0
}
