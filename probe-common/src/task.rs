//! Offsets of the few `struct task_struct` fields the programs read, resolved from the
//! kernel's BTF at load time and passed as read-only globals (Rust eBPF has no CO-RE).

/// Global: `offsetof(struct task_struct, se.sum_exec_runtime)`.
pub const SUM_EXEC_RUNTIME_OFFSET_GLOBAL: &str = "TASK_SUM_EXEC_RUNTIME_OFFSET";
/// Global: `offsetof(struct task_struct, se.prev_sum_exec_runtime)`: `sum_exec_runtime` when
/// the scheduler last put the task on its CPU (`set_next_entity`).
pub const PREV_SUM_EXEC_RUNTIME_OFFSET_GLOBAL: &str = "TASK_PREV_SUM_EXEC_RUNTIME_OFFSET";
/// Global: `offsetof(struct task_struct, policy)`: the scheduling policy, which says whether
/// the fair class keeps `prev_sum_exec_runtime`.
pub const POLICY_OFFSET_GLOBAL: &str = "TASK_POLICY_OFFSET";
/// Global: `offsetof(struct task_struct, sched_task_group)`: the task's cpu controller group
/// (0: a kernel without CONFIG_CGROUP_SCHED).
pub const SCHED_TASK_GROUP_OFFSET_GLOBAL: &str = "TASK_SCHED_TASK_GROUP_OFFSET";
/// Global: `offsetof(struct task_group, css.cgroup)`: the cgroup a cpu controller group is of.
pub const TASK_GROUP_CSS_CGROUP_OFFSET_GLOBAL: &str = "TASK_GROUP_CSS_CGROUP_OFFSET";
/// Global: `offsetof(struct task_struct, pid)` (the thread id).
pub const PID_OFFSET_GLOBAL: &str = "TASK_PID_OFFSET";
/// Global: `offsetof(struct task_struct, sched_info.pcount)`.
pub const SCHED_INFO_PCOUNT_OFFSET_GLOBAL: &str = "TASK_SCHED_INFO_PCOUNT_OFFSET";
/// Global: `offsetof(struct task_struct, sched_info.run_delay)`.
pub const SCHED_INFO_RUN_DELAY_OFFSET_GLOBAL: &str = "TASK_SCHED_INFO_RUN_DELAY_OFFSET";
/// Global: `offsetof(struct task_struct, sched_info.last_arrival)`.
pub const SCHED_INFO_LAST_ARRIVAL_OFFSET_GLOBAL: &str = "TASK_SCHED_INFO_LAST_ARRIVAL_OFFSET";
/// Global: `offsetof(struct task_struct, sched_info.last_queued)`.
pub const SCHED_INFO_LAST_QUEUED_OFFSET_GLOBAL: &str = "TASK_SCHED_INFO_LAST_QUEUED_OFFSET";
/// Global: `offsetof(struct task_struct, cgroups)`.
pub const CGROUPS_OFFSET_GLOBAL: &str = "TASK_CGROUPS_OFFSET";
/// Global: `offsetof(struct css_set, dfl_cgrp)`.
pub const CSS_SET_DFL_CGRP_OFFSET_GLOBAL: &str = "CSS_SET_DFL_CGRP_OFFSET";
/// Global: `offsetof(struct cgroup, kn)`.
pub const CGROUP_KN_OFFSET_GLOBAL: &str = "CGROUP_KN_OFFSET";
/// Global: `offsetof(struct cgroup, root)`.
pub const CGROUP_ROOT_OFFSET_GLOBAL: &str = "CGROUP_ROOT_OFFSET";
/// Global: `offsetof(struct cgroup_root, hierarchy_id)` (0 is the cgroup2 hierarchy).
pub const CGROUP_ROOT_HIERARCHY_ID_OFFSET_GLOBAL: &str = "CGROUP_ROOT_HIERARCHY_ID_OFFSET";
/// Global: `offsetof(struct kernfs_node, id)`.
pub const KERNFS_NODE_ID_OFFSET_GLOBAL: &str = "KERNFS_NODE_ID_OFFSET";

/// Global: 1 when a tracing program always finds a task's existing local storage, even while
/// the storage is busy on its CPU (6.2+, `bpf_task_storage_get_recur`). Only then may a
/// switch-out whose task has no storage, and none could be made, charge its slice through a
/// stand-in: on older kernels the task may have storage that was busy, whose account would
/// charge the slice again.
pub const STAND_IN_STATE_GLOBAL: &str = "STAND_IN_STATE";

/// Global: `offsetof(struct task_struct, utime)` (tick-sampled user time, ns).
pub const UTIME_OFFSET_GLOBAL: &str = "TASK_UTIME_OFFSET";
/// Global: `offsetof(struct task_struct, stime)` (tick-sampled system time, ns).
pub const STIME_OFFSET_GLOBAL: &str = "TASK_STIME_OFFSET";
/// Global: `offsetof(struct task_struct, tgid)` (the process id).
pub const TGID_OFFSET_GLOBAL: &str = "TASK_TGID_OFFSET";
/// Global: `offsetof(struct task_struct, flags)` (PF_KTHREAD tells kernel threads).
pub const FLAGS_OFFSET_GLOBAL: &str = "TASK_FLAGS_OFFSET";
/// Global: `offsetof(struct task_struct, files)`.
pub const FILES_OFFSET_GLOBAL: &str = "TASK_FILES_OFFSET";
/// Global: `offsetof(struct files_struct, fdt)`.
pub const FILES_FDT_OFFSET_GLOBAL: &str = "FILES_FDT_OFFSET";
/// Global: `offsetof(struct fdtable, max_fds)`.
pub const FDTABLE_MAX_FDS_OFFSET_GLOBAL: &str = "FDTABLE_MAX_FDS_OFFSET";
/// Global: `offsetof(struct fdtable, fd)`.
pub const FDTABLE_FD_OFFSET_GLOBAL: &str = "FDTABLE_FD_OFFSET";
/// Global: `offsetof(struct file, f_inode)`.
pub const FILE_F_INODE_OFFSET_GLOBAL: &str = "FILE_F_INODE_OFFSET";
/// Global: `offsetof(struct inode, i_mode)`.
pub const INODE_I_MODE_OFFSET_GLOBAL: &str = "INODE_I_MODE_OFFSET";
/// Global: `offsetof(struct pt_regs, orig_ax)` (the system call number, x86-64).
pub const PT_REGS_ORIG_AX_OFFSET_GLOBAL: &str = "PT_REGS_ORIG_AX_OFFSET";
/// Global: `offsetof(struct pt_regs, di)` (a system call's first argument, x86-64).
pub const PT_REGS_DI_OFFSET_GLOBAL: &str = "PT_REGS_DI_OFFSET";

/// Where a sleeping thread's wait reason is read: its flags, its system call and the kind of
/// file that call is on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WaitOffsets {
    /// `task_struct.flags`.
    pub task_flags: u32,
    /// `task_struct.files`.
    pub task_files: u32,
    /// `files_struct.fdt`.
    pub files_fdt: u32,
    /// `fdtable.max_fds`.
    pub fdtable_max_fds: u32,
    /// `fdtable.fd`.
    pub fdtable_fd: u32,
    /// `file.f_inode`.
    pub file_f_inode: u32,
    /// `inode.i_mode`.
    pub inode_i_mode: u32,
    /// `pt_regs.orig_ax`.
    pub pt_regs_orig_ax: u32,
    /// `pt_regs.di`.
    pub pt_regs_di: u32,
}

/// The offsets, in the order the loader resolves them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskOffsets {
    /// `task_struct.se.sum_exec_runtime`.
    pub sum_exec_runtime: u32,
    /// `task_struct.se.prev_sum_exec_runtime`.
    pub prev_sum_exec_runtime: u32,
    /// `task_struct.policy`.
    pub policy: u32,
    /// `task_struct.sched_task_group` and `task_group.css.cgroup`, `None` without
    /// CONFIG_CGROUP_SCHED.
    pub cpu_group: Option<CpuGroupOffsets>,
    /// `task_struct.pid`.
    pub pid: u32,
    /// `task_struct.cgroups`.
    pub cgroups: u32,
    /// `task_struct.sched_info.pcount` (arrivals on a CPU), `None` without CONFIG_SCHED_INFO.
    pub sched_info: Option<SchedInfoOffsets>,
    /// `css_set.dfl_cgrp`.
    pub css_set_dfl_cgrp: u32,
    /// `cgroup.kn`.
    pub cgroup_kn: u32,
    /// `kernfs_node.id`.
    pub kernfs_node_id: u32,
    /// `cgroup.root`.
    pub cgroup_root: u32,
    /// `cgroup_root.hierarchy_id`.
    pub cgroup_root_hierarchy_id: u32,
    /// `task_struct.utime`.
    pub utime: u32,
    /// `task_struct.stime`.
    pub stime: u32,
    /// `task_struct.tgid`.
    pub tgid: u32,
}

/// Where a task's cpu controller group and that group's cgroup are.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuGroupOffsets {
    /// `task_struct.sched_task_group`.
    pub sched_task_group: u32,
    /// `task_group.css.cgroup`.
    pub task_group_css_cgroup: u32,
}

/// Offsets in `task_struct.sched_info`, the scheduler's own run-queue accounting (rq clock).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchedInfoOffsets {
    /// `pcount`: times the task arrived on a CPU.
    pub pcount: u32,
    /// `run_delay`: total ns spent runnable, waiting for a CPU.
    pub run_delay: u32,
    /// `last_arrival`: rq clock when it last arrived on a CPU.
    pub last_arrival: u32,
    /// `last_queued`: rq clock when it last became runnable (0 once it runs).
    pub last_queued: u32,
}
