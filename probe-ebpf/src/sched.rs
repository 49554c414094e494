//! `tp_btf/sched_switch`: on-CPU time and context switches per cgroup.
//!
//! A slice is what the kernel charged the outgoing task (`se.sum_exec_runtime`) since we last
//! accounted for it, so the figures agree with `cpu.stat` and do not depend on seeing every
//! switch (some kernels hide a few tasks' switches from tracing).

use aya_ebpf::{
    helpers::bpf_ktime_get_ns,
    macros::{btf_tracepoint, map},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, PerCpuHashMap, Stack},
    programs::BtfTracePointContext,
};
use probe_common::{
    DEFAULT_MAX_WORKERS,
    cpu::{CpuStats, HASHED_CPU, LastSwitch, RUNQ_BUCKETS, SlotCounters, runq_bucket},
    drops::{DROP_CPU_STATS, DROP_SLOTS, DROP_TASK_STATE},
    wait::{
        SYSCALL_WAITS, SYSCALLS, TABLE_ON_FD, TABLE_REASON, TABLE_UNKNOWN, WAIT_NETWORK,
        WAIT_OTHER, WAIT_REASONS, file_wait, unknown_wait,
    },
};

use crate::{
    task::{self, BLOCKED_IO, RUNNING, SLEEPING, Task, TaskState},
    zero::clear,
};

/// `prev_state` bits (include/linux/sched.h).
const TASK_UNINTERRUPTIBLE: u64 = 0x2;
const TASK_NOLOAD: u64 = 0x400;

/// cgroup id → what its threads did on this CPU. Allocated per worker, not up front.
#[map]
static CPU_STATS: PerCpuHashMap<u64, CpuStats> =
    PerCpuHashMap::with_max_entries(DEFAULT_MAX_WORKERS, BPF_F_NO_PREALLOC);

/// `probe_common::cpu::HASHES_USED_MAP`: 1 at `HASHED_CPU` / `HASHED_NET` once a program
/// made an entry in `CPU_STATS` / `NET_STATS`.
#[map]
static HASHES_USED: Array<u64> = Array::with_max_entries(2, 0);

/// Notes, before a first entry is made in one of the hashes, that user space must read it.
/// On the rare path only: a plain store of 1, the same from any CPU.
#[inline(always)]
pub(crate) fn mark_hash_used(index: u32) {
    if let Some(used) = HASHES_USED.get_ptr_mut(index) {
        // SAFETY: an array value; every writer stores the same 1.
        unsafe { core::ptr::write_volatile(used, 1) };
    }
}

/// The fast path: slot → what its cgroup's threads did on this CPU. Sized by the loader
/// (`probe_common::cpu::fast_slots`); workers beyond it use `CPU_STATS`.
#[map]
static CPU_SLOTS: PerCpuArray<SlotCounters> = PerCpuArray::with_max_entries(1, 0);

/// cgroup id → its slot in `CPU_SLOTS`.
#[map]
static SLOT_OF: HashMap<u64, u64> = HashMap::with_max_entries(1, 0);

/// Slots free to take, filled by the loader and refilled by user space as workers end.
#[map]
static FREE_SLOTS: Stack<u32> = Stack::with_max_entries(1, 0);

/// Slot 0: this CPU's last switch, read by user space to add the slice still running.
#[map]
static LAST_SWITCH: PerCpuArray<LastSwitch> = PerCpuArray::with_max_entries(1, 0);

/// Where a process (or a thread moved alone) was last moved to, and when.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Move {
    /// cgroup id it was moved into.
    to_cgroup_id: u64,
    /// CLOCK_MONOTONIC ns of the move.
    at_ns: u64,
}

/// Process id, or thread id with `LONE_THREAD` for a thread moved alone (threaded cgroups) →
/// its last move. Recent moves only: a thread reads its entries at its next switch-out or
/// switch-in after a sleep.
#[map]
static MOVES: LruHashMap<u64, Move> = LruHashMap::with_max_entries(4096, 0);

/// Key bit of a thread moved alone: thread and process ids share one number space.
const LONE_THREAD: u64 = 1 << 32;

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

/// CPU accounting only, on `sched_switch(bool preempt, struct task_struct *prev,
/// struct task_struct *next, unsigned int prev_state)`.
#[btf_tracepoint(function = "sched_switch")]
pub fn switch_cpu(ctx: BtfTracePointContext) -> u32 {
    on_switch::<false, false>(&ctx);
    0
}

/// CPU accounting and where the off-CPU time went (run-queue wait, blocked on I/O, sleep).
#[btf_tracepoint(function = "sched_switch")]
pub fn switch_full(ctx: BtfTracePointContext) -> u32 {
    on_switch::<true, false>(&ctx);
    0
}

/// All of `switch_full`, and what each sleep waits on (`--programs waits`).
#[btf_tracepoint(function = "sched_switch")]
pub fn switch_waits(ctx: BtfTracePointContext) -> u32 {
    on_switch::<true, true>(&ctx);
    0
}

/// `cgroup_attach_task(struct cgroup *dst_cgrp, const char *path, struct task_struct *task,
/// bool threadgroup)`: a process (`threadgroup`, named by its leader) or one thread was moved
/// to another cgroup. Rare. Only the move is noted: each of its threads splits what it did
/// since it was last accounted at the move itself, at its own next switch-out or switch-in (the
/// kernel names the leader only, and a thread's counters are written on its own CPU).
#[btf_tracepoint(function = "cgroup_attach_task")]
pub fn moved(ctx: BtfTracePointContext) -> u32 {
    let destination: task::Cgroup = ctx.arg(0);
    // v1 controllers' hierarchies fire this too; workers are cgroup2 cgroups.
    if !task::is_cgroup2(destination) {
        return 0;
    }
    let leader: Task = ctx.arg(2);
    let threadgroup = ctx.arg::<u64>(3) & 1 != 0;
    let key = if threadgroup {
        u64::from(task::tgid(leader))
    } else {
        u64::from(task::tid(leader)) | LONE_THREAD
    };
    let moved = Move {
        to_cgroup_id: task::id_of_cgroup(destination),
        // SAFETY: a helper without arguments.
        at_ns: unsafe { bpf_ktime_get_ns() },
    };
    let _ = MOVES.insert(key, moved, 0);
    0
}

/// The task is in `cgroup_id` now, not where it was last accounted: notes the new cgroup and
/// returns the one it left and how long ago it was moved here.
#[inline(always)]
fn settle_move(state: &mut TaskState, task: Task, cgroup_id: u64) -> (u64, u64) {
    let from_cgroup_id = state.cgroup_id;
    state.cgroup_id = cgroup_id;
    (from_cgroup_id, since_moved_ns(task, cgroup_id))
}

/// How long ago the task was moved into `cgroup_id`: the later of its process's move and its
/// own (as a lone thread) that went there. With neither noted, the move is still under way:
/// its tracepoint fires once every thread has moved and each controller has taken it, and
/// the kernel may switch a moved thread out before that (the cpu controller reschedules a
/// running one). It happened a moment ago, so 0. A stale entry of a reused id that happens to
/// name the same cgroup is old, so it splits nothing off.
#[inline(always)]
fn since_moved_ns(task: Task, cgroup_id: u64) -> u64 {
    let moved_at = |key: u64| {
        // SAFETY: LRU hash values are read whole; a racing update gives the old or new move.
        let moved = unsafe { MOVES.get(key) }?;
        (moved.to_cgroup_id == cgroup_id).then_some(moved.at_ns)
    };
    // 0 for none (a move's time is never 0): no value is left undefined on any path, which
    // the verifier would refuse.
    let as_process = moved_at(u64::from(task::tgid(task))).unwrap_or(0);
    let alone = moved_at(u64::from(task::tid(task)) | LONE_THREAD).unwrap_or(0);
    let at_ns = as_process.max(alone);
    if at_ns == 0 {
        return 0;
    }
    // SAFETY: a helper without arguments.
    unsafe { bpf_ktime_get_ns() }.saturating_sub(at_ns)
}

/// Rare path: the task's slice ends in another cgroup than it began in. The part before the
/// move goes to the cgroup it left, with its share of the tick-sampled user/system time;
/// returns that part. As the kernel's `cpu.stat` charges it: what ran before the move, to the
/// cgroup it ran in (to within the scheduler's update before the move, at most a tick).
///
/// Where the move went through the cpu controller (the task's cpu group is now the new
/// cgroup's), the scheduler says where in the slice it fell: the controller takes a running
/// task off its CPU and puts it back, which restarts `prev_sum_exec_runtime` at the move; a
/// task not running then began this slice after it, in the new cgroup. The move's tracepoint
/// fires only once every thread has moved, so it cannot tell: a thread that took the CPU in
/// between would have its run charged to the cgroup it left. The figure restarts at other
/// changes too (a thread's exit, its affinity or priority), always later than the move, so the
/// tracepoint's split bounds it. Elsewhere no controller touches the task, and the
/// tracepoint's time splits the slice (its length less the time since the move, as it ran
/// throughout); a move not yet noted is under way, and all of it goes to the cgroup it left.
/// With that cgroup gone from the map, all of it stays with the new one.
#[inline(never)]
fn charge_slice_before_move(
    state: &mut TaskState,
    prev: Task,
    cgroup_id: u64,
    slice_ns: u64,
    runtime_ns: u64,
) -> u64 {
    let (from_cgroup_id, since_ns) = settle_move(state, prev, cgroup_id);
    // Up to the tracepoint, if it ran throughout; all of it if the move is still under way.
    let before_tracepoint_ns = slice_ns.saturating_sub(since_ns);
    let before_ns = if task::cpu_group_is_cgroups_own(prev) {
        let slice_start_ns = runtime_ns.saturating_sub(slice_ns);
        // Not past the slice's start: it was not running at the move (or is of a class that
        // leaves the figure alone). Past the tracepoint: put back later in the slice than the
        // move (at its exit, by a change of affinity or priority), so the tracepoint is nearer.
        task::prev_sum_exec_runtime_ns(prev)
            .saturating_sub(slice_start_ns)
            .min(before_tracepoint_ns)
    } else {
        before_tracepoint_ns
    };
    if before_ns == 0 {
        return 0;
    }
    // Not made if missing: the cgroup left may be gone and summarised already.
    let Some(stats) = existing_counters(from_cgroup_id) else {
        return 0;
    };
    // SAFETY: this CPU's value; no other writer while we run.
    let stats = unsafe { &mut *stats };
    // The tick samples in the same proportion, in 1/1024ths (ns times ns would overflow).
    let share = before_ns * 1024 / slice_ns;
    let (utime, stime) = task::utime_stime_ns(prev);
    let user_before_ns = utime.saturating_sub(state.accounted_utime_ns) * share / 1024;
    let system_before_ns = stime.saturating_sub(state.accounted_stime_ns) * share / 1024;
    stats.on_cpu_ns += before_ns;
    stats.user_tick_ns += user_before_ns;
    stats.system_tick_ns += system_before_ns;
    state.accounted_utime_ns += user_before_ns;
    state.accounted_stime_ns += system_before_ns;
    before_ns
}

/// Rare path: the task woke in another cgroup than it fell asleep in. The part of the sleep
/// before the move goes to the cgroup it left (its wakeup counts in the new one); returns
/// that part. The move is on CLOCK_MONOTONIC and the sleep on the rq clock: only a difference
/// of each is used.
#[inline(never)]
fn charge_sleep_before_move(
    state: &mut TaskState,
    task: Task,
    cgroup_id: u64,
    slept_ns: u64,
    blocked_io: bool,
) -> u64 {
    let (from_cgroup_id, since_ns) = settle_move(state, task, cgroup_id);
    let before_ns = slept_ns.saturating_sub(since_ns);
    let Some(stats) = existing_counters(from_cgroup_id) else {
        return 0;
    };
    // SAFETY: this CPU's value; no other writer while we run.
    let stats = unsafe { &mut *stats };
    if blocked_io {
        stats.blocked_io_ns += before_ns;
    } else {
        stats.sleep_ns += before_ns;
    }
    stats.wait_ns[state.reason as usize & (WAIT_REASONS - 1)] += before_ns;
    before_ns
}

/// `sched_wakeup_new(struct task_struct *p)`: a new task became runnable; its account starts
/// now. Rare. Wakeups of sleeping tasks have no program: their sleeps end at the switch-in.
#[btf_tracepoint(function = "sched_wakeup_new")]
pub fn wakeup_new(ctx: BtfTracePointContext) -> u32 {
    let task: Task = ctx.arg(0);
    // Without state, nothing is lost: the first switch-out starts a new thread's account
    // from its birth (see `on_switch`).
    let Some(state) = task::state(task) else {
        return 0;
    };
    if state.flags & task::SEEN == 0 {
        start_account(state, task);
    }
    0
}

/// The incoming task's sleep, if it slept, ends: its length goes to the task's cgroup (on this
/// CPU's slot); it is running again.
///
/// Charged at the switch-in rather than at `sched_wakeup`: a program there ran at every
/// wakeup, and the switch-in follows it by no more than the run-queue wait, with the wakeup's
/// time still on the task: the scheduler set `sched_info.last_queued` to it and folds it
/// into `run_delay` only after this tracepoint (and earlier only at a migration while queued,
/// whose wait `run_delay` then holds: taken off here). No clock is read. Not at the next
/// switch-out either, which may come much later (a thread that runs on) or after its parent
/// has reaped it: a reader would see the sleep late.
///
/// A task moved to another cgroup while it slept has the part after the move measured to now,
/// so its run-queue wait since the wakeup (µs as a rule) goes to the new cgroup's sleep.
#[inline(always)]
fn switch_in(next: Task) {
    // Made here so the socket programs find it while the task runs. Without it nothing is
    // lost: the task was never seen, and its switch-out starts its account.
    let Some(state) = task::state(next) else {
        return;
    };
    if state.flags & task::SEEN == 0 {
        // First sight: its switch-out starts its account (see `on_switch`).
        return;
    }
    let blocked_io = match state.state {
        BLOCKED_IO => true,
        SLEEPING => false,
        _ => return, // preempted, or woken before it got off the CPU
    };
    let queued_at_ns = task::last_queued_ns(next);
    if queued_at_ns == 0 {
        // No wakeup time (not seen on these kernels): its switch-out rebuilds the sleep.
        return;
    }
    let waited_ns = task::run_delay_ns(next).saturating_sub(state.accounted_run_delay_ns);
    let slept_ns = queued_at_ns
        .saturating_sub(waited_ns)
        .saturating_sub(state.slept_at_ns);
    state.state = RUNNING;
    if crate::process::on() {
        crate::process::add_wait(state, slept_ns);
    }
    charge_sleep(state, next, slept_ns, blocked_io);
    if state.reason == WAIT_NETWORK {
        // For the socket programs to charge to the peer when this call returns.
        if state.unclaimed_syscall != state.sleep_syscall {
            state.unclaimed_syscall = state.sleep_syscall;
            state.unclaimed_net_wait_ns = 0;
            state.unclaimed_net_waits = 0;
        }
        state.unclaimed_net_wait_ns += slept_ns;
        state.unclaimed_net_waits += 1;
    }
}

/// Adds one ended sleep to the task's cgroup on this CPU. Without `waits` every reason is
/// `WAIT_OTHER`, which user space shows as not measured.
#[inline(always)]
fn charge_sleep(state: &mut TaskState, task: Task, mut slept_ns: u64, blocked_io: bool) {
    let cgroup_id = task::cgroup_id(task);
    if state.cgroup_id != cgroup_id {
        slept_ns -= charge_sleep_before_move(state, task, cgroup_id, slept_ns, blocked_io);
    }
    let Some(stats) = counters(state, cgroup_id) else {
        // No room: the task's next switch-out tries again (and counts the drop).
        keep_pending(state, slept_ns, blocked_io);
        return;
    };
    // SAFETY: this CPU's value; the scheduler's tracepoints run with interrupts off here, so
    // no other program writes it meanwhile.
    let stats = unsafe { &mut *stats };
    if blocked_io {
        stats.blocked_io_ns += slept_ns;
    } else {
        stats.sleep_ns += slept_ns;
    }
    stats.wakeups += 1;
    let reason = state.reason as usize & (WAIT_REASONS - 1);
    stats.wait_ns[reason] += slept_ns;
    stats.waits[reason] += 1;
}

/// Rare path: the task slept and ran again, but its switch-in did not reach us (on 6.18, about
/// one sleep in a few hundred under load: the wakeup and the switch-in are hidden from every
/// tracing program). It was woken when it joined the run queue: its arrival, less the wait the
/// scheduler added to `run_delay` then. The sleep goes to its cgroup with this slice.
#[inline(never)]
fn recover_unseen_switch_in(state: &mut TaskState, prev: Task) {
    let waited_ns = task::run_delay_ns(prev).saturating_sub(state.accounted_run_delay_ns);
    let woken_at_ns = task::last_arrival_ns(prev).saturating_sub(waited_ns);
    let slept_ns = woken_at_ns.saturating_sub(state.slept_at_ns);
    if crate::process::on() {
        crate::process::add_wait(state, slept_ns);
    }
    keep_pending(state, slept_ns, state.state == BLOCKED_IO);
    state.state = RUNNING;
}

/// Keeps a sleep on the task until its next switch-out.
#[inline(never)]
fn keep_pending(state: &mut TaskState, slept_ns: u64, blocked_io: bool) {
    if blocked_io {
        state.pending_blocked_io_ns += slept_ns;
    } else {
        state.pending_sleep_ns += slept_ns;
    }
    state.pending_wakeups += 1;
    state.pending_reason = state.reason;
}

/// The CPU counters of `cgroup_id` on this CPU, the task's cgroup: in its slot if it has
/// one, else in `CPU_STATS` (made if missing). `None` when there is no room anywhere.
#[inline(always)]
fn counters(state: &mut TaskState, cgroup_id: u64) -> Option<*mut CpuStats> {
    match task_slot(state, cgroup_id) {
        // SAFETY: this CPU's value; no other writer while we run.
        Some(slot) => Some(unsafe { &mut (*slot).stats }),
        None => hashed_counters(cgroup_id),
    }
}

/// The slot of `cgroup_id`, the task's cgroup, on this CPU: an array access when the task
/// knows it, else found or taken on the rare path; `None` when the cgroup has no slot (none
/// was free), and its counters are in the hash maps.
#[inline(always)]
pub(crate) fn task_slot(state: &mut TaskState, cgroup_id: u64) -> Option<*mut SlotCounters> {
    if state.slot_cgroup_id == cgroup_id && cgroup_id != 0 {
        // `NO_SLOT` is past the array's end: no lookup succeeds.
        let slot = CPU_SLOTS.get_ptr_mut(state.slot)?;
        // A slot given back and taken by another worker no longer names this one.
        // SAFETY: this CPU's value; no other writer while we run.
        if unsafe { (*slot).cgroup_id } == cgroup_id {
            return Some(slot);
        }
    }
    find_slot(state, cgroup_id)
}

/// Rare path of `task_slot`: the cgroup's slot, taken now if it has none and one is free;
/// the task remembers either answer.
#[inline(never)]
fn find_slot(state: &mut TaskState, cgroup_id: u64) -> Option<*mut SlotCounters> {
    if cgroup_id == 0 {
        return None;
    }
    state.slot_cgroup_id = cgroup_id;
    let found = slot_counters(cgroup_id, true);
    // Remembered either way, so a full slot array costs the task no search per event.
    state.slot = found.map_or(NO_SLOT, |(slot, _)| slot);
    found.map(|(_, counters)| counters)
}

/// The counters of a cgroup a task left, if it has any: not made.
#[inline(never)]
fn existing_counters(cgroup_id: u64) -> Option<*mut CpuStats> {
    match slot_counters(cgroup_id, false) {
        // SAFETY: this CPU's value; no other writer while we run.
        Some((_, slot)) => Some(unsafe { &mut (*slot).stats }),
        None => CPU_STATS.get_ptr_mut(cgroup_id),
    }
}

/// The cgroup's slot and its counters on this CPU; with `take`, a free slot is taken for a
/// cgroup that has none. The first use of a slot on a CPU marks it as the cgroup's there.
#[inline(always)]
fn slot_counters(cgroup_id: u64, take: bool) -> Option<(u32, *mut SlotCounters)> {
    // SAFETY: a plain hash value, read whole.
    let slot = match unsafe { SLOT_OF.get(cgroup_id) } {
        Some(&slot) => slot as u32,
        None if take => take_slot(cgroup_id)?,
        None => return None,
    };
    let counters = CPU_SLOTS.get_ptr_mut(slot)?;
    // SAFETY: this CPU's value; no other writer while we run.
    unsafe {
        if (*counters).cgroup_id != cgroup_id {
            // The slot's first use on this CPU by this cgroup: from zero, whatever a late
            // write of its last owner left after user space zeroed it.
            crate::zero::zero(counters);
            (*counters).cgroup_id = cgroup_id;
        }
    }
    Some((slot, counters))
}

/// Takes a free slot for the cgroup; if another CPU just gave it one, that one.
#[inline(always)]
fn take_slot(cgroup_id: u64) -> Option<u32> {
    take_free_slot(&FREE_SLOTS, &SLOT_OF, &cgroup_id).map(|(slot, _)| slot)
}

/// Takes a slot from `free` for `owner` and names it in `slot_of`; if another CPU just gave
/// the owner one, that one. The flag says whether the slot was taken here.
#[inline(always)]
pub(crate) fn take_free_slot<K>(
    free: &Stack<u32>,
    slot_of: &HashMap<K, u64>,
    owner: &K,
) -> Option<(u32, bool)> {
    let slot = free.pop().ok().flatten()?;
    if slot_of.insert(owner, u64::from(slot), BPF_NOEXIST).is_ok() {
        return Some((slot, true));
    }
    let _ = free.push(slot, 0);
    // SAFETY: a plain hash value, read whole.
    unsafe { slot_of.get(owner) }.map(|&slot| (slot as u32, false))
}

/// `TaskState::slot` of a task whose cgroup has no slot (its counters are in the hashes).
const NO_SLOT: u32 = u32::MAX;

/// The cgroup's entry in `CPU_STATS` on this CPU, made if missing.
#[inline(never)]
fn hashed_counters(cgroup_id: u64) -> Option<*mut CpuStats> {
    match CPU_STATS.get_ptr_mut(cgroup_id) {
        Some(stats) => Some(stats),
        None => insert_zero_stats(cgroup_id),
    }
}

/// Rare path: a cgroup's first entry on this CPU, all zeros; `None` when the map is full.
#[inline(never)]
fn insert_zero_stats(cgroup_id: u64) -> Option<*mut CpuStats> {
    mark_hash_used(HASHED_CPU);
    // Insert zeros, then add: the value is too large to build on the BPF stack.
    // By reference: a copy on the stack would take most of its 512 bytes.
    #[allow(clippy::needless_borrows_for_generic_args)]
    let _ = CPU_STATS.insert(cgroup_id, &ZERO_STATS, BPF_NOEXIST);
    // Another CPU may have inserted the same cgroup a moment ago: either way, add to it.
    CPU_STATS.get_ptr_mut(cgroup_id)
}

/// Sets the task's baselines to what the scheduler has counted so far.
#[inline(always)]
fn start_account(state: &mut TaskState, task: Task) {
    state.accounted_runtime_ns = task::sum_exec_runtime_ns(task);
    (state.accounted_utime_ns, state.accounted_stime_ns) = task::utime_stime_ns(task);
    state.accounted_run_delay_ns = task::run_delay_ns(task);
    state.accounted_arrivals = task::arrivals(task);
    state.cgroup_id = task::cgroup_id(task);
    state.state = RUNNING;
    state.flags |= task::SEEN;
}

/// One context switch on this CPU. With `DELAYS`, also where the off-CPU time went.
///
/// Everything is accounted at the outgoing task's switch-out, when its cgroup is at hand:
/// its slice (runtime the scheduler charged since we last accounted), and with `DELAYS` its
/// run-queue waits (the scheduler's own `sched_info.run_delay`, added at each arrival) and
/// the sleeps its wakeups measured.
#[inline(always)]
fn on_switch<const DELAYS: bool, const WAITS: bool>(ctx: &BtfTracePointContext) {
    let prev: Task = ctx.arg(1);
    let next: Task = ctx.arg(2);

    // The incoming task: record where its accounting stands, for user space's view of the
    // running slice and for a first sight of it at the next switch here. A task that has not
    // left a CPU since it came in has accounted exactly its runtime at switch-in.
    let Some(last) = LAST_SWITCH.get_ptr_mut(0) else {
        return;
    };
    let since = record_switch(last, next);
    switch_out::<DELAYS, WAITS>(ctx, prev, &since);
    // Last, so its early exits end the program: ahead of the switch-out, its exit for a task
    // without state made the verifier walk the whole switch-out once more.
    if DELAYS && task::tid(next) != 0 {
        switch_in(next);
    }
}

/// The outgoing task's part of [`on_switch`]; `since` is this CPU's switch before this one.
#[inline(always)]
fn switch_out<const DELAYS: bool, const WAITS: bool>(
    ctx: &BtfTracePointContext,
    prev: Task,
    since: &LastSwitch,
) {
    // The idle task (tid 0) is node idle, not a worker.
    if task::tid(prev) == 0 {
        return;
    }
    let prev_state: u64 = ctx.arg(3);
    if crate::process::on() && prev_state & crate::process::TASK_DEAD != 0 {
        crate::process::thread_end(prev, task::existing_state(prev).as_deref());
    }
    let preempt: u64 = ctx.arg(0);
    // As the kernel counts nvcsw: a switch is voluntary when the thread left the run queue.
    let voluntary = (preempt & 1) == 0 && (prev_state & 0xffff_ffff) != 0;
    let Some(state) = task::state(prev) else {
        stand_in_switch_out::<DELAYS>(
            prev,
            since.next_task,
            since.next_accounted_runtime_ns,
            voluntary,
        );
        return;
    };
    if state.flags & task::SEEN == 0
        && !first_sight(
            state,
            prev,
            since.next_task,
            since.next_accounted_runtime_ns,
        )
    {
        if DELAYS {
            // Its switch-in was not seen: its account starts now.
            go_off_cpu::<WAITS>(state, prev, voluntary, prev_state, 0);
        }
        return;
    }
    let (runtime_ns, slice_ns) = take_slice(state, prev);
    if DELAYS {
        if state.state != RUNNING {
            // Back on a CPU without a switch-in we saw.
            recover_unseen_switch_in(state, prev);
        }
        go_off_cpu::<WAITS>(state, prev, voluntary, prev_state, slice_ns);
    }
    charge_slice::<DELAYS>(state, prev, runtime_ns, slice_ns, voluntary);
}

/// Rare path: a switch-out whose task has no state and none could be made. A stand-in
/// charges the slice as at a first sight, and is then dropped: no sleep starts in it. Kept
/// out of the switch-out's own path, which the verifier walked once for each kind of state
/// pointer (task storage, per-CPU array) when the stand-in joined it.
#[cold]
#[inline(never)]
fn stand_in_switch_out<const DELAYS: bool>(
    prev: Task,
    last_next_task: u64,
    last_next_runtime_ns: u64,
    voluntary: bool,
) {
    let Some(state) = task::stand_in_state() else {
        count_drop(DROP_TASK_STATE);
        return;
    };
    if first_sight(state, prev, last_next_task, last_next_runtime_ns) {
        let (runtime_ns, slice_ns) = take_slice(state, prev);
        charge_slice::<DELAYS>(state, prev, runtime_ns, slice_ns, voluntary);
    } else if last_next_task != 0 {
        // Neither state nor a switch-in to count from: this slice is lost.
        count_drop(DROP_TASK_STATE);
    }
}

/// The slice ending now: the runtime the scheduler charged `prev` (just before this
/// tracepoint) since its account last stood, which now stands at the runtime returned first.
#[inline(always)]
fn take_slice(state: &mut TaskState, prev: Task) -> (u64, u64) {
    let runtime_ns = task::sum_exec_runtime_ns(prev);
    let slice_ns = runtime_ns.saturating_sub(state.accounted_runtime_ns);
    state.accounted_runtime_ns = runtime_ns;
    if crate::process::on() {
        crate::process::add_cpu(task::tgid(prev), slice_ns);
    }
    (runtime_ns, slice_ns)
}

/// Adds the slice to the counters of the cgroup `prev` ran in, split at a move.
#[inline(always)]
fn charge_slice<const DELAYS: bool>(
    state: &mut TaskState,
    prev: Task,
    runtime_ns: u64,
    slice_ns: u64,
    voluntary: bool,
) {
    let cgroup_id = task::cgroup_id(prev);
    let mut slice_ns = slice_ns;
    if state.cgroup_id != cgroup_id {
        slice_ns -= charge_slice_before_move(state, prev, cgroup_id, slice_ns, runtime_ns);
    }
    if let Some(stats) = counters(state, cgroup_id) {
        // SAFETY: per-CPU value of this CPU; no other writer while we run.
        unsafe { add_slice::<DELAYS>(&mut *stats, state, prev, slice_ns, voluntary) };
    } else {
        count_drop(DROP_CPU_STATS);
    }
}

/// Rare path: the task's first switch-out with state of its own or a stand-in; starts its
/// account. True when the slice ending now is to be charged, from where the task's runtime
/// stood at its switch-in: this CPU's record of it when the task came in at this CPU's last
/// switch (`last_next_task`, then with `last_next_runtime_ns`); else, when that switch-in went
/// unreported (the tracepoint misses a few switches on some virtual machines), the fair
/// class's own record of it, which it also restarts later in a slice (at a thread's exit, a
/// change of affinity, priority or cpu group), so the slice is never overcharged. False for a
/// task running since before any switch here was seen (it began before the programs were
/// attached), as for a task of another class whose switch-in went unreported.
#[cold]
#[inline(never)]
fn first_sight(
    state: &mut TaskState,
    prev: Task,
    last_next_task: u64,
    last_next_runtime_ns: u64,
) -> bool {
    start_account(state, prev);
    let switched_in_runtime_ns = if last_next_task == prev as u64 {
        last_next_runtime_ns
    } else if last_next_task != 0 && task::is_fair(prev) {
        task::prev_sum_exec_runtime_ns(prev)
    } else {
        return false;
    };
    state.accounted_runtime_ns = switched_in_runtime_ns;
    if switched_in_runtime_ns == 0 {
        // A new thread: its sampled times and waits were zero at switch-in too, but for its
        // first run-queue wait (folded in at that switch-in), its own.
        clear(&mut state.accounted_utime_ns);
        clear(&mut state.accounted_stime_ns);
        clear(&mut state.accounted_run_delay_ns);
        clear(&mut state.accounted_arrivals);
    }
    true
}

/// Writes this CPU's switch to `next` over `last` (a per-CPU value); returns the switch before.
#[inline(always)]
pub(crate) fn record_switch(last: *mut LastSwitch, next: Task) -> LastSwitch {
    // SAFETY: this CPU's value; preemption is off inside the tracepoint.
    unsafe {
        let since = *last;
        *last = LastSwitch {
            next_task: next as u64,
            next_accounted_runtime_ns: task::sum_exec_runtime_ns(next),
            switch_count: since.switch_count + 1,
            next_tid: task::tid(next),
            reserved: 0,
        };
        since
    }
}

/// Notes how the task leaves the CPU: still runnable (the scheduler times that wait), or
/// asleep from now — the end of its slice on the rq clock: arrival plus the slice.
#[inline(always)]
fn go_off_cpu<const WAITS: bool>(
    state: &mut TaskState,
    prev: Task,
    voluntary: bool,
    prev_state: u64,
    slice_ns: u64,
) {
    if !voluntary {
        state.state = RUNNING;
        return;
    }
    let uninterruptible = prev_state & TASK_UNINTERRUPTIBLE != 0 && prev_state & TASK_NOLOAD == 0;
    state.state = if uninterruptible {
        BLOCKED_IO
    } else {
        SLEEPING
    };
    state.slept_at_ns = task::last_arrival_ns(prev) + slice_ns;
    if WAITS {
        let (reason, syscall) = wait_reason(prev, uninterruptible);
        state.reason = reason;
        state.sleep_syscall = syscall;
    } else {
        // Not classified: nothing downstream reads it, and no endpoint claims it.
        state.reason = WAIT_OTHER;
    }
}

/// Why `prev` is going to sleep, and the system call it sleeps in: the call says why, and for
/// a call on a file descriptor the file's kind. Kernel threads wait for other.
#[inline(always)]
fn wait_reason(prev: Task, uninterruptible: bool) -> (u32, i64) {
    if task::is_kthread(prev) {
        return (WAIT_OTHER, -1);
    }
    let Some((nr, first_arg)) = task::syscall(prev) else {
        return (unknown_wait(uninterruptible), -1);
    };
    // A table load, not a chain of comparisons: this runs at every sleep.
    let entry = if (0..SYSCALLS as i64).contains(&nr) {
        SYSCALL_WAITS[nr as usize & (SYSCALLS - 1)]
    } else {
        TABLE_UNKNOWN
    };
    let reason = match entry {
        TABLE_UNKNOWN => unknown_wait(uninterruptible),
        TABLE_ON_FD => match task::fd_mode(prev, first_arg) {
            Some(mode) => file_wait(mode),
            None => unknown_wait(uninterruptible),
        },
        reason => u32::from(reason - TABLE_REASON),
    };
    (reason, nr)
}

/// Adds a slice, and with `DELAYS` the task's run-queue waits and pending sleeps, to its
/// cgroup's counters.
#[inline(always)]
fn add_slice<const DELAYS: bool>(
    stats: &mut CpuStats,
    state: &mut TaskState,
    prev: Task,
    slice_ns: u64,
    voluntary: bool,
) {
    stats.on_cpu_ns += slice_ns;
    // The tick-sampled split of the slices, scaled to their precise length in user space.
    let (utime, stime) = task::utime_stime_ns(prev);
    stats.user_tick_ns += utime.saturating_sub(state.accounted_utime_ns);
    stats.system_tick_ns += stime.saturating_sub(state.accounted_stime_ns);
    state.accounted_utime_ns = utime;
    state.accounted_stime_ns = stime;
    if voluntary {
        stats.voluntary_switches += 1;
    } else {
        stats.involuntary_switches += 1;
    }
    if !DELAYS {
        return;
    }
    // The scheduler added the wait before this slice at the task's arrival.
    let run_delay_ns = task::run_delay_ns(prev);
    let arrivals = task::arrivals(prev);
    let waited_ns = run_delay_ns.saturating_sub(state.accounted_run_delay_ns);
    let waits = arrivals.saturating_sub(state.accounted_arrivals);
    state.accounted_run_delay_ns = run_delay_ns;
    state.accounted_arrivals = arrivals;
    stats.runqueue_wait_ns += waited_ns;
    if let Some(mean_wait_ns) = waited_ns.checked_div(waits) {
        // Normally one wait per slice; if switches were hidden from us, their mean.
        let bucket = runq_bucket(mean_wait_ns) & (RUNQ_BUCKETS - 1);
        stats.runqueue_wait_hist[bucket] += waits;
    }
    if state.pending_wakeups != 0 {
        flush_pending(stats, state);
    }
}

/// Rare path: sleeps not charged at their switch-in (no room for the cgroup then, or a
/// switch-in the kernel hid, rebuilt at this switch-out).
#[inline(never)]
fn flush_pending(stats: &mut CpuStats, state: &mut TaskState) {
    stats.blocked_io_ns += state.pending_blocked_io_ns;
    stats.sleep_ns += state.pending_sleep_ns;
    stats.wakeups += state.pending_wakeups;
    let reason = state.pending_reason as usize & (WAIT_REASONS - 1);
    stats.wait_ns[reason] += state.pending_blocked_io_ns + state.pending_sleep_ns;
    stats.waits[reason] += state.pending_wakeups;
    clear(&mut state.pending_blocked_io_ns);
    clear(&mut state.pending_sleep_ns);
    clear(&mut state.pending_wakeups);
}

/// All-zero counters, inserted for a new cgroup.
static ZERO_STATS: CpuStats = CpuStats {
    on_cpu_ns: 0,
    voluntary_switches: 0,
    involuntary_switches: 0,
    runqueue_wait_ns: 0,
    blocked_io_ns: 0,
    sleep_ns: 0,
    wakeups: 0,
    runqueue_wait_hist: [0; RUNQ_BUCKETS],
    wait_ns: [0; WAIT_REASONS],
    waits: [0; WAIT_REASONS],
    user_tick_ns: 0,
    system_tick_ns: 0,
};
