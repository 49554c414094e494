//! Memory peaks the kernel keeps and loses when a worker ends: the largest resident set of
//! each exiting process (`signal->maxrss`, what wait4's `ru_maxrss` reports) and the memory
//! cgroup's high-water mark (`memory.peak`) at the cgroup's removal. Both are read by
//! programs at the moment they are final, so a worker shorter than a sample has its peak.

/// Name of the per-CPU hash: cgroup id → largest `signal->maxrss` (pages) of its exited
/// processes, on that CPU.
pub const PROCESS_PEAKS_MAP: &str = "PROCESS_PEAKS";

/// Global: `offsetof(struct task_struct, signal)`.
pub const TASK_SIGNAL_OFFSET_GLOBAL: &str = "TASK_SIGNAL_OFFSET";
/// Global: `offsetof(struct signal_struct, maxrss)` (pages).
pub const SIGNAL_MAXRSS_OFFSET_GLOBAL: &str = "SIGNAL_MAXRSS_OFFSET";
/// Global: `offsetof(struct cgroup, subsys[memory_cgrp_id])`, or 0 when the kernel has no
/// memory controller.
pub const CGROUP_MEMORY_CSS_OFFSET_GLOBAL: &str = "CGROUP_MEMORY_CSS_OFFSET";
/// Global: `offsetof(struct css_set, subsys[memory_cgrp_id])`, where a task's memory
/// controller state is (read only when [`TASK_MEMORY_CGROUP_GLOBAL`] is 1).
pub const CSS_SET_MEMORY_CSS_OFFSET_GLOBAL: &str = "CSS_SET_MEMORY_CSS_OFFSET";
/// Global: `offsetof(struct cgroup_subsys_state, cgroup)`.
pub const CSS_CGROUP_OFFSET_GLOBAL: &str = "CSS_CGROUP_OFFSET";
/// Global: 1 when the two offsets above were found (the kernel has a memory controller), so
/// the process walk names each process's memory cgroup.
pub const TASK_MEMORY_CGROUP_GLOBAL: &str = "TASK_MEMORY_CGROUP";
/// Global: offset of `memory.watermark` (pages) from a memory cgroup's `css`.
pub const MEMCG_WATERMARK_OFFSET_GLOBAL: &str = "MEMCG_WATERMARK_OFFSET";
/// Global: offset of `memory.usage` (pages, what `memory.current` shows) from a memory
/// cgroup's `css`.
pub const MEMCG_USAGE_OFFSET_GLOBAL: &str = "MEMCG_USAGE_OFFSET";

/// Name of the hash map the memory walk fills: cgroup id → [`MemoryNow`], for every cgroup with
/// a memory controller of its own. Read at each sample instead of two files per worker.
pub const MEMORY_NOW_MAP: &str = "MEMORY_NOW";

/// Name of the one-entry array holding the id of the last memory walk that ended.
pub const LAST_MEMORY_WALK_MAP: &str = "LAST_MEMORY_WALK";

/// A cgroup's memory counters as the walk that wrote them found them.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryNow {
    /// Pages charged now (`memory.current` / page size).
    pub current_pages: u64,
    /// The high-water mark (`memory.peak` / page size).
    pub peak_pages: u64,
    /// The walk (the iterator session's id): an entry no later walk rewrote is of a cgroup
    /// that is gone.
    pub walk: u64,
}

#[cfg(feature = "user")]
// SAFETY: plain `#[repr(C)]` integers, no padding, every bit pattern valid.
unsafe impl aya::Pod for MemoryNow {}

/// What the process walk writes to its output for each process (not kernel threads): user
/// space sums the resident pages by cgroup. Read where the memory walk cannot run (hybrid
/// hosts, cgroups without the memory controller) instead of each worker's process list and
/// each process's /proc/PID/statm.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessRss {
    /// The id of the process's cgroup2 cgroup.
    pub cgroup_id: u64,
    /// Its resident pages (/proc/PID/statm's second field).
    pub rss_pages: u64,
    /// The id of the cgroup holding its memory controller state (on hybrid hosts its v1
    /// memory cgroup, the inode of its directory there); 0 when not known. User space tells
    /// by it whether that cgroup is known to be shared, without reading /proc/PID/cgroup.
    pub memory_cgroup_id: u64,
    /// Its pid: user space looks up the v1 memory cgroup through one of a cgroup's processes
    /// without listing them.
    pub pid: u32,
    /// Padding, zero.
    pub reserved: u32,
}

/// Where the programs find the memory peaks, from the kernel's BTF.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryOffsets {
    /// `task_struct.signal`.
    pub task_signal: u32,
    /// `signal_struct.maxrss`.
    pub signal_maxrss: u32,
    /// `cgroup.subsys[memory_cgrp_id]`; 0 without a memory controller.
    pub cgroup_memory_css: u32,
    /// `mem_cgroup.memory.watermark` less `mem_cgroup.css`.
    pub memcg_watermark: u32,
    /// `mem_cgroup.memory.usage` less `mem_cgroup.css`; 0 when not found.
    pub memcg_usage: u32,
    /// `css_set.subsys[memory_cgrp_id]` and `cgroup_subsys_state.cgroup`: a task's memory
    /// cgroup; `None` without a memory controller.
    pub task_memory_cgroup: Option<(u32, u32)>,
}
