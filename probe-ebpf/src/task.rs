//! Reading tasks: the few `struct task_struct` fields the programs need, at offsets the
//! loader resolved from the kernel's BTF, and per-task state in task-local storage.
//!
//! Loads through the tracepoints' task pointers are checked by the verifier against BTF and
//! cost a few nanoseconds; `bpf_get_current_cgroup_id` cost ~45 ns per call here.

use aya_ebpf::{
    Global,
    helpers::{bpf_probe_read_kernel, generated::bpf_task_pt_regs},
    macros::{btf_map, map},
    maps::PerCpuArray,
};

use crate::local_storage::{LocalStorage, TASK_STORAGE};

#[unsafe(no_mangle)]
static TASK_SUM_EXEC_RUNTIME_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static TASK_PREV_SUM_EXEC_RUNTIME_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static TASK_POLICY_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static TASK_SCHED_TASK_GROUP_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static TASK_GROUP_CSS_CGROUP_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static TASK_PID_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static TASK_SCHED_INFO_PCOUNT_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static TASK_SCHED_INFO_RUN_DELAY_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static TASK_SCHED_INFO_LAST_ARRIVAL_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static TASK_SCHED_INFO_LAST_QUEUED_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static TASK_CGROUPS_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static CSS_SET_DFL_CGRP_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static CGROUP_KN_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static KERNFS_NODE_ID_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static CGROUP_ROOT_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static CGROUP_ROOT_HIERARCHY_ID_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static TASK_FLAGS_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static STAND_IN_STATE: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static TASK_UTIME_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static TASK_STIME_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static TASK_FILES_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static FILES_FDT_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static FDTABLE_MAX_FDS_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static FDTABLE_FD_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static FILE_F_INODE_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static INODE_I_MODE_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static PT_REGS_ORIG_AX_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static PT_REGS_DI_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static TASK_TGID_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static TASK_SIGNAL_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static SIGNAL_MAXRSS_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static CGROUP_MEMORY_CSS_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static MEMCG_WATERMARK_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static MEMCG_USAGE_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static CSS_SET_MEMORY_CSS_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static CSS_CGROUP_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static TASK_MEMORY_CGROUP: Global<u32> = Global::new(0);

/// A `struct task_struct *` from a tracepoint argument (or the current task).
pub type Task = *const u8;

/// Reads a field of type `T` at `offset` bytes into the object `base` points to (a task, or any
/// BTF-typed kernel object).
///
/// # Safety
/// `base` must be a BTF-typed kernel pointer and `offset` a field offset of its type.
#[inline(always)]
pub(crate) unsafe fn field<T: Copy>(base: *const u8, offset: u32) -> T {
    // SAFETY: the verifier turns this into a fault-safe load checked against BTF.
    unsafe { core::ptr::read_volatile(base.add(offset as usize) as *const T) }
}

/// CPU time the kernel has charged the task so far (`se.sum_exec_runtime`).
#[inline(always)]
pub fn sum_exec_runtime_ns(task: Task) -> u64 {
    // SAFETY: task pointer from a tracepoint; offset from BTF.
    unsafe { field(task, TASK_SUM_EXEC_RUNTIME_OFFSET.load()) }
}

/// The task's `sum_exec_runtime` when the scheduler last put it on its CPU
/// (`se.prev_sum_exec_runtime`, set by `set_next_entity`): at its switch-in, and again when
/// the cpu controller moves it while it runs (it takes the task off its CPU and puts it back).
/// Fair-class tasks only; other classes leave it as it was.
#[inline(always)]
pub fn prev_sum_exec_runtime_ns(task: Task) -> u64 {
    // SAFETY: task pointer from a tracepoint; offset from BTF.
    unsafe { field(task, TASK_PREV_SUM_EXEC_RUNTIME_OFFSET.load()) }
}

/// Whether the task is scheduled by the fair class (`SCHED_NORMAL`, `SCHED_BATCH` or
/// `SCHED_IDLE`), the one that keeps [`prev_sum_exec_runtime_ns`] (a sched_ext scheduler that
/// takes every task runs such tasks in its own class, which does not).
#[inline(always)]
pub fn is_fair(task: Task) -> bool {
    // SAFETY: task pointer from a tracepoint; offset from BTF.
    let policy: u32 = unsafe { field(task, TASK_POLICY_OFFSET.load()) };
    matches!(policy, 0 | 3 | 5)
}

/// Whether the task's cpu controller group is its cgroup2 cgroup's own
/// (`sched_task_group->css.cgroup == cgroups->dfl_cgrp`): its move into that cgroup went
/// through the cpu controller. False on a kernel without cpu controller groups, where the cpu
/// controller is on a v1 hierarchy, or where the cgroup has none of its own.
#[inline(always)]
pub fn cpu_group_is_cgroups_own(task: Task) -> bool {
    let group_offset = TASK_SCHED_TASK_GROUP_OFFSET.load();
    if group_offset == 0 {
        return false;
    }
    // SAFETY: each pointer comes from a BTF-checked load of the previous one; a fault yields
    // null, which is no cgroup.
    let group_cgroup: Cgroup = unsafe {
        let group: *const u8 = field(task, group_offset);
        field(group, TASK_GROUP_CSS_CGROUP_OFFSET.load())
    };
    !group_cgroup.is_null() && group_cgroup == cgroup2(task)
}

/// User and system time the kernel's tick sampling has charged the task (`utime`, `stime`).
#[inline(always)]
pub fn utime_stime_ns(task: Task) -> (u64, u64) {
    // SAFETY: task pointer from a tracepoint; offsets from BTF.
    unsafe {
        (
            field(task, TASK_UTIME_OFFSET.load()),
            field(task, TASK_STIME_OFFSET.load()),
        )
    }
}

/// Thread id (`pid`); 0 for the idle tasks.
#[inline(always)]
pub fn tid(task: Task) -> u32 {
    // SAFETY: as above.
    unsafe { field(task, TASK_PID_OFFSET.load()) }
}

/// Process id (`tgid`).
#[inline(always)]
pub fn tgid(task: Task) -> u32 {
    // SAFETY: as above.
    unsafe { field(task, TASK_TGID_OFFSET.load()) }
}

/// Times the task arrived on a CPU (`sched_info.pcount`): one per run-queue wait.
#[inline(always)]
pub fn arrivals(task: Task) -> u64 {
    // SAFETY: as above.
    unsafe { field(task, TASK_SCHED_INFO_PCOUNT_OFFSET.load()) }
}

/// Total run-queue wait so far (`sched_info.run_delay`, ns of the rq clock), kept by the
/// scheduler itself: a wait is added when the task arrives on a CPU.
#[inline(always)]
pub fn run_delay_ns(task: Task) -> u64 {
    // SAFETY: as above.
    unsafe { field(task, TASK_SCHED_INFO_RUN_DELAY_OFFSET.load()) }
}

/// rq clock when the task last arrived on a CPU (`sched_info.last_arrival`).
#[inline(always)]
pub fn last_arrival_ns(task: Task) -> u64 {
    // SAFETY: as above.
    unsafe { field(task, TASK_SCHED_INFO_LAST_ARRIVAL_OFFSET.load()) }
}

/// rq clock when the task last became runnable (`sched_info.last_queued`): at its switch-in,
/// the moment of its wakeup (or of its move to this CPU's queue); 0 once it has arrived.
#[inline(always)]
pub fn last_queued_ns(task: Task) -> u64 {
    // SAFETY: as above.
    unsafe { field(task, TASK_SCHED_INFO_LAST_QUEUED_OFFSET.load()) }
}

/// The cgroup v2 id of the task: `task->cgroups->dfl_cgrp->kn->id`, as
/// `bpf_get_current_cgroup_id` computes it, for any task.
#[inline(always)]
pub fn cgroup_id(task: Task) -> u64 {
    id_of_cgroup(cgroup2(task))
}

/// The task's cgroup v2 cgroup: `task->cgroups->dfl_cgrp`.
#[inline(always)]
fn cgroup2(task: Task) -> Cgroup {
    // SAFETY: each pointer comes from a BTF-checked load of the previous one; a fault yields 0.
    unsafe {
        let css_set: *const u8 = field(task, TASK_CGROUPS_OFFSET.load());
        field(css_set, CSS_SET_DFL_CGRP_OFFSET.load())
    }
}

/// `PF_KTHREAD` in `task_struct.flags`.
const PF_KTHREAD: u32 = 0x0020_0000;

/// Whether the task is a kernel thread.
#[inline(always)]
pub fn is_kthread(task: Task) -> bool {
    // SAFETY: task pointer from a tracepoint; offset from BTF.
    let flags: u32 = unsafe { field(task, TASK_FLAGS_OFFSET.load()) };
    flags & PF_KTHREAD != 0
}

/// The system call the task is in (`pt_regs.orig_ax`; negative outside one) and its first
/// argument (`pt_regs.di`), from the registers it entered the kernel with.
#[inline(always)]
pub fn syscall(task: Task) -> Option<(i64, u64)> {
    // SAFETY: the helper returns the task's pt_regs as a BTF pointer, or null.
    let regs = unsafe { bpf_task_pt_regs(task as *mut _) } as *const u8;
    if regs.is_null() {
        return None;
    }
    // SAFETY: BTF-checked loads from the BTF pt_regs pointer.
    unsafe {
        Some((
            field(regs, PT_REGS_ORIG_AX_OFFSET.load()),
            field(regs, PT_REGS_DI_OFFSET.load()),
        ))
    }
}

/// Reads a `T` at `address` with `bpf_probe_read_kernel` (for addresses computed from an
/// index, which BTF-checked loads cannot take); `None` if the read faults.
#[inline(always)]
fn read_kernel<T: Copy>(address: u64) -> Option<T> {
    // SAFETY: the helper copes with any address; a fault is an error return.
    unsafe { bpf_probe_read_kernel(address as *const T).ok() }
}

/// `i_mode` of the file the task has open as `fd`: task→files→fdt→fd[fd]→f_inode→i_mode.
#[inline(always)]
pub fn fd_mode(task: Task, fd: u64) -> Option<u16> {
    // SAFETY: BTF-checked loads through the task pointer; a fault yields 0.
    let (max_fds, fd_array) = unsafe {
        let files: *const u8 = field(task, TASK_FILES_OFFSET.load());
        let fdt: *const u8 = field(files, FILES_FDT_OFFSET.load());
        let max_fds: u32 = field(fdt, FDTABLE_MAX_FDS_OFFSET.load());
        let fd_array: u64 = field(fdt, FDTABLE_FD_OFFSET.load());
        (max_fds, fd_array)
    };
    if fd >= u64::from(max_fds) || fd_array == 0 {
        return None;
    }
    let file: u64 = read_kernel(fd_array + fd * 8)?;
    if file == 0 {
        return None;
    }
    let inode: u64 = read_kernel(file + u64::from(FILE_F_INODE_OFFSET.load()))?;
    read_kernel(inode + u64::from(INODE_I_MODE_OFFSET.load()))
}

/// A `struct cgroup *` from a tracepoint argument.
pub type Cgroup = *const u8;

/// The id of a cgroup: `cgrp->kn->id`, the inode number of its directory.
#[inline(always)]
pub fn id_of_cgroup(cgroup: Cgroup) -> u64 {
    // SAFETY: BTF-checked loads; a fault yields 0.
    unsafe {
        let kernfs_node: *const u8 = field(cgroup, CGROUP_KN_OFFSET.load());
        field(kernfs_node, KERNFS_NODE_ID_OFFSET.load())
    }
}

/// The task's `signal_struct` (shared by its process's threads).
#[inline(always)]
pub fn signal(task: Task) -> *const u8 {
    // SAFETY: BTF-checked load through the task pointer.
    unsafe { field(task, TASK_SIGNAL_OFFSET.load()) }
}

/// The largest resident set the task's process has had, in pages (`signal->maxrss`, what
/// wait4's `ru_maxrss` reports): final once its last thread is exiting.
#[inline(always)]
pub fn max_rss_pages(task: Task) -> u64 {
    // SAFETY: BTF-checked loads through the task pointer; a fault yields 0.
    unsafe {
        let signal: *const u8 = field(task, TASK_SIGNAL_OFFSET.load());
        field(signal, SIGNAL_MAXRSS_OFFSET.load())
    }
}

/// A cgroup's memory high-water mark in pages (`memory.peak`); 0 when it has no memory
/// controller of its own (or the kernel none at all).
#[inline(always)]
pub fn memory_peak_pages(cgroup: Cgroup) -> u64 {
    memory_css(cgroup).map_or(0, |css| {
        read_kernel(css + u64::from(MEMCG_WATERMARK_OFFSET.load())).unwrap_or(0)
    })
}

/// A cgroup's memory in pages now and at its high-water mark (`memory.current`,
/// `memory.peak`); `None` when it has no memory controller of its own.
#[inline(always)]
pub fn memory_pages(cgroup: Cgroup) -> Option<(u64, u64)> {
    let css = memory_css(cgroup)?;
    let current = read_kernel(css + u64::from(MEMCG_USAGE_OFFSET.load()))?;
    let peak = read_kernel(css + u64::from(MEMCG_WATERMARK_OFFSET.load()))?;
    Some((current, peak))
}

/// The cgroup's memory controller state (`subsys[memory_cgrp_id]`) as an address, if it has
/// one. The counters lie past `struct cgroup_subsys_state`, in the `mem_cgroup` around it:
/// beyond what a BTF-checked load of a css may reach, so they are read from the address.
#[inline(always)]
fn memory_css(cgroup: Cgroup) -> Option<u64> {
    let css_offset = CGROUP_MEMORY_CSS_OFFSET.load();
    if css_offset == 0 {
        return None;
    }
    // SAFETY: BTF-checked load of `subsys[memory_cgrp_id]`, a css pointer or null.
    let css: u64 = unsafe { field(cgroup, css_offset) };
    (css != 0).then_some(css)
}

/// The id of the cgroup holding the task's memory controller state
/// (`task->cgroups->subsys[memory_cgrp_id]->cgroup`): on hybrid hosts its v1 memory cgroup.
/// 0 without a memory controller.
#[inline(always)]
pub fn memory_cgroup_id(task: Task) -> u64 {
    if TASK_MEMORY_CGROUP.load() == 0 {
        return 0;
    }
    // SAFETY: each pointer comes from a BTF-checked load of the previous one; a fault yields 0.
    let cgroup: Cgroup = unsafe {
        let css_set: *const u8 = field(task, TASK_CGROUPS_OFFSET.load());
        let css: *const u8 = field(css_set, CSS_SET_MEMORY_CSS_OFFSET.load());
        if css.is_null() {
            return 0;
        }
        field(css, CSS_CGROUP_OFFSET.load())
    };
    id_of_cgroup(cgroup)
}

/// Whether a cgroup belongs to the cgroup2 hierarchy (hierarchy id 0), not a v1 controller.
#[inline(always)]
pub fn is_cgroup2(cgroup: Cgroup) -> bool {
    // SAFETY: BTF-checked loads.
    unsafe {
        let root: *const u8 = field(cgroup, CGROUP_ROOT_OFFSET.load());
        field::<i32>(root, CGROUP_ROOT_HIERARCHY_ID_OFFSET.load()) == 0
    }
}

/// What the programs remember about one task, freed with the task.
///
/// Times are on the scheduler's rq clock (what `sched_info` uses), so no program reads a
/// clock of its own.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct TaskState {
    /// How much of the task's `sum_exec_runtime` is already in `CPU_STATS`.
    pub accounted_runtime_ns: u64,
    /// How much of its `sched_info.run_delay` is already in `CPU_STATS`.
    pub accounted_run_delay_ns: u64,
    /// How much of its `utime` is already in `CPU_STATS`.
    pub accounted_utime_ns: u64,
    /// How much of its `stime` is already in `CPU_STATS`.
    pub accounted_stime_ns: u64,
    /// Its `sched_info.pcount` when last accounted.
    pub accounted_arrivals: u64,
    /// rq clock when it last went to sleep (`BLOCKED_IO` or `SLEEPING`).
    pub slept_at_ns: u64,
    /// Sleep that ended (at a wakeup) while its cgroup was not at hand; added to its cgroup
    /// at its next switch-out, when it is the outgoing task.
    pub pending_blocked_io_ns: u64,
    /// See `pending_blocked_io_ns`.
    pub pending_sleep_ns: u64,
    /// 0 in fresh storage; `SEEN` once the baselines above are set (a new thread's runtime
    /// is 0, so the runtime itself cannot tell).
    pub flags: u32,
    /// `RUNNING` (on a CPU or runnable), `BLOCKED_IO` or `SLEEPING`.
    pub state: u32,
    /// Wakeups not yet added to its cgroup.
    pub pending_wakeups: u64,
    /// Why it is asleep (`probe_common::wait::WAIT_*`), set when it leaves the CPU to sleep.
    pub reason: u32,
    /// The reason of the pending sleep (the one its last wakeup ended).
    pub pending_reason: u32,
    /// The system call it went to sleep in (negative: none).
    pub sleep_syscall: i64,
    /// The system call of `unclaimed_net_wait_ns`.
    pub unclaimed_syscall: i64,
    /// Network sleeps in that call not yet charged to an endpoint: the socket programs charge
    /// them to the socket's peer when the call returns.
    pub unclaimed_net_wait_ns: u64,
    /// How many sleeps `unclaimed_net_wait_ns` holds.
    pub unclaimed_net_waits: u64,
    /// The cgroup it was in when last accounted: a different one at its next switch-out or
    /// wakeup means it was moved meanwhile.
    pub cgroup_id: u64,
    /// Socket payload it sent (process workers only).
    pub sent_bytes: u64,
    /// Socket payload it received (process workers only).
    pub received_bytes: u64,
    /// The cgroup whose slot in `CPU_SLOTS` is `slot` (0: none known): while the task stays
    /// in that cgroup, its counters are an array access away.
    pub slot_cgroup_id: u64,
    /// See `slot_cgroup_id`.
    pub slot: u32,
    /// The slot in `ENDPOINT_SLOTS` of the endpoint of its last socket call (a hint: the
    /// slot's key on the CPU says whose it is, so 0 in fresh storage is checked as any other).
    pub endpoint_slot: u32,
    /// Its own sleeps by wait reason, ns (process workers only).
    pub own_wait_ns: [u64; probe_common::wait::WAIT_REASONS],
}

/// [`TaskState::flags`]: the baselines are set.
pub const SEEN: u32 = 1;
/// [`TaskState::state`]: on a CPU or runnable.
pub const RUNNING: u32 = 0;
/// In uninterruptible sleep (D).
pub const BLOCKED_IO: u32 = 1;
/// In any other sleep (S, idle kernel waits).
pub const SLEEPING: u32 = 2;

/// Per-task state.
#[btf_map]
static TASK_STATE: LocalStorage<TaskState, TASK_STORAGE> = LocalStorage::new();

/// The task's state if it has one (never made here: for programs off the scheduler path).
#[inline(always)]
pub fn existing_state(task: Task) -> Option<&'static mut TaskState> {
    TASK_STATE.task_value(task, false)
}

/// The task's state, made (zeroed) if it has none; `None` only when the kernel could not
/// allocate or the storage was busy on this CPU.
#[inline(always)]
pub fn state(task: Task) -> Option<&'static mut TaskState> {
    TASK_STATE.task_value(task, true)
}

/// Per CPU: [`stand_in_state`]'s value.
#[map]
static STAND_IN_STATES: PerCpuArray<TaskState> = PerCpuArray::with_max_entries(1, 0);

/// Rare path: a fresh state, this CPU's, for a switch-out whose task has no state and none
/// could be made; `None` on a kernel where the task may have state the lookup did not find
/// (see `probe_common::task::STAND_IN_STATE_GLOBAL`). Its account starts like a first
/// sight's, from the switch-in this CPU recorded, so the slice is charged once; the task's
/// next switch-out with state of its own is a first sight again.
#[inline(never)]
pub fn stand_in_state() -> Option<&'static mut TaskState> {
    if STAND_IN_STATE.load() == 0 {
        return None;
    }
    let state = STAND_IN_STATES.get_ptr_mut(0)?;
    // SAFETY: this CPU's value; no other program writes it while this one runs.
    unsafe {
        crate::zero::zero(state);
        Some(&mut *state)
    }
}
